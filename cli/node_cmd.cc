// `chorus node`, the session: one node of a topology file from its typed settings (NodeArgs,
// parsed once in node_flags.cc). In consensus or PS mode it trains (chorus_consensus,
// chorus_ps); with --mode ping it checks the cluster with Ping/Pong traffic (chorus_ping's
// session). Every mode shares the node's lifecycle here (signals, listen, connect, leave); the
// runtime, the training and the ping logic live in the libraries.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "cli/node_internal.h"
#include "cli/run_spec.h"
#include "cli/sparse_node.h"
#include "cli/suggest.h"
#include "faults/link_delay.h"
#include "faults/straggler.h"
#include "launch/launch_env.h"
#include "ml/checkpoint.h"
#include "ml/dataset.h"
#include "modes/registry.h"
#include "node/connection.h"
#include "node/node.h"
#include "run/cli_checks.h"
#include "run/cluster_checkpoint.h"
#include "run/training_run.h"
#include "run/training_session.h"
#include "topology/topology.h"

namespace chorus::cli {
namespace {

static_assert(topology::kMaxClusterNameBytes == node::kMaxClusterNameBytes,
              "a topology file must not accept a cluster name the runtime refuses");

using std::chrono::milliseconds;

// Why waitClusterReady() failed, with what to do about a time-out.
std::string readyFailure(const node::Status& status) {
  if (status.code() != node::ErrorCode::kTimeout) return status.message();
  return status.message() +
         "; start the missing nodes, or give them longer with --ready-timeout SECONDS";
}

milliseconds secondsToMs(double seconds) {
  return milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

node::NodeId resolveNodeId(const NodeArgs& args) {
  if (args.id) return *args.id;
  std::optional<launch::LauncherRank> rank;
  const node::Status status = launch::rankFromEnvironment(
      [](const char* name) {
        return std::getenv(name);  // NOLINT(concurrency-mt-unsafe): before any thread starts
      },
      &rank);
  if (!status.ok()) throw CommandFailure(2, status.message());
  if (!rank) {
    throw CommandFailure(2,
                         "no node id: pass --id N, or run under a launcher that sets "
                         "OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID");
  }
  spdlog::info("node id {} taken from ${}", rank->rank, rank->variable);
  return rank->rank;
}

// Turns SIGINT/SIGTERM/SIGHUP into an orderly Leave. The signals are blocked in every thread
// (the node's loop thread inherits the mask) and taken by one watcher thread with sigwait().
class SignalWatcher {
 public:
  SignalWatcher() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGHUP);
    sigaddset(&set_, SIGUSR1);  // private wake-up used by stop()
    pthread_sigmask(SIG_BLOCK, &set_, &previous_);
  }
  ~SignalWatcher() {
    stop();
    // A signal that came after the first is still pending: unblocked with its default action
    // it would kill the process in the middle of its orderly exit.
    for (int signal : {SIGINT, SIGTERM, SIGHUP})
      std::signal(signal, SIG_IGN);
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  // Ends the watcher thread (after a handler that is running returns). Callers stop it before
  // the objects its handler uses are destroyed: a signal after that would reach freed memory.
  void stop() {
    if (thread_.joinable()) {
      pthread_kill(thread_.native_handle(), SIGUSR1);
      thread_.join();
    }
  }
  // Stops the watcher when it goes out of scope; declared after what the handler uses.
  struct StopFirst {
    SignalWatcher& watcher;
    ~StopFirst() { watcher.stop(); }
  };
  // Starts waiting; `on_signal` runs on the watcher thread for the first SIGINT/SIGTERM/SIGHUP.
  // Later ones are taken and only logged: the node is leaving already, and the same interrupt
  // often arrives twice (a terminal's Ctrl-C and a launcher passing it on).
  void start(std::function<void(int)> on_signal) {
    thread_ = std::thread([this, on_signal = std::move(on_signal)] {
      for (;;) {
        int signal = 0;
        if (sigwait(&set_, &signal) != 0 || signal == SIGUSR1) return;
        if (received_.exchange(signal) == 0) {
          on_signal(signal);
        } else {
          spdlog::warn("{} again: already leaving (SIGKILL stops the node at once)",
                       signalName(signal));
        }
      }
    });
  }
  // The first signal that arrived, or 0.
  int received() const { return received_.load(); }
  // "SIGINT", "SIGTERM" or "SIGHUP".
  static const char* signalName(int signal) {
    return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "SIGHUP";
  }

 private:
  sigset_t set_{};
  sigset_t previous_{};
  std::thread thread_;
  std::atomic<int> received_{0};
};

// Under `chorus launch`: asks the kernel for SIGTERM when the launcher dies, so that a node
// whose launcher was killed (or whose terminal closed) leaves in order instead of running on
// alone. Throws when the launcher is gone already.
void followLauncher() {
  const char* text = std::getenv(kLauncherPidVariable);  // NOLINT(concurrency-mt-unsafe)
  if (text == nullptr) return;
  char* end = nullptr;
  const long launcher = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || launcher <= 1) return;
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The launcher may have died before the request was in place.
  if (getppid() != static_cast<pid_t>(launcher)) {
    throw CommandFailure(1, fmt::format("the launcher (pid {}) is gone; not starting", launcher));
  }
}

// Leaves the cluster in order (Leave, linger, close) and ends the command: returns on success,
// otherwise throws with `code` and `message`, with 128+N when signal N interrupted the node,
// or with 1 when the loop did not close every handle.
void leaveCluster(node::Node& node, double linger_s, const SignalWatcher& signals, uint32_t self,
                  int code, const std::string& message) {
  node.shutdown(secondsToMs(linger_s));
  if (node.loopCloseResult() != 0) {
    throw CommandFailure(1, fmt::format("node {}: uv_loop_close() returned {} at shutdown", self,
                                        node.loopCloseResult()));
  }
  if (signals.received() != 0) {
    throw CommandFailure(128 + signals.received(),
                         fmt::format("node {}: interrupted; left the cluster", self));
  }
  if (code != 0) throw CommandFailure(code, message);
}

// What every mode needs: the topology, this node's entry and the runtime's options.
struct NodeSetup {
  node::NodeId self = 0;
  topology::Topology topo;
  const topology::NodeSpec* me = nullptr;
  node::NodeOptions options;
  std::vector<node::PeerAddress> peers;  // every other member (consensus mode connects a subset)
  std::vector<node::NodeId> peer_ids;
};

topology::Topology loadTopologyFile(const std::string& path) {
  node::Result<topology::Topology> loaded = topology::loadTopology(path);
  if (!loaded.ok()) throw CommandFailure(2, loaded.message());
  return std::move(loaded).value();
}

// `loaded`: the file, when the caller has it already.
NodeSetup setUpNode(const NodeArgs& args, spdlog::level::level_enum level,
                    const topology::Topology* loaded = nullptr) {
  NodeSetup setup;
  setup.self = resolveNodeId(args);
  const node::NodeId self = setup.self;
  setup.topo = loaded != nullptr ? *loaded : loadTopologyFile(args.topology);
  const topology::Topology& topo = setup.topo;
  setup.me = topo.find(self);
  if (setup.me == nullptr) {
    std::string ids;
    for (const auto& n : topo.nodes)
      ids += fmt::format("{}{}", ids.empty() ? "" : ", ", n.id);
    throw CommandFailure(
        2, fmt::format("node id {} is not in {} (its ids: {})", self, args.topology, ids));
  }
  node::NodeOptions& options = setup.options;
  options.cluster = topo.name;
  options.self = self;
  options.listen_host = setup.me->host;
  options.listen_port = setup.me->port;
  for (const auto& n : topo.nodes)
    options.members.push_back(n.id);
  options.max_frame_bytes = args.max_frame_mib << 20;
  options.heartbeat_interval = milliseconds(args.heartbeat_ms);
  options.write_slice_packets = args.write_slice_packets;
  options.peer_timeout = milliseconds(args.peer_timeout_ms);
  options.log_level = level;
  options.log_color = !launch::plainLogs(std::getenv);  // NOLINT(concurrency-mt-unsafe)
  options.cluster_ready_timeout = secondsToMs(args.ready_timeout_s);
  const LinkFaults link = nodeLinkFaults(args.link_delay, args.link_loss, *setup.me, args.topology,
                                         options.heartbeat_interval, options.peer_timeout,
                                         fmt::format("--peer-timeout-ms {}", args.peer_timeout_ms),
                                         "raise --peer-timeout-ms");
  link.applyTo(options);
  if (!link.delay.empty() || !link.loss.empty()) {
    const auto worst = node::linkWorstCase(options);
    options.link_seed = args.run.seed;
    // A handshake crosses the link up to four times: its time-out grows with the delay.
    options.handshake_timeout =
        std::max(options.handshake_timeout,
                 std::chrono::duration_cast<milliseconds>(worst * 8 + std::chrono::seconds(1)));
  }
  // --secret-file, else the topology's [cluster] secret_file.
  const std::string secret_file = !args.secret_file.empty() ? args.secret_file : topo.secretPath();
  if (!secret_file.empty()) {
    node::ClusterKey key{};
    std::string warning;
    if (node::Status loaded = node::loadClusterKey(secret_file, &key, &warning); !loaded.ok()) {
      throw CommandFailure(2, loaded.message());
    }
    // `level` is off for launch's check: the nodes warn themselves.
    if (!warning.empty() && level != spdlog::level::off) {
      spdlog::warn("node {}: {}", self, warning);
    }
    options.cluster_key = key;
  }
  if (node::Status valid = node::validateOptions(options); !valid.ok()) {
    throw CommandFailure(2, "bad node options: " + valid.message());
  }
  for (const auto& n : topo.nodes) {
    if (n.id == self) continue;
    setup.peers.push_back({n.id, n.host, n.port});
    setup.peer_ids.push_back(n.id);
  }
  return setup;
}

// The settings of the modes the registry runs (modes/session.h), from the flags.
modes::ModeSettings modeSettings(const NodeArgs& args, const NodeSetup& setup) {
  modes::ModeSettings settings;
  settings.run = args.run;
  settings.ping.pings_per_peer = args.pings;
  settings.ping.payload_bytes = args.payload_bytes;
  settings.ping.timeout = secondsToMs(args.ping_timeout_s);
  settings.consensus = args.consensusOptions();
  settings.ps = args.psOptions();
  settings.max_frame_bytes = setup.options.max_frame_bytes;
  return settings;
}

// The registry's entry of `mode`, one `--mode` takes (CommandFailure 2 otherwise).
const modes::Mode& registeredMode(const std::string& mode) {
  const modes::Mode* entry = modes::findMode(mode);
  if (entry == nullptr || !entry->named_by_flag) {
    throw CommandFailure(2,
                         fmt::format("unknown mode \"{}\": use {}", mode, modes::flagModeNames()));
  }
  return *entry;
}

// Every check of the flags that needs no data and no port, for the mode the node will run in
// (exit 2). `chorus launch` runs the same checks once before it starts any node.
void checkModeArgs(const NodeArgs& args, const NodeSetup& setup, const std::string& mode) {
  const modes::Mode& entry = registeredMode(mode);
  const modes::ModeSettings settings = modeSettings(args, setup);
  if (!entry.trains) {
    if (entry.check == nullptr) return;
    if (const node::Status checked = entry.check(settings); !checked.ok()) {
      throw CommandFailure(2, checked.message());
    }
    return;
  }
  if (isSparseModel(args.run.model.name)) {
    return checkSparseNodeArgs(args.run, args.sparse, args.psOptions(), args.consensusOptions(),
                               entry);
  }
  checkImageData(args.run);
  checkImageModelFlags(args.run, args.sparse);
  checkStragglersNameMembers(args.run.stragglers, setup.topo, args.topology);
  if (const node::Status run = run::checkRunOptions(args.run); !run.ok()) {
    throw CommandFailure(2, run.message());
  }
  try {
    run::validateCheckpointOptions(args.run, args.consensus.rejoin);
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, e.what());
  }
  if (entry.check != nullptr) {
    if (const node::Status checked = entry.check(settings); !checked.ok()) {
      throw CommandFailure(2, checked.message());
    }
  }
  // The flag's terms with the node's own attribute (two crash steps for one node, say): found
  // here, before the data is loaded, and by launch before any node starts.
  if (const auto combined = args.run.stragglers.combinedWith(setup.me->stragglers);
      !combined.ok()) {
    throw CommandFailure(2, fmt::format("node {}: {}", setup.self, combined.message()));
  }
}

