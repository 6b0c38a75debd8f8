// `chorus launch FILE [node options]`: the embedded way to run a whole cluster on one machine.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "run/cli_checks.h"
#include "topology/topology.h"

namespace chorus::cli {
namespace {

struct LaunchArgs {
  std::string topology;
  std::vector<uint32_t> ids;
  double timeout_s = 0;
  bool keep_going = false;
  bool fail_fast_given = false;  // --fail-fast: the default, accepted as before
};

// The launch's run spec, in the temporary folder for as long as the launch runs: every node
// reads it once, at its start.
class TemporarySpec {
 public:
  explicit TemporarySpec(const NodeArgs& args)
      : path_((std::filesystem::temp_directory_path() /
               fmt::format("chorus-launch-{}.spec", ::getpid()))
                  .string()) {
    if (const node::Status written = writeRunSpec(args, path_); !written.ok()) {
      throw CommandFailure(1, written.message());
    }
  }
  ~TemporarySpec() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  TemporarySpec(const TemporarySpec&) = delete;
  TemporarySpec& operator=(const TemporarySpec&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string selfExecutable() {
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec)
    throw CommandFailure(1, "cannot find the chorus executable (/proc/self/exe): " + ec.message());
  return path.string();
}

void runLaunchCommand(CLI::App& cmd, const LaunchArgs& args) {
  node::Result<topology::Topology> loaded = topology::loadTopology(args.topology);
  if (!loaded.ok()) throw CommandFailure(2, loaded.message());
  const topology::Topology topo = std::move(loaded).value();
  LaunchOptions options;
  options.binary = selfExecutable();
  options.file = "/proc/self/exe";  // this very image, whatever happens to the file on disk
  const std::vector<std::string> node_args = cmd.remaining();
  // A node that fails leaves the others waiting for it: stop them at once, unless asked not to.
  options.fail_fast = !args.keep_going;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));
  if (args.ids.empty()) {
    for (const auto& n : topo.nodes)
      options.ids.push_back(n.id);
  } else {
    std::set<uint32_t> seen;
    for (uint32_t id : args.ids) {
      if (topo.find(id) == nullptr) {
        throw CommandFailure(2, fmt::format("--ids: node {} is not in {}", id, args.topology));
      }
      // Two copies of one node would fight over its port.
      if (!seen.insert(id).second) {
        throw CommandFailure(2, fmt::format("--ids: node {} is given twice", id));
      }
    }
    options.ids = args.ids;
  }
  // launch gives each node its file and id itself; a second one would be refused by every node.
  for (const std::string& arg : node_args) {
    for (const char* own : {"--id", "--topology", "--spec"}) {
      if (arg == own || arg.rfind(std::string(own) + "=", 0) == 0) {
        throw CommandFailure(2, fmt::format("{}: chorus launch passes each node the topology file "
                                            "and its id itself; choose nodes with --ids",
                                            own));
      }
    }
  }
  // One parse and one check here say once what every node would say; the nodes get the result.
  std::vector<std::string> given;
  NodeArgs node = parseNodeArguments(args.topology, options.ids, node_args, &given);
  // The nodes of a launch start together: a minute covers the slowest start-up (64 nodes
  // connected within 18 s here), where chorus node alone waits longer for people.
  if (std::find(given.begin(), given.end(), "--ready-timeout") == given.end()) {
    node.ready_timeout_s = 60;
  }
  // --rejoin restarts nodes into a running job; started on every node there is no job left.
  if (node.consensus.rejoin && options.ids.size() == topo.nodes.size()) {
    throw CommandFailure(
        2, fmt::format("--rejoin on every node of {} leaves no running job to join: pass --ids "
                       "with the node(s) to restart (e.g. --ids 2 --rejoin), or leave out "
                       "--rejoin to start a new job",
                       args.topology));
  }
  const TemporarySpec spec(node);
  options.spec_path = spec.path();
  const std::string& mode = node.mode;
  fmt::print(
      "[launch] cluster '{}' ({} mode) from {}: starting {} node(s){}\n", topo.name,
      mode.empty() ? topology::modeName(topo.mode) : mode, args.topology, options.ids.size(),
      node_args.empty() ? std::string() : fmt::format(" with: {}", fmt::join(node_args, " ")));
  std::fflush(stdout);
  LaunchResult result = runLaunch(options);
  auto failures = result.failures();
  if (result.ok()) {
    const auto crashes = result.injectedCrashes();
    if (crashes.empty()) {
      fmt::print("[launch] all {} node(s) finished cleanly in {:.1f} s\n", result.nodes.size(),
                 result.seconds);
    } else {
      fmt::print("[launch] {} of {} node(s) finished cleanly in {:.1f} s; {}\n",
                 result.nodes.size() - crashes.size(), result.nodes.size(), result.seconds,
                 fmt::join(crashes, "; "));
    }
    return;
  }
  std::string why = result.timed_out     ? "the --timeout passed"
                    : result.interrupted ? "interrupted"
                                         : fmt::format("{} of {} node(s) failed", failures.size(),
                                                       result.nodes.size());
  // Interrupted: 128 + the signal, as `chorus node` and the shell report it.
  throw CommandFailure(
      result.interrupted ? 128 + result.signal : 1,
      fmt::format("launch of {} ended after {:.1f} s: {}{}{}", args.topology, result.seconds, why,
                  failures.empty() ? "" : ": ", fmt::join(failures, "; ")));
}

}  // namespace

void addLaunchCommand(CLI::App& app) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "launch",
      "Start every node of a topology file on this machine as child processes.\n"
      "Every option this command does not know itself is a `chorus node` option (so: `chorus\n"
      "launch FILE --log-level debug` sets the nodes' --log-level); those options, and the data\n"
      "set, are parsed and checked once before any node starts, and each child runs `chorus node\n"
      "--spec SPEC --id I` with the result (a run spec in the temporary folder).\n"
      "Output lines are prefixed with [node I]; Ctrl-C, SIGTERM or SIGHUP is passed to every node\n"
      "once (another one more than a second later kills them), and a node whose launcher dies\n"
      "leaves in order. Exits 0 only when every node exits 0 (or 86, a crash injected with\n"
      "--stragglers crash:NODE@STEP); 128+N when signal N interrupted it; otherwise 1, naming\n"
      "the nodes that failed (2: bad arguments or topology).");
  cmd->add_option("topology", args->topology, "Topology file (TOML); see docs/topology.md")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--ids", args->ids, "Start only these node ids (default: every node of the file)")
      ->delimiter(',');
  cmd->add_option("--timeout", args->timeout_s,
                  "Stop every node after this many seconds (0: no limit)")
      ->check(run::nonNegative());
  cmd->add_flag("--keep-going", args->keep_going,
                "Let the other nodes run on when one node fails (by default they are stopped at "
                "once: they could only wait for it). An injected crash never stops them");
  // Stopping the others is the default now; the old flag is still accepted.
  cmd->add_flag("--fail-fast", args->fail_fast_given,
                "Stop the other nodes as soon as one node fails (the default)")
      ->group("");
  cmd->allow_extras();
  cmd->callback([cmd, args] { runLaunchCommand(*cmd, *args); });
}

}  // namespace chorus::cli
