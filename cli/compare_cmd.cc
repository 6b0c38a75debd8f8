// `chorus compare`: runs several training variants (single, PS, consensus) on the same data,
// model, shards, initial model, stragglers and budget, one after another through the launcher,
// and writes summary.csv, report.md and plots. Variant mapping and the report live in
// chorus_report; this file runs the launches and prints progress.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "cli/run_ports.h"
#include "cli/sparse_node.h"
#include "consensus/consensus_peer.h"
#include "experiment/target.h"
#include "experiment/variant.h"
#include "faults/link_delay.h"
#include "faults/straggler.h"
#include "ml/dataset.h"
#include "node/node.h"
#include "node/secret.h"
#include "ps/ps_peer.h"
#include "report/conclusion.h"
#include "report/report.h"
#include "report/sparse_table.h"
#include "run/cli_checks.h"
#include "run/training_run.h"
#include "topology/topology.h"

namespace chorus::cli {
namespace fs = std::filesystem;
namespace {

struct CompareArgs {
  run::RunOptions run;
  // Mode options, passed only to that mode's variants (experiment::OptionScope).
  ps::PsOptions ps;
  consensus::ConsensusOptions consensus;
  // --staleness: the consensus variants' tau (a PS variant's bound is its name's).
  run::StalenessBound staleness = run::kDefaultStaleness;
  std::set<std::string> ps_flags, consensus_flags;
  // The sparse models' flags (chorus node's: --dim, --negatives, ...; the sampling flags are PS
  // mode's, the gossip flags consensus mode's).
  SparseNodeArgs sparse;
  // --target-mrr, --target-rmse, --target (--target-acc is the run options'); given when the
  // option's count is not 0.
  double target_mrr = 0, target_rmse = 0, target_any = 0;
  std::string topology;
  std::string variants;
  std::string secret_file;  // empty: the topology's [cluster] secret_file, if any
  std::string link_delay;   // forwarded to every node; checked here first
  std::string link_loss;    // the same
  int seeds = 1;
  bool force = false;
  double run_timeout_s = 0;
  double progress_s = 5;
};

// The option scopes of the two modes whose options compare offers (modes/variants.h: a mode's
// scope is its name).
const std::string kPsScope = "ps";
const std::string kConsensusScope = "consensus";

// Flags compare sets per run itself, or that belong to compare only: never forwarded as given.
const std::set<std::string> kOwnFlags = {"--topology",    "--variants",       "--seeds", "--force",
                                         "--run-timeout", "--progress-every", "--seed",  "--out",
                                         "--rounds",      "--eval-every",     "--help",  "--target",
                                         "--target-mrr",  "--target-rmse"};

// Mode options that the variant's name sets (or that make no sense for a compare): refused with
// what to write instead.
const std::vector<std::pair<std::string, std::string>> kVariantFlags = {
    {"--backup", "the variant name sets it: consensus:RULE, e.g. consensus:static:1"},
    {"--rejoin", "it is for one restarted node, not for a compare"},
    {"--technique", "the variant name sets it: ps:TECHNIQUE, e.g. ps:lapse or ps:lapse:ssp:2"},
    {"--mf-schedule", "the variant name sets it: ps:rotation"}};

// Registers a mode's options on `cmd` through `add`, under the help heading `heading`, and
// returns their flags.
template <typename Add>
std::set<std::string> addModeOptions(CLI::App& cmd, const std::string& heading, Add add) {
  std::set<std::string> before;
  for (const CLI::Option* option : cmd.get_options())
    before.insert(option->get_name());
  add(cmd);
  std::set<std::string> added;
  for (CLI::Option* option : cmd.get_options()) {
    if (before.count(option->get_name()) > 0) continue;
    added.insert(option->get_name());
    option->group(heading);
  }
  return added;
}

// Error messages from the libraries may span lines (a list of places looked at); compare
// reports each bad input on one line.
std::string oneLine(const std::string& text) {
  std::string out;
  bool space = false;
  for (char c : text) {
    if (c == '\n') {
      if (!out.empty() && out.back() != ':' && out.back() != '.') out += ";";
      space = true;
      continue;
    }
    if (c == ' ' && space) continue;
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

std::string selfExecutable() {
  std::error_code ec;
  auto path = fs::read_symlink("/proc/self/exe", ec);
  if (ec)
    throw CommandFailure(1, "cannot find the chorus executable (/proc/self/exe): " + ec.message());
  return path.string();
}

// The training options the user gave, to pass on unchanged: every training option to every
// node, a mode's options to the nodes of that mode's variants. --data and --model are always
// passed, so that the nodes train what compare checked even if their own defaults change.
std::vector<experiment::ForwardedOption> forwardedOptions(CLI::App& cmd, const CompareArgs& args,
                                                          const std::string& data,
                                                          double target_acc) {
  const run::RunOptions& run = args.run;
  std::vector<experiment::ForwardedOption> forwarded;
  for (const CLI::Option* option : cmd.get_options()) {
    if (option->count() == 0) continue;
    const std::string flag = option->get_name();
    if (kOwnFlags.count(flag) > 0 || !flag.starts_with("--")) continue;
    const auto& results = option->results();
    std::string joined;
    for (const auto& value : results) {
      if (!joined.empty()) joined += ",";
      joined += value;
    }
    // A flag (--augment, --no-flip) is forwarded bare: its recorded result is not an argument.
    const bool bare = results.empty() || option->get_items_expected_max() == 0;
    // The deprecated spelling reaches the nodes as --staleness (said once, by this parse).
    if (flag == "--staleness-bound") {
      forwarded.push_back({"--staleness", {joined}, kConsensusScope});
      continue;
    }
    const std::string scope = flag == "--staleness"           ? kConsensusScope
                              : flag == ps::kAsyncRoundsFlag  ? std::string(modes::kPsAsyncScope)
                              : args.ps_flags.count(flag) > 0 ? kPsScope
                              : args.consensus_flags.count(flag) > 0 ? kConsensusScope
                                                                     : std::string();
    forwarded.push_back(
        {flag, bare ? std::vector<std::string>{} : std::vector<std::string>{joined}, scope});
  }
  const auto given = [&](const std::string& flag) {
    return std::any_of(forwarded.begin(), forwarded.end(),
                       [&](const auto& option) { return option.flag == flag; });
  };
  if (!given("--model")) {
    forwarded.insert(forwarded.begin(), {"--model", {run.model.name}, ""});
  }
  if (!given("--data")) forwarded.insert(forwarded.begin(), {"--data", {data}, ""});
  // --target on an image model is its --target-acc: the nodes log when they reach it.
  if (!given("--target-acc") && target_acc > 0) {
    forwarded.push_back({"--target-acc", {fmt::format("{}", target_acc)}, ""});
  }
  return forwarded;
}

// The options the single variant gets: `forwarded` with --stragglers narrowed to the terms that
// act on node 0, the one node it runs (left out when none do). Says what it left out, once.
std::vector<experiment::ForwardedOption> singleVariantOptions(
    const std::vector<experiment::ForwardedOption>& forwarded,
    const faults::StragglerProfile& whole, const std::vector<experiment::Variant>& variants) {
  const bool has_single =
      std::any_of(variants.begin(), variants.end(), [](const auto& v) { return v.alone(); });
  if (!has_single || whole.text.empty()) return forwarded;
  const auto own = whole.restrictedTo(0);
  std::vector<experiment::ForwardedOption> out;
  for (const auto& option : forwarded) {
    if (option.flag != "--stragglers") {
      out.push_back(option);
    } else if (!own.empty()) {
      out.push_back({option.flag, {own.text}, option.scope});
    }
  }
  if (own.text != whole.text) {
    fmt::print(
        "[compare] single runs node 0 alone, so it takes node 0's straggler terms: {} "
        "(of --stragglers {})\n",
        own.text, whole.text);
  }
  return out;
}

// Refuses an existing output folder unless --force, and even then only one that compare made
// (or an empty one): --force must never wipe a folder of something else.
void prepareOutputFolder(const fs::path& out, bool force) {
  std::error_code ec;
  if (fs::exists(out, ec)) {
    if (!force) {
      throw CommandFailure(
          2, fmt::format("--out {}: the folder exists; choose another or add --force to replace it",
                         out.string()));
    }
    const bool empty = fs::is_directory(out, ec) && fs::is_empty(out, ec);
    if (!empty && !fs::exists(out / "runs.jsonl", ec)) {
      throw CommandFailure(2, fmt::format("--out {}: exists and is not a chorus compare folder "
                                          "(no runs.jsonl); --force replaces only those",
                                          out.string()));
    }
    fs::remove_all(out, ec);
    if (ec) {
      throw CommandFailure(2,
                           fmt::format("--out {}: cannot remove: {}", out.string(), ec.message()));
    }
  }
  fs::create_directories(out, ec);
  if (ec) {
    throw CommandFailure(2, fmt::format("--out {}: cannot create: {}", out.string(), ec.message()));
  }
}

struct RunOutcome {
  LaunchResult result;
  std::string first_node_error;  // the first "chorus: error:" line a node wrote
  std::string last_node_line;    // else the last line a node wrote to stderr
  // What the nodes said about a failure, or "".
  const std::string& nodesSay() const {
    return first_node_error.empty() ? last_node_line : first_node_error;
  }
};

// Runs one launch on its own thread while this thread prints a progress line every
// `progress_s` seconds from node 0's metrics file.
RunOutcome launchWithProgress(const LaunchOptions& base, const fs::path& log_path,
                              const fs::path& node0_metrics, const std::string& label,
                              double progress_s) {
  auto log = std::make_shared<std::ofstream>(log_path, std::ios::trunc);
  RunOutcome outcome;
  LaunchOptions options = base;
  options.out = [log](std::string_view line) { *log << line << '\n'; };
  options.err = [log, &outcome](std::string_view line) {
    *log << line << '\n';
    // The launcher's own lines ("[launch] node 1 exited with status 4") repeat what the
    // outcome says; the cause is in what the nodes wrote, and the first node to fail with an
    // error usually caused the others to fail (they wait for it and time out). CLI11 follows
    // its message with a pointer to --help, which says nothing about the cause.
    if (!line.starts_with("[node ") || line.find("--help") != std::string_view::npos) return;
    if (outcome.first_node_error.empty() && line.find("chorus: error:") != std::string_view::npos) {
      outcome.first_node_error = std::string(line);
    }
    outcome.last_node_line = std::string(line);
  };
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  const auto start = std::chrono::steady_clock::now();
  std::thread runner([&] {
    LaunchResult result = runLaunch(options);
    std::lock_guard lock(mutex);
    outcome.result = std::move(result);
    done = true;
    done_cv.notify_all();
  });
  {
    std::unique_lock lock(mutex);
    const auto interval = std::chrono::milliseconds(static_cast<int64_t>(progress_s * 1000));
    while (!done_cv.wait_for(lock, interval, [&] { return done; })) {
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::string status = "starting";
      if (auto p = report::readProgress(node0_metrics)) {
        status = fmt::format("step {}", p->step);
        if (p->test_accuracy)
          status += fmt::format(", test accuracy {:.2f}%", 100 * *p->test_accuracy);
      }
      fmt::print("[compare] {}: {:.0f} s, {}\n", label, elapsed, status);
      std::fflush(stdout);
    }
  }
  runner.join();
  log->flush();
  return outcome;
}

void runCompare(CLI::App& cmd, const CompareArgs& args) {
  // Every bad input is refused before the first run starts.
  node::Result<std::vector<experiment::Variant>> listed =
      experiment::readVariantList(args.variants);
  if (!listed.ok()) throw CommandFailure(2, fmt::format("--variants: {}", listed.message()));
  std::vector<experiment::Variant> variants = std::move(listed).value();
  for (const auto& [flag, why] : kVariantFlags) {
    if (cmd.get_option(flag)->count() > 0) {
      throw CommandFailure(2, fmt::format("{} cannot be given to compare: {}", flag, why));
    }
  }
  // --staleness is the consensus variants' tau; a PS variant's bound is in its name.
  const bool has_ps = std::any_of(variants.begin(), variants.end(),
                                  [](const auto& v) { return v.inScope(kPsScope); });
  for (const char* flag : {"--staleness", "--staleness-bound"}) {
    if (has_ps && cmd.get_option(flag)->count() > 0) {
      throw CommandFailure(2, fmt::format("{} cannot be given to compare: the variant name sets it "
                                          "for the ps:* variants (ps:bsp, ps:ssp:N or ps:async); "
                                          "compare the consensus variants' bound in a compare of "
                                          "their own",
                                          flag));
    }
  }
  // The model's family: a technique's variant trains the sparse models only, and a sparse model
  // counts epochs, evaluates every --eval-every-epochs and is measured in MRR or RMSE.
  const bool sparse = isSparseModel(args.run.model.name);
  for (const auto& v : variants) {
    if ((v.spec.family == modes::ModelFamily::kSparse && !sparse) ||
        (v.spec.family == modes::ModelFamily::kMf && args.run.model.name != "mf")) {
      throw CommandFailure(2, fmt::format("--variants: {} does not apply to --model {}: {}", v.name,
                                          args.run.model.name, v.spec.family_reason));
    }
  }
  if (sparse) {
    for (const auto& [flag, why] : std::vector<std::pair<std::string, std::string>>{
             {"--rounds", "a sparse model trains whole --epochs"},
             {"--eval-every", "a sparse model evaluates every N epochs: --eval-every-epochs N"}}) {
      if (cmd.get_option(flag)->count() > 0) {
        throw CommandFailure(
            2, fmt::format("{} does not apply to --model {} ({})", flag, args.run.model.name, why));
      }
    }
  }
  std::optional<experiment::Target> target;
  try {
    experiment::TargetFlags flags;
    const auto givenValue = [&](const char* flag, double value) {
      return cmd.get_option(flag)->count() > 0 ? std::optional<double>(value) : std::nullopt;
    };
    flags.acc = givenValue("--target-acc", args.run.target_acc);
    flags.mrr = givenValue("--target-mrr", args.target_mrr);
    flags.rmse = givenValue("--target-rmse", args.target_rmse);
    flags.any = givenValue("--target", args.target_any);
    target = experiment::resolveTarget(flags, args.run.model.name);
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, e.what());
  }
  // The image models' target travels to the nodes (they log when they reach it); a sparse
  // model's is found in node 0's evaluations by the report.
  const double target_acc = target && !sparse ? target->value : 0;
  std::optional<report::QualityTarget> quality_target;
  if (target && sparse) quality_target = report::QualityTarget{target->metric, target->value};
  std::error_code ec;
  if (!fs::is_regular_file(args.topology, ec)) {
    throw CommandFailure(2, fmt::format("--topology {}: no such file (write one with `chorus topo "
                                        "gen`, or use one from examples/topologies/)",
                                        args.topology));
  }
  node::Result<topology::Topology> loaded = topology::loadTopology(args.topology);
  if (!loaded.ok()) throw CommandFailure(2, oneLine(loaded.message()));
  const topology::Topology topo = std::move(loaded).value();
  if (args.run.out_dir.empty()) throw CommandFailure(2, "--out DIR is required");
  if (const node::Status run = run::checkRunOptions(args.run); !run.ok()) {
    throw CommandFailure(2, run.message());
  }
  try {
    ps::validatePsOptions(args.ps);
    consensus::ConsensusOptions consensus = args.consensus;
    consensus.staleness = args.staleness;
    consensus::validateConsensusOptions(consensus);
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, e.what());
  }
  // A secret that no node could load would fail every run; refuse it once, up front.
  if (!args.secret_file.empty()) {
    node::ClusterKey key{};
    std::string warning;
    if (node::Status loaded = node::loadClusterKey(args.secret_file, &key, &warning);
        !loaded.ok()) {
      throw CommandFailure(2, "--secret-file: " + loaded.message());
    }
  }
  checkStragglersNameMembers(args.run.stragglers, topo, args.topology);
  {
    // The nodes run with the default heartbeat and peer time-out (compare does not change them).
    const node::NodeOptions defaults;
    // Read here, as each node's parse will (compare's refusals are one "chorus: error:" line).
    const node::Result<faults::LinkDelay> delay = faults::LinkDelay::read(args.link_delay);
    if (!delay.ok()) throw CommandFailure(2, "--link-delay: " + delay.message());
    const node::Result<faults::LinkLoss> loss = faults::LinkLoss::read(args.link_loss);
    if (!loss.ok()) throw CommandFailure(2, "--link-loss: " + loss.message());
    for (const topology::NodeSpec& node : topo.nodes) {
      nodeLinkFaults(*delay, *loss, node, args.topology, defaults.heartbeat_interval,
                     defaults.peer_timeout,
                     fmt::format("the nodes' {} ms peer time-out", defaults.peer_timeout.count()),
                     "compare runs the nodes with the default time-outs");
    }
  }
  if (!sparse && args.run.data.name != "synthetic") {
    try {
      ml::findDataDir(args.run.data.name, args.run.data.dataDir);
    } catch (const ml::DataError& e) {
      throw CommandFailure(2, oneLine(e.what()));
    }
  }
  const fs::path out = args.run.out_dir;
  prepareOutputFolder(out, args.force);

  const std::string binary = selfExecutable();
  // The command as it would reproduce this compare, defaults made explicit.
  std::vector<std::string> argv = {"chorus",     "compare",
                                   "--topology", args.topology,
                                   "--variants", args.variants,
                                   "--seeds",    std::to_string(args.seeds),
                                   "--seed",     std::to_string(args.run.seed)};
  if (args.run.rounds > 0) {
    argv.insert(argv.end(), {"--rounds", std::to_string(args.run.rounds)});
  }
  if (!sparse) argv.insert(argv.end(), {"--eval-every", std::to_string(args.run.eval_every)});
  if (quality_target) {
    argv.insert(argv.end(), {quality_target->metric == "mrr" ? "--target-mrr" : "--target-rmse",
                             fmt::format("{}", quality_target->value)});
  }
  // A sparse model without --data trains on its own default (wn18rr, zipf-mf), as chorus node
  // would: the nodes are told which.
  const std::string data = sparse && cmd.get_option("--data")->count() == 0
                               ? (args.run.model.name == "mf" ? "zipf-mf" : "wn18rr")
                               : args.run.data.name;
  const auto forwarded = forwardedOptions(cmd, args, data, target_acc);
  for (const auto& option : forwarded) {
    argv.push_back(option.flag);
    argv.insert(argv.end(), option.values.begin(), option.values.end());
  }
  argv.insert(argv.end(), {"--out", args.run.out_dir});
  std::vector<std::string> names;
  names.reserve(variants.size());
  for (const auto& v : variants)
    names.push_back(v.name);

  const int nodes = static_cast<int>(topo.nodes.size());
  experiment::RunBudget budget{args.run.rounds, args.run.eval_every, nodes, sparse};
  // The single variant is one node, node 0: it takes the --stragglers terms that act on node 0
  // (a slow or crash term for another node would never act on it, and chorus node refuses
  // such a term).
  const auto single_forwarded = singleVariantOptions(forwarded, args.run.stragglers, variants);
  // One run's topology, node ids and node options (command.txt and run.spec hold them).
  struct RunPlan {
    std::string topology;
    std::vector<uint32_t> ids;
    std::vector<std::string> node_args;
  };
  // `ported`: the run's copy of the topology on ports free now (withFreePorts), written to the
  // run's folder; null: the file itself (the checks before the first run).
  const auto planRun = [&](const experiment::Variant& variant, uint64_t seed,
                           const fs::path& run_dir, const topology::Topology* ported) {
    RunPlan plan;
    const topology::Topology& run_topo = ported != nullptr ? *ported : topo;
    if (variant.alone()) {
      const fs::path single = run_dir / "single.toml";
      std::ofstream(single) << experiment::singleTopology(topo.name + "-single",
                                                          run_topo.nodes.front().address(),
                                                          topo.nodes.front().stragglers.text);
      plan.topology = single.string();
      plan.ids = {0};
    } else {
      plan.topology = args.topology;
      if (ported != nullptr) {
        plan.topology = (run_dir / "topology.toml").string();
        std::ofstream(plan.topology) << topology::toToml(*ported);
      }
      for (const auto& n : topo.nodes)
        plan.ids.push_back(n.id);
    }
    plan.node_args = experiment::nodeArgs(variant, variant.alone() ? single_forwarded : forwarded,
                                          budget, seed, run_dir.string());
    // --save FILE: each run saves its model as FILE in its own folder.
    for (size_t i = 0; i + 1 < plan.node_args.size(); ++i) {
      if (plan.node_args[i] == "--save") {
        plan.node_args[i + 1] = (run_dir / fs::path(plan.node_args[i + 1]).filename()).string();
      }
    }
    return plan;
  };
  // Every variant's nodes are checked as `chorus launch` checks them (flags that do not apply to
  // the mode or the model, the data set) before the first run starts, in a folder of their own.
  {
    const fs::path check_dir = out / ".check";
    for (const auto& variant : variants) {
      const fs::path dir = check_dir / variant.dirName();
      fs::create_directories(dir, ec);
      const RunPlan plan = planRun(variant, args.run.seed, dir, nullptr);
      try {
        (void)parseNodeArguments(plan.topology, plan.ids, plan.node_args);
      } catch (const CommandFailure& e) {
        fs::remove_all(out, ec);
        throw CommandFailure(e.code(), fmt::format("variant {}: {}", variant.name, e.what()));
      }
    }
    fs::remove_all(check_dir, ec);
  }
  auto manifest = report::CompareManifest::create(out, experiment::shellQuote(argv), target_acc,
                                                  names, quality_target);
  const int total = args.seeds * static_cast<int>(variants.size());
  int index = 0, failed = 0;
  bool interrupted = false;
  std::vector<std::string> failures;
  const auto compare_start = std::chrono::steady_clock::now();
  fmt::print("[compare] {} variant(s) x {} seed(s) on {} ({} nodes), results in {}\n",
             variants.size(), args.seeds, args.topology, nodes, out.string());
  std::fflush(stdout);
  // Seed-major order: load drift on the machine hits every variant alike.
  for (int s = 0; s < args.seeds && !interrupted; ++s) {
    const uint64_t seed = args.run.seed + static_cast<uint64_t>(s);
    for (const auto& variant : variants) {
      ++index;
      const fs::path run_dir = out / variant.dirName() / fmt::format("seed-{}", seed);
      fs::create_directories(run_dir, ec);
      LaunchOptions launch;
      launch.binary = binary;
      launch.file = "/proc/self/exe";
      // A run whose node failed cannot succeed: the others would only wait for it until their
      // --ready-timeout (or for ever, under BSP).
      launch.fail_fast = true;
      launch.timeout = std::chrono::milliseconds(static_cast<int64_t>(args.run_timeout_s * 1000));
      // Ports that are free now, not the file's: a port another program took since (another
      // test, a run still closing) would fail this run mid-comparison (cli/run_ports.h).
      node::Result<topology::Topology> ported = withFreePorts(topo);
      if (!ported.ok()) throw CommandFailure(1, ported.message());
      RunPlan plan = planRun(variant, seed, run_dir, &*ported);
      const std::string& topology_path = plan.topology;
      launch.ids = plan.ids;
      const std::vector<std::string>& node_args = plan.node_args;
      // command.txt: the run as a person would start it again; run.spec: the same settings,
      // parsed and checked here once, which the nodes read instead of parsing them again.
      std::vector<std::string> shown = {"chorus", "launch", topology_path};
      shown.insert(shown.end(), node_args.begin(), node_args.end());
      std::ofstream(run_dir / "command.txt") << experiment::shellQuote(shown) << '\n';
      launch.spec_path = (run_dir / "run.spec").string();
      if (const node::Status written = writeRunSpec(
              parseNodeArguments(topology_path, launch.ids, node_args), launch.spec_path);
          !written.ok()) {
        throw CommandFailure(1, written.message());
      }

      const std::string label = fmt::format("[{}/{}] {} seed {}", index, total, variant.name, seed);
      fmt::print("[compare] {}: starting ({})\n", label, (run_dir / "command.txt").string());
      std::fflush(stdout);
      RunOutcome outcome = launchWithProgress(launch, run_dir / "output.log",
                                              run_dir / "node-0.jsonl", label, args.progress_s);
      report::RunRecord record{variant.name, seed, run_dir, ""};
      const LaunchResult& result = outcome.result;
      if (result.ok()) {
        std::string summary = fmt::format("finished in {:.1f} s", result.seconds);
        try {
          auto metrics = report::readRunFolder(run_dir);
          auto s = report::summarizeRun(metrics);
          if (s.final_accuracy)
            summary += fmt::format(", test accuracy {:.2f}%", 100 * *s.final_accuracy);
          if (s.final_quality) {
            summary += fmt::format(", test {} {:.4f}", report::qualityName(s.quality_metric),
                                   *s.final_quality);
          }
          if (quality_target) {
            const auto& ref = metrics.nodes.front();
            const auto reached = ref.sparse
                                     ? report::sparseTimeToTarget(*ref.sparse, *quality_target)
                                     : std::nullopt;
            const std::string name = report::qualityTargetName(*quality_target);
            summary += reached ? fmt::format(", {} reached after {:.1f} s", name, *reached)
                               : fmt::format(", {} not reached", name);
          } else if (target_acc > 0) {
            summary += s.time_to_target ? fmt::format(", {:.1f}% reached after {:.1f} s",
                                                      100 * target_acc, *s.time_to_target)
                                        : fmt::format(", {:.1f}% not reached", 100 * target_acc);
          }
        } catch (const report::ReportError& e) {
          summary += fmt::format(" (metrics unreadable: {})", e.what());
        }
        // A crash the profile asked for is part of the run, but it should not go unsaid.
        for (const std::string& crash : result.injectedCrashes())
          summary += "; " + crash;
        fmt::print("[compare] {}: {}\n", label, summary);
      } else {
        auto lines = result.failures();
        std::string why = result.timed_out     ? "--run-timeout passed"
                          : result.interrupted ? "interrupted"
                                               : fmt::format("{}", fmt::join(lines, "; "));
        // A node's own last words explain a failure; after a time-out or Ctrl-C they do not.
        if (!result.timed_out && !result.interrupted && !outcome.nodesSay().empty()) {
          why += " (" + outcome.nodesSay() + ")";
        }
        record.error = why;
        ++failed;
        failures.push_back(fmt::format("{} seed {}", variant.name, seed));
        fmt::print("[compare] {}: FAILED after {:.1f} s: {}; output in {}\n", label, result.seconds,
                   why, (run_dir / "output.log").string());
        interrupted = result.interrupted;
      }
      std::fflush(stdout);
      manifest.append(record);
      if (interrupted) break;
    }
  }

  report::Report built = report::buildReport(report::loadReportInput(out));
  for (const auto& warning : built.warnings) {
    std::fprintf(stderr, "chorus: warning: %s\n", warning.c_str());
  }
  report::PlotSet plots;
  try {
    plots = report::writeReportFiles(built, out);
  } catch (const report::ReportError& e) {
    throw CommandFailure(
        1, fmt::format("the runs are in {}, but the report failed: {}", out.string(), e.what()));
  }
  const double minutes =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - compare_start).count() / 60;
  fmt::print("\n{}\n", report::markdownTable(built));
  if (const std::string said = report::conclusion(built); !said.empty()) fmt::print("{}\n\n", said);
  fmt::print("[compare] done in {:.1f} min: table {}, per run {}\n", minutes,
             (out / "report.md").string(), (out / "summary.csv").string());
  for (const auto& png : plots.pngs)
    fmt::print("[compare] plot: {}\n", png.string());
  std::fflush(stdout);
  if (interrupted) throw CommandFailure(130, "interrupted; the report covers the runs that ended");
  if (failed > 0) {
    throw CommandFailure(1, fmt::format("{} of {} run(s) failed ({}); the report covers the others",
                                        failed, total, fmt::join(failures, ", ")));
  }
}

}  // namespace

