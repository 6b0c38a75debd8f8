#include "run/training_run.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cassert>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <span>
#include <stdexcept>

#include "ml/checkpoint.h"
#include "ml/rng.h"
#include "ml/sharding.h"
#include "run/cli_checks.h"
#include "run/cluster_checkpoint.h"

namespace chorus::run {

node::Result<ShardSpec> ShardSpec::read(std::string_view text) {
  ShardSpec spec;
  if (text == "iid") return spec;
  constexpr std::string_view kPrefix = "dirichlet:";
  if (text.starts_with(kPrefix)) {
    const std::string number(text.substr(kPrefix.size()));
    char* end = nullptr;
    const double alpha = std::strtod(number.c_str(), &end);
    const bool parsed = !number.empty() && end == number.c_str() + number.size();
    if (parsed && alpha > kMaxDirichletAlpha) {
      return node::invalidInput(fmt::format(
          "--shard '{}': ALPHA must be at most {} (Dirichlet shards are iid in effect long "
          "before that; use --shard iid)",
          text, kMaxDirichletAlpha));
    }
    if (parsed && alpha > 0) {
      spec.kind = Kind::kDirichlet;
      spec.alpha = alpha;
      return spec;
    }
  }
  return node::invalidInput(fmt::format(
      "--shard '{}': expected 'iid' or 'dirichlet:ALPHA' with ALPHA > 0 (e.g. dirichlet:0.5)",
      text));
}

std::string ShardSpec::toString() const {
  return kind == Kind::kIid ? "iid" : fmt::format("dirichlet:{}", alpha);
}

void addRunOptions(CLI::App& cmd, RunOptions& o) {
  cmd.add_option("--data", o.data.name, "Data set: mnist, fashion-mnist, cifar10, synthetic")
      ->check(CLI::IsMember(ml::datasetNames()))
      ->capture_default_str();
  cmd.add_option("--data-dir", o.data.dataDir,
                 "Folder holding the data files (default: $CHORUS_DATA, data/ in the source "
                 "tree, /usr/share/datasets/)");
  cmd.add_option("--synthetic-train", o.data.syntheticTrain, "Training samples of --data synthetic")
      ->check(CLI::Range(size_t{1}, size_t{10'000'000}))
      ->capture_default_str();
  cmd.add_option("--synthetic-test", o.data.syntheticTest, "Test samples of --data synthetic")
      ->check(CLI::Range(size_t{1}, size_t{10'000'000}))
      ->capture_default_str();
  cmd.add_option("--model", o.model.name, "Model: softmax, mlp, lenet, cifar-cnn")
      ->check(CLI::IsMember(ml::modelNames()))
      ->capture_default_str();
  cmd.add_option("--hidden", o.model.hidden,
                 "mlp hidden layer sizes, comma separated (default 256,128)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1'000'000));
  cmd.add_option("--dropout", o.model.dropout,
                 "Dropout rate before the output layer (mlp, lenet, cifar-cnn)")
      ->check(CLI::Range(0.0f, 0.95f))
      ->capture_default_str();
  cmd.add_option("--limit", o.train_limit,
                 "Train on the first N training samples only, before sharding (0 = all)")
      ->capture_default_str();
  cmd.add_flag_callback(
      "--no-normalize", [&o] { o.data.normalize = false; },
      "Keep pixels in [0, 1] instead of per-channel mean/std standardization");
  // Parsed here, once: the value travels typed (a run spec carries its kind and alpha).
  cmd.add_option_function<std::string>(
         "--shard",
         [&o](const std::string& text) {
           o.shard = ShardSpec::read(text).value();  // checked below
         },
         "How the training set is split over the nodes: iid or dirichlet:ALPHA "
         "(label-skewed, 0 < ALPHA <= 1e6)")
      ->check(readableAs(&ShardSpec::read, "SHARD", "SHARD"))
      ->default_str(o.shard.toString());
  cmd.add_option("--rounds", o.rounds,
                 "Training steps per node: consensus rounds, PS clocks (0: derived from --epochs)")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000'000}))
      ->capture_default_str();
  cmd.add_option("--epochs", o.epochs,
                 "Passes over an average node's shard (training set / nodes), when --rounds is 0; "
                 "every node runs the same rounds (fractions allowed)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  cmd.add_option("--batch", o.batch, "Minibatch size")
      ->check(CLI::Range(size_t{1}, size_t{1'000'000}))
      ->capture_default_str();
  cmd.add_option("--lr", o.lr, "Learning rate of the local step (0: pure averaging)")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  cmd.add_option("--momentum", o.momentum,
                 "SGD momentum (0 = plain SGD). Consensus mode: of each node's local step; PS "
                 "mode: applied by the owners, per clock (see --owner-momentum)")
      ->check(CLI::Range(0.0, 0.999))
      ->capture_default_str();
  cmd.add_flag("--nesterov", o.nesterov, "Nesterov momentum (needs --momentum > 0)");
  cmd.add_option("--weight-decay", o.weight_decay, "L2 weight decay")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd.add_option("--schedule", o.schedule,
                 "Learning-rate schedule over the rounds (clocks in PS mode): constant, step, "
                 "cosine (to 0 at the last round)")
      ->check(CLI::IsMember({"constant", "step", "cosine"}))
      ->capture_default_str();
  cmd.add_option("--warmup-epochs", o.warmup_epochs,
                 "Linear learning-rate warm-up, in epochs of an average shard (any schedule)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  cmd.add_option("--step-epochs", o.step_epochs,
                 "--schedule step: multiply the rate by --gamma every this many epochs")
      ->check(CLI::Range(0.0, 1e6));
  cmd.add_option("--gamma", o.gamma, "--schedule step: decay factor")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd.add_flag("--augment", o.augment,
               "Augment training images: random crop (see --crop-padding) and horizontal flip");
  cmd.add_option("--crop-padding", o.crop_padding,
                 "--augment: crop from the image padded by this many zero pixels")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  cmd.add_flag_callback(
      "--no-flip", [&o] { o.flip = false; },
      "--augment: no horizontal flips (digits are not symmetric)");
  cmd.add_option("--seed", o.seed,
                 "Seed of the initial model (same on every node), shards, shuffling, straggler "
                 "delays and synthetic data")
      ->capture_default_str();
  // Read here, once: a bad profile is refused by CLI11 naming the flag and the bad term.
  cmd.add_option_function<std::string>(
         "--stragglers",
         [&o](const std::string& text) {
           o.stragglers = faults::StragglerProfile::read(text).value();  // checked below
         },
         "Straggler profile (docs/stragglers.md), added to each node's own attribute "
         "from the topology file, e.g. shifted-exp:5,20+slow:3=4; crash:N@S ends node "
         "N's process right after its S-th step (a real crash). Sparse models: PS mode "
         "only, drawn per clock")
      ->check(readableAs(&faults::StragglerProfile::read, "PROFILE", "STRAGGLERS"));
  cmd.add_option("--eval-every", o.eval_every,
                 "Test accuracy every N steps (rounds, clocks; 0: only at the end)")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000'000}))
      ->capture_default_str();
  cmd.add_option("--target-acc", o.target_acc,
                 "Record the time the test accuracy first reaches this fraction (e.g. 0.97); "
                 "training still runs all rounds")
      ->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--out", o.out_dir, "Write metrics as JSON lines to DIR/node-<id>.jsonl");
  cmd.add_option("--save", o.save_path,
                 "Write the final model as a checkpoint (which --resume reads): node 0's model in "
                 "consensus mode, the owners' model in PS mode, written by node 0; one node "
                 "(chorus train) also writes it after every epoch");
  cmd.add_option("--resume", o.resume_path,
                 "Start from this checkpoint's model (a --save of the same --model and --data). "
                 "chorus train continues the saved run at its step, with its momentum, and "
                 "needs the same --seed; chorus node, launch and compare start every node's "
                 "rounds at 0 from that model. chorus node and launch also take a "
                 "--checkpoint-dir folder: the whole cluster then restarts from the newest cut "
                 "every node finished (docs/checkpoints.md)")
      ->check(CLI::ExistingPath);
  cmd.add_flag("--confusion", o.confusion,
               "Compute the test confusion matrix at the end: printed, and in the final metrics "
               "event (each node's own model)");
}

node::Status checkRunOptions(const RunOptions& o) {
  const auto bad = [](std::string message) { return node::invalidInput(std::move(message)); };
  if (o.batch == 0) return bad("--batch must be > 0");
  if (!std::isfinite(o.lr) || o.lr < 0) return bad("--lr must be >= 0");
  // Written as !(in range) so that NaN fails too: NaN compares false with everything, and a NaN
  // momentum reached the optimizer (a node segfaulted) and a NaN target the compare manifest.
  if (!(o.momentum >= 0 && o.momentum < 1)) {
    return bad("--momentum must be in [0, 1)");
  }
  if (o.nesterov && !(o.momentum > 0)) {
    return bad("--nesterov needs --momentum > 0");
  }
  if (!(o.model.dropout >= 0 && o.model.dropout <= 0.95f)) {
    return bad("--dropout must be in [0, 0.95]");
  }
  if (!(o.weight_decay >= 0 && o.weight_decay <= 1)) {
    return bad("--weight-decay must be in [0, 1]");
  }
  if (o.rounds < 0) return bad("--rounds must be >= 0");
  if (o.rounds == 0 && !(o.epochs > 0)) {
    return bad("give --rounds N or --epochs E (> 0)");
  }
  if (const auto kind = ml::LrSchedule::readKind(o.schedule); !kind.ok()) {
    return bad("--schedule: " + kind.message());
  }
  if (!(o.warmup_epochs >= 0)) return bad("--warmup-epochs must be >= 0");
  if (o.schedule == "step" && !(o.step_epochs > 0)) {
    return bad("--schedule step needs --step-epochs > 0");
  }
  if (!(o.step_epochs >= 0)) return bad("--step-epochs must be >= 0");
  if (o.schedule != "step" && o.step_epochs > 0) {
    return bad("--step-epochs applies only to --schedule step");
  }
  if (!(o.gamma >= 0 && o.gamma <= 1)) return bad("--gamma must be in [0, 1]");
  if (o.crop_padding < 0) return bad("--crop-padding must be >= 0");
  if (o.eval_every < 0) return bad("--eval-every must be >= 0");
  if (!(o.target_acc >= 0 && o.target_acc <= 1)) {
    return bad("--target-acc must be a fraction in [0, 1]");
  }
  if (o.model.name != "mlp" && !o.model.hidden.empty()) {
    return bad("--hidden applies only to --model mlp");
  }
  return node::Status();
}

node::Result<ml::DataSplit> loadRunSplit(const RunOptions& options) {
  ml::DataOptions data = options.data;
  data.syntheticSeed = options.seed;
  ml::DataSplit split;
  try {
    split = ml::loadDataset(data);
  } catch (const ml::DataError& e) {  // the ml/ readers still throw; the message names the file
    return node::Status(node::ErrorCode::kIo, e.what());
  }
  // As chorus train --limit: the first N samples, normalized with the whole set's statistics.
  if (options.train_limit > 0 && options.train_limit < split.train.size()) {
    split.train.labels.resize(options.train_limit);
    split.train.features.resize(options.train_limit * split.train.dim());
  }
  return split;
}

node::Result<std::shared_ptr<const ml::DataSplit>> loadRunData(const RunOptions& options) {
  node::Result<ml::DataSplit> split = loadRunSplit(options);
  if (!split.ok()) return split.status();
  return std::shared_ptr<const ml::DataSplit>(
      std::make_shared<const ml::DataSplit>(std::move(split).value()));
}

namespace {

// This node's part of the first `labels.size()` training samples: every node computes the same
// split from the same seed and keeps its own part. An error when the part is empty.
node::Result<std::vector<size_t>> shardOf(const RunOptions& options,
                                          std::span<const int32_t> labels, int classes,
                                          NodeId node_id, int nodes) {
  const ShardSpec& shard = options.shard;
  const uint64_t shard_seed = ml::mixSeed(options.seed, 0x5AAD);
  ml::Shards shards = shard.kind == ShardSpec::Kind::kIid
                          ? ml::shardIid(labels.size(), nodes, shard_seed)
                          : ml::shardDirichlet(labels, classes, nodes, shard.alpha, shard_seed);
  if (shards[node_id].empty()) {
    return node::invalidInput(fmt::format(
        "node {} got no training samples ({} samples over {} nodes, --shard {}): give fewer "
        "nodes, more samples (--limit, --synthetic-train) or a larger Dirichlet ALPHA",
        node_id, labels.size(), nodes, options.shard.toString()));
  }
  return std::move(shards[node_id]);
}

// The options' checks (checkRunOptions) and the node's id among `nodes`.
node::Status checkJob(const RunOptions& options, NodeId node_id, int nodes) {
  if (node::Status ok = checkRunOptions(options); !ok.ok()) return ok;
  if (nodes <= 0 || node_id >= static_cast<uint32_t>(nodes)) {
    return node::invalidInput(fmt::format("node {} is not one of {} nodes", node_id, nodes));
  }
  return node::Status();
}

// Everything of a job but its shard: the model, the optimizer, the rounds (from `train_size`,
// the samples all nodes share), the schedule, the stragglers and the metrics file.
node::Result<NodeJob> jobOnShard(const RunOptions& options,
                                 std::shared_ptr<const ml::DataSplit> data,
                                 std::vector<size_t> shard, size_t train_size, NodeId node_id,
                                 int nodes, const faults::StragglerProfile& node_stragglers);

}  // namespace

node::Result<NodeJob> prepareNodeJob(const RunOptions& options,
                                     std::shared_ptr<const ml::DataSplit> data, NodeId node_id,
                                     int nodes, const faults::StragglerProfile& node_stragglers) {
  if (node::Status ok = checkJob(options, node_id, nodes); !ok.ok()) return ok;
  // --limit: the first N samples only (loadRunSplit drops the others already; a caller that
  // passes the whole set gets the same shards).
  const size_t train_size = options.train_limit > 0
                                ? std::min(options.train_limit, data->train.size())
                                : data->train.size();
  node::Result<std::vector<size_t>> shard =
      shardOf(options, std::span<const int32_t>(data->train.labels).first(train_size),
              data->train.classes, node_id, nodes);
  if (!shard.ok()) return shard.status();
  return jobOnShard(options, std::move(data), std::move(shard).value(), train_size, node_id, nodes,
                    node_stragglers);
}

node::Result<NodeJob> loadNodeProcessJob(const RunOptions& options, NodeId node_id, int nodes,
                                         const faults::StragglerProfile& node_stragglers) {
  if (node::Status ok = checkJob(options, node_id, nodes); !ok.ok()) return ok;
  ml::DataOptions data_options = options.data;
  data_options.syntheticSeed = options.seed;
  std::vector<int32_t> labels;
  try {
    labels = ml::loadTrainLabels(data_options);
  } catch (const ml::DataError& e) {  // the ml/ readers still throw; the message names the file
    return node::Status(node::ErrorCode::kIo, e.what());
  }
  if (options.train_limit > 0 && options.train_limit < labels.size()) {
    labels.resize(options.train_limit);
  }
  // Every dense data set has 10 classes (loadDataset); checked against the loaded part below.
  constexpr int kClasses = 10;
  node::Result<std::vector<size_t>> rows = shardOf(options, labels, kClasses, node_id, nodes);
  if (!rows.ok()) return rows.status();
  std::shared_ptr<ml::DataSplit> split;
  try {
    split = std::make_shared<ml::DataSplit>(ml::loadDatasetRows(data_options, *rows));
  } catch (const ml::DataError& e) {
    return node::Status(node::ErrorCode::kIo, e.what());
  }
  // ml::loadDatasetRows sets 10 classes for every dense data set: a bug if not, not input.
  assert(split->train.classes == kClasses);
  // The loaded training part is the shard, in shard order: the sampler's positions 0..k-1 draw
  // exactly what prepareNodeJob()'s shard indices would.
  std::vector<size_t> shard(rows->size());
  std::iota(shard.begin(), shard.end(), size_t{0});
  return jobOnShard(options, std::move(split), std::move(shard), labels.size(), node_id, nodes,
                    node_stragglers);
}

namespace {

node::Result<NodeJob> jobOnShard(const RunOptions& options,
                                 std::shared_ptr<const ml::DataSplit> data,
                                 std::vector<size_t> shard, size_t train_size, NodeId node_id,
                                 int nodes, const faults::StragglerProfile& node_stragglers) {
  NodeJob job;
  job.node_id = node_id;
  job.shard = std::move(shard);
  ml::ModelSpec spec = options.model;
  spec.input = data->train.shape;
  spec.classes = data->train.classes;
  job.model = ml::Model::create(spec, options.seed);
  // A folder is a whole-cluster resume: prepareCuts() reads it, knowing the cluster and mode.
  if (!options.resume_path.empty() && !resumesCluster(options)) {
    ml::Checkpoint checkpoint;
    try {  // ml/'s checkpoint reader still throws; its message names the file and the mismatch
      checkpoint = ml::loadCheckpoint(options.resume_path);
      ml::checkCompatible(checkpoint, options.resume_path, spec.toString(), job.model->size());
    } catch (const ml::CheckpointError& e) {
      // A file that cannot be used, as an unreadable data file: the run fails (exit 1).
      return node::Status(node::ErrorCode::kIo, e.what());
    }
    std::copy(checkpoint.params.begin(), checkpoint.params.end(), job.model->params().begin());
    job.resumed_from = options.resume_path;
    job.resumed_step = checkpoint.step;
    job.resumed_seed = checkpoint.seed;
    job.resumed_optimizer_state = std::move(checkpoint.optimizerState);
  }
  job.confusion = options.confusion;
  job.sgd.momentum = options.momentum;
  job.sgd.nesterov = options.nesterov;
  job.sgd.weightDecay = options.weight_decay;
  job.lr = options.lr;
  job.batch = options.batch;
  // Every node must run the same rounds (a node that stops early would hold its neighbors'
  // staleness gate), so an "epoch" is one pass over an average shard, not over the own one.
  const size_t average_shard = std::max<size_t>(1, train_size / static_cast<size_t>(nodes));
  const size_t per_epoch = (average_shard + options.batch - 1) / options.batch;
  job.rounds =
      options.rounds > 0
          ? options.rounds
          : std::max<int64_t>(1, std::llround(options.epochs * static_cast<double>(per_epoch)));
  job.schedule.kind = ml::LrSchedule::readKind(options.schedule).value();  // checked above
  job.schedule.baseLr = options.lr;
  job.schedule.warmupSteps =
      ml::scheduleSteps(options.warmup_epochs, static_cast<int64_t>(per_epoch));
  job.schedule.stepEvery = ml::scheduleSteps(options.step_epochs, static_cast<int64_t>(per_epoch));
  job.schedule.gamma = options.gamma;
  job.schedule.totalSteps = job.rounds;
  if (options.augment) {
    job.augmentation.enabled = true;
    job.augmentation.padding = options.crop_padding;
    job.augmentation.flip = options.flip;
  }
  job.seed = options.seed;
  node::Result<faults::StragglerProfile> stragglers =
      options.stragglers.combinedWith(node_stragglers);
  if (!stragglers.ok()) return stragglers.status();
  job.stragglers = std::move(stragglers).value();
  job.eval_every = options.eval_every;
  job.target_acc = options.target_acc;
  node::Result<std::string> metrics_path = nodeMetricsPath(options.out_dir, node_id);
  if (!metrics_path.ok()) return metrics_path.status();
  job.metrics_path = std::move(metrics_path).value();
  job.data = std::move(data);
  return job;
}

}  // namespace

node::Result<std::string> nodeMetricsPath(const std::string& dir, NodeId node_id) {
  if (dir.empty()) return std::string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return node::Status(node::ErrorCode::kIo,
                        fmt::format("--out {}: cannot create the metrics folder: {} (give a "
                                    "folder this user may write)",
                                    dir, ec.message()));
  }
  return (std::filesystem::path(dir) / fmt::format("node-{}.jsonl", node_id)).string();
}

node::Result<NodeJob> prepareNodeProcessJob(const RunOptions& options, ml::DataSplit data,
                                            NodeId node_id, int nodes,
                                            const faults::StragglerProfile& node_stragglers) {
  // Not const, so that the test set can be moved out once the job no longer shares it.
  auto full = std::make_shared<ml::DataSplit>(std::move(data));
  node::Result<NodeJob> prepared = prepareNodeJob(options, full, node_id, nodes, node_stragglers);
  if (!prepared.ok()) return prepared.status();
  NodeJob job = std::move(prepared).value();
  const ml::Dataset& train = full->train;
  if (job.shard.size() == train.size()) return job;  // one node: everything is its shard
  job.data.reset();
  auto kept = std::make_shared<ml::DataSplit>();
  kept->source = full->source;
  ml::Dataset& shard = kept->train;
  shard.name = train.name;
  shard.shape = train.shape;
  shard.classes = train.classes;
  shard.features.reserve(job.shard.size() * train.dim());
  shard.labels.reserve(job.shard.size());
  for (size_t index : job.shard) {
    const std::span<const float> sample = train.sample(index);
    shard.features.insert(shard.features.end(), sample.begin(), sample.end());
    shard.labels.push_back(train.labels[index]);
  }
  kept->test = std::move(full->test);
  full.reset();  // the other nodes' samples
  // The sampler shuffles positions, not values: position p now holds what shard[p] held.
  std::iota(job.shard.begin(), job.shard.end(), size_t{0});
  job.data = std::move(kept);
  return job;
}

ShardBatcher::ShardBatcher(const ml::Dataset& train, std::vector<size_t> shard, size_t batch,
                           uint64_t seed, ml::Augmentation augmentation)
    : train_(train),
      sampler_(std::move(shard), batch, seed),
      augmentation_(augmentation),
      seed_(seed),
      rng_(ml::mixSeed(seed, 0xBA7C)) {}

std::span<const size_t> ShardBatcher::nextIndices() {
  auto indices = epoch_ == 0 ? std::span<const size_t>() : sampler_.next();
  if (indices.empty()) {
    rng_ = ml::Rng(ml::mixSeed(seed_, 0xBA7C0000 + static_cast<uint64_t>(epoch_)));
    sampler_.startEpoch(epoch_++);
    indices = sampler_.next();
  }
  return indices;
}

void ShardBatcher::next(ml::Matrix& batch, std::vector<int32_t>& labels) {
  ml::gatherBatch(train_, nextIndices(), batch, labels, augmentation_, rng_);
}

void ShardBatcher::skip(size_t batches) {
  // The augmentation generator advances as if the batches were gathered, so the batches after
  // the skipped ones get the crops and flips an uninterrupted run gives them.
  const bool augment = ml::augments(augmentation_, train_);
  for (size_t i = 0; i < batches; ++i) {
    const size_t samples = nextIndices().size();
    for (size_t s = 0; augment && s < samples; ++s)
      (void)ml::drawAugmentation(augmentation_, rng_);
  }
}

}  // namespace chorus::run
