// Sparse PS mode over the peer runtime: a sparse workload's embedding rows are the keys (one key
// per row, ps/sparse_keys.h), every node owns the rows whose home it is (classic placement:
// ShardMap) with their optimizer state, and every node is a worker on its shard of the training
// points. A clock is one step: the worker draws the step's negatives, pulls exactly the rows the
// step touches (one message per owner, this node's rows without frames), computes the
// gradient with the workload's code and pushes the sparse gradient; owners apply AdaGrad or
// SGD with the row's state (ps/update_policy.h). SSP as in dense PS mode. Node 0 pulls the
// whole model to evaluate at the evaluation epochs and after the last clock. Protocol, options
// and metrics: docs/sparse-ps.md.
//
// The rows are reached through one seam, SparseRowAccess (ps/sparse_row_access.h): pull, push,
// localize, clock. `--technique classic` is KvServer + KvWorker (rows at their homes),
// `--technique lapse` the relocation shell (rows move to the worker that localizes them; the
// loop localizes the next clock's data points one clock ahead), `--technique nups` replicas of
// the hot keys on every node (synced in the background, drained before the end-of-run read)
// beside the relocation of the others.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ml/sparse_train.h"
#include "ps/kv_server.h"
#include "ps/kv_worker.h"
#include "ps/ps_peer.h"
#include "ps/ps_run_barrier.h"
#include "ps/sample_worker.h"
#include "ps/sparse_keys.h"
#include "ps/sparse_row_access.h"
#include "run/cut_plan.h"
#include "run/membership.h"

namespace chorus::node {
class Node;
}