// One training run on a started node: the mode's run (run::TrainingRun, built by its registry
// entry's plan), so that every mode shares the node's lifecycle (flags, data, signals, listen,
// connect, leave) and its printed result.
class TrainingSession : public NodeSession {
 public:
  TrainingSession(node::NodeId self, const run::RunOptions& options, std::string model_spec,
                  std::unique_ptr<run::TrainingRun> mode)
      : self_(self),
        options_(options),
        model_spec_(std::move(model_spec)),
        mode_(std::move(mode)) {}

  // Trainer thread: trains, then prints this node's results.
  void run() override {
    const run::TrainingOutcome outcome = mode_->run();
    const run::LoopReport& loop = outcome.loop;
    for (const std::string& line : outcome.before)
      fmt::print("node {}: {}\n", self_, line);
    fmt::print(
        "node {}: final test accuracy {:.2f}% (loss {:.4f}) after {} {} in {:.1f} s ({:.1f} s "
        "{})\n",
        self_, 100 * loop.final.accuracy, loop.final.loss, loop.steps_done, outcome.steps,
        loop.seconds, loop.wait_seconds, outcome.waiting);
    if (loop.time_to_target) {
      fmt::print("node {}: reached test accuracy {:.2f}% after {:.1f} s\n", self_,
                 100 * options_.target_acc, *loop.time_to_target);
    }
    if (!loop.departed_peers.empty()) {
      fmt::print("node {}: node(s) {} left before the end\n", self_,
                 fmt::join(loop.departed_peers, ", "));
    }
    for (const std::string& line : outcome.after)
      fmt::print("node {}: {}\n", self_, line);
    if (options_.confusion) fmt::print("node {}: {}", self_, ml::formatConfusion(loop.final));
    saveFinalModel(outcome);
  }
  // Any thread (the signal watcher): ends run() early.
  void stop() override { mode_->stop(); }

