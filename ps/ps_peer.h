// PS mode over the peer runtime: every node is a worker and the owner of its shard of the keys.
// The trainer thread runs the clocks (pull the model, local gradient, straggler wait, push,
// clock); the loop thread serves this node's keys (KvServer) and completes the worker's
// requests (KvWorker). Protocol, options and metrics: docs/ps.md.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "node/repeated_log.h"
#include "ps/kv_server.h"
#include "ps/kv_worker.h"
#include "ps/managed_comm_shell.h"
#include "ps/ps_run_barrier.h"
#include "ps/ps_service.h"
#include "run/membership.h"
#include "run/training_loop.h"
#include "run/training_run.h"

namespace CLI {
class App;
}
namespace chorus::node {
class Node;
}
namespace chorus::wire {
struct PsCatchupReply;
}

namespace chorus::ps {

// The knobs of PS mode; tests shrink the timings.
struct PsOptions {
  // --staleness (registered with run::addStalenessOption, one flag for both modes): 0 = BSP,
  // infinite = fully asynchronous.
  Staleness staleness = run::kDefaultStaleness;
  size_t key_floats = 4096;    // floats per key (the model's flat buffer cut into keys)
  double down_timeout_s = 10;  // a down worker stops blocking pulls after this (0: never)
  // --bandwidth: managed communication's budget in Mbit/s (docs/managed-comm.md); 0 = off.
  double bandwidth_mbps = 0;
  bool cache = true;                     // the worker's SSP row cache
  std::string owner_momentum = "clock";  // clock | push (OwnerOptimizer::Momentum)
  std::string async_rounds = "cluster";  // cluster | worker (AsyncRounds)
  bool async_rounds_given = false;       // --async-rounds was on the command line
  // This node restarts after a failure: restore its keys from a live node's last read and join
  // at the cluster's clock (docs/ps.md). Set from --rejoin (registered with consensus mode's
  // options: one flag for both modes).
  bool rejoin = false;
  // How long a rejoining node waits for the live nodes' catch-up replies (all asked at once).
  std::chrono::milliseconds rejoin_timeout{30000};
  std::chrono::milliseconds report_every{5000};
  std::chrono::milliseconds tick_every{100};  // down time-outs and waiting reports
  // Longest the end-of-run barrier waits for the other nodes' TrainingDone.
  std::chrono::milliseconds finish_timeout{120000};
  // Tests: owner-side waiting reports (workers behind, the clock they must reach).
  std::function<void(const std::vector<WorkerId>&, Clock)> on_owner_waiting;
  // Tests: worker-side waiting reports (clock, owners still to answer).
  std::function<void(Clock, const std::vector<NodeId>&)> on_worker_waiting;
  // Tests: called on the trainer thread after each clock with the worker's parameters.
  std::function<void(Clock, std::span<const float>)> on_clock_end;
};

// How --rounds R ends a fully asynchronous run of N workers. kCluster: every worker trains until
// the workers' clocks add up to N x R, so a fast worker runs more clocks than a slow one and no
// one trains on alone at the end. kWorker: every worker runs exactly R clocks, as under a bound.
enum class AsyncRounds { kCluster, kWorker };
// Parses --async-rounds ("cluster" or "worker"); throws std::invalid_argument naming the flag.
AsyncRounds parseAsyncRounds(std::string_view text);

// The flag of AsyncRounds. It shapes fully asynchronous runs only: bounded nodes ignore it
// with a warning, and `chorus compare` forwards it to ps:async alone.
inline constexpr const char* kAsyncRoundsFlag = "--async-rounds";

// Registers --key-floats, --down-timeout, --no-cache, --owner-momentum and --async-rounds on
// `cmd` (--staleness is both modes': run::addStalenessOption).
void addPsOptions(CLI::App& cmd, PsOptions& options);
// Throws std::invalid_argument naming the flag.
void validatePsOptions(const PsOptions& options);

// What a run achieved: what every mode reports (run::LoopReport: stopped, seconds, wait time
// for reads, final evaluation of this worker's last read, time to target, who finished or
// left), and PS mode's own.
struct PsReport : run::LoopReport {
  int64_t clocks_done = 0;
  double final_loss = 0;  // of final (this worker's last view of the model)
  double final_accuracy = 0;
  // Node 0: the test accuracy of the model as held by the owners after every worker's last
  // clock (or its exclusion), and that model.
  std::optional<double> owner_accuracy;
  std::vector<float> owner_model;
  WorkerStats worker;
  ServerSummary server;
  uint64_t failed_pulls = 0;                // pulls that an owner could not answer (it was down)
  uint64_t failed_pushes = 0;               // pushes lost to an owner that was down
  std::optional<ManagedCommStats> managed;  // --bandwidth: what managed communication did
  Clock first_clock = 0;                    // the clock this run started at (> 0 after a rejoin)
  std::optional<NodeId> rejoined_from;      // the node whose last read restored this node's keys
  // How fresh those keys were: every update from clocks below this was in them (-1: unknown).
  Clock rejoin_read_clock = -1;
  // Every usable catch-up answer as (node, read clock), in the order the nodes were asked.
  std::vector<std::pair<NodeId, Clock>> rejoin_answers;
};

// A rejoining node's order of trust in the catch-up answers it got, as (node, read clock)
// pairs: the freshest read first, ties to the lower id.
std::vector<NodeId> freshestFirst(std::vector<std::pair<NodeId, Clock>> reads);

// The clock a rejoining worker `self` was in when it died: the latest that any of the helpers'
// views (one list per catch-up answer) heard of; 0 when none did.
Clock lastClockHeard(NodeId self, const std::vector<std::vector<WorkerView>>& views);

// The clocks themselves run in run::runTrainingLoop; this class is its PS strategy (read the
// model before the gradient, push it after), the owner side and the end-of-run barrier.
class PsPeer : private run::TrainingStrategy {
 public:
  // Installs the PS handlers and the event handler on `node`; the node must be shut down
  // before this object is destroyed, and destroyed after it (a ticker thread posts to the node
  // until the destructor joins it). Throws std::invalid_argument for bad options.
  // `members` are every id of the cluster, self included.
  PsPeer(node::Node& node, run::NodeJob job, std::vector<NodeId> members, PsOptions options);
  ~PsPeer();
  PsPeer(const PsPeer&) = delete;
  PsPeer& operator=(const PsPeer&) = delete;