namespace chorus::ps {

class RotationPlan;
class RotationDriver;
struct LocalizeCount;

struct SparsePsOptions {
  // --staleness, --down-timeout and the time-outs and test hooks of dense PS mode (--key-floats,
  // --no-cache, --owner-momentum and --async-rounds do not apply: a key is a row, and a row
  // cache would be invalidated by the worker's own push of nearly every row it read).
  PsOptions ps;
  // The training settings of the single-node run (`chorus train`): epochs, batch per worker,
  // optimizer and rate, seed, evaluation and step-event intervals, metrics file and the start
  // event's extra fields. keepBest: node 0 keeps the tables of its best evaluation on the first
  // split and evaluates those at the end when the last epoch is not better. timeLimitSeconds: a
  // node whose training time passed it after an epoch trains no more and ends its remaining
  // clocks at once (no steps, no pushes), so that no other worker's SSP bound waits for it; the
  // others go on. savePath and resumePath are not supported.
  ml::SparseTrainOptions train;
  // --sample-scheme and --sample-reuse: the step's sampled rows (KGE's negatives) are drawn
  // through a SampleWorker of this node with these options, prepared one step ahead, and their
  // values read by pullSample. nullopt: the workload draws them (i.i.d. per step, as naive) and
  // they are read with the step's rows.
  std::optional<sampling::SampleSchemeOptions> sampling;
  // --technique: how the rows are managed (classic: at their homes; lapse: relocated; nups: hot
  // keys replicated, the others relocated; auto: each key's from ps/technique_choice.h, which
  // needs replication.node_accesses).
  SparseTechnique technique = SparseTechnique::kClassic;
  // nups: the hot set and the sync rate (--replicate, --replica-bytes, --replica-syncs-per-s);
  // auto: every node's expected accesses, the replicas' memory cap and the sync rate.
  ReplicationOptions replication;
  // Lapse: the rows of the data points of the clock this many clocks ahead are localized at the
  // start of each clock (0: none). One clock is Lapse's "one data point ahead" for a step.
  int64_t localize_ahead = 1;
  // --mf-schedule rotation (MF only; docs/orion.md): 0 runs the data-parallel loop above; N > 0
  // trains by Orion's rotation of N x N blocks (ps/rotation.h; N a multiple of the workers: the
  // CLI gives one block per worker, the tests' serial reference N blocks to one worker). Needs
  // --technique lapse (the column blocks move by relocation); the worker's shard is then its row
  // blocks' ratings (the `shard` given to the constructor is not used) and localize_ahead is off.
  size_t rotation_blocks = 0;
  // Rotation: false (`rotation`): a worker takes its next column block as soon as the block's
  // holder announced the sub-epoch's end (neighbour hand-off); true (`rotation-barrier`): once
  // every worker did (the all-worker barrier, kept to measure the hand-off against).
  bool rotation_barrier = false;
  // Whole-cluster checkpoints (--checkpoint-every N epochs, --checkpoint-dir, --resume DIR;
  // docs/checkpoints.md, "Sparse runs"): where the cuts go, every how many epochs, and the cut
  // this node resumes from (run::planCuts). Techniques classic and lapse; a cut is an epoch's end.
  run::CutPlan cuts;
  // Tests: called on the trainer thread after each step's pull with the keys it pulled.
  std::function<void(int64_t clock, std::span<const Key> pulled)> on_pull;
  // --stragglers: called on the trainer thread once per clock, after the step's gradient was
  // computed and pushed, with the time its gradient took; it waits the straggler's extra time
  // (the CLI's faults::StragglerInjector::waitAfterStep, which may also end the process at a
  // crash step). Null: no extra time.
  std::function<void(std::chrono::nanoseconds compute)> after_step;
};

// Throws std::invalid_argument naming the flag when an option cannot be used in sparse PS mode.
void validateSparsePsOptions(const SparsePsOptions& options);

// What a run achieved on this node.
struct SparsePsReport {
  bool stopped = false;
  int64_t epochs_done = 0;
  int64_t clocks_done = 0;
  int64_t clocks_per_epoch = 0;
  double train_seconds = 0;  // the clocks only (evaluations not counted)
  double wait_seconds = 0;   // of which waiting for pulls
  double points_per_second = 0;
  std::vector<double> epoch_losses;  // this worker's mean training loss per epoch
  // Node 0: the headline metric of the first split at each evaluation during the run, by epoch.
  std::vector<std::pair<int64_t, double>> epoch_quality;
  // Node 0: the epoch whose tables `final` evaluated (the last one, or --keep-best's best).
  int64_t evaluated_epoch = 0;
  // --time-limit: this node's time was up after epochs_done epochs (its later clocks ended at
  // once, without steps).
  bool time_limited = false;
  // Node 0: every split's metrics of the owners' model after the last clock (evalSplits order).
  std::vector<std::pair<std::string, std::vector<ml::NamedMetric>>> final;
  size_t parameters = 0;
  std::string spec;
  uint64_t rows_pulled = 0;  // keys read by the steps (not the evaluation reads)
  uint64_t rows_pushed = 0;
  uint64_t bytes_out = 0;  // this node's traffic, all peers, the final read included
  uint64_t bytes_in = 0;
  // The same by the end of the last clock (before node 0's final read of the whole model).
  uint64_t clock_bytes_out = 0;
  uint64_t clock_bytes_in = 0;
  uint64_t failed_pulls = 0;
  uint64_t failed_pushes = 0;
  // nups, auto: the replicated keys' share of the expected accesses (formatReplicaChoice's).
  double replica_share = 0;
  // The technique's counters (keys localized, rows held at the end, the replicas').
  SparseTechnique technique = SparseTechnique::kClassic;
  RowAccessStats access;
  // With a sample scheme: its counters (keys handed out, of which local; distinct sampled keys
  // read from other owners).
  std::optional<SampleWorkerStats> sampling;
  WorkerStats worker;
  ServerSummary server;
  // --mf-schedule rotation: the plan (RotationPlan::describe) and the seconds and count of the
  // sub-epoch synchronizations, hand-offs or barriers (part of wait_seconds).
  std::string rotation;
  double barrier_seconds = 0;
  uint64_t barriers = 0;
  std::vector<uint32_t> finished_peers;
  std::vector<uint32_t> departed_peers;

  // Share of the key reads and writes served by this node's own rows.
  double localShare() const;
  // Share of the sampled keys that were local when handed out (0 without a scheme).
  double sampleLocalShare() const;
};

// The clocks of one epoch: the batches of the largest shard (ceil(ceil(points / workers) /
// batch)), the same on every worker so that SSP's clocks line up.
int64_t sparseClocksPerEpoch(size_t points, size_t workers, size_t batch);
// The points of `shard` for `clock` (0-based within the epoch) of `clocks` clocks: the shard in
// `order` (a permutation of it) cut into `clocks` slices whose sizes differ by at most one.
std::span<const size_t> sparseClockBatch(std::span<const size_t> order, int64_t clock,
                                         int64_t clocks);

class SparsePsPeer {
 public:
  // Installs the PS handlers on `node` (which must be shut down before this object is
  // destroyed). `workload` is this node's copy of the model, initialized alike on every node
  // (same seed): owners take their rows from it. `shard`: this worker's training points.
  // `members`: every id of the cluster, self included. Throws std::invalid_argument for bad
  // options.
  SparsePsPeer(node::Node& node, ml::SparseWorkload& workload, std::vector<size_t> shard,
               std::vector<NodeId> members, SparsePsOptions options);
  ~SparsePsPeer();
  SparsePsPeer(const SparsePsPeer&) = delete;
  SparsePsPeer& operator=(const SparsePsPeer&) = delete;