 private:
  // --save: node 0 writes the final model as a checkpoint that --resume reads. Nothing to
  // write (another node, no model) writes nothing.
  void saveFinalModel(const run::TrainingOutcome& outcome) const {
    if (options_.save_path.empty() || self_ != 0) return;
    if (!outcome.saved) {
      if (outcome.model_to_save.empty()) return;
      ml::Checkpoint checkpoint;
      checkpoint.modelSpec = model_spec_;
      checkpoint.step = outcome.loop.steps_done;
      checkpoint.seed = options_.seed;
      checkpoint.params = outcome.model_to_save;
      ml::saveCheckpoint(options_.save_path, checkpoint);
    }
    fmt::print("node {}: saved the final model to {}\n", self_, options_.save_path);
  }

  node::NodeId self_;
  const run::RunOptions& options_;
  std::string model_spec_;
  std::unique_ptr<run::TrainingRun> mode_;
};

// A node's session from its factory (called once the node exists, before it listens).
using SessionFactory = std::function<std::unique_ptr<NodeSession>(node::Node&)>;
// The line a node prints once every peer is connected, from the milliseconds that took.
using ConnectedLine = std::function<std::string(int64_t ready_ms)>;

// A training mode's line: "node 0 of cluster "c" (4 nodes, ps mode): connected to all 3 peers
// in 12 ms; <doing>".
ConnectedLine trainingLine(const NodeSetup& setup, std::string mode, size_t peers,
                           std::string doing) {
  return [&setup, mode = std::move(mode), peers, doing = std::move(doing)](int64_t ready_ms) {
    return fmt::format(
        "node {} of cluster \"{}\" ({} nodes, {} mode): connected to all {} peers in {} ms; {}",
        setup.self, setup.topo.name, setup.topo.nodes.size(), mode, peers, ready_ms, doing);
  };
}