  // Trainer thread: runs every clock, the final read (node 0) and the end-of-run barrier.
  PsReport run();
  // Any thread: the clocks and the barrier end at once.
  void stop();
  // The key layout and owners (tests).
  const ChunkLayout& layout() const { return layout_; }
  const ShardMap& shardMap() const { return map_; }

 private:
  // The trainer thread's state across clocks.
  struct ClockState {
    std::vector<Key> keys;  // every key: each clock reads the whole model
    std::optional<KvWorker::Handle> pending_push;
    std::string last_pull_error;
    WorkerStats stats_before;  // at the previous clock's event
    std::unique_ptr<node::RepeatedLog> lost_pushes;
  };

  // run::TrainingStrategy: the PS clock around the local gradient.
  std::string_view mode() const override { return "ps"; }
  std::string_view stepName() const override { return "clock"; }
  bool stepsLocally() const override { return false; }
  double remoteLr(int64_t clock) const override;
  void describe(ml::MetricsEvent& start) override;
  int64_t firstStep(ml::MetricsWriter& metrics) override;
  bool finished(int64_t clock) const override;
  run::StepExchange beforeGradient(int64_t clock) override;
  std::string divergence(double loss, int64_t clock) const override;
  run::StepExchange exchange(int64_t& clock, double compute_s) override;
  void describeStep(ml::MetricsEvent& event) override;
  void afterStep(int64_t clock, double loss, const ml::Evaluation* evaluated) override;
  void afterLastStep() override;
  // Whole-cluster checkpoints: keeps the loop's part of the cut; the owner's rows join it at the
  // cut's barrier (beforeGradient), where it is written.
  void cutReached(run::NodeCheckpoint& part) override;
  run::Traffic traffic() const override;
  // The final read (node 0), TrainingDone and the barrier.
  void finish(int64_t clocks_done, std::vector<uint32_t>& finished,
              std::vector<uint32_t>& departed) override;
  void describeEnd(ml::MetricsEvent& last) override;

