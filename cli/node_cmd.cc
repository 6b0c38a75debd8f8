// `chorus node`: one node of a topology file. In consensus or PS mode it trains
// (chorus_consensus, chorus_ps); with --mode ping it connects to every other member, checks the
// cluster with Ping/Pong traffic, reports, and leaves in order. The runtime, the training and the
// ping logic live in the libraries; this file maps a topology and flags onto them.
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
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "cli/sparse_node.h"
#include "cli/suggest.h"
#include "consensus/consensus_peer.h"
#include "faults/link_delay.h"
#include "faults/straggler.h"
#include "launch/launch_env.h"
#include "ml/checkpoint.h"
#include "ml/dataset.h"
#include "node/connection.h"
#include "node/node.h"
#include "ping/ping_exchange.h"
#include "ps/ps_peer.h"
#include "run/cli_checks.h"
#include "run/single_node.h"
#include "run/training_run.h"
#include "topology/topology.h"

namespace chorus::cli {
namespace {

static_assert(topology::kMaxClusterNameBytes == node::kMaxClusterNameBytes,
              "a topology file must not accept a cluster name the runtime refuses");

using std::chrono::milliseconds;

struct NodeArgs {
  std::string topology;
  std::optional<uint32_t> id;
  std::string log_level = "info";
  // A person or a scheduler starting machines one by one needs minutes; chorus launch, which
  // starts every node at once, passes --ready-timeout 60 unless told otherwise.
  double ready_timeout_s = 300;
  uint32_t pings = 3;
  size_t payload_bytes = 1024;
  double ping_timeout_s = 30;
  double linger_s = 5;
  uint32_t heartbeat_ms = 500;
  uint32_t write_slice_packets = 2;
  uint32_t peer_timeout_ms = 5000;
  uint32_t max_frame_mib = 256;
  std::string secret_file;  // empty: no shared secret
  std::string link_delay;   // faults::LinkDelay grammar; empty: none
  std::string link_loss;    // faults::LinkLoss grammar; empty: none
  std::string mode;         // ping | consensus | ps; empty: the topology's mode
  run::RunOptions run;
  consensus::ConsensusOptions consensus;
  ps::PsOptions ps;
  SparseNodeArgs sparse;  // --model complex | distmult | mf (cli/sparse_node.h)
};

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
  try {
    return topology::loadTopology(path);
  } catch (const topology::TopologyError& e) {
    throw CommandFailure(2, e.what());
  }
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

// --rejoin is one flag for both modes; it is registered with consensus mode's options.
ps::PsOptions psOptions(const NodeArgs& args) {
  ps::PsOptions options = args.ps;
  options.rejoin = args.consensus.rejoin;
  return options;
}

// Every check of the flags that needs no data and no port, for the mode the node will run in
// (exit 2). `chorus launch` runs the same checks once before it starts any node.
void checkModeArgs(const NodeArgs& args, const NodeSetup& setup, const std::string& mode) {
  if (mode == "ping") {
    // A ping larger than a frame may be would close every connection it is sent on.
    constexpr size_t kPingEnvelopeBytes = 4096;  // header, nonce and vector prefix, with room
    if (args.payload_bytes + kPingEnvelopeBytes > setup.options.max_frame_bytes) {
      throw CommandFailure(2, fmt::format("--payload-bytes {} plus a frame's envelope is more "
                                          "than --max-frame-mib {} accepts: lower "
                                          "--payload-bytes or raise --max-frame-mib",
                                          args.payload_bytes, args.max_frame_mib));
    }
    return;
  }
  if (mode != "consensus" && mode != "ps") {
    throw CommandFailure(2, fmt::format("unknown mode \"{}\": use consensus, ps or ping", mode));
  }
  if (isSparseModel(args.run.model.name)) {
    return checkSparseNodeArgs(args.run, args.sparse, psOptions(args), mode);
  }
  checkImageData(args.run);
  checkStragglersNameMembers(args.run.stragglers, setup.topo, args.topology);
  try {
    run::validateRunOptions(args.run);
    if (mode == "consensus") {
      consensus::validateConsensusOptions(args.consensus);
      consensus::validateChunkFitsFrames(args.consensus, setup.options.max_frame_bytes);
    } else {
      ps::validatePsOptions(psOptions(args));
    }
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, e.what());
  }
  // The flag's terms with the node's own attribute (two crash steps for one node, say): found
  // here, before the data is loaded, and by launch before any node starts.
  try {
    (void)faults::StragglerProfile::parse(args.run.stragglers)
        .combinedWith(faults::StragglerProfile::parse(setup.me->stragglers));
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, fmt::format("node {}: {}", setup.self, e.what()));
  }
}

