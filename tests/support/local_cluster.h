// A local cluster for the mode tests: N nodes of the real runtime as threads in this process, on
// loopback with port 0, connected as a full mesh, each with a mode's peer (ConsensusPeer, PsPeer,
// or AlonePeer for one node training alone) on its own trainer thread. Start, stop, kill a node
// for real (its peer stops and its node shuts down mid-run), wait for each peer's report with a
// generous deadline, read what each node logged. Modelled on gloo's BaseTest (ranks as threads
// in one process) and tensorpipe's TransportTest (one suite for every transport).
#pragma once

#include <gtest/gtest.h>

#include <any>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "consensus/consensus_peer.h"
#include "ml/dataset.h"
#include "node/node.h"
#include "run/single_node.h"
#include "run/training_loop.h"
#include "run/training_run.h"
#include "tests/node/test_util.h"

namespace chorus::testsupport {

using NodeId = node::NodeId;
// Who gossips with whom: the sorted neighbors of every node.
using Graph = std::vector<std::vector<NodeId>>;

// Every node next to the one before and the one after it.
Graph ring(size_t n);
// Every node next to every other.
Graph complete(size_t n);
// Node 0 next to every other; the others next to node 0 only.
Graph star(size_t n);
// Node `self`'s consensus layout in `g` (every node a member).
consensus::PeerLayout layoutOf(const Graph& g, NodeId self);
// The ids 0..n-1.
std::vector<NodeId> membersOf(size_t n);

// An MLP (64 hidden units) on the synthetic data set, batches of 32, evaluation every 100 steps,
// the time to 95% test accuracy measured, seed 3: the modes' training runs add their rates and
// step counts.
run::RunOptions syntheticTraining();

// The synthetic data set of `train` and `test` samples made with `seed`.
std::shared_ptr<const ml::DataSplit> syntheticData(size_t train, size_t test, uint64_t seed = 7);

// A test node's runtime settings: quick heartbeats and redials.
struct NodeSettings {
  std::string cluster = "local-cluster";
  std::chrono::milliseconds heartbeat_interval{100};
  std::chrono::milliseconds dial_backoff_max{100};
  std::chrono::milliseconds peer_timeout{3000};
  spdlog::level::level_enum log_level = spdlog::level::warn;
};

// The options of node `self` of a cluster of `members` nodes (ids 0..members-1).
node::NodeOptions nodeOptions(const NodeSettings& settings, NodeId self, size_t members,
                              uint16_t port = 0);

// One node training alone (chorus train, a one-node cluster of chorus node) with the interface
// of the distributed modes' peers: run() on the trainer thread, stop() from any thread.
class AlonePeer {
 public:
  AlonePeer(node::Node& node, run::NodeJob job, run::SingleOptions options = {});
  // Trainer thread: the whole run (progress lines go nowhere).
  run::SingleReport run();
  // Any thread: the run ends before its next step.
  void stop() { stop_->store(true); }

 private:
  node::Node& node_;
  run::NodeJob job_;
  run::SingleOptions options_;
  std::shared_ptr<std::atomic<bool>> stop_ = std::make_shared<std::atomic<bool>>(false);
};

// Counts the events of a JSON-lines metrics file by name ("start", "step", "final", ...).
std::map<std::string, size_t> countEvents(const std::string& metrics_path);

// Nodes 0..n-1 of a cluster, listening on port 0 from construction. A peer is attached to some
// of them (the others stay bare runtime nodes: connected, never training). Destruction stops
// every peer, joins the trainer threads, shuts every node down, then destroys the peers before
// the nodes (a peer's handlers run on its node's loop until the node is shut down).
class LocalCluster {
 public:
  // Nodes 0..n-1 here, of a cluster of `members` nodes (0: n; the rest run elsewhere).
  explicit LocalCluster(size_t n, size_t members = 0, NodeSettings settings = {});
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  size_t size() const { return slots_.size(); }
  node::Node& node(size_t i) { return *slots_[i].node; }
  // Everything node i logged so far.
  std::string log(size_t i) { return slots_[i].log->all(); }
  // What node i logs, as it comes (LogCapture::waitForLine).
  node::testing::LogCapture& logCapture(size_t i) { return *slots_[i].log; }

  // Before start(): puts a `Peer` on node i, constructed as Peer(node(i), args...). Peer has
  // run() (returning its report, a run::LoopReport) and stop().
  template <typename Peer, typename... Args>
  Peer& attach(size_t i, Args&&... args) {
    auto peer = std::make_shared<Peer>(*slots_[i].node, std::forward<Args>(args)...);
    Peer* raw = peer.get();
    Slot& slot = slots_[i];
    slot.peer = peer;
    slot.run = [raw] { return std::any(raw->run()); };
    slot.stop = [raw] { raw->stop(); };
    // Peers whose report is no run::LoopReport (sparse PS) have no loopResult().
    using Report = decltype(std::declval<Peer&>().run());
    if constexpr (std::is_base_of_v<run::LoopReport, Report>) {
      slot.loop_report = [](const std::any& report) {
        return static_cast<const run::LoopReport&>(std::any_cast<const Report&>(report));
      };
    }
    return *raw;
  }
  // The peer attached to node i.
  template <typename Peer>
  Peer& peer(size_t i) {
    return *static_cast<Peer*>(slots_[i].peer.get());
  }

  // Connects every node here to every other one (and to the nodes elsewhere in `extra`, as
  // (id, port) on loopback) and waits until all are connected (30 s at most).
  void connect(const std::vector<std::pair<NodeId, uint16_t>>& extra = {});
  // Connects `outside`, a member of this cluster made apart from it (a node restarted by the
  // test), to every node here; its readiness is the caller's to wait for.
  void connectOutside(node::Node& outside);
  // Starts every attached peer's run() on its own trainer thread.
  void start();
  // Any thread: ends peer i's run early (its node stays up).
  void stop(size_t i);
  // Any thread: stops every peer.
  void stopAll();
  // Any thread, also peer i's own trainer thread: kills node i for real mid-run: its peer stops
  // and its node closes every connection at once, as a crashed process's would.
  void kill(size_t i);

  // Waits for peer i's report (a failure after `timeout`: then every peer is stopped and the
  // report is what the run returned once stopped, or an empty one). Rethrows what run() threw.
  template <typename Report>
  Report result(size_t i, std::chrono::seconds timeout = std::chrono::seconds(300)) {
    if (!awaitResult(i, timeout)) return {};
    return std::any_cast<const Report&>(slots_[i].result.get());
  }
  // Whether peer i's run ended within `wait` (false: still running).
  bool finishedWithin(size_t i, std::chrono::milliseconds wait) {
    return slots_[i].result.valid() && slots_[i].result.wait_for(wait) == std::future_status::ready;
  }
  // Peer i's report as every mode has it.
  run::LoopReport loopResult(size_t i, std::chrono::seconds timeout = std::chrono::seconds(300));

 private:
  struct Slot {
    std::shared_ptr<node::testing::LogCapture> log;
    std::unique_ptr<node::Node> node;
    std::shared_ptr<void> peer;
    std::function<std::any()> run;
    std::function<void()> stop;
    std::function<run::LoopReport(const std::any&)> loop_report;
    std::shared_future<std::any> result;
    std::thread trainer;
  };
  // True when peer i's result is there (waiting up to `timeout`, then stopping every peer).
  bool awaitResult(size_t i, std::chrono::seconds timeout);

  std::vector<Slot> slots_;
};

}  // namespace chorus::testsupport
