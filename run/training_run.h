// The training side of a distributed run, shared by consensus and PS mode: the options both
// modes take (and their CLI flags), this node's data shard, the common initial model, the
// batcher, the straggler injector and the per-node JSON-lines metrics file. No networking.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "faults/straggler.h"
#include "ml/batches.h"
#include "ml/dataset.h"
#include "ml/metrics.h"
#include "ml/model.h"
#include "ml/optimizer.h"
#include "node/result.h"
#include "run/cut_plan.h"
#include "run/node_id.h"

namespace CLI {
class App;
}

namespace chorus::run {

// How the training set is split across the nodes (--shard).
struct ShardSpec {
  enum class Kind { kIid, kDirichlet };
  Kind kind = Kind::kIid;
  double alpha = 0;  // kDirichlet: concentration (small = few classes per node)

  // Largest ALPHA parse() accepts: 1e6 is iid in effect, and near DBL_MAX the Gamma draws of
  // shardDirichlet overflow.
  static constexpr double kMaxDirichletAlpha = 1e6;

  // Reads "iid" or "dirichlet:ALPHA" (0 < ALPHA <= kMaxDirichletAlpha), or an error naming
  // the flag and the accepted forms.
  static node::Result<ShardSpec> read(std::string_view text);
  // As written on the command line.
  std::string toString() const;
  bool operator==(const ShardSpec&) const = default;
};

// The training options both distributed modes take.
struct RunOptions {
  ml::DataOptions data;  // --data, --data-dir, --synthetic-train/--synthetic-test
  ml::ModelSpec model;   // --model, --hidden (input and classes come from the data)
  ShardSpec shard;       // --shard, parsed where the flag is read
  int64_t rounds = 0;    // 0: derived from --epochs
  double epochs = static_cast<double>(ml::defaults::kEpochs);  // passes over an average shard
  size_t batch = ml::defaults::kBatch;
  double lr = ml::defaults::kLearningRate;
  double momentum = ml::defaults::kMomentum;
  bool nesterov = false;
  double weight_decay = 0.0;
  std::string schedule = "constant";  // --schedule: constant | step | cosine, over the rounds
  double warmup_epochs = 0;           // linear warm-up, in epochs of an average shard
  double step_epochs = 0;             // --schedule step: decay every this many epochs
  double gamma = 0.1;                 // --schedule step: decay factor
  bool augment = false;               // random crop + horizontal flip of training images
  int crop_padding = 4;               // --augment: crop from the image padded by this much
  bool flip = true;                   // --augment: mirror left-right (--no-flip turns it off)
  uint64_t seed = 1;                  // initial model, shards, shuffling, straggler delays
  // --stragglers, read where the flag is; combined with the node's own attribute.
  faults::StragglerProfile stragglers;
  int64_t eval_every = 10;  // test accuracy every this many rounds (0: only at the end)
  double target_acc = 0;    // record when the test accuracy first reaches this (0: off)
  std::string out_dir;      // DIR/node-<id>.jsonl (empty: no metrics file)
  size_t train_limit = 0;   // --limit: the first N training samples only (0: all)
  std::string save_path;    // --save: the final model as a checkpoint (empty: none)
  std::string resume_path;  // --resume: this checkpoint's model, or a cut folder's cluster state
  bool confusion = false;   // --confusion: the final test confusion matrix
  // Whole-cluster checkpoints (run/cluster_checkpoint.h, run/cut_plan.h): every N steps (0: none),
  // into this folder (empty: DIR/checkpoints under --out). Registered by addCheckpointOptions().
  int64_t checkpoint_every = 0;
  std::string checkpoint_dir;
};

// Registers the options above on `cmd` (both modes' commands call this). The defaults written
// in `options` are shown in --help.
void addRunOptions(CLI::App& cmd, RunOptions& options);

// An error naming the flag when an option is out of range or two do not go together
// (--stragglers and --shard are typed where the flags are read). No I/O.
node::Status checkRunOptions(const RunOptions& options);

// Everything one node trains with: its data (shared, read-only), its shard, the initial model
// (identical on every node: the seed's, or the --resume checkpoint's), the optimizer settings,
// the batcher and its straggler injector.
struct NodeJob {
  NodeId node_id = 0;
  std::shared_ptr<const ml::DataSplit> data;
  std::vector<size_t> shard;  // indices into data->train
  std::unique_ptr<ml::Model> model;
  ml::SgdConfig sgd;
  double lr = 0.05;         // the base rate (schedule.baseLr)
  ml::LrSchedule schedule;  // the rate per round (consensus) or clock (PS)
  ml::Augmentation augmentation;
  size_t batch = 64;
  int64_t rounds = 0;
  uint64_t seed = 1;
  faults::StragglerProfile stragglers;
  int64_t eval_every = 10;
  double target_acc = 0;
  std::string metrics_path;  // empty: no metrics
  bool confusion = false;    // the final evaluation computes the confusion matrix
  // --resume: the checkpoint the model was loaded from (empty: none), the steps it had run and
  // its optimizer velocity (a single node continues at that step with it).
  std::string resumed_from;
  int64_t resumed_step = 0;
  uint64_t resumed_seed = 0;
  std::vector<float> resumed_optimizer_state;
  // Whole-cluster checkpoints: where they go, and the cut this node resumes from (prepareCuts).
  CutPlan cuts;
};

// Loads the data set named in `options`, or the reader's error naming the file and what to do
// (a missing or malformed data file: ml::DataError's message, as a value).
node::Result<ml::DataSplit> loadRunSplit(const RunOptions& options);
// The same, shared read-only by the jobs of several nodes in one process.
node::Result<std::shared_ptr<const ml::DataSplit>> loadRunData(const RunOptions& options);

// This node's job among `nodes` nodes: its shard of `data` (same split on every node), the
// model built from options.seed, the straggler profile --stragglers + `node_stragglers` (the
// topology attribute), and the rounds: --rounds, or --epochs passes over an average shard
// (training set / nodes), so that every node runs the same number of rounds.
// An error naming the flag for unusable options, the node and --shard for an empty shard, the
// file for a --resume checkpoint that cannot be read or does not fit the model.
node::Result<NodeJob> prepareNodeJob(const RunOptions& options,
                                     std::shared_ptr<const ml::DataSplit> data, NodeId node_id,
                                     int nodes,
                                     const faults::StragglerProfile& node_stragglers = {});

// For a process that runs one node: prepareNodeJob() on `data`, keeping only the job's shard of
// the training set (copied, in shard order) and the test set (moved). job.shard is renumbered
// 0..k-1, so the node draws exactly the batches prepareNodeJob() would have given it, and the
// other nodes' samples are freed before this returns (CIFAR-10 over 8 nodes: about 200 MB of
// samples per process instead of 740, and the test set is never held twice).
// Errors as prepareNodeJob()'s.
node::Result<NodeJob> prepareNodeProcessJob(const RunOptions& options, ml::DataSplit data,
                                            NodeId node_id, int nodes,
                                            const faults::StragglerProfile& node_stragglers = {});

// For a process that runs one node, from the files themselves: reads the training labels alone,
// computes the shards as prepareNodeJob() does, then streams the training files keeping only
// this node's samples (ml::loadDatasetRows), normalized with the whole training part's
// statistics. The job equals prepareNodeProcessJob(options, loadRunSplit(options), ...)'s, and
// the memory it needs is the shard and the test set, never the whole training set. Errors as
// prepareNodeJob()'s and loadRunSplit()'s.
node::Result<NodeJob> loadNodeProcessJob(const RunOptions& options, NodeId node_id, int nodes,
                                         const faults::StragglerProfile& node_stragglers = {});

// DIR/node-<id>.jsonl (creating DIR); "" when dir is empty. A kIo error naming --out DIR when it
// cannot be created.
node::Result<std::string> nodeMetricsPath(const std::string& dir, NodeId node_id);

// Cycles through a shard in minibatches, reshuffled every epoch (seeded per node), augmenting
// images when asked (the augmentation draws are seeded per epoch too, so that a resumed run
// continues them from an epoch's start).
class ShardBatcher {
 public:
  ShardBatcher(const ml::Dataset& train, std::vector<size_t> shard, size_t batch, uint64_t seed,
               ml::Augmentation augmentation = {});
  // Fills the next minibatch (starting a new epoch when the current one is used up).
  void next(ml::Matrix& batch, std::vector<int32_t>& labels);
  // Passes over the next `batches` minibatches without gathering them (a resumed run).
  void skip(size_t batches);
  // Batches per pass over the shard.
  size_t batchesPerEpoch() const { return sampler_.batchesPerEpoch(); }
  // Epochs started so far (1 after the first batch).
  int64_t epoch() const { return epoch_; }

 private:
  // The next minibatch's sample indices, starting an epoch when needed.
  std::span<const size_t> nextIndices();

  const ml::Dataset& train_;
  ml::EpochSampler sampler_;
  ml::Augmentation augmentation_;
  uint64_t seed_;
  ml::Rng rng_;
  int64_t epoch_ = 0;
};

}  // namespace chorus::run
