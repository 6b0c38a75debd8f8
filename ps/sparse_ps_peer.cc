#include "ps/sparse_ps_peer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <numeric>
#include <stdexcept>

#include "ml/metrics.h"
#include "ml/rng.h"
#include "node/node.h"
#include "ps/cut_rows.h"
#include "ps/rotation.h"
#include "ps/rotation_driver.h"
#include "run/cluster_checkpoint.h"

namespace chorus::ps {

using SteadyClock = std::chrono::steady_clock;

namespace {

double secondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// The owners' rule: the single-node optimizer's, applied to each worker's push as it comes (a
// worker's step is a whole step, as one node's: push scale 1).
std::shared_ptr<const UpdatePolicy> ownerPolicy(const ml::SparseOptimizerConfig& config) {
  ml::LrSchedule schedule;
  schedule.kind = ml::LrSchedule::Kind::kConstant;
  schedule.baseLr = config.lr;
  if (config.kind == ml::SparseOptimizerKind::kAdagrad) {
    return std::make_shared<AdagradPolicy>(
        AdagradConfig{.schedule = schedule,
                      .push_scale = 1.0,
                      .epsilon = config.epsilon,
                      .initial_accumulator = config.initialAccumulator});
  }
  OwnerOptimizer sgd;
  sgd.sgd.momentum = 0.0;
  sgd.sgd.weightDecay = 0.0;
  sgd.schedule = schedule;
  sgd.push_scale = 1.0;
  return std::make_shared<SgdPolicy>(sgd);
}

// --bandwidth applies to the rows at their homes (classic) under a finite bound: the owners push
// their changed rows into every worker's copy (docs/managed-comm.md, "Sparse rows").
bool managesRows(const SparsePsOptions& options, const Staleness& staleness) {
  return options.ps.bandwidth_mbps > 0 && options.technique == SparseTechnique::kClassic &&
         !staleness.infinite();
}

}  // namespace

void validateSparsePsOptions(const SparsePsOptions& options) {
  validatePsOptions(options.ps);
  ml::validateSparseTrainOptions(options.train);
  const ml::SparseTrainOptions& t = options.train;
  if (t.timeLimitSeconds > 0 && options.rotation_blocks > 0) {
    // A node that stops early would leave the others waiting at the next sub-epoch barrier.
    throw std::invalid_argument("--time-limit does not apply with --mf-schedule rotation");
  }
  if (!t.savePath.empty() || !t.resumePath.empty()) {
    throw std::invalid_argument(
        "--save and --resume are not supported for sparse models in PS "
        "mode yet");
  }
  if (options.ps.rejoin) {
    throw std::invalid_argument("--rejoin is not supported for sparse models in PS mode yet");
  }
  const double syncs = options.replication.syncs_per_second;
  if (!(syncs >= 0 && syncs <= 1000)) {
    throw std::invalid_argument(fmt::format(
        "--replica-syncs-per-s {}: a rate from 0 (sync only at the end) to 1000", syncs));
  }
  if (options.rotation_blocks > 0 && options.technique != SparseTechnique::kLapse) {
    throw std::invalid_argument(fmt::format(
        "--mf-schedule rotation moves whole column blocks by relocation and runs with --technique "
        "lapse, not {}{}",
        sparseTechniqueName(options.technique),
        options.technique == SparseTechnique::kNups
            ? " (a replicated hot column would be updated by every worker at once, which the "
              "schedule exists to prevent)"
            : ""));
  }
  const bool cuts = options.cuts.every > 0 || options.cuts.resumed;
  if (cuts && options.technique != SparseTechnique::kClassic &&
      options.technique != SparseTechnique::kLapse) {
    throw std::invalid_argument(fmt::format(
        "--checkpoint-every and --resume DIR take sparse PS runs with --technique classic or "
        "lapse; {}'s replicas are not written into a cut yet",
        sparseTechniqueName(options.technique)));
  }
  if (cuts && options.rotation_blocks > 0) {
    throw std::invalid_argument(
        "--checkpoint-every and --resume DIR do not take --mf-schedule rotation yet (its column "
        "blocks are on their way between workers at an epoch's end)");
  }
  if (cuts && options.train.timeLimitSeconds > 0) {
    throw std::invalid_argument(
        "--time-limit does not take --checkpoint-every or --resume DIR yet in sparse PS runs (a "
        "node that stops early would leave the others waiting at the next cut)");
  }
  if (options.cuts.resumed && options.train.keepBest) {
    throw std::invalid_argument(
        "--keep-best does not take --resume DIR yet in sparse PS runs (the best tables before "
        "the cut are not in it)");
  }
  if (cuts && options.sampling) {
    throw std::invalid_argument(
        "--checkpoint-every and --resume DIR do not take --sample-scheme yet (its pools and "
        "localized samples would be lost at a cut)");
  }
  if (options.sampling) {
    if (std::optional<std::string> error = sampling::checkSampleOptions(*options.sampling)) {
      throw std::invalid_argument(fmt::format("--sample-scheme: {}", *error));
    }
  }
}

double SparsePsReport::sampleLocalShare() const {
  if (!sampling || sampling->scheme.handed_out == 0) return 0.0;
  return static_cast<double>(sampling->scheme.local) /
         static_cast<double>(sampling->scheme.handed_out);
}

double SparsePsReport::localShare() const {
  const uint64_t all = worker.keys_local + worker.keys_remote;
  return all > 0 ? static_cast<double>(worker.keys_local) / static_cast<double>(all) : 0.0;
}

int64_t sparseClocksPerEpoch(size_t points, size_t workers, size_t batch) {
  const size_t largest = (points + workers - 1) / workers;
  return static_cast<int64_t>(std::max<size_t>(1, (largest + batch - 1) / batch));
}

std::span<const size_t> sparseClockBatch(std::span<const size_t> order, int64_t clock,
                                         int64_t clocks) {
  // n * clock stays below 2^64 for any data set and clock count this code can hold.
  const uint64_t n = order.size();
  const auto begin =
      static_cast<size_t>(n * static_cast<uint64_t>(clock) / static_cast<uint64_t>(clocks));
  const auto end =
      static_cast<size_t>(n * static_cast<uint64_t>(clock + 1) / static_cast<uint64_t>(clocks));
  return order.subspan(begin, end - begin);
}

SparsePsPeer::SparsePsPeer(node::Node& node, ml::SparseWorkload& workload,
                           std::vector<size_t> shard, std::vector<NodeId> members,
                           SparsePsOptions options)
    : node_(node),
      workload_(workload),
      tables_(workload.tables()),
      shard_(std::move(shard)),
      members_(std::move(members)),
      options_(std::move(options)),
      staleness_((validateSparsePsOptions(options_), options_.ps.staleness)),
      map_(members_),
      space_(sparseKeySpace(tables_)),
      membership_(node.id(), members_) {
  std::sort(members_.begin(), members_.end());
  const size_t rank = static_cast<size_t>(std::find(members_.begin(), members_.end(), node_.id()) -
                                          members_.begin());
  if (options_.rotation_blocks > 0) {
    // The blocks from the data: table 0's row and table 1's column of every training point.
    std::vector<std::vector<ml::RowKey>> point_rows(tables_.size());
    std::vector<size_t> all(workload_.trainPoints());
    std::iota(all.begin(), all.end(), size_t{0});
    workload_.pointRows(all, point_rows);
    if (tables_.size() != 2 || point_rows[0].size() != all.size() ||
        point_rows[1].size() != all.size()) {
      throw std::invalid_argument(fmt::format(
          "--mf-schedule rotation applies to matrix factorization (one row and one column per "
          "point); {} is not",
          workload_.spec()));
    }
    const std::vector<uint64_t> rows(point_rows[0].begin(), point_rows[0].end());
    const std::vector<uint64_t> cols(point_rows[1].begin(), point_rows[1].end());
    rotation_plan_ =
        std::make_unique<RotationPlan>(rows, cols, tables_[0]->rows(), tables_[1]->rows(),
                                       options_.rotation_blocks, options_.train.batchSize);
    if (!rotation_plan_->fitsWorkers(members_.size())) {
      throw std::invalid_argument(
          fmt::format("--mf-schedule rotation: {} blocks cannot be shared by {} workers",
                      options_.rotation_blocks, members_.size()));
    }
    shard_ = rotation_plan_->shardOf(rank, members_.size());
    // No two workers share a row within a sub-epoch: reads need no bound, and the sub-epoch
    // barrier (ps/rotation_driver.h) is the synchronization. The start event says so ("inf").
    staleness_ = Staleness{Staleness::kInfinite};
    clocks_per_epoch_ = rotation_plan_->clocksPerEpoch(members_.size());
  } else {
    clocks_per_epoch_ =
        sparseClocksPerEpoch(workload_.trainPoints(), members_.size(), options_.train.batchSize);
  }
  const Clock total_clocks = options_.train.epochs * clocks_per_epoch_;

  // This node's rows, from its copy of the model (every node's is the seed's).
  const std::shared_ptr<const UpdatePolicy> policy = ownerPolicy(options_.train.optimizer);
  KeyStore store(space_, policy);
  const KeyDirectory directory(map_, space_);
  for (size_t t = 0; t < tables_.size(); ++t) {
    const KeyTable& table = space_.tables()[t];
    for (Key key = table.first; key < table.end(); ++key) {
      if (directory.owner(key) != node_.id()) continue;
      const float* row = tables_[t]->row(key - table.first);
      KeyEntry entry;
      entry.values.assign(row, row + table.row_floats);
      if (std::optional<std::string> error = store.insert(key, std::move(entry))) {
        throw std::logic_error(fmt::format("sparse PS: {}", *error));
      }
    }
  }
  owned_at_start_ = store.size();
  cut_keys_ = store.ownedKeys();
  if (options_.cuts.resumed) restoreCut(store);
  localizing_ = std::make_shared<LocalizeCount>();
  RowAccessSetup setup;
  setup.map = &map_;
  setup.members = members_;
  setup.staleness = staleness_;
  // Each cut adds one empty clock (takeCut).
  const int64_t cuts = options_.cuts.every > 0 ? options_.train.epochs / options_.cuts.every : 0;
  setup.max_clock = total_clocks + cuts + 1;
  setup.ps = &options_.ps;
  if (options_.technique == SparseTechnique::kNups) {
    ReplicaChoice choice = chooseHotKeys(space_, options_.replication, *policy);
    replica_share_ = choice.share;
    node_.logger().info("nups: {}{}", formatReplicaChoice(choice),
                        options_.replication.replicate ? " (--replicate)" : "");
    setup.replicas = replicaSetup(std::move(choice.keys), policy);
    std::vector<TableAccesses>().swap(options_.replication.accesses);  // read only for the choice
  } else if (options_.technique == SparseTechnique::kAuto) {
    // Every node's shard's expected accesses decide each key's technique (the same on every
    // node).
    if (options_.replication.node_accesses.size() != members_.size()) {
      throw std::invalid_argument(fmt::format(
          "--technique auto needs every node's expected accesses: {} given for {} nodes",
          options_.replication.node_accesses.size(), members_.size()));
    }
    TechniqueChoice choice = chooseAutoTechniques(space_, options_.replication, *policy,
                                                  clocks_per_epoch_, total_clocks);
    replica_share_ = choice.replicated_share;
    relocated_keys_ = choice.relocated.size();
    home_keys_ = choice.home;
    node_.logger().info("{}", formatTechniqueChoice(choice));
    setup.replicas = replicaSetup(std::move(choice.replicated), policy);
    setup.replicas.technique = SparseTechnique::kAuto;
    setup.relocated = std::move(choice.relocated);
    // Every node's expected accesses (a double per key and node) decided the choice and are
    // not read again: not kept for the whole run.
    std::vector<std::vector<TableAccesses>>().swap(options_.replication.node_accesses);
  }
  if (managesRows(options_, staleness_)) {
    // Every worker's copy of the rows starts from the model every node starts from.
    setup.managed_model.resize(space_.total());
    gatherTables(space_, tables_, setup.managed_model);
  } else if (options_.ps.bandwidth_mbps > 0) {
    node_.logger().warn(
        "--bandwidth {} is ignored: managed communication covers the rows at their homes "
        "(--technique classic) under a finite --staleness, not {}{}",
        options_.ps.bandwidth_mbps, sparseTechniqueName(options_.technique),
        staleness_.infinite() ? " with an infinite bound" : "");
  }
  access_ = makeSparseRowAccess(options_.technique, node_, std::move(store), setup);
  ahead_rows_.resize(tables_.size());
  ahead_keys_ = std::make_unique<StepKeys>(space_);
  barrier_ = std::make_unique<PsRunBarrier>(node_, access_->runHooks(), membership_,
                                            options_.ps.tick_every);
  if (rotation_plan_) {
    rotation_ = std::make_unique<RotationDriver>(*rotation_plan_, *access_, space_, rank, members_,
                                                 options_.train.seed, options_.rotation_barrier,
                                                 node_.logger());
  }

  if (options_.sampling) {
    const std::optional<size_t> sampled = workload_.sampledTable();
    if (!sampled || *sampled >= tables_.size()) {
      throw std::invalid_argument(
          fmt::format("--sample-scheme applies to models that sample rows (KGE's negatives); {} "
                      "samples none",
                      workload_.spec()));
    }
    const KeyTable& table = space_.tables()[*sampled];
    sample_pi_ = std::make_unique<sampling::NegativeSampler>(
        sampling::NegativeSampler::uniform(table.first, table.end()));
    // Through the technique's own data path: its localize and its locality, whatever it is. A
    // pool group spans `reuse` steps' samples (a step's negatives are one sample).
    sampling::SampleSchemeOptions scheme = *options_.sampling;
    scheme.group_size =
        sampling::poolGroupSize(workload_.sampledRowsPerStep(options_.train.batchSize), scheme);
    sampler_ =
        std::make_unique<SampleWorker>(*access_, space_, *sample_pi_, scheme,
                                       sampling::workerSeed(options_.train.seed, node_.id()));
  }
}

SparsePsPeer::~SparsePsPeer() = default;

ReplicaSetup SparsePsPeer::replicaSetup(std::vector<Key> keys,
                                        std::shared_ptr<const UpdatePolicy> policy) {
  ReplicaSetup setup;
  // The seed's values, the same on every node.
  for (Key key : keys) {
    const KeyTable* table = space_.tableOf(key);
    const auto t = static_cast<size_t>(table - space_.tables().data());
    const float* row = tables_[t]->row(key - table->first);
    setup.initial.insert(setup.initial.end(), row, row + table->row_floats);
  }
  setup.keys = std::move(keys);
  setup.policy = std::move(policy);
  setup.syncs_per_second = options_.replication.syncs_per_second;
  return setup;
}

void SparsePsPeer::stop() {
  membership_.stop();
  barrier_->tickNow();
  access_->cancelAll({node::ErrorCode::kShutdown, "stopped"});
}

void SparsePsPeer::settlePush() {
  if (!pending_push_) return;
  const node::Status status = access_->wait(*pending_push_);
  pending_push_.reset();
  if (!status.ok() && status.code() != node::ErrorCode::kShutdown) {
    if (report_.failed_pushes++ == 0) {
      node_.logger().warn("a push was lost: {} (later losses are only counted)", status.message());
    }
  }
}

struct LocalizeCount {
  std::mutex mu;
  std::condition_variable done;
  uint64_t pending = 0;
};

void SparsePsPeer::waitLocalizes() {
  std::unique_lock lock(localizing_->mu);
  while (localizing_->pending > 0 && !membership_.stopped()) {
    localizing_->done.wait_for(lock, std::chrono::milliseconds(100));
  }
}

void SparsePsPeer::localizeAhead(std::span<const size_t> points) {
  if (points.empty()) return;
  for (std::vector<ml::RowKey>& rows : ahead_rows_)
    rows.clear();
  workload_.pointRows(points, ahead_rows_);
  ahead_keys_->assign(ahead_rows_);
  if (ahead_keys_->keys().empty()) return;
  // Not waited for: a failed localize is harmless (the rows are read where they are), and the
  // shell counts it.
  {
    std::lock_guard lock(localizing_->mu);
    ++localizing_->pending;
  }
  access_->localize(ahead_keys_->keys(), [count = localizing_](const node::Status&) {
    std::lock_guard lock(count->mu);
    --count->pending;
    count->done.notify_all();
  });
}

bool SparsePsPeer::pullModel(std::optional<Clock> min_clock) {
  std::vector<Key> keys = space_.allKeys();
  std::vector<float> flat(space_.total());
  const node::Status status = min_clock ? access_->wait(access_->pullAt(*min_clock, keys, flat))
                                        : access_->wait(access_->pull(keys, flat));
  if (!status.ok()) {
    if (!membership_.stopped()) {
      node_.logger().warn("could not read the owners' model: {}", status.message());
    }
    return false;
  }
  scatterTables(space_, flat, tables_);
  return true;
}

bool SparsePsPeer::sampleStep(Clock clock, Clock total, std::span<const size_t> batch,
                              size_t next_points) {
  const size_t n = workload_.sampledRowsPerStep(batch.size());
  std::optional<sampling::SampleId> id;
  if (prepared_ && prepared_->first == clock) id = prepared_->second;
  prepared_.reset();
  if (!id && n > 0) id = sampler_->prepareSample(n);
  // One step ahead: the next clock's sample is announced before this one is read, so that a
  // scheme that localizes has a step's time to do it.
  const size_t next = workload_.sampledRowsPerStep(next_points);
  if (clock + 1 < total && next > 0) prepared_.emplace(clock + 1, sampler_->prepareSample(next));

  bool ok = true;
  sample_.keys.clear();
  if (id) {
    const node::Status status = sampler_->pullSample(*id, n, sample_);
    if (!status.ok()) {
      if (sample_.keys.size() != n) {
        // onlylocal found no local key: the node holds too little of the table to sample from.
        throw std::runtime_error(
            fmt::format("clock {}: sampling failed: {}", clock, status.message()));
      }
      ok = false;
      ++report_.failed_pulls;
      if (status.message() != last_pull_error_ && !membership_.stopped()) {
        node_.logger().warn("clock {}: {}; training on with the last values of the sampled rows",
                            clock, status.message());
        last_pull_error_ = status.message();
      }
    }
  }
  const size_t t = *workload_.sampledTable();
  const KeyTable& table = space_.tables()[t];
  sample_rows_.resize(sample_.keys.size());
  for (size_t i = 0; i < sample_.keys.size(); ++i)
    sample_rows_[i] = sample_.keys[i] - table.first;
  workload_.drawStepWith(batch, sample_rows_);
  if (ok) {
    for (size_t i = 0; i < sample_rows_.size(); ++i) {
      const std::span<const float> row = sample_.row(i);
      std::copy(row.begin(), row.end(), tables_[t]->row(sample_rows_[i]));
    }
  }
  return ok;
}

SparsePsReport SparsePsPeer::run() {
  report_ = SparsePsReport{};
  const ml::SparseTrainOptions& train = options_.train;
  spdlog::logger& log = node_.logger();
  const NodeId self = node_.id();
  const bool reporter = self == members_.front();
  const size_t rank =
      static_cast<size_t>(std::find(members_.begin(), members_.end(), self) - members_.begin());
  report_.clocks_per_epoch = clocks_per_epoch_;
  report_.spec = workload_.spec();
  for (const ml::SparseTable* table : tables_)
    report_.parameters += table->values().size();
  const size_t owned = owned_at_start_;

  // A resumed cut (options_.cuts.resumed) continues the node's earlier life: its lines stay, and
  // the run starts at the cut's epoch with fresh SSP clocks on every node (each cut's own empty
  // clock shifts the SSP clock from the training clock: ssp_offset).
  const run::CutPlan& cuts = options_.cuts;
  const int64_t first_epoch = cuts.resumed ? cuts.resumed->header.cut : 0;
  ml::MetricsWriter metrics(train.metricsPath, /*append=*/cuts.resumed.has_value());
  for (const std::string& line : cuts.skipped)
    log.warn("{}", line);
  if (cuts.resumed) {
    log.info("resuming from cut {} ({}): epoch {} of {}", first_epoch, cuts.resumed_path,
             first_epoch + 1, train.epochs);
  }
  ml::MetricsEvent start("start");
  start.add("model", workload_.spec())
      .add("parameters", static_cast<uint64_t>(report_.parameters))
      .add("train_points", static_cast<uint64_t>(workload_.trainPoints()))
      .add("batch", static_cast<uint64_t>(train.batchSize))
      .add("optimizer", ml::sparseOptimizerName(train.optimizer.kind))
      .add("lr", train.optimizer.lr)
      .add("seed", train.seed)
      .add("start_epoch", first_epoch)
      .add("mode", "ps")
      .add("technique", sparseTechniqueName(options_.technique))
      .add("sample_scheme",
           options_.sampling ? sampling::sampleSchemeName(options_.sampling->kind) : "workload")
      .add("sample_reuse", static_cast<uint64_t>(options_.sampling ? options_.sampling->reuse : 0))
      .add("node", static_cast<uint64_t>(self))
      .add("workers", static_cast<uint64_t>(members_.size()))
      .add("staleness", staleness_.toString())
      .add("bandwidth_mbps", managesRows(options_, staleness_) ? options_.ps.bandwidth_mbps : 0.0)
      .add("shard_points", static_cast<uint64_t>(shard_.size()))
      .add("clocks_per_epoch", clocks_per_epoch_)
      .add("keys", static_cast<uint64_t>(space_.numKeys()))
      .add("owned_keys", static_cast<uint64_t>(owned));
  start.add("schedule", rotation_ ? "rotation" : "data-parallel");
  if (rotation_) {
    const RotationBalance balance = rotation_plan_->balance(members_.size());
    start.add("rotation_blocks", static_cast<uint64_t>(rotation_plan_->blocks()))
        .add("rotation_min_block", balance.min_block)
        .add("rotation_max_block", balance.max_block)
        .add("rotation_idle_share", balance.idle_share)
        .add("rotation_max_over_mean", balance.max_over_mean)
        .add("rotation_handoff_idle_share", balance.handoff_idle_share)
        .add("rotation_floor_idle_share", balance.floor_idle_share)
        .add("rotation_sync", options_.rotation_barrier ? "barrier" : "hand-off");
    report_.rotation = rotation_plan_->describe(members_.size());
    log.info("rotation: {}", report_.rotation);
  }
  if (replicates()) {
    start.add("replicated_keys", access_->stats().replicated_keys)
        .add("replica_share", replica_share_)
        .add("replica_syncs_per_s", options_.replication.syncs_per_second);
  }
  if (options_.technique == SparseTechnique::kAuto) {
    start.add("relocated_keys", static_cast<uint64_t>(relocated_keys_))
        .add("home_keys", static_cast<uint64_t>(home_keys_));
  }
  for (const auto& [key, value] : train.startFields)
    start.add(key, value);
  metrics.write(start);
  access_->startRun();
  log.info(
      "sparse ps: {} epochs of {} clocks on {} of {} points, model {} ({} rows as keys, {} "
      "owned here), staleness {}, {} workers",
      train.epochs, clocks_per_epoch_, shard_.size(), workload_.trainPoints(), workload_.spec(),
      space_.numKeys(), owned, staleness_.toString(), members_.size());

  std::vector<ml::SparseGradAccumulator> accumulators;
  for (const ml::SparseTable* table : tables_)
    accumulators.emplace_back(table->rows(), table->dim());
  std::vector<ml::SparseGrad> grads(tables_.size());
  std::vector<std::vector<ml::RowKey>> rows(tables_.size());
  StepKeys step_keys(space_);
  std::vector<float> pulled;
  std::vector<Key> push_keys;
  std::vector<float> push_floats;
  std::vector<size_t> order = shard_;
  const std::vector<std::string> splits = workload_.evalSplits();

  // Pushes in flight: one, except under managed communication, where the steps read their rows
  // from the copy and waiting for the last push's acknowledgement would cost each clock the
  // round trip the copy saved: up to s + 1 then (the bound does not depend on it: an owner
  // takes a worker's clock, sent after its pushes on the same connection, as the promise that
  // they are in). Without the copy a step's read waits a round trip anyway, by which time the
  // last push's acknowledgement (sent before the read's answer on that connection) is in.
  const size_t push_window =
      managesRows(options_, staleness_) ? static_cast<size_t>(staleness_.bound) + 1 : 1;
  std::deque<SparseRowAccess::Handle> pushes_out;
  const int64_t localize_ahead =
      options_.technique == SparseTechnique::kClassic || rotation_ ? 0 : options_.localize_ahead;
  Clock clock = first_epoch * clocks_per_epoch_;
  Clock ssp_offset = -clock;
  double window_loss = 0;
  size_t window_points = 0;
  int64_t points_seen = 0;
  RowAccessStats stats_before = access_->stats();
  SampleWorkerStats sample_before = sampler_ ? sampler_->stats() : SampleWorkerStats{};
  const Clock total_clocks = train.epochs * clocks_per_epoch_;
  const auto traffic = [this] { return node_.totals(); };
  // --keep-best (node 0): the tables of the best evaluation on the first split so far (empty:
  // none yet).
  std::vector<std::vector<float>> best_tables;
  double best_quality = 0;
  int64_t best_epoch = 0;
  const auto improves = [&](double quality) {
    return best_tables.empty() ||
           (workload_.higherIsBetter() ? quality > best_quality : quality < best_quality);
  };
  const auto keepIfBest = [&](double quality, int64_t epoch_number) {
    if (!train.keepBest || !improves(quality)) return;
    best_tables.resize(tables_.size());
    for (size_t t = 0; t < tables_.size(); ++t)
      best_tables[t].assign(tables_[t]->values().begin(), tables_[t]->values().end());
    best_quality = quality;
    best_epoch = epoch_number;
  };
  int64_t epoch = first_epoch;
  for (; epoch < train.epochs && !membership_.stopped(); ++epoch) {
    const bool cut_after = cuts.cutAt(epoch + 1, train.epochs);
    // Each worker's order of an epoch depends only on (seed, epoch, its rank); its sampling
    // stream too, so that a run is repeatable.
    std::copy(shard_.begin(), shard_.end(), order.begin());
    ml::Rng shuffle(
        ml::mixSeed(train.seed, 0x5EED1000 + static_cast<uint64_t>(epoch) * 4096 + rank));
    shuffle.shuffle(order.begin(), order.end());
    ml::Rng rng(ml::mixSeed(train.seed, 0x5EED0000 + static_cast<uint64_t>(epoch) * 4096 + rank));
    const auto epoch_start = SteadyClock::now();
    double epoch_wait = 0;
    double epoch_loss = 0;
    size_t epoch_points = 0;
    SteadyClock::duration compute{};
    for (int64_t c = 0; c < clocks_per_epoch_; ++c, ++clock) {
      // Rotation: the clock's slice of its block, after the sub-epoch barrier and the start of the
      // column blocks' move at a sub-epoch's first clock (ps/rotation_driver.h).
      const double barrier_before = rotation_ ? rotation_->barrierSeconds() : 0.0;
      const std::span<const size_t> batch = rotation_
                                                ? rotation_->beginClock(epoch, c, clock)
                                                : sparseClockBatch(order, c, clocks_per_epoch_);
      if (rotation_) epoch_wait += rotation_->barrierSeconds() - barrier_before;
      if (membership_.stopped()) break;
      // 0. Localize ahead (lapse): the rows of the data points of the clock localize_ahead
      // clocks on start moving here now, so that they are local when that clock reads them
      // (at the start of an epoch, the clocks before it as well).
      if (localize_ahead > 0) {
        for (int64_t a = c == 0 ? 0 : c + localize_ahead; a <= c + localize_ahead; ++a) {
          if (a < clocks_per_epoch_) localizeAhead(sparseClockBatch(order, a, clocks_per_epoch_));
        }
      }
      if (!batch.empty()) {
        // 1. The rows the step touches (its draws first), 2. read exactly those. With a sample
        // scheme the sampled rows come, values included, from pullSample, and the step reads
        // the others.
        if (sampler_) {
          const auto sample_start = SteadyClock::now();
          const size_t next_points =
              sparseClockBatch(order, (c + 1) % clocks_per_epoch_, clocks_per_epoch_).size();
          sampleStep(clock, total_clocks, batch, next_points);
          epoch_wait += secondsSince(sample_start);
          if (membership_.stopped()) break;
          workload_.stepRowsUnsampled(rows);
        } else {
          workload_.drawStep(batch, rng);
          workload_.stepRows(rows);
        }
        step_keys.assign(rows);
        pulled.resize(step_keys.floats());
        const auto read_start = SteadyClock::now();
        const node::Status status = access_->wait(access_->pull(step_keys.keys(), pulled));
        epoch_wait += secondsSince(read_start);
        if (membership_.stopped()) break;
        if (status.ok()) {
          step_keys.scatter(pulled, tables_);
        } else {
          ++report_.failed_pulls;
          if (status.message() != last_pull_error_) {
            log.warn("clock {}: {}; training on with the last values of those rows", clock,
                     status.message());
            last_pull_error_ = status.message();
          }
        }
        report_.rows_pulled += step_keys.keys().size();
        if (options_.on_pull) options_.on_pull(clock, step_keys.keys());
        // 3. The gradient, with the workload's own code.
        const auto compute_start = SteadyClock::now();
        const double loss = workload_.computeDrawnGradients(accumulators);
        compute = SteadyClock::now() - compute_start;
        if (!std::isfinite(loss)) {
          throw std::runtime_error(fmt::format(
              "training diverged (loss {}) at epoch {}, clock {}{}", loss, epoch + 1, clock,
              last_pull_error_.empty()
                  ? std::string(": lower --lr")
                  : fmt::format(" after a read failed ({})", last_pull_error_)));
        }
        // 4. Push the sparse gradient (at most `push_window` pushes in flight).
        while (pushes_out.size() >= push_window) {
          pending_push_ = pushes_out.front();
          pushes_out.pop_front();
          settlePush();
        }
        push_keys.clear();
        push_floats.clear();
        for (size_t t = 0; t < tables_.size(); ++t) {
          accumulators[t].finish(grads[t]);
          appendGrad(space_.tables()[t], grads[t], push_keys, push_floats);
        }
        report_.rows_pushed += push_keys.size();
        pushes_out.push_back(access_->push(push_keys, push_floats));
        epoch_loss += loss * static_cast<double>(batch.size());
        epoch_points += batch.size();
        window_loss += loss * static_cast<double>(batch.size());
        window_points += batch.size();
      }
      // --stragglers: the step's extra time, before the clock ends (as a slower step would).
      if (options_.after_step) {
        options_.after_step(std::chrono::duration_cast<std::chrono::nanoseconds>(compute));
        compute = {};
      }
      // 5. End the clock (before a cut, once the rows this worker moves arrived: barrier A
      // then says no row is on its way).
      if (cut_after && c + 1 == clocks_per_epoch_) waitLocalizes();
      access_->clock();
      if ((clock + 1) % train.logEverySteps == 0 && window_points > 0) {
        const RowAccessStats stats = access_->stats();
        const node::PeerStats bytes = traffic();
        const double elapsed = secondsSince(epoch_start);
        metrics.write(ml::MetricsEvent("step")
                          .add("epoch", epoch + 1)
                          .add("step", clock + 1)
                          .add("loss", window_loss / static_cast<double>(window_points))
                          .add("lr", train.optimizer.lr)
                          .add("points_per_s",
                               elapsed > 0 ? static_cast<double>(epoch_points) / elapsed : 0.0)
                          .add("keys_local", stats.keys_local - stats_before.keys_local)
                          .add("keys_remote", stats.keys_remote - stats_before.keys_remote)
                          .add("bytes_out", bytes.bytes_out)
                          .add("bytes_in", bytes.bytes_in));
        if (sampler_) {
          // The window's sampled keys, of which local, and sampled keys read remotely.
          const SampleWorkerStats now = sampler_->stats();
          metrics.write(
              ml::MetricsEvent("sample")
                  .add("epoch", epoch + 1)
                  .add("step", clock + 1)
                  .add("sampled_keys", now.scheme.handed_out - sample_before.scheme.handed_out)
                  .add("sampled_local", now.scheme.local - sample_before.scheme.local)
                  .add("sampled_remote_keys", now.remote_keys - sample_before.remote_keys));
          sample_before = now;
        }
        stats_before = stats;
        window_loss = 0;
        window_points = 0;
      }
    }
    if (membership_.stopped()) break;
    const double seconds = secondsSince(epoch_start);
    report_.train_seconds += seconds;
    report_.wait_seconds += epoch_wait;
    points_seen += static_cast<int64_t>(epoch_points);
    const double mean_loss = epoch_loss / static_cast<double>(std::max<size_t>(epoch_points, 1));
    report_.epoch_losses.push_back(mean_loss);
    const node::PeerStats bytes = traffic();
    ml::MetricsEvent event("epoch");
    event.add("epoch", epoch + 1)
        .add("step", clock)
        .add("loss", mean_loss)
        .add("epoch_seconds", seconds)
        .add("train_seconds", report_.train_seconds)
        .add("wait_seconds", epoch_wait)
        .add("points_per_s", seconds > 0 ? static_cast<double>(epoch_points) / seconds : 0.0)
        .add("bytes_out", bytes.bytes_out)
        .add("bytes_in", bytes.bytes_in);
    std::string line = fmt::format(
        "epoch {}/{}: train loss {:.4f} (this worker) | {:.1f} s ({:.1f} s waiting for reads), "
        "{:.0f} points/s",
        epoch + 1, train.epochs, mean_loss, seconds, epoch_wait,
        seconds > 0 ? static_cast<double>(epoch_points) / seconds : 0.0);
    const bool last = epoch + 1 == train.epochs;
    if (reporter && !splits.empty() && train.evalEvery > 0 && (epoch + 1) % train.evalEvery == 0 &&
        !last) {
      const auto eval_start = SteadyClock::now();
      if (pullModel(std::nullopt)) {
        const std::vector<ml::NamedMetric> quality = workload_.evaluate(splits.front());
        const double eval_seconds = secondsSince(eval_start);
        if (!quality.empty()) {
          report_.epoch_quality.emplace_back(epoch + 1, quality.front().value);
          keepIfBest(quality.front().value, epoch + 1);
        }
        ml::addMetrics(event, splits.front() + "_", quality);
        event.add("eval_seconds", eval_seconds);
        line += fmt::format(" | {}: {} ({:.1f} s)", splits.front(), ml::formatMetrics(quality),
                            eval_seconds);
      }
    }
    metrics.write(event);
    log.info("{}", line);
    if (cut_after && !membership_.stopped()) {
      if (!takeCut(epoch + 1, clock + ssp_offset)) break;
      ++ssp_offset;
    }
    if (train.timeLimitSeconds > 0 && report_.train_seconds >= train.timeLimitSeconds && !last) {
      // This worker trains no more. Its remaining clocks end at once, without steps or pushes:
      // the other workers' reads never wait for it, and node 0's final read (at the last clock)
      // then holds everything the others pushed.
      log.info(
          "--time-limit {} s reached after epoch {} ({:.1f} s of training): stopping; this "
          "worker's remaining {} clocks end without steps",
          train.timeLimitSeconds, epoch + 1, report_.train_seconds, total_clocks - clock);
      report_.time_limited = true;
      ++epoch;
      break;
    }
  }
  for (SparseRowAccess::Handle handle : pushes_out) {
    pending_push_ = handle;
    settlePush();
  }
  const Clock trained_clocks = clock;
  if (report_.time_limited) {
    for (; clock < total_clocks && !membership_.stopped(); ++clock)
      access_->clock();
  }
  if (!membership_.stopped()) {
    // nups: the replicas take in every live node's last pushes before node 0 reads them.
    const node::Status drained = access_->finishPushes(options_.ps.finish_timeout);
    if (!drained.ok())
      log.warn("{}; the hot rows read at the end may miss pushes", drained.message());
  }
  const node::PeerStats clock_bytes = traffic();
  report_.clock_bytes_out = clock_bytes.bytes_out;
  report_.clock_bytes_in = clock_bytes.bytes_in;
  report_.stopped = membership_.stopped();
  report_.epochs_done = epoch;
  report_.clocks_done = trained_clocks;
  report_.evaluated_epoch = epoch;
  report_.points_per_second =
      report_.train_seconds > 0 ? static_cast<double>(points_seen) / report_.train_seconds : 0.0;

  ml::MetricsEvent summary("summary");
  if (!report_.stopped) {
    // Node 0: the owners' model once every worker's last push is in (workers announce a clock
    // after pushing it, on the same connection), evaluated on every split.
    if (reporter) {
      log.info("reading the owners' model after clock {} of every worker", clock);
      if (pullModel(clock + ssp_offset)) {
        // --keep-best: the last epoch was not evaluated yet; if it is not better on the first
        // split than the best kept one, the kept tables are evaluated instead.
        if (!best_tables.empty() && !splits.empty()) {
          const std::vector<ml::NamedMetric> last = workload_.evaluate(splits.front());
          if (!last.empty() && !improves(last.front().value)) {
            for (size_t t = 0; t < tables_.size(); ++t)
              std::copy(best_tables[t].begin(), best_tables[t].end(), tables_[t]->values().begin());
            report_.evaluated_epoch = best_epoch;
            log.info(
                "--keep-best: evaluating the tables of epoch {} ({} {} {:.4f}; epoch {}: {:.4f})",
                best_epoch, splits.front(), last.front().name, best_quality, epoch,
                last.front().value);
          }
        }
        report_.final = ml::evaluateSplitsInto(workload_, splits, summary);
      }
    }
    // Everyone keeps serving its rows until every other member is done or gone.
    run::SettleOptions settle;
    settle.timeout = options_.ps.finish_timeout;
    settle.report_every = options_.ps.report_every;
    run::PeerSettlement settled = barrier_->finish(clock + ssp_offset, settle);
    report_.finished_peers = std::move(settled.finished);
    report_.departed_peers = std::move(settled.departed);
    if (!report_.departed_peers.empty()) {
      log.warn("node(s) {} left before the end of training; the rows they owned are lost",
               fmt::join(report_.departed_peers, ", "));
    }
  }
  report_.access = access_->stats();
  report_.technique = options_.technique;
  report_.replica_share = replica_share_;
  report_.worker.keys_local = report_.access.keys_local;
  report_.worker.keys_remote = report_.access.keys_remote;
  if (const KvWorker* worker = access_->kvWorker()) report_.worker = worker->stats();
  if (const KvServer* server = access_->kvServer()) report_.server = server->summary();
  if (sampler_) report_.sampling = sampler_->stats();
  if (rotation_) {
    report_.barrier_seconds = rotation_->barrierSeconds();
    report_.barriers = rotation_->barriers();
    summary.add("barrier_seconds", report_.barrier_seconds).add("barriers", report_.barriers);
  }
  const node::PeerStats bytes = traffic();
  report_.bytes_out = bytes.bytes_out;
  report_.bytes_in = bytes.bytes_in;
  ml::addSparseRunSummary(summary, {.epochs = report_.epochs_done,
                                    .steps = report_.clocks_done,
                                    .train_seconds = report_.train_seconds,
                                    .wait_seconds = report_.wait_seconds,
                                    .points_per_s = report_.points_per_second,
                                    .bytes_out = report_.bytes_out,
                                    .bytes_in = report_.bytes_in,
                                    .stopped = report_.stopped});
  summary.add("rows_pulled", report_.rows_pulled)
      .add("rows_pushed", report_.rows_pushed)
      .add("keys_local", report_.worker.keys_local)
      .add("keys_remote", report_.worker.keys_remote)
      .add("local_share", report_.localShare())
      .add("sampled_keys", report_.sampling ? report_.sampling->scheme.handed_out : 0)
      .add("sampled_local_share", report_.sampleLocalShare())
      .add("sampled_remote_keys", report_.sampling ? report_.sampling->remote_keys : 0)
      .add("clock_bytes_out", report_.clock_bytes_out)
      .add("clock_bytes_in", report_.clock_bytes_in)
      .add("failed_pulls", report_.failed_pulls)
      .add("failed_pushes", report_.failed_pushes)
      .add("localized_keys", report_.access.localized)
      .add("localize_failed", report_.access.localize_failed)
      .add("held_keys", report_.access.held_keys);
  if (options_.technique == SparseTechnique::kAuto) {
    // The keys left at their homes: reads and writes served by the classic path.
    summary.add("keys_home", report_.access.keys_home);
  }
  if (replicates()) {
    // The replicas: how many, how much they served, the sync's work, their age during the
    // clocks, and their digest once drained (equal on every node that drained).
    const RowAccessStats& a = report_.access;
    summary.add("replicated_keys", a.replicated_keys)
        .add("replica_keys", a.keys_replica)
        .add("replica_rounds", a.replica_rounds)
        .add("replica_lost_deltas", a.replica_lost_deltas)
        .add("replica_bytes_out", a.replica_bytes_sent)
        .add("replica_staleness_mean_s", a.replica_staleness_mean_s)
        .add("replica_staleness_max_s", a.replica_staleness_max_s)
        .add("replica_digest", fmt::format("{:016x}", a.replica_digest));
  }
  if (managesRows(options_, staleness_)) {
    // Managed communication: what the owners pushed, and the share of the steps' row reads the
    // pushed rows served.
    const RowAccessStats& a = report_.access;
    const uint64_t reads = a.cache_hits + a.cache_misses;
    summary.add("managed_frames", a.managed_frames)
        .add("managed_rows_sent", a.managed_rows_sent)
        .add("managed_bytes", a.managed_bytes)
        .add("managed_rows_received", a.managed_rows_received)
        .add("managed_refused", a.managed_refused)
        .add("cache_hit_rate",
             reads > 0 ? static_cast<double>(a.cache_hits) / static_cast<double>(reads) : 0.0);
  }
  metrics.write(summary);
  return report_;
}

}  // namespace chorus::ps