// Builds the session, joins the cluster, runs it and leaves in order: the lifecycle every mode
// shares (signals, listen, connect, leave). The flags were checked before. A session's
// CommandFailure ends the node with its code (ping's 5), any other exception with 1.
// `peers`: whom this node connects to (the neighbors in consensus mode, everyone otherwise).
void runSession(const NodeArgs& args, const NodeSetup& setup, const std::string& mode,
                const SessionFactory& make_session, const ConnectedLine& connected_line,
                const std::vector<node::PeerAddress>& peers) {
  const node::NodeId self = setup.self;
  SignalWatcher signals;
  node::Node node(setup.options);
  spdlog::logger& log = node.logger();
  std::unique_ptr<NodeSession> session;
  try {
    session = make_session(node);
  } catch (const run::NodeCheckpointError& e) {
    throw CommandFailure(2, fmt::format("node {}: {}", self, e.what()));  // a bad --resume DIR
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, fmt::format("node {}: {}", self, e.what()));
  }
  // The session's handlers run on the node's loop thread: on every way out of this function
  // the node stops before the session is destroyed.
  struct StopNodeFirst {
    node::Node& node;
    ~StopNodeFirst() { node.shutdown(std::chrono::milliseconds(0)); }
  } stop_node_first{node};
  signals.start([&](int signal) {
    log.warn("received {}: stopping the {} run and leaving the cluster",
             SignalWatcher::signalName(signal), mode);
    // Stops the training (or the end-of-run wait) and, through the shutdown, a pending
    // waitClusterReady(); the trainer's later sends fail quietly on a stopped node.
    session->stop();
    node.shutdown(secondsToMs(args.linger_s));
  });
  const SignalWatcher::StopFirst stop_signals_first{signals};
  auto finish = [&](int code, const std::string& message) {
    leaveCluster(node, args.linger_s, signals, self, code, message);
  };
  const auto start = std::chrono::steady_clock::now();
  if (node::Status status = node.listen(); !status.ok()) {
    // A signal that shut the node down during setup is an interruption, not a failure.
    if (signals.received() != 0) leaveCluster(node, args.linger_s, signals, self, 0, "");
    throw CommandFailure(3, fmt::format("node {}: {}", self, status.message()));
  }
  if (node::Status status = node.connect(peers); !status.ok()) {
    // A signal that shut the node down during setup is an interruption, not a failure.
    if (signals.received() != 0) leaveCluster(node, args.linger_s, signals, self, 0, "");
    throw CommandFailure(3, fmt::format("node {}: {}", self, status.message()));
  }
  node::Status ready = node.waitClusterReady();
  if (!ready.ok()) finish(4, fmt::format("node {}: {}", self, readyFailure(ready)));
  const auto ready_ms =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start).count();
  fmt::print("{}\n", connected_line(ready_ms));
  std::fflush(stdout);
  try {
    session->run();
  } catch (const CommandFailure& e) {
    finish(e.code(), e.what());  // a mode's own exit status (ping's 5)
  } catch (const std::exception& e) {
    finish(1, fmt::format("node {}: {}", self, e.what()));
  }
  std::fflush(stdout);
  finish(0, "");
  fmt::print("node {}: left the cluster cleanly\n", self);
}