void runPing(const NodeArgs& args, const NodeSetup& setup) {
  const node::NodeId self = setup.self;
  const topology::Topology& topo = setup.topo;
  const topology::NodeSpec* me = setup.me;
  const std::vector<node::PeerAddress>& peers = setup.peers;

  SignalWatcher signals;
  node::Node node(setup.options);
  spdlog::logger& log = node.logger();
  ping::PingOptions ping_options;
  ping_options.pings_per_peer = args.pings;
  ping_options.payload_bytes = args.payload_bytes;
  ping_options.timeout = secondsToMs(args.ping_timeout_s);
  ping::PingExchange exchange(node, setup.peer_ids, ping_options);
  signals.start([&](int signal) {
    log.warn("received {}: leaving the cluster", SignalWatcher::signalName(signal));
    exchange.cancel({node::ErrorCode::kShutdown, "interrupted"});
    node.shutdown(secondsToMs(args.linger_s));
  });
  const SignalWatcher::StopFirst stop_signals_first{signals};

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
  const auto ready_ms =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start).count();
  auto finish = [&](int code, const std::string& message) {
    leaveCluster(node, args.linger_s, signals, self, code, message);
  };
  if (!ready.ok()) finish(4, fmt::format("node {}: {}", self, readyFailure(ready)));

  fmt::print(
      "node {} of cluster \"{}\" ({} nodes) listening on {}: connected to all {} peers "
      "in {} ms\n",
      self, topo.name, topo.nodes.size(), me->address(), peers.size(), ready_ms);
  const ping::PingReport report = exchange.run();
  for (const auto& peer : report.peers) {
    const node::PeerStats stats = node.stats(peer.peer);
    fmt::print(
        "  peer {}: {} of {} pongs verified, {} pings answered, rtt min/mean/max "
        "{:.0f}/{:.0f}/{:.0f} us; {} frames / {} bytes out, {} frames / {} bytes in{}\n",
        peer.peer, peer.pongs_verified, args.pings, peer.pings_answered, peer.rtt_min_us,
        peer.rtt_mean_us, peer.rtt_max_us, stats.frames_out, stats.bytes_out, stats.frames_in,
        stats.bytes_in,
        stats.frames_lost > 0
            ? fmt::format("; {} frames out lost and sent again (--link-loss)", stats.frames_lost)
            : "");
  }
  if (!report.status.ok()) {
    finish(5, fmt::format("node {}: {}", self, report.status.message()));
  }
  fmt::print("node {}: ping exchange verified with {} peers in {} ms; leaving\n", self,
             peers.size(), report.elapsed.count());
  std::fflush(stdout);
  finish(0, "");
  fmt::print("node {}: left the cluster cleanly\n", self);
}

// What a mode's run achieved, as the node prints it.
struct TrainingOutcome {
  std::string steps;  // "rounds" or "clocks"
  run::LoopReport loop;
  std::string waiting = "waiting";   // what the wait time was spent on (and the cache's share)
  std::vector<std::string> before;   // lines before the result (a rejoin)
  std::vector<std::string> after;    // lines after it (the average's or the owners' accuracy)
  std::vector<float> model_to_save;  // --save: node 0's final model (empty: nothing to save)
  bool saved = false;                // the run wrote --save itself
};

// The mode's part of a session: its peer object (kept alive here), how to run it and how to
// stop it. Built by a ModeFactory once the data and the node are there.
struct ModeRun {
  std::shared_ptr<void> peer;
  std::function<TrainingOutcome()> run;
  std::function<void()> stop;
};
using ModeFactory = std::function<ModeRun(node::Node&, run::NodeJob)>;