  // Any thread: the owner's time-outs are checked now, not only every tick_every: a member that
  // finished or went down may settle the end of the run (a worker dropped after its down
  // time-out is in the summary of a node whose last peer just finished).
  void tickNow();
  // Waits for the pending push; counts and logs it when it failed.
  void settlePush();
  // Whole-cluster checkpoints (docs/checkpoints.md). Trainer thread, before this worker announces
  // clock `cut`: asks its own server for a snapshot of the owned rows at the cut.
  void requestSnapshot(Clock cut);
  // Trainer thread, at clock `cut`: the barrier (a read of every key once every worker reached
  // the cut, so no worker pushes clock `cut` before every owner took its snapshot), then this
  // node's part of the cut with the snapshot, written. False when stopped.
  bool passCut(Clock cut);
  // The owned rows of a resumed cut into `store` (values, optimizer state, update counts);
  // throws run::NodeCheckpointError naming the file when they do not fit this node's keys.
  void restoreRows(KeyStore& store) const;
  // --rejoin: asks every live node at once for this node's keys and the workers' clocks,
  // restores them from the freshest answer (freshestFirst) and returns the clock to start at;
  // throws std::runtime_error when no node answers usably.
  Clock catchUp(PsReport& report);
  // Loop thread: answers a rejoining node's PsCatchupRequest.
  void answerCatchup(NodeId to);
  // Loop thread: a catch-up reply (checked; kept for catchUp()).
  void onCatchupReply(NodeId from, const wire::PsCatchupReply& reply);
  // Node 0: reads the owners' model once every update up to `min_clock` is in.
  void readOwnersModel(Clock min_clock);
  // The end-of-run wait's time-outs.
  run::SettleOptions settleOptions() const;
  // Waits until every other member is done or gone.
  void settle(std::vector<uint32_t>& finished, std::vector<uint32_t>& departed);
  // Has the cluster run its clock budget, counting `own_clocks` for this worker?
  bool budgetReached(Clock own_clocks) const;

  node::Node& node_;
  run::NodeJob job_;
  std::vector<NodeId> members_;
  PsOptions options_;
  Staleness staleness_;
  // Fully asynchronous with --async-rounds cluster: the run ends on the cluster's clock total.
  bool cluster_budget_ = false;
  ShardMap map_;
  ChunkLayout layout_;
  OwnerOptimizer optimizer_;
  std::unique_ptr<KvServer> server_;
  std::unique_ptr<KvWorker> worker_;
  // Who finished or left, and the end-of-run barrier. Its lock also guards the state below.
  run::Membership membership_;
  // TrainingDone and peer events, the owner's ticker, the end-of-run barrier. Destroyed
  // first (its ticker posts to the server).
  std::unique_ptr<PsRunBarrier> barrier_;
  // catchUp(): the nodes asked, and their checked answers as they come.
  struct Catchup {
    std::string error;
    std::vector<Key> keys;
    std::vector<float> values;
    std::vector<WorkerView> views;
    Clock read_clock = -1;
  };
  // Set when this node turns out to have started into a running job without --rejoin.
  std::string running_job_error_;
  std::set<NodeId> catchup_asked_;
  std::map<NodeId, Catchup> catchup_answers_;
  // Whole-cluster checkpoints: the owner's rows at a cut, taken on the loop thread (guarded by
  // the membership lock), the loop's part of it waiting for them, and the clock whose read is
  // the cut's barrier.
  struct OwnerSnapshot {
    Clock cut = -1;
    std::vector<uint64_t> keys, updates;
    std::vector<float> values, state;
  };
  OwnerSnapshot snapshot_;
  std::optional<run::NodeCheckpoint> cut_part_;
  Clock barrier_clock_ = -1;
  // Trainer thread, during run().
  ClockState clocks_;
  PsReport report_;
  // --bandwidth with a finite bound: the owner's server push. Declared last, destroyed first
  // (its timer reads the server and feeds the worker).
  std::unique_ptr<ManagedComm> managed_;
};

}  // namespace chorus::ps