// The members of `setup.peers` that `ids` names, in the topology's order.
std::vector<node::PeerAddress> peersNamed(const NodeSetup& setup,
                                          const std::vector<node::NodeId>& ids) {
  std::vector<node::PeerAddress> peers;
  for (const node::PeerAddress& peer : setup.peers) {
    if (std::find(ids.begin(), ids.end(), peer.id) != ids.end()) peers.push_back(peer);
  }
  return peers;
}

// A training mode's image-model run (its registry entry's plan, modes/session.h): step 1 loads
// the data and the model before the listener (once this node accepts connections its peers may
// send models or requests, and the handlers must be in place by then), step 2 builds the run on
// the node; then it joins the cluster, trains and leaves in order.
void runTraining(const NodeArgs& args, const NodeSetup& setup, const modes::Mode& mode,
                 const modes::ModeSettings& settings) {
  const node::NodeId self = setup.self;
  node::Result<modes::TrainingPlan> planned = mode.plan({setup.topo, *setup.me, settings});
  if (!planned.ok()) {
    // Bad settings or a --resume DIR that cannot be used: 2; unreadable data: 1.
    throw CommandFailure(exitStatusOf(planned.status()),
                         fmt::format("node {}: {}", self, planned.message()));
  }
  modes::TrainingPlan plan = std::move(planned).value();
  const std::vector<node::PeerAddress> peers = peersNamed(setup, plan.peers);
  runSession(
      args, setup, std::string(mode.name),
      [&](node::Node& node) {
        return std::make_unique<TrainingSession>(self, args.run, std::move(plan.model_spec),
                                                 plan.start(node));
      },
      trainingLine(setup, std::string(mode.name), peers.size(), plan.doing), peers);
}