void addCompareCommand(CLI::App& app) {
  auto args = std::make_shared<CompareArgs>();
  args->run.model.name = "mlp";
  args->run.data.name = "fashion-mnist";
  CLI::App* cmd = app.add_subcommand(
      "compare",
      fmt::format(
          "Run training variants one after another on the same data, shards, model, initial\n"
          "model, stragglers and budget, and compare them: summary.csv, report.md (table) and\n"
          "plots/*.png; with a target, a conclusion after the table says which variant reached it\n"
          "first and why (pace and waiting, updates to target, staleness, bytes). Variants (each "
          "mode's own, from the mode registry): {}.\n"
          "A PS variant names a staleness bound (ps:bsp, ps:ssp:N, ps:async), a technique of the\n"
          "sparse models (ps:lapse: PS mode's default bound), or both (ps:lapse:ssp:2); the\n"
          "consensus variants' tau is --staleness. Seeds are --seed, --seed+1, ... Every\n"
          "training option is passed to every node; the PS-mode and consensus-mode options only\n"
          "to that mode's variants. The target: --target-acc (image models), --target-mrr\n"
          "(complex, distmult: node 0's valid MRR), --target-rmse (mf), or --target, read as the\n"
          "model's. See docs/compare.md.\n"
          "Example: chorus compare --topology examples/topologies/demo4.toml --data synthetic\n"
          "  --variants single,consensus:wait-all,consensus:dynamic --rounds 300 --target-acc 0.9\n"
          "  --out runs/cmp\n"
          "Example: chorus compare --topology examples/topologies/demo4.toml --model complex\n"
          "  --data wn18rr --epochs 3 --variants single,ps:classic,ps:lapse,consensus:dynamic\n"
          "  --target-mrr 0.3 --out runs/kge",
          experiment::variantForms()));
  cmd->add_option("--topology", args->topology, "Topology file (TOML) of the distributed variants")
      ->required();
  cmd->add_option("--variants", args->variants,
                  "Comma-separated variants, e.g. single,ps:bsp,ps:ssp:2,consensus:dynamic")
      ->required();
  cmd->add_option("--seeds", args->seeds, "Runs per variant, with seeds --seed, --seed+1, ...")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_flag("--force", args->force, "Replace an existing compare folder at --out");
  cmd->add_option("--secret-file", args->secret_file,
                  "The cluster's shared secret, passed to every node (default: the topology's "
                  "[cluster] secret_file); see `chorus node --help`")
      ->check(CLI::ExistingFile);
  cmd->add_option("--link-delay", args->link_delay,
                  "Fault injection passed to every node: each frame waits MS (plus a uniform "
                  "draw from [0, JITTER_MS)) before it is sent; MS or MS,JITTER_MS; see "
                  "`chorus node --help`");
  cmd->add_option("--link-loss", args->link_loss,
                  "Fault injection passed to every node: each frame is lost with probability P "
                  "and sent again after RTO_MS (default 200), as TCP would; P or P,RTO_MS; see "
                  "`chorus node --help`");
  cmd->add_option("--run-timeout", args->run_timeout_s,
                  "Stop a run (and count it as failed) after this many seconds (0: no limit)")
      ->check(run::nonNegative())
      ->capture_default_str();
  cmd->add_option("--progress-every", args->progress_s, "Seconds between progress lines")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  run::addRunOptions(*cmd, args->run);
  cmd->add_option("--target-mrr", args->target_mrr,
                  "Sparse models (complex, distmult): the time to this MRR of node 0's model on "
                  "the validation split, at its evaluations (--eval-every-epochs)");
  cmd->add_option("--target-rmse", args->target_rmse,
                  "Sparse models (mf): the time to this test RMSE of node 0's model, at its "
                  "evaluations (--eval-every-epochs)");
  cmd->add_option("--target", args->target_any,
                  "The target in the model's own metric: test accuracy (image models, as "
                  "--target-acc), MRR (complex, distmult) or RMSE (mf)");
  run::addStalenessOption(*cmd, args->staleness);
  args->ps_flags = addModeOptions(*cmd, "PS mode (the ps:* variants only)",
                                  [&](CLI::App& c) { ps::addPsOptions(c, args->ps); });
  args->consensus_flags =
      addModeOptions(*cmd, "Consensus mode (the consensus:* variants only)",
                     [&](CLI::App& c) { consensus::addConsensusOptions(c, args->consensus); });
  // The sparse models' flags: every variant's, but for the sampling schemes (PS mode's
  // primitives) and sparse gossip's flags (consensus mode's), which only their variants get.
  const std::set<std::string> sparse_flags =
      addModeOptions(*cmd, "Sparse models (complex, distmult, mf)",
                     [&](CLI::App& c) { addSparseNodeOptions(c, args->sparse); });
  std::set<std::string> gossip_flags;
  {
    CLI::App probe;
    consensus::SparseGossipFlags flags;
    consensus::addSparseGossipOptions(probe, flags);
    for (const CLI::Option* option : probe.get_options())
      gossip_flags.insert(option->get_name());
  }
  for (const std::string& flag : sparse_flags) {
    CLI::Option* option = cmd->get_option(flag);
    if (gossip_flags.count(flag) > 0) {
      args->consensus_flags.insert(flag);
      option->group("Consensus mode (the consensus:* variants only)");
    } else if (flag == "--sample-scheme" || flag == "--sample-reuse") {
      args->ps_flags.insert(flag);
      option->group("PS mode (the ps:* variants only)");
    }
  }
  // Set by each variant's name; refused with a pointer to the name when given (kVariantFlags).
  for (const auto& [flag, why] : kVariantFlags)
    cmd->get_option(flag)->group("");
  cmd->get_option("--staleness")
      ->group("Consensus mode (the consensus:* variants only)")
      ->description(
          "Consensus variants: tau, a neighbor's model may be used up to tau rounds late (0 with "
          "consensus:wait-all: synchronous D-PSGD). The ps:* variants take their bound from "
          "their name (ps:bsp, ps:ssp:N, ps:async)");
  cmd->get_option("--out")
      ->description(
          "Output folder: per-run metrics (VARIANT/seed-S/), summary.csv, report.md, plots/")
      ->required();
  cmd->get_option("--save")->description(
      "Each run writes its final model as a checkpoint named FILE in its own folder "
      "(VARIANT/seed-S/FILE): node 0's model in consensus mode, the owners' model in PS mode");
  cmd->callback([cmd, args] { runCompare(*cmd, *args); });
}

}  // namespace chorus::cli