// One training run on a started node: the mode's run behind ModeRun, so that every mode shares
// the node's lifecycle (flags, data, signals, listen, connect, leave) and its printed result.
class TrainingSession : public NodeSession {
 public:
  TrainingSession(node::NodeId self, const run::RunOptions& options, std::string model_spec,
                  ModeRun mode)
      : self_(self),
        options_(options),
        model_spec_(std::move(model_spec)),
        mode_(std::move(mode)) {}

  // Trainer thread: trains, then prints this node's results.
  void run() override {
    const TrainingOutcome outcome = mode_.run();
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
  void stop() override { mode_.stop(); }

 private:
  // --save: node 0 writes the final model as a checkpoint that --resume reads. Nothing to
  // write (another node, no model) writes nothing.
  void saveFinalModel(const TrainingOutcome& outcome) const {
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
  ModeRun mode_;
};

// A node's session from its factory (called once the node exists, before it listens).
using SessionFactory = std::function<std::unique_ptr<NodeSession>(node::Node&)>;

// Builds the session, joins the cluster, trains and leaves in order: the lifecycle every
// training run shares (signals, listen, connect, leave). The flags were checked before.
// `peers`: whom this node connects to (the neighbors in consensus mode, everyone in PS mode).
void runSession(const NodeArgs& args, const NodeSetup& setup, const std::string& mode,
                const SessionFactory& make_session, const std::string& peers_description,
                const std::vector<node::PeerAddress>& peers) {
  const node::NodeId self = setup.self;
  const topology::Topology& topo = setup.topo;
  SignalWatcher signals;
  node::Node node(setup.options);
  spdlog::logger& log = node.logger();
  std::unique_ptr<NodeSession> session;
  try {
    session = make_session(node);
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
    log.warn("received {}: stopping training and leaving the cluster",
             SignalWatcher::signalName(signal));
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
  fmt::print(
      "node {} of cluster \"{}\" ({} nodes, {} mode): connected to all {} peers in {} ms; {}\n",
      self, topo.name, topo.nodes.size(), mode, peers.size(), ready_ms, peers_description);
  std::fflush(stdout);
  try {
    session->run();
  } catch (const std::exception& e) {
    finish(1, fmt::format("node {}: {}", self, e.what()));
  }
  std::fflush(stdout);
  finish(0, "");
  fmt::print("node {}: left the cluster cleanly\n", self);
}

// Loads the data, builds the mode's run, joins the cluster, trains and leaves in order.
void runTraining(const NodeArgs& args, const NodeSetup& setup, const std::string& mode,
                 const ModeFactory& make_mode, const std::string& peers_description,
                 const std::vector<node::PeerAddress>& peers) {
  const node::NodeId self = setup.self;
  // The data and the model come before the listener: once this node accepts connections its
  // peers may send models or requests, and the handlers must be in place by then.
  run::NodeJob job;
  try {
    // This process runs one node: it reads its own samples only.
    job = run::loadNodeProcessJob(args.run, self, static_cast<int>(setup.topo.nodes.size()),
                                  setup.me->stragglers);
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, fmt::format("node {}: {}", self, e.what()));
  } catch (const std::exception& e) {
    throw CommandFailure(1, fmt::format("node {}: {}", self, e.what()));
  }
  std::string model_spec = job.model->spec().toString();
  runSession(
      args, setup, mode,
      [&](node::Node& node) {
        return std::make_unique<TrainingSession>(self, args.run, std::move(model_spec),
                                                 make_mode(node, std::move(job)));
      },
      peers_description, peers);
}

// Consensus training (docs/consensus.md): gossip with the topology neighbors, the end of the run
// over the neighbor graph (a convergecast of the final models on a spanning tree).
ModeRun consensusRun(node::Node& node, run::NodeJob job, const consensus::PeerLayout& layout,
                     const consensus::ConsensusOptions& options) {
  auto peer = std::make_shared<consensus::ConsensusPeer>(node, std::move(job), layout, options);
  return {peer,
          [peer = peer.get()] {
            const consensus::ConsensusReport report = peer->run();
            TrainingOutcome out;
            out.steps = "rounds";
            out.loop = report;
            if (report.average_accuracy) {
              out.after.push_back(
                  fmt::format("test accuracy of the average of {} final models: "
                              "{:.2f}%",
                              report.averaged_models, 100 * *report.average_accuracy));
            }
            out.model_to_save = report.final_model;
            return out;
          },
          [peer = peer.get()] { peer->stop(); }};
}

// PS training (docs/ps.md): every node owns a shard of the keys and trains; reads and writes go
// to each key's owner over the full mesh.
ModeRun psRun(node::Node& node, run::NodeJob job, std::vector<node::NodeId> members,
              const ps::PsOptions& options) {
  auto peer = std::make_shared<ps::PsPeer>(node, std::move(job), std::move(members), options);
  return {
      peer,
      [peer = peer.get()] {
        const ps::PsReport report = peer->run();
        TrainingOutcome out;
        out.steps = "clocks";
        out.loop = report;
        const uint64_t reads = report.worker.cache_hits + report.worker.cache_misses;
        out.waiting = fmt::format(
            "waiting for reads, {:.0f}% of reads from the cache",
            reads > 0
                ? 100.0 * static_cast<double>(report.worker.cache_hits) / static_cast<double>(reads)
                : 0.0);
        if (report.rejoined_from) {
          out.before.push_back(fmt::format(
              "rejoined at clock {} with its keys from node {}'s last read (the freshest "
              "answer: every update from clocks below {} in it)",
              report.first_clock, *report.rejoined_from, report.rejoin_read_clock));
        }
        if (report.owner_accuracy) {
          out.after.push_back(
              fmt::format("test accuracy of the model as held by the owners: "
                          "{:.2f}%",
                          100 * *report.owner_accuracy));
        }
        for (const auto& [worker, clock] : report.server.excluded) {
          out.after.push_back(
              fmt::format("node {} was dropped at clock {}: its updates from clock {} on are lost",
                          worker, clock, clock));
        }
        for (const ps::ServerSummary::SkippedClocks& gap : report.server.skipped) {
          out.after.push_back(fmt::format(
              "node {} went from clock {} to clock {} (it rejoined): its updates of clocks {}-{} "
              "are lost",
              gap.worker, gap.from, gap.to, gap.from, gap.to - 1));
        }
        if (report.failed_pulls + report.failed_pushes > 0) {
          out.after.push_back(
              fmt::format("{} read(s) and {} push(es) failed because an owner was down",
                          report.failed_pulls, report.failed_pushes));
        }
        out.model_to_save = report.owner_model;
        return out;
      },
      [peer = peer.get()] { peer->stop(); }};
}

// A cluster of one node (the single variant of chorus compare) trains alone: the run of chorus
// train, with no peers to exchange with.
ModeRun singleRun(node::Node& node, run::NodeJob job, const run::RunOptions& options) {
  struct Alone {
    run::NodeJob job;
    run::SingleOptions single;
  };
  auto alone = std::make_shared<Alone>(Alone{std::move(job), {}});
  auto stopped = std::make_shared<std::atomic<bool>>(false);
  alone->single.stop = stopped;
  alone->single.save_path = options.save_path;
  alone->single.warmup_epochs = options.warmup_epochs;
  // --resume: the checkpoint's model, and the rounds from 0, as every other node's.
  alone->single.continue_resumed = false;
  return {alone,
          [alone = alone.get(), &log = node.logger()] {
            // Progress lines go to the node's log, as the distributed modes' do.
            ml::ProgressReporter progress(stderr, false, std::chrono::hours(24 * 365));
            const run::SingleReport report =
                run::trainAlone(alone->job, alone->single, progress, log);
            TrainingOutcome out;
            out.steps = "rounds";
            out.loop = report;
            out.saved = true;
            return out;
          },
          // A signal ends the run before its next step, as it ends a distributed node's.
          [stopped] { stopped->store(true); }};
}

void runTrainingMode(const NodeArgs& args, const NodeSetup& setup, const std::string& mode) {
  if (isSparseModel(args.run.model.name)) {
    // Sparse models train in PS mode on any number of nodes, one included (docs/sparse-ps.md).
    std::vector<node::NodeId> members;
    for (const auto& n : setup.topo.nodes)
      members.push_back(n.id);
    const std::shared_ptr<SparseNodeJob> job =
        loadSparseNodeJob(args.run, args.sparse, setup.self, members);
    const ps::PsOptions options = psOptions(args);
    return runSession(
        args, setup, "ps",
        [&](node::Node& node) { return sparsePsSession(node, job, members, options); },
        fmt::format("owning its share of the rows, staleness {}", args.ps.staleness), setup.peers);
  }
  if (setup.topo.nodes.size() == 1) {
    return runTraining(
        args, setup, "single",
        [&](node::Node& node, run::NodeJob job) {
          return singleRun(node, std::move(job), args.run);
        },
        "training alone", setup.peers);
  }
  if (mode == "consensus") {
    consensus::PeerLayout layout;
    layout.self = setup.self;
    layout.neighbors = setup.me->neighbors;
    for (const auto& n : setup.topo.nodes) {
      layout.members.push_back(n.id);
      layout.degrees[n.id] = n.neighbors.size();
      layout.graph[n.id] = n.neighbors;
    }
    // Connections to the topology neighbors only: gossip, the end of the run and a rejoin all
    // travel over the neighbor graph.
    std::vector<node::PeerAddress> neighbors;
    for (const node::PeerAddress& peer : setup.peers) {
      if (std::binary_search(setup.me->neighbors.begin(), setup.me->neighbors.end(), peer.id)) {
        neighbors.push_back(peer);
      }
    }
    return runTraining(
        args, setup, "consensus",
        [&](node::Node& node, run::NodeJob job) {
          return consensusRun(node, std::move(job), layout, args.consensus);
        },
        fmt::format("training with neighbors [{}]", fmt::join(layout.neighbors, ", ")), neighbors);
  }
  std::vector<node::NodeId> members;
  for (const auto& n : setup.topo.nodes)
    members.push_back(n.id);
  const ps::PsOptions options = psOptions(args);
  runTraining(
      args, setup, "ps",
      [&](node::Node& node, run::NodeJob job) {
        return psRun(node, std::move(job), members, options);
      },
      fmt::format("owning its shard of the parameters, staleness {}", args.ps.staleness),
      setup.peers);
}

std::string modeOf(const NodeArgs& args, const NodeSetup& setup) {
  return args.mode.empty() ? topology::modeName(setup.topo.mode) : args.mode;
}

// What every node of a cluster must run alike, as "key=value" lines for the handshake
// (NodeOptions::run_fingerprint): a node started with another model, mode or optimizer would
// otherwise hang the others or train something else. Per-node settings (its output folder,
// straggler terms, data folder, log level, time-outs) stay out.
std::string runFingerprint(const NodeArgs& args, const std::string& mode) {
  std::vector<std::pair<std::string, std::string>> s = {{"mode", mode}};
  if (mode == "ping") {
    s.insert(s.end(), {{"pings", fmt::format("{}", args.pings)},
                       {"payload-bytes", fmt::format("{}", args.payload_bytes)}});
  } else if (isSparseModel(args.run.model.name)) {
    const run::RunOptions& r = args.run;
    s.insert(s.end(), {{"model", r.model.name},
                       {"seed", fmt::format("{}", r.seed)},
                       {"staleness", args.ps.staleness}});
    const auto sparse = sparseFingerprint(r, args.sparse);
    s.insert(s.end(), sparse.begin(), sparse.end());
  } else {
    const run::RunOptions& r = args.run;
    s.insert(s.end(),
             {{"data", r.data.name},
              {"normalize", r.data.normalize ? "yes" : "no"},
              {"limit", fmt::format("{}", r.train_limit)},
              {"model", r.model.toString()},
              {"shard", r.shard},
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
    if (r.data.name == "synthetic") {
      s.emplace_back("synthetic",
                     fmt::format("{},{}", r.data.syntheticTrain, r.data.syntheticTest));
    }
    if (mode == "ps") {
      s.insert(s.end(), {{"staleness", args.ps.staleness},
                         {"key-floats", fmt::format("{}", args.ps.key_floats)},
                         {"cache", args.ps.cache ? "yes" : "no"},
                         {"owner-momentum", args.ps.owner_momentum},
                         {"async-rounds", args.ps.async_rounds}});
    } else {
      s.insert(s.end(), {{"mixing", args.consensus.mixing},
                         {"staleness-bound", fmt::format("{}", args.consensus.staleness_bound)},
                         {"chunk-floats", fmt::format("{}", args.consensus.chunk_floats)}});
    }
  }
  std::string text;
  for (const auto& [key, value] : s)
    text += key + "=" + value + "\n";
  return text;
}

void runNode(const NodeArgs& args) {
  followLauncher();
  const auto level = spdlog::level::from_str(args.log_level);
  spdlog::set_level(level);
  NodeSetup setup = setUpNode(args, level);
  const std::string mode = modeOf(args, setup);
  // Bad flags first (exit 2), before any data is read or port bound.
  checkModeArgs(args, setup, mode);
  setup.options.run_fingerprint = runFingerprint(args, mode);
  if (mode == "ping") return runPing(args, setup);
  return runTrainingMode(args, setup, mode);
}

// `chorus launch`'s check, for each of `ids`: everything runNode does before it reads data,
// binds a port or starts a thread, and nothing after. The file is read once.
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
    if (modeOf(args, setUpNode(args, spdlog::level::off, &topo)) != "ping") {
      checkSparseData(args.run, args.sparse);
    }
    return;
  }
  for (uint32_t id : ids) {
    args.id = id;
    NodeSetup setup = setUpNode(args, spdlog::level::off, &topo);
    const std::string mode = modeOf(args, setup);
    checkModeArgs(args, setup, mode);
    trains = trains || mode != "ping";
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

// Registers `chorus node` on `app`; `action` runs with the parsed flags.
void registerNodeCommand(CLI::App& app, std::function<void(const NodeArgs&)> action) {
  auto args = std::make_shared<NodeArgs>();
  args->run.data.name = "fashion-mnist";
  args->run.model.name = "mlp";
  CLI::App* cmd = app.add_subcommand(
      "node",
      "Run one node of a topology file.\n"
      "The node listens on its address from the file, connects to every other member (in\n"
      "consensus mode to its topology neighbors only; the lower id dials, the higher accepts)\n"
      "and waits until those are connected. Then, by\n"
      "--mode (default: the file's mode):\n"
      "  consensus  train: local SGD steps on this node's shard, gossip averaging with the\n"
      "             topology neighbors, waiting only for the fastest (--backup); per-round\n"
      "             metrics in --out DIR/node-<id>.jsonl; at the end every node prints its test\n"
      "             accuracy and node 0 also that of the average of all final models\n"
      "             (docs/consensus.md).\n"
      "  ping       exchange --pings Ping/Pong messages with every peer, check each echoed\n"
      "             payload and print what happened (a connectivity check).\n"
      "  ps         train with sharded parameter ownership: every node owns a shard of the\n"
      "             keys and is a worker; each clock it reads the model (SSP: --staleness),\n"
      "             computes a gradient on its shard and pushes it to the owners, who apply\n"
      "             the optimizer; per-clock metrics in --out DIR/node-<id>.jsonl; node 0\n"
      "             also prints the accuracy of the model as held by the owners (docs/ps.md).\n"
      "A topology of one node trains alone in either training mode: the run of chorus train\n"
      "(the single variant of chorus compare).\n"
      "Sparse models (--model complex, distmult or mf, with chorus train's flags for them)\n"
      "train in PS mode: their embedding rows are the keys, each worker reads the rows its\n"
      "step touches and pushes their gradient, the owners apply the optimizer; node 0 prints\n"
      "the owners' model's quality at the end (docs/sparse-ps.md). Consensus mode for them is\n"
      "not implemented yet.\n"
      "Then it leaves in order (Leave, wait for the peers' Leave, close).\n"
      "Example, on each machine with its own id (all nodes of a file on one machine: chorus\n"
      "launch): chorus node --topology lab.toml --id 0 --data fashion-mnist --model mlp --out "
      "runs/a\n"
      "Exit status: 0 on success; 1 training failed or data unreadable; 2 bad arguments or\n"
      "topology; 3 cannot listen; 4 cluster not ready in time (the message names the missing\n"
      "peers); 5 ping exchange failed; 86 crashed as injected (--stragglers crash:NODE@STEP);\n"
      "128+N interrupted by signal N (SIGINT, SIGTERM and SIGHUP\n"
      "make the node leave in order; under `chorus launch` the node also leaves when the\n"
      "launcher dies).");
  cmd->add_option("--mode", args->mode, "consensus, ping or ps (default: the topology file's mode)")
      ->check(CLI::IsMember({"consensus", "ping", "ps"}));
  cmd->add_option("--topology", args->topology, "Topology file (TOML); see docs/topology.md")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--id", args->id,
                  "This node's id in the file. Default: the rank from OMPI_COMM_WORLD_RANK,\n"
                  "PMI_RANK or SLURM_PROCID (mpirun / srun)");
  cmd->add_option("--log-level", args->log_level, "trace, debug, info, warn, error, critical, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
  cmd->add_option("--ready-timeout", args->ready_timeout_s,
                  "Seconds to wait until every peer is connected (a line every 5 s names the "
                  "peers still missing and why; chorus launch passes 60 unless given)")
      ->check(run::positive())
      ->capture_default_str();
  cmd->add_option("--pings", args->pings,
                  "--mode ping: Ping/Pong round trips per peer (same on every node)")
      ->capture_default_str();
  cmd->add_option("--payload-bytes", args->payload_bytes, "--mode ping: bytes of payload per ping")
      ->check(CLI::Range(0, 64 << 20))
      ->capture_default_str();
  cmd->add_option("--ping-timeout", args->ping_timeout_s,
                  "--mode ping: seconds allowed for the whole ping exchange")
      ->check(run::positive())
      ->capture_default_str();
  cmd->add_option("--linger", args->linger_s,
                  "Seconds to wait for the peers' Leave when shutting down")
      ->check(run::nonNegative())
      ->capture_default_str();
  cmd->add_option("--heartbeat-ms", args->heartbeat_ms,
                  "Heartbeat interval when nothing else is sent")
      ->check(CLI::Range(1u, 3'600'000u))
      ->capture_default_str();
  cmd->add_option("--write-slice-packets", args->write_slice_packets,
                  "Each socket write carries at most this many TCP packets (0: no cut). 2 keeps "
                  "Linux's BBR from pacing large writes on loopback; see bench/README.md")
      ->check(CLI::Range(0u, static_cast<uint32_t>(node::kMaxWriteSlicePackets)))
      ->capture_default_str();
  cmd->add_option("--peer-timeout-ms", args->peer_timeout_ms,
                  "Silence after which a peer is reported down")
      ->check(CLI::Range(2u, 3'600'000u))
      ->capture_default_str();
  cmd->add_option("--secret-file", args->secret_file,
                  "File holding the cluster's shared secret (the same on every node; trailing "
                  "line breaks are ignored; default: the topology's [cluster] secret_file). Each "
                  "new connection's two ends prove they know it (HMAC challenge both ways) and a "
                  "peer that cannot is refused. It authenticates peers at the handshake only: "
                  "traffic is neither signed nor encrypted after it")
      ->check(CLI::ExistingFile);
  cmd->add_option(
      "--link-delay", args->link_delay,
      "Fault injection: every frame this node sends waits MS milliseconds (plus a "
      "uniform draw from [0, JITTER_MS), seeded by --seed) before it reaches the "
      "socket, in order: MS or MS,JITTER_MS, e.g. 20 or 20,5 (default: none; the node's "
      "link_delay attribute in the topology file adds to it). A round "
      "trip then takes at least 2 x MS; see docs/stragglers.md");
  cmd->add_option("--link-loss", args->link_loss,
                  "Fault injection: each frame this node sends is lost with probability P, as "
                  "TCP loses a segment: it is sent again after a retransmission time-out of "
                  "RTO_MS (default 200, Linux's smallest), doubled for each further loss (at "
                  "most 3), and nothing behind it on that link arrives before it: P or P,RTO_MS, "
                  "e.g. 0.01 or 0.01,200 (default: none); P at most 0.5; see docs/stragglers.md");
  cmd->add_option("--max-frame-mib", args->max_frame_mib, "Largest accepted frame, in MiB")
      ->check(CLI::Range(1u, 2047u))
      ->capture_default_str();
  run::addRunOptions(*cmd, args->run);
  consensus::addConsensusOptions(*cmd, args->consensus);
  ps::addPsOptions(*cmd, args->ps);
  addSparseNodeOptions(*cmd, args->sparse);
  cmd->callback([args, cmd, action = std::move(action)] {
    recordGivenFlags(*cmd, args->sparse);
    action(*args);
  });
}

}  // namespace

LinkFaults nodeLinkFaults(const std::string& delay_flag, const std::string& loss_flag,
                          const topology::NodeSpec& node, const std::string& topology_path,
                          milliseconds heartbeat, milliseconds peer_timeout,
                          const std::string& time_out_name, const std::string& remedy) {
  LinkFaults link;
  std::string source;
  if (!delay_flag.empty()) {
    try {
      link.delay = faults::LinkDelay::parse(delay_flag);
    } catch (const std::invalid_argument& e) {
      throw CommandFailure(2, fmt::format("--link-delay: {}", e.what()));
    }
    source = "--link-delay " + delay_flag;
  }
  if (!node.link_delay.empty()) {
    // The loader has checked the attribute already.
    const faults::LinkDelay own = faults::LinkDelay::parse(node.link_delay);
    link.delay.delay += own.delay;
    link.delay.jitter += own.jitter;
    source += fmt::format("{}node {}'s link_delay \"{}\" in {}", source.empty() ? "" : " plus ",
                          node.id, node.link_delay, topology_path);
  }
  if (!loss_flag.empty()) {
    try {
      link.loss = faults::LinkLoss::parse(loss_flag);
    } catch (const std::invalid_argument& e) {
      throw CommandFailure(2, fmt::format("--link-loss: {}", e.what()));
    }
    if (!link.loss.empty()) {
      source += fmt::format("{}--link-loss {}", source.empty() ? "" : " plus ", loss_flag);
    }
  }
  // A heartbeat is due every `heartbeat`; held back as long as the link faults can hold a
  // frame, it could come later than the time-out after the one before it, and a healthy peer
  // would be called down.
  node::NodeOptions faulty;
  link.applyTo(faulty);
  if (node::linkWorstCase(faulty) + heartbeat >= peer_timeout) {
    throw CommandFailure(
        2, fmt::format("{}: delay plus jitter{} must stay below {} ms, or a heartbeat could arrive "
                       "later than {}; {}",
                       source,
                       link.loss.empty() ? ""
                                         : fmt::format(" plus {} retransmission time-outs",
                                                       (1 << node::kMaxLinkRetransmissions) - 1),
                       (peer_timeout - heartbeat).count(), time_out_name, remedy));
  }
  return link;
}

void LinkFaults::applyTo(node::NodeOptions& options) const {
  options.link_delay = delay.delay;
  options.link_jitter = delay.jitter;
  options.link_loss = loss.probability;
  options.link_rto = loss.rto;
}

void checkStragglersNameMembers(const std::string& stragglers, const topology::Topology& topo,
                                const std::string& topology_path) {
  faults::StragglerProfile profile;
  try {
    profile = faults::StragglerProfile::parse(stragglers);
  } catch (const std::invalid_argument&) {
    return;  // the flag's own check says what is wrong with it
  }
  for (const uint32_t named : profile.namedNodes()) {
    if (topo.find(named) == nullptr) {
      throw CommandFailure(2, fmt::format("--stragglers {}: names node {}, which is not in {} (its "
                                          "ids are 0 to {}); a term for no node would never act",
                                          stragglers, named, topology_path, topo.nodes.size() - 1));
    }
  }
}

void addNodeCommands(CLI::App& app) {
  registerNodeCommand(app, runNode);
}

void checkNodeArguments(const std::string& topology, const std::vector<uint32_t>& ids,
                        const std::vector<std::string>& node_args) {
  if (ids.empty()) return;
  CLI::App app{"", "chorus"};
  app.require_subcommand(1);
  registerNodeCommand(app, [&ids](const NodeArgs& args) { checkNodes(args, ids); });
  std::vector<std::string> argv = {"node", "--topology", topology, "--id",
                                   std::to_string(ids.front())};
  argv.insert(argv.end(), node_args.begin(), node_args.end());
  const std::vector<std::string> words = argv;
  std::reverse(argv.begin(), argv.end());  // CLI11 takes the words last to first
  try {
    app.parse(argv);
  } catch (const CLI::ParseError& e) {
    const std::string hint = suggestFor(app, words);
    throw CommandFailure(2, fmt::format("{} (passed on to the nodes: see chorus node --help){}",
                                        e.what(), hint.empty() ? "" : "; " + hint));
  }
}

}  // namespace chorus::cli