// A registered mode's session (modes/session.h) as the node drives a session.
class RegisteredSession : public NodeSession {
 public:
  explicit RegisteredSession(std::unique_ptr<modes::Session> session)
      : session_(std::move(session)) {}
  void run() override {
    try {
      session_->run();
    } catch (const modes::SessionFailure& e) {
      throw CommandFailure(e.exitCode(), e.what());
    }
  }
  void stop() override { session_->stop(); }

 private:
  std::unique_ptr<modes::Session> session_;
};

// A mode whose session the registry builds (ping): with every other member.
void runRegisteredMode(const NodeArgs& args, const NodeSetup& setup, const modes::Mode& mode) {
  const modes::ModeSettings settings = modeSettings(args, setup);
  const modes::Session* session = nullptr;
  runSession(
      args, setup, std::string(mode.name),
      [&](node::Node& node) {
        std::unique_ptr<modes::Session> made =
            mode.make_session({node, setup.topo, *setup.me, setup.peer_ids}, settings);
        session = made.get();
        return std::make_unique<RegisteredSession>(std::move(made));
      },
      [&](int64_t ready_ms) { return session->connectedLine(ready_ms); }, setup.peers);
}

// A training mode (`mode` as named; a topology of one node may run another, the registry says
// which): a sparse model's session from cli/sparse_node.cc, an image model's from the entry's
// plan.
void runTrainingMode(const NodeArgs& args, const NodeSetup& setup, const modes::Mode& named) {
  const bool sparse = isSparseModel(args.run.model.name);
  const modes::Mode& mode = modes::modeThatRuns(named, setup.topo.nodes.size(), sparse);
  const modes::ModeSettings settings = modeSettings(args, setup);
  if (!sparse) return runTraining(args, setup, mode, settings);
  // Sparse models: the mode's entry names the session (checkSparseNodeArgs refused a mode
  // without one).
  SparsePlan plan = planSparseTraining(mode, {setup.topo, *setup.me, settings}, args.sparse);
  const std::vector<node::PeerAddress> peers = peersNamed(setup, plan.peers);
  runSession(
      args, setup, std::string(mode.name), [&](node::Node& node) { return plan.start(node); },
      trainingLine(setup, std::string(mode.name), peers.size(), plan.doing), peers);
}

std::string modeOf(const NodeArgs& args, const NodeSetup& setup) {
  return args.mode.empty() ? topology::modeName(setup.topo.mode) : args.mode;
}