  // Trainer thread: every clock, node 0's evaluations and the end-of-run barrier. Throws
  // std::runtime_error when the loss is not finite or the metrics file cannot be written.
  SparsePsReport run();
  // Any thread: the clocks and the barrier end at once.
  void stop();
  // The key space (tables as key ranges) and the default placement.
  const KeySpace& space() const { return space_; }
  const ShardMap& shardMap() const { return map_; }

 private:
  // Reads every key into the workload's tables (node 0's evaluations); `min_clock`: wait until
  // every worker reached it (the final read), else under SSP as a step's read. False (logged)
  // when the read failed.
  bool pullModel(std::optional<Clock> min_clock);
  // nups and auto: the replicas of `keys` (sorted) with the seed's values, updated with `policy`.
  ReplicaSetup replicaSetup(std::vector<Key> keys, std::shared_ptr<const UpdatePolicy> policy);
  // nups and auto keep replicas (their metrics say how they did).
  bool replicates() const {
    return options_.technique == SparseTechnique::kNups ||
           options_.technique == SparseTechnique::kAuto;
  }
  // Starts localizing the rows the data points `points` name (not waited for here; counted in
  // localizing_ until done).
  void localizeAhead(std::span<const size_t> points);
  // Trainer thread: waits until every localize this worker started is done (or the run stops).
  void waitLocalizes();
  // Trainer thread, after the last clock of epoch `cut`-1 (this worker announced `ssp_clock`, its
  // pushes completed): this node's part of cut `cut` (docs/checkpoints.md, "Sparse runs").
  // Barrier A (a read at `ssp_clock`: every worker announced it, so every push before it is in
  // its row and no localize is under way), under lapse this node's home rows brought home, the
  // rows copied and written, then the cut's own empty clock and barrier B (a read at
  // `ssp_clock` + 1: every node took its part before anyone trains on). False when the run
  // stopped meanwhile.
  bool takeCut(int64_t cut, Clock ssp_clock);
  // Sets the store's rows from the resumed cut (options_.cuts.resumed). Throws
  // run::NodeCheckpointError naming the file.
  void restoreCut(KeyStore& store) const;
  // Waits for the pending push; counts and logs it when it failed.
  void settlePush();
  // With a sample scheme: draws the step's sampled rows (prepared one step ahead: `clock` of
  // `total` clocks, `batch` points now, `next_points` at the next clock), gives them to the
  // workload and writes their values into its tables. False (logged, counted) when the read
  // failed: the step trains on the last values of those rows.
  bool sampleStep(Clock clock, Clock total, std::span<const size_t> batch, size_t next_points);

  node::Node& node_;
  ml::SparseWorkload& workload_;
  std::vector<ml::SparseTable*> tables_;
  std::vector<size_t> shard_;
  std::vector<NodeId> members_;
  SparsePsOptions options_;
  Staleness staleness_;
  ShardMap map_;
  KeySpace space_;
  int64_t clocks_per_epoch_ = 0;
  std::unique_ptr<SparseRowAccess> access_;
  uint64_t owned_at_start_ = 0;
  double replica_share_ = 0;   // nups, auto: the hot keys' share of the expected accesses
  size_t relocated_keys_ = 0;  // auto: keys it relocates, and keys it leaves at their homes
  size_t home_keys_ = 0;
  std::vector<std::vector<ml::RowKey>> ahead_rows_;  // localizeAhead's buffers
  // Whole-cluster checkpoints: the keys whose home this node is (its part of a cut), and the
  // localizes not done yet (done on the loop thread, waited for on the trainer thread).
  std::vector<Key> cut_keys_;
  std::shared_ptr<LocalizeCount> localizing_;
  std::unique_ptr<StepKeys> ahead_keys_;
  // With a sample scheme: pi, the sampler (over access_) and the sample prepared for the next
  // clock.
  std::unique_ptr<sampling::NegativeSampler> sample_pi_;
  std::unique_ptr<SampleWorker> sampler_;
  std::optional<std::pair<Clock, sampling::SampleId>> prepared_;
  SampleBatch sample_;
  std::vector<ml::RowKey> sample_rows_;
  run::Membership membership_;
  // TrainingDone and peer events, the owner's ticker, the end of the run.
  std::unique_ptr<PsRunBarrier> barrier_;
  // --mf-schedule rotation: the blocks and this worker's driver over access_ (null otherwise).
  std::unique_ptr<RotationPlan> rotation_plan_;
  std::unique_ptr<RotationDriver> rotation_;
  std::optional<SparseRowAccess::Handle> pending_push_;
  std::string last_pull_error_;
  SparsePsReport report_;
};

}  // namespace chorus::ps
