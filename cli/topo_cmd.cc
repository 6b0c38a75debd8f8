// `chorus topo gen` and `chorus topo check`: thin wrappers over chorus_topology, which holds the
// logic (and its tests).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "topology/topology.h"

namespace chorus::cli {
namespace {

struct GenArguments {
  std::string kind;
  uint32_t nodes = 0;
  uint16_t base_port = 7100;
  std::vector<std::string> hosts{"127.0.0.1"};
  std::string hosts_file;
  uint32_t degree = 4;
  uint64_t seed = 1;
  std::string name;
  std::string mode = "consensus";
  std::string output;
  bool force = false;
  CLI::Option* degree_option = nullptr;
  CLI::Option* seed_option = nullptr;
};

// The hosts of a --hosts-file: one per line; blank lines and '#' comments are skipped.
std::vector<std::string> readHostsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw CommandFailure(2, fmt::format("--hosts-file {}: cannot read it", path));
  std::vector<std::string> hosts;
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    const size_t begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos) continue;
    const size_t end = line.find_last_not_of(" \t\r");
    hosts.push_back(line.substr(begin, end - begin + 1));
  }
  if (hosts.empty()) {
    throw CommandFailure(2, fmt::format("--hosts-file {}: no host in it (one per line)", path));
  }
  return hosts;
}

void runGen(const GenArguments& arguments) {
  topology::GenerateOptions options;
  options.kind = topology::parseGraphKind(arguments.kind).value();  // CLI11 checked the name
  options.nodes = arguments.nodes;
  options.base_port = arguments.base_port;
  options.hosts = arguments.hosts;
  if (!arguments.hosts_file.empty()) options.hosts = readHostsFile(arguments.hosts_file);
  options.degree = arguments.degree;
  options.seed = arguments.seed;
  options.name = arguments.name;
  options.mode = topology::parseMode(arguments.mode).value();
  if (options.kind != topology::GraphKind::kRegular &&
      (arguments.degree_option->count() > 0 || arguments.seed_option->count() > 0)) {
    throw CommandFailure(2, "--degree and --seed apply only to `regular` graphs");
  }
  node::Result<topology::Topology> made = topology::generate(options);
  if (!made.ok()) {
    throw CommandFailure(
        1, fmt::format("cannot generate a {} topology: {}", arguments.kind, made.message()));
  }
  const topology::Topology& generated = *made;
  // generate() accepted the name, so the command line is made too.
  const std::string text =
      fmt::format("# {}\n# {}\n{}", topology::generateCommandLine(options).value(),
                  topology::summarize(generated), topology::toToml(generated));
  if (arguments.output.empty()) {
    std::fputs(text.c_str(), stdout);
    return;
  }
  if (node::Status written = topology::writeTopologyFile(arguments.output, text, arguments.force);
      !written.ok()) {
    throw CommandFailure(1, written.message());
  }
  std::fprintf(stderr, "wrote %s (%s)\n", arguments.output.c_str(),
               topology::summarize(generated).c_str());
}

void runCheck(const std::vector<std::string>& files) {
  size_t failed = 0;
  for (const std::string& file : files) {
    topology::FileCheck check = topology::checkTopologyFile(file);
    std::FILE* stream = check.ok ? stdout : stderr;
    std::fprintf(stream, "%s\n", check.report.c_str());
    if (!check.ok) {
      ++failed;
    }
  }
  std::fflush(stdout);
  if (failed > 0) {
    throw CommandFailure(1, fmt::format("{} of {} topology file{} failed the check", failed,
                                        files.size(), files.size() == 1 ? "" : "s"));
  }
}

void addGen(CLI::App& topo) {
  auto arguments = std::make_shared<GenArguments>();
  CLI::App* gen = topo.add_subcommand(
      "gen",
      "Generate a topology file: node i listens on HOST:(BASE_PORT + i) and the neighbor edges "
      "form the chosen graph (symmetric, connected). Writes to stdout unless -o is given.");
  gen->add_option("kind", arguments->kind,
                  "Graph: ring (degree 2), torus (rows x cols as square as possible, N not "
                  "prime, N >= 4), complete, regular (random, --degree, --seed), exponential "
                  "(i linked to i +/- 2^k mod N), star (node 0 in the center)")
      ->required()
      ->check(CLI::IsMember({"ring", "torus", "complete", "regular", "exponential", "star"}));
  gen->add_option("-n,--nodes", arguments->nodes, "Number of nodes N (ids 0..N-1)")
      ->required()
      ->check(CLI::Range(1u, topology::kMaxNodes));
  gen->add_option("--base-port", arguments->base_port,
                  "Port of node 0; node i uses base port + i (must stay <= 65535)")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  auto* host_option =
      gen->add_option("--host", arguments->hosts,
                      "Host(s), comma separated: IPv4 address, host name, or IPv6 in brackets. "
                      "Node i runs on host i mod M and listens on --base-port + i / M (one host: "
                      "every node on it, ports base, base+1, ...)")
          ->delimiter(',')
          ->capture_default_str();
  gen->add_option("--hosts-file", arguments->hosts_file,
                  "A file with one host per line (# comments), instead of --host")
      ->excludes(host_option);
  arguments->degree_option =
      gen->add_option("--degree", arguments->degree,
                      "Degree of every node for `regular` (N x degree must be even, degree < N)")
          ->capture_default_str();
  arguments->seed_option =
      gen->add_option("--seed", arguments->seed,
                      "Random seed for `regular`; the same seed gives the same graph")
          ->capture_default_str();
  gen->add_option("--name", arguments->name, "Cluster name (default: KIND followed by N)");
  gen->add_option("--mode", arguments->mode, "Training mode written into [cluster]")
      ->capture_default_str()
      ->check(CLI::IsMember({"consensus", "ps"}));
  gen->add_option("-o,--output", arguments->output, "Write to FILE instead of stdout")
      ->type_name("FILE");
  gen->add_flag("--force", arguments->force, "Replace the -o file if it already exists");
  gen->callback([arguments] { runGen(*arguments); });
}

void addCheck(CLI::App& topo) {
  auto files = std::make_shared<std::vector<std::string>>();
  CLI::App* check = topo.add_subcommand(
      "check",
      "Validate topology files. Prints 'FILE: ok (N nodes, E edges, mode M, connected)' for a "
      "good file, or every problem as 'FILE:LINE:COL: error: ... (fix: ...)'. Exits 1 when any "
      "file has an error.");
  check->add_option("files", *files, "Topology files to check")->required()->type_name("FILE");
  check->callback([files] { runCheck(*files); });
}

}  // namespace

void addTopoCommands(CLI::App& app) {
  CLI::App* topo =
      app.add_subcommand("topo", "Generate and check topology files (format: docs/topology.md)");
  topo->require_subcommand(1);
  addGen(*topo);
  addCheck(*topo);
}

}  // namespace chorus::cli