// What every node of a cluster must run alike, as "key=value" lines for the handshake
// (NodeOptions::run_fingerprint): a node started with another model, mode or optimizer would
// otherwise hang the others or train something else. Per-node settings (its output folder,
// straggler terms, data folder, log level, time-outs) stay out.
std::string runFingerprint(const NodeArgs& args, const std::string& mode,
                           const modes::ModeSettings& settings) {
  std::vector<std::pair<std::string, std::string>> s = {{"mode", mode}};
  const modes::Mode& entry = registeredMode(mode);
  if (!entry.trains) {
    const modes::Fingerprint own =
        entry.fingerprint != nullptr ? entry.fingerprint(settings) : modes::Fingerprint{};
    s.insert(s.end(), own.begin(), own.end());
  } else if (isSparseModel(args.run.model.name)) {
    const run::RunOptions& r = args.run;
    s.insert(s.end(), {{"model", r.model.name},
                       {"seed", fmt::format("{}", r.seed)},
                       {"staleness", args.staleness.toString()}});
    const auto sparse = sparseFingerprint(r, args.sparse);
    s.insert(s.end(), sparse.begin(), sparse.end());
  } else {
    const run::RunOptions& r = args.run;
    s.insert(s.end(),
             {{"data", r.data.name},
              {"normalize", r.data.normalize ? "yes" : "no"},
              {"limit", fmt::format("{}", r.train_limit)},
              {"model", r.model.toString()},
              {"shard", r.shard.toString()},
              {"rounds", fmt::format("{}", r.rounds)},
              {"epochs", fmt::format("{}", r.epochs)},
              {"batch", fmt::format("{}", r.batch)},
              {"lr", fmt::format("{}", r.lr)},
              {"momentum", fmt::format("{}", r.momentum)},
              {"nesterov", r.nesterov ? "yes" : "no"},
              {"weight-decay", fmt::format("{}", r.weight_decay)},
              {"schedule", fmt::format("{} warmup-epochs={} step-epochs={} gamma={}", r.schedule,
                                       r.warmup_epochs, r.step_epochs, r.gamma)},
              {"augment", r.augment ? fmt::format("crop-padding={} flip={}", r.crop_padding,
                                                  r.flip ? "yes" : "no")
                                    : "no"},
              {"seed", fmt::format("{}", r.seed)}});
    // Cuts are complete only when every node takes them at the same steps.
    if (r.checkpoint_every > 0) {
      s.emplace_back("checkpoint-every", fmt::format("{}", r.checkpoint_every));
    }
    if (r.data.name == "synthetic") {
      s.emplace_back("synthetic",
                     fmt::format("{},{}", r.data.syntheticTrain, r.data.syntheticTest));
    }
    const modes::Fingerprint own =
        entry.fingerprint != nullptr ? entry.fingerprint(settings) : modes::Fingerprint{};
    s.insert(s.end(), own.begin(), own.end());
  }
  std::string text;
  for (const auto& [key, value] : s)
    text += key + "=" + value + "\n";
  return text;
}

}  // namespace

void runNode(const NodeArgs& args) {
  followLauncher();
  const auto level = spdlog::level::from_str(args.log_level);
  spdlog::set_level(level);
  NodeSetup setup = setUpNode(args, level);
  const std::string mode = modeOf(args, setup);
  // Bad flags first (exit 2), before any data is read or port bound.
  checkModeArgs(args, setup, mode);
  setup.options.run_fingerprint = runFingerprint(args, mode, modeSettings(args, setup));
  if (const modes::Mode& entry = registeredMode(mode); entry.make_session != nullptr) {
    return runRegisteredMode(args, setup, entry);
  }
  return runTrainingMode(args, setup, registeredMode(mode));
}

// The topology file is read once for every id.
void checkNodes(NodeArgs args, const std::vector<uint32_t>& ids) {
  const topology::Topology topo = loadTopologyFile(args.topology);
  bool trains = false;
  if (isSparseModel(args.run.model.name)) {
    for (uint32_t id : ids) {
      args.id = id;
      NodeSetup setup = setUpNode(args, spdlog::level::off, &topo);
      checkModeArgs(args, setup, modeOf(args, setup));
    }
    // The nodes of a launch share this machine's data folder: a missing graph is said once.
    if (registeredMode(modeOf(args, setUpNode(args, spdlog::level::off, &topo))).trains) {
      checkSparseData(args.run, args.sparse);
    }
    return;
  }
  for (uint32_t id : ids) {
    args.id = id;
    NodeSetup setup = setUpNode(args, spdlog::level::off, &topo);
    const std::string mode = modeOf(args, setup);
    checkModeArgs(args, setup, mode);
    trains = trains || registeredMode(mode).trains;
  }
  // The nodes of a launch share this machine's data folder: a missing data set is said once.
  if (trains && args.run.data.name != "synthetic") {
    try {
      ml::findDataDir(args.run.data.name, args.run.data.dataDir);
    } catch (const ml::DataError& e) {
      throw CommandFailure(2, e.what());
    }
  }
}

}  // namespace chorus::cli
