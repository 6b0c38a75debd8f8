#include "cli/sparse_node.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "cli/commands.h"
#include "faults/straggler.h"
#include "ml/dataset.h"
#include "ml/kge_workload.h"
#include "ml/mf_workload.h"
#include "ml/ratings.h"
#include "ml/sharding.h"
#include "ml/sparse_stats.h"
#include "ml/triples.h"
#include "node/node.h"
#include "ps/sparse_ps_peer.h"
#include "run/cluster_checkpoint.h"

namespace chorus::cli {

namespace {

namespace defaults = sparse_defaults;

// The flags of chorus node that a sparse model does not take yet, and why (kForSparsePs: those
// that sparse PS mode takes, sparse consensus not yet).
const std::vector<std::pair<std::string, std::string>> kNotForSparse = {
    {"--rounds", "a sparse run is measured in --epochs"},
    {"--eval-every",
     "it counts steps; a sparse model evaluates every N epochs: --eval-every-epochs"},
    {"--target-acc", "an image model's accuracy target"},
    {"--save",
     "a sparse cluster checkpoints itself whole: --checkpoint-every N epochs, resumed with "
     "--resume DIR"},
    {"--stragglers", "straggler injection is not wired into sparse consensus runs yet"},
    {"--rejoin", "a sparse PS node cannot rejoin yet (a consensus node can)"},
    {"--key-floats", "a sparse model's key is one embedding row"},
    {"--no-cache", "sparse PS workers read every row from its owner"},
    {"--owner-momentum", "sparse models train with --optimizer adagrad or sgd"},
    {"--async-rounds", "a sparse run is measured in --epochs"},
    {"--keep-best", "model selection is not implemented in sparse consensus runs yet"},
    {"--time-limit", "a time limit is not implemented in sparse consensus runs yet"},
    {"--write-data", "chorus train --model mf writes the data"}};

// Taken by sparse PS runs (docs/sparse-ps.md, "Run options"); refused with sparse consensus.
const std::vector<std::string> kForSparsePs = {"--stragglers", "--keep-best", "--time-limit"};

// --technique nups's flags (docs/ps-replication.md).
const std::vector<std::string> kReplicaFlags = {"--replicate", "--replica-bytes",
                                                "--replica-syncs-per-s"};

// Sparse consensus's own flags (docs/sparse-consensus.md).
const std::vector<std::string> kGossipFlags = {"--cold-every", "--round-bytes", "--hot-bytes",
                                               "--relay-hops", "--dense-exchange"};

bool given(const SparseNodeArgs& sparse, const std::string& flag) {
  return sparse.given.count(flag) > 0;
}

void refuse(const SparseNodeArgs& sparse, const std::vector<std::string>& flags,
            const std::string& model, const std::string& why) {
  for (const std::string& flag : flags) {
    if (given(sparse, flag)) {
      throw CommandFailure(
          2, fmt::format("{} does not apply to --model {} ({}); see chorus node --help", flag,
                         model, why));
    }
  }
}

bool isMf(const std::string& model) {
  return model == "mf";
}

// The data set: --data, or the model's default (wn18rr, zipf-mf) when --data was not given.
std::string dataName(const run::RunOptions& run, const SparseNodeArgs& sparse) {
  if (given(sparse, "--data")) return run.data.name;
  return isMf(run.model.name) ? "zipf-mf" : "wn18rr";
}

int64_t epochsOf(const run::RunOptions& run, const SparseNodeArgs& sparse) {
  if (isMf(run.model.name) && !given(sparse, "--epochs")) return defaults::kMfEpochs;
  if (run.epochs < 1 || run.epochs != std::floor(run.epochs) || run.epochs > 1e6) {
    throw CommandFailure(2, fmt::format("--epochs {}: a sparse model trains whole epochs (a "
                                        "count from 1)",
                                        run.epochs));
  }
  return static_cast<int64_t>(run.epochs);
}

// The trainer's settings, as chorus train takes them.
ml::SparseTrainOptions trainOptions(const run::RunOptions& run, const SparseNodeArgs& sparse) {
  const SparseFlags& f = sparse.flags;
  ml::SparseTrainOptions train;
  train.epochs = epochsOf(run, sparse);
  train.batchSize = given(sparse, "--batch")
                        ? run.batch
                        : (isMf(run.model.name) ? defaults::kMfBatch : defaults::kKgeBatch);
  train.optimizer.kind = ml::parseSparseOptimizer(f.optimizer);
  train.optimizer.lr =
      given(sparse, "--lr") ? run.lr : (isMf(run.model.name) ? defaults::kMfLr : defaults::kKgeLr);
  train.optimizer.initialAccumulator = f.adagradInitial;
  train.seed = run.seed;
  train.evalEvery = f.evalEvery;
  train.logEverySteps = sparse.logEvery;
  // PS mode only (sparse consensus refuses the flags), KGE only (MF's flags refuse them).
  train.timeLimitSeconds = f.timeLimit;
  train.keepBest = f.keepBest;
  return train;
}

// --mf-schedule rotation or rotation-barrier (docs/orion.md).
bool isRotation(const SparseNodeArgs& sparse) {
  return sparse.mfSchedule == "rotation" || sparse.mfSchedule == "rotation-barrier";
}

// --mf-schedule rotation's conditions (docs/orion.md): MF in PS mode over relocation, without a
// per-clock bound.
void checkRotation(const run::RunOptions& run, const SparseNodeArgs& sparse, bool gossip) {
  if (!isMf(run.model.name)) {
    throw CommandFailure(
        2, fmt::format("--mf-schedule rotation applies to --model mf (Orion's blocks of a rating "
                       "matrix: rows and columns); --model {} has no such blocks",
                       run.model.name));
  }
  if (gossip) {
    throw CommandFailure(2,
                         "--mf-schedule rotation is a PS mode schedule (the column blocks move "
                         "between owners): use --mode ps");
  }
  if (given(sparse, "--technique") && sparse.technique != "lapse") {
    throw CommandFailure(
        2, fmt::format("--mf-schedule rotation moves whole column blocks by relocation and runs "
                       "with --technique lapse, not {}{}",
                       sparse.technique,
                       sparse.technique == "nups"
                           ? " (a replicated hot column would be updated by every worker at "
                             "once, which the schedule exists to prevent)"
                           : ""));
  }
  if (given(sparse, "--staleness")) {
    throw CommandFailure(2,
                         "--staleness does not apply to --mf-schedule rotation: its workers "
                         "meet at every sub-epoch (a bound of 0 on sub-epochs) and share no "
                         "row within one, so a per-clock bound changes nothing");
  }
}

}  // namespace

static std::vector<size_t> mfRowBlockShard(const ml::RatingsData& ratings, size_t workers,
                                           size_t rank) {
  const uint64_t rows = std::max<uint64_t>(ratings.rows, 1);
  std::vector<size_t> shard;
  for (size_t i = 0; i < ratings.train.size(); ++i) {
    const uint64_t block = static_cast<uint64_t>(ratings.train[i].row) * workers / rows;
    if (block == rank) shard.push_back(i);
  }
  return shard;
}

struct SparseNodeJob {
  std::string data_name;
  std::string source;
  ml::KgData graph;
  ml::RatingsData ratings;
  std::unique_ptr<ml::SparseWorkload> workload;
  std::vector<size_t> shard;
  ml::SparseTrainOptions train;
  std::optional<sampling::SampleSchemeOptions> sampling;
  ps::SparseTechnique technique = ps::SparseTechnique::kClassic;
  // --mf-schedule rotation: the blocks per dimension (one per worker); 0: data-parallel.
  size_t rotation_blocks = 0;
  bool rotation_barrier = false;  // rotation-barrier: the all-worker barrier, not hand-offs
  ps::ReplicationOptions
      replication;  // nups, auto: the flags (the accesses are filled in by the PS session)
  // auto: every member's training points (member order; shard is this node's), for each node's
  // expected accesses; freed once the peer chose the techniques (SparsePsSession).
  std::vector<std::vector<size_t>> member_shards;
  // PS mode: --stragglers with this node's own attribute (the topology file's), drawn per clock.
  faults::StragglerProfile stragglers;
  std::string out_dir;
  uint32_t self = 0;
  // KGE: entities a training triple draws as negatives, on average (for the expected accesses
  // that choose sparse gossip's hot rows).
  double negatives_per_triple = 0;
  // Whole-cluster checkpoints (run::planCuts): where they go, every how many epochs, and the cut
  // this node resumes from.
  run::CutPlan cuts;
};

bool isSparseModel(const std::string& model) {
  return isMf(model) || isKgeModel(model);
}

void addSparseNodeOptions(CLI::App& node, SparseNodeArgs& args) {
  addSparseOptions(node, args.flags);
  node.add_option("--sample-scheme", args.sampleScheme,
                  "KGE in PS mode (any --technique): draw the negatives through the PS's "
                  "sampling primitives with this scheme (docs/sampling.md). Conforming: naive "
                  "(i.i.d., read where they live: exact), preloc (i.i.d., localized a step "
                  "ahead: exact), pool (groups localized ahead, each handed out --sample-reuse "
                  "times: each draw marginally pi, draws dependent), postpone (pool, local keys "
                  "first: the sample's multiset holds). Biased: onlylocal (only keys local now, "
                  "never a frame: pi restricted to them). Default: the model draws them i.i.d. "
                  "per step, as naive");
  node.add_option("--sample-reuse", args.sampleReuse,
                  "KGE in PS mode, --sample-scheme pool or postpone: times each drawn key is "
                  "handed out (default 16, NuPS's untuned setting; a group spans that many "
                  "steps' negatives; 1: every draw once)");
  node.add_option(
          "--technique", args.technique,
          "Sparse models in PS mode: how the embedding rows are managed: auto (each key's "
          "technique from every worker's expected accesses, no tuning: a key several nodes "
          "use between two replica syncs gets a replica on every node, one that one node "
          "uses most is relocated to it, the rest stay at their hash owners; chosen at "
          "start), classic (every row at its hash owner), lapse (Lapse relocation: a worker "
          "moves the rows of its next clock's data points to itself one clock ahead; MF "
          "splits the ratings by row block, as auto does) or nups (NuPS: the hot keys have a "
          "replica on every node, read and pushed locally and synced in the background; the "
          "others are relocated as under lapse); see docs/sparse-ps.md and "
          "docs/ps-replication.md")
      ->capture_default_str();
  node.add_option("--mf-schedule", args.mfSchedule,
                  "--model mf in PS mode: data-parallel (every worker trains its shard under "
                  "SSP) or rotation (Orion: the matrix is cut into N x N blocks of near-equal "
                  "rating counts for N workers; worker w keeps row block w and at sub-epoch t "
                  "trains it with column block (w + t) mod N, each column block moving by "
                  "relocation to the next worker as soon as its holder is done with it, so no "
                  "two workers update a row at once and the result is the serial algorithm's; "
                  "runs with --technique lapse; see docs/orion.md); rotation-barrier: the same "
                  "with every worker waiting for all at each sub-epoch (to compare)")
      ->check(CLI::IsMember({"data-parallel", "rotation", "rotation-barrier"}))
      ->capture_default_str();
  node.add_option("--replicate", args.replicate,
                  "--technique nups: replicate the N keys with the most expected accesses (the "
                  "data's counts plus sampling's share), whatever their memory; 0: none (lapse "
                  "exactly). Default: as many as fit --replica-bytes")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000'000}));
  node.add_option("--replica-bytes", args.replicaBytes,
                  "--technique nups without --replicate: the hot keys' replicas get this many "
                  "bytes on each node (row, optimizer state, synced copy and delta: about 24 "
                  "bytes per float with AdaGrad), most accessed keys first; --technique auto: "
                  "its replicas' memory cap (default 64 MiB there), most shared keys first")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40))
      ->capture_default_str();
  node.add_option("--replica-syncs-per-s", args.replicaSyncsPerSecond,
                  "--technique nups or auto: replica sync rounds a node starts per second "
                  "(NuPS's default; 0: the replicas sync only at the end of the run)")
      ->check(CLI::Range(0.0, 1000.0))
      ->capture_default_str();
  consensus::addSparseGossipOptions(node, args.gossip);
  node.add_option("--log-every", args.logEvery,
                  "Sparse models: a \"step\" metrics event every N clocks")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000'000}))
      ->capture_default_str();
  // --model and --data take the sparse models and their data too (as chorus train's do); an
  // image model's data set is checked by checkImageData().
  std::vector<std::string> models = ml::modelNames();
  models.push_back("mf");
  models.insert(models.end(), ml::kgeModelNames().begin(), ml::kgeModelNames().end());
  CLI::Option* model = node.get_option("--model");
  model->get_validator()->active(false);
  model->check(CLI::IsMember(models))
      ->description(
          "Model: softmax, mlp, lenet, cifar-cnn (images); mf (matrix factorization); complex, "
          "distmult (knowledge-graph embeddings; sparse PS or consensus mode)");
  CLI::Option* data = node.get_option("--data");
  data->get_validator()->active(false);
  data->description(
      "Data set: mnist, fashion-mnist, cifar10, synthetic (images); zipf-mf or ratings (--model "
      "mf, default zipf-mf); wn18rr or a triple folder's name (--model complex|distmult, default "
      "wn18rr)");
}

void checkImageData(const run::RunOptions& run) {
  const auto& images = ml::datasetNames();
  if (std::find(images.begin(), images.end(), run.data.name) == images.end()) {
    throw CommandFailure(2, fmt::format("--data {} is not a data set of --model {} (one of {}); "
                                        "knowledge graphs and ratings are trained by --model "
                                        "complex, distmult or mf",
                                        run.data.name, run.model.name, fmt::join(images, ", ")));
  }
}

void checkImageModelFlags(const run::RunOptions& run, const SparseNodeArgs& sparse) {
  refuse(sparse, {"--sample-scheme", "--sample-reuse"}, run.model.name,
         "the sampling schemes draw a knowledge-graph model's negatives in PS mode");
  refuse(sparse, kGossipFlags, run.model.name,
         "sparse gossip sends a sparse model's changed rows; dense consensus sends whole models");
  refuse(sparse, {"--technique"}, run.model.name,
         "the techniques manage a sparse model's embedding rows in PS mode");
  refuse(sparse, {"--mf-schedule"}, run.model.name,
         "the schedules order matrix factorization's ratings in PS mode");
  refuse(sparse, kReplicaFlags, run.model.name,
         "--technique nups replicates a sparse model's hot embedding rows in PS mode");
}

ps::SparseTechnique techniqueOf(const SparseNodeArgs& sparse) {
  if (std::optional<ps::SparseTechnique> t = ps::parseSparseTechnique(sparse.technique)) return *t;
  throw CommandFailure(
      2, fmt::format("--technique {}: unknown technique (auto, classic, lapse or nups)",
                     sparse.technique));
}

ps::ReplicationOptions replicationOf(const SparseNodeArgs& sparse) {
  ps::ReplicationOptions options;
  if (sparse.replicate >= 0) options.replicate = static_cast<size_t>(sparse.replicate);
  options.budget_bytes = sparse.replicaBytes;
  if (sparse.technique == "auto" && !given(sparse, "--replica-bytes")) {
    options.budget_bytes = kAutoReplicaBytes;
  }
  options.syncs_per_second = sparse.replicaSyncsPerSecond;
  return options;
}

std::optional<sampling::SampleSchemeOptions> sampleSchemeOf(const SparseNodeArgs& sparse) {
  const bool scheme = given(sparse, "--sample-scheme");
  const bool reuse = given(sparse, "--sample-reuse");
  if (!scheme && !reuse) return std::nullopt;
  if (!scheme) {
    throw CommandFailure(2, "--sample-reuse needs --sample-scheme pool or postpone");
  }
  sampling::SampleSchemeOptions options;
  if (std::optional<std::string> error = sampling::sampleOptionsFromFlags(
          sparse.sampleScheme, reuse ? std::optional<int64_t>(sparse.sampleReuse) : std::nullopt,
          options)) {
    throw CommandFailure(2, *error);
  }
  return options;
}

void recordGivenFlags(const CLI::App& node, SparseNodeArgs& args) {
  args.given.clear();
  for (const CLI::Option* option : node.get_options()) {
    if (option->count() == 0) continue;
    for (const std::string& name : option->get_lnames())
      args.given.insert("--" + name);
  }
}

void checkSparseNodeArgs(const run::RunOptions& run, const SparseNodeArgs& sparse,
                         const ps::PsOptions& ps, const consensus::ConsensusOptions& consensus,
                         const modes::Mode& mode) {
  const std::string& model = run.model.name;
  if (mode.sparse == modes::SparseTraining::kNone) {
    throw CommandFailure(2, fmt::format("{} mode for sparse models (--model {}) is not "
                                        "implemented yet: train them with --mode {}",
                                        mode.name, model, modes::sparseModeNames()));
  }
  const bool gossip = mode.sparse == modes::SparseTraining::kConsensus;
  if (gossip) {
    refuse(sparse, {"--sample-scheme", "--sample-reuse"}, model,
           "the sampling schemes draw the negatives through PS mode's primitives");
    refuse(sparse, {"--skip-gap"}, model,
           "iteration skipping is dense consensus's: a sparse share holds only changed rows");
    refuse(sparse, {"--technique"}, model, "the techniques manage the rows of PS mode's owners");
    refuse(sparse, kReplicaFlags, model,
           "--technique nups replicates hot rows in PS mode; sparse gossip has --hot-bytes");
  } else {
    refuse(sparse, kGossipFlags, model, "the flags of sparse gossip, consensus mode's");
  }
  refuse(sparse, kDenseOnlyFlags, model, "an image model's flag");
  const ps::SparseTechnique technique = techniqueOf(sparse);
  if (technique == ps::SparseTechnique::kAuto) {
    if (given(sparse, "--replicate")) {
      throw CommandFailure(2,
                           "--replicate N sets nups's hot-set size; --technique auto chooses "
                           "each key's technique itself (give --technique nups --replicate N "
                           "to set it by hand)");
    }
  } else if (technique != ps::SparseTechnique::kNups) {
    for (const std::string& flag : kReplicaFlags) {
      if (given(sparse, flag)) {
        throw CommandFailure(2, fmt::format("{} applies to --technique {} only (this run's is "
                                            "{}); see chorus node --help",
                                            flag, flag == "--replicate" ? "nups" : "nups or auto",
                                            sparse.technique));
      }
    }
  } else if (given(sparse, "--replicate") && given(sparse, "--replica-bytes")) {
    throw CommandFailure(2,
                         "--replicate N and --replica-bytes both choose the hot set: give one "
                         "(--replicate takes the top N whatever their memory)");
  }
  if (isRotation(sparse)) checkRotation(run, sparse, gossip);
  // Whole-cluster checkpoints (docs/checkpoints.md, "Sparse runs"): --resume takes a cut folder
  // only (a --save file is a single model, which sparse runs do not write).
  const bool resumes = run::resumesCluster(run);
  if (given(sparse, "--resume") && !resumes) {
    throw CommandFailure(
        2, fmt::format("--resume {}: not a folder; a sparse run resumes a whole cluster from "
                       "the --checkpoint-dir of an earlier run (--resume DIR; a --save file is "
                       "an image model's)",
                       run.resume_path));
  }
  try {
    run::validateCheckpointOptions(run, gossip && consensus.rejoin);
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, e.what());
  }
  for (const auto& [flag, why] : kNotForSparse) {
    if (gossip && flag == "--rejoin") continue;  // it takes a neighbor's tables
    if (!gossip &&
        std::find(kForSparsePs.begin(), kForSparsePs.end(), flag) != kForSparsePs.end()) {
      continue;
    }
    refuse(sparse, {flag}, model, why);
  }
  if (given(sparse, "--shard") && run.shard.kind != run::ShardSpec::Kind::kIid) {
    throw CommandFailure(2, fmt::format("--shard {} does not apply to --model {}: its training "
                                        "points are split iid",
                                        run.shard.toString(), model));
  }
  const std::string data = dataName(run, sparse);
  if (isMf(model)) {
    refuse(sparse, kKgeOnlyFlags, model, "a knowledge-graph model's flag");
    refuse(sparse, {"--sample-scheme", "--sample-reuse"}, model,
           "matrix factorization samples no rows; the schemes draw KGE's negatives");
    if (given(sparse, "--data-dir")) {
      throw CommandFailure(2,
                           "--data-dir does not apply to --model mf (--data ratings reads "
                           "--data-file)");
    }
    if (data != "zipf-mf" && data != "ratings") {
      throw CommandFailure(2, "--model mf trains on --data zipf-mf or --data ratings");
    }
    if ((data == "ratings") != !sparse.flags.dataFile.empty()) {
      throw CommandFailure(
          2, "--data ratings needs --data-file FILE, and --data-file needs --data ratings");
    }
  } else {
    refuse(sparse, kMfOnlyFlags, model, "matrix factorization's flag");
    if (sampleSchemeOf(sparse) && sparse.flags.negatives == "all") {
      throw CommandFailure(2, fmt::format("--sample-scheme does not apply with --negatives all "
                                          "(every entity is a negative: nothing is sampled)"));
    }
    const auto& images = ml::datasetNames();
    if (std::find(images.begin(), images.end(), data) != images.end() || data == "zipf-mf" ||
        data == "ratings") {
      throw CommandFailure(2, fmt::format("--data {} is not a knowledge graph; --model {} trains "
                                          "on --data wn18rr, or any triple folder with --data-dir",
                                          data, model));
    }
  }
  try {
    if (isMf(model)) {
      ml::validateMfOptions(mfModelOptions(sparse.flags));
    } else {
      (void)kgeModelConfig(model, sparse.flags);
    }
    if (gossip) {
      consensus::SparseConsensusOptions options;
      options.backup = consensus.backup;
      options.mixing = consensus.mixing;
      options.staleness = consensus.staleness;
      options.chunk_floats = consensus.chunk_floats;
      options.gossip = sparse.gossip;
      options.train = trainOptions(run, sparse);
      consensus::validateSparseConsensusOptions(options);
    } else {
      ps::SparsePsOptions options;
      options.ps = ps;
      options.train = trainOptions(run, sparse);
      options.sampling = sampleSchemeOf(sparse);
      options.technique = technique;
      options.replication = replicationOf(sparse);
      // What the cuts refuse (the techniques, schedules and schemes whose state a cut does not
      // hold) needs only whether there are cuts; the files are read by planSparseTraining.
      options.cuts.every = run.checkpoint_every;
      if (resumes) options.cuts.resumed.emplace();
      ps::validateSparsePsOptions(options);
    }
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, e.what());
  }
}

void checkSparseData(const run::RunOptions& run, const SparseNodeArgs& sparse) {
  if (isMf(run.model.name)) return;
  try {
    ml::findTripleDir(dataName(run, sparse), run.data.dataDir);
  } catch (const ml::DataError& e) {
    throw CommandFailure(2, e.what());
  }
}

std::vector<std::pair<std::string, std::string>> sparseFingerprint(const run::RunOptions& run,
                                                                   const SparseNodeArgs& sparse) {
  const SparseFlags& f = sparse.flags;
  std::vector<std::pair<std::string, std::string>> s = {
      {"sparse-data", dataName(run, sparse)},
      {"sparse-train",
       fmt::format("epochs={} batch={} lr={} eval-every={}", run.epochs,
                   given(sparse, "--batch") ? fmt::format("{}", run.batch) : "",
                   given(sparse, "--lr") ? fmt::format("{}", run.lr) : "", f.evalEvery)},
      {"sparse-model",
       fmt::format("reg={} reg-weight={} optimizer={} init-scale={} adagrad-initial={}", f.reg,
                   f.regWeight, f.optimizer, f.initScale, f.adagradInitial)}};
  if (isMf(run.model.name)) {
    const ml::ZipfRatingsOptions& z = f.zipf;
    s.emplace_back("mf", fmt::format("rank={} rows={} cols={} cells={} planted={} zipf={},{} "
                                     "noise={} test-share={}",
                                     f.mf.rank, z.rows, z.cols, z.cells, z.rank, z.rowExponent,
                                     z.colExponent, z.noiseSigma, z.testShare));
  } else {
    s.emplace_back("kge", fmt::format("dim={} negatives={} loss={} temperature={} reciprocal={} "
                                      "share-negatives={}",
                                      f.kge.dim, f.negatives, f.loss, f.kge.adversarialTemperature,
                                      f.kge.reciprocal, f.kge.sharedNegatives));
    s.emplace_back("sample", fmt::format("scheme={} reuse={}", sparse.sampleScheme,
                                         given(sparse, "--sample-reuse") ? sparse.sampleReuse : 0));
  }
  // Cuts are complete only when every node takes them at the same epochs.
  if (run.checkpoint_every > 0) {
    s.emplace_back("checkpoint-every", fmt::format("{}", run.checkpoint_every));
  }
  s.emplace_back("technique", sparse.technique);
  s.emplace_back("schedule", sparse.mfSchedule);
  s.emplace_back("replicas", fmt::format("replicate={} bytes={} syncs-per-s={}", sparse.replicate,
                                         sparse.replicaBytes, sparse.replicaSyncsPerSecond));
  const consensus::SparseGossipFlags& g = sparse.gossip;
  s.emplace_back(
      "sparse-gossip",
      fmt::format("cold-every={} round-bytes={} hot-bytes={} relay-hops={} dense={}", g.cold_every,
                  g.round_bytes, g.hot_bytes, g.relay_hops, g.dense_exchange));
  return s;
}

namespace {

// loadSparseNodeJob for a node of `training`'s mode: the PS techniques' MF row blocks are PS
// mode's only. A consensus node keeps the seed's i.i.d. split whatever --technique says (its
// default, auto, is a PS setting): every replica steps on a sample of all the ratings, shards
// of equal size.
std::shared_ptr<SparseNodeJob> loadJobFor(const run::RunOptions& run, const SparseNodeArgs& sparse,
                                          uint32_t self, const std::vector<uint32_t>& members,
                                          modes::SparseTraining training) {
  auto job = std::make_shared<SparseNodeJob>();
  job->self = self;
  job->data_name = dataName(run, sparse);
  job->out_dir = run.out_dir;
  const SparseFlags& f = sparse.flags;
  try {
    job->train = trainOptions(run, sparse);
    job->sampling = sampleSchemeOf(sparse);
    // Rotation moves its column blocks by relocation (checkRotation refused another technique).
    job->technique = isRotation(sparse) ? ps::SparseTechnique::kLapse : techniqueOf(sparse);
    job->replication = replicationOf(sparse);
    if (isMf(run.model.name)) {
      ml::MfOptions mf = mfModelOptions(f);
      mf.seed = run.seed;
      ml::ZipfRatingsOptions zipf = f.zipf;
      zipf.seed = run.seed;
      // Every node generates (or reads) the same ratings from the same seed.
      job->ratings = job->data_name == "ratings"
                         ? ml::readRatings(f.dataFile, zipf.testShare, run.seed)
                         : ml::makeZipfRatings(zipf);
      job->source = job->ratings.source;
      job->workload = std::make_unique<ml::MfWorkload>(job->ratings, mf);
      job->train.startFields = {{"data", job->data_name}, {"source", job->source}};
    } else {
      const ml::KgeConfig kge = kgeModelConfig(run.model.name, f);
      job->source = ml::findTripleDir(job->data_name, run.data.dataDir);
      job->graph = ml::readTriples(job->source);
      job->workload = std::make_unique<ml::KgeWorkload>(job->graph, kge, run.seed);
      // Both directions draw `negatives` (shared: once per step of a batch).
      job->negatives_per_triple =
          kge.allNegatives ? 0.0
          : kge.sharedNegatives
              ? 2.0 * static_cast<double>(kge.negatives) / static_cast<double>(job->train.batchSize)
              : 2.0 * static_cast<double>(kge.negatives);
      job->train.startFields = {{"data", job->data_name},
                                {"source", job->source},
                                {"negatives", f.negatives},
                                {"loss", f.loss},
                                {"reg", f.reg.empty() ? "n3" : f.reg},
                                {"reciprocal", kge.reciprocal ? "true" : "false"},
                                {"share_negatives", kge.sharedNegatives ? "true" : "false"},
                                {"reg_weight", fmt::format("{}", kge.regWeight)}};
    }
    node::Result<std::string> metrics_path = run::nodeMetricsPath(run.out_dir, self);
    if (!metrics_path.ok()) {
      throw CommandFailure(1, fmt::format("node {}: {}", self, metrics_path.message()));
    }
    job->train.metricsPath = std::move(metrics_path).value();
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, fmt::format("node {}: {}", self, e.what()));
  } catch (const CommandFailure&) {
    throw;
  } catch (const std::exception& e) {
    throw CommandFailure(1, fmt::format("node {}: {}", self, e.what()));
  }
  std::vector<uint32_t> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  const auto rank =
      static_cast<size_t>(std::find(sorted.begin(), sorted.end(), self) - sorted.begin());
  if (isRotation(sparse)) {
    job->rotation_blocks = sorted.size();
    job->rotation_barrier = sparse.mfSchedule == "rotation-barrier";
  }
  if (training == modes::SparseTraining::kPs && job->technique != ps::SparseTechnique::kClassic &&
      isMf(run.model.name)) {
    // Lapse's MF partition (nups relocates the same way): worker r takes the ratings of the
    // matrix rows of block r, so that the row factors it localizes stay with it (only the
    // columns move between workers).
    job->shard = mfRowBlockShard(job->ratings, sorted.size(), rank);
    if (job->technique == ps::SparseTechnique::kAuto) {
      for (size_t r = 0; r < sorted.size(); ++r)
        job->member_shards.push_back(r == rank ? job->shard
                                               : mfRowBlockShard(job->ratings, sorted.size(), r));
    }
    return job;
  }
  // The same split on every node (the seed's), each taking its own part.
  ml::Shards shards =
      ml::shardIid(job->workload->trainPoints(), static_cast<int>(sorted.size()), run.seed);
  job->shard = shards[rank];
  if (job->technique == ps::SparseTechnique::kAuto) job->member_shards = std::move(shards);
  return job;
}

}  // namespace

std::shared_ptr<SparseNodeJob> loadSparseNodeJob(const run::RunOptions& run,
                                                 const SparseNodeArgs& sparse, uint32_t self,
                                                 const std::vector<uint32_t>& members) {
  return loadJobFor(run, sparse, self, members, modes::SparseTraining::kPs);
}

namespace {

// The data's expected accesses of every table's rows, the skew layer's pre-scan (KGE: each
// triple's entities and relation plus the negatives' uniform share; MF: each rating's row and
// column), one vector per table of the workload. The same on every node.
// `points`: only those training points' (one worker's shard: --technique auto), else all.
std::vector<std::vector<double>> expectedAccesses(
    const SparseNodeJob& job, std::optional<std::span<const size_t>> points = std::nullopt) {
  std::vector<std::vector<double>> accesses;
  if (job.workload->higherIsBetter()) {
    ml::KgAccessStats stats =
        points ? ml::kgShardAccessStats(job.graph, *points, job.negatives_per_triple)
               : ml::kgAccessStats(job.graph, job.negatives_per_triple);
    accesses = {std::move(stats.entities), std::move(stats.relations)};
  } else {
    ml::MfAccessStats stats =
        points ? ml::mfShardAccessStats(job.ratings, *points) : ml::mfAccessStats(job.ratings);
    accesses = {std::move(stats.rows), std::move(stats.cols)};
  }
  const std::vector<ml::SparseTable*> tables = job.workload->tables();
  for (size_t t = 0; t < tables.size() && t < accesses.size(); ++t) {
    if (accesses[t].size() * 2 == tables[t]->rows()) {
      // Reciprocal relations: row r + R is used as often as row r.
      accesses[t].insert(accesses[t].end(), accesses[t].begin(), accesses[t].end());
    }
  }
  accesses.resize(tables.size());
  return accesses;
}

class SparsePsSession : public NodeSession {
 public:
  SparsePsSession(node::Node& node, std::shared_ptr<SparseNodeJob> job,
                  const std::vector<uint32_t>& members, const ps::PsOptions& ps)
      : job_(std::move(job)),
        peer_(node, *job_->workload, job_->shard, members, optionsOf(*job_, ps)) {
    // auto chose each key's technique in the peer's constructor: every member's shard was
    // only needed for that (its expected accesses), and is not kept for the whole run.
    std::vector<std::vector<size_t>>().swap(job_->member_shards);
  }

  void run() override {
    const ps::SparsePsReport r = peer_.run();
    const uint32_t self = job_->self;
    fmt::print(
        "node {}: {} epoch(s), {} clocks ({} per epoch) on {} of {} {} points in {:.1f} s "
        "({:.1f} s waiting for reads), {:.0f} points/s{}\n",
        self, r.epochs_done, r.clocks_done, r.clocks_per_epoch, job_->shard.size(),
        job_->workload->trainPoints(), job_->data_name, r.train_seconds, r.wait_seconds,
        r.points_per_second, r.stopped ? " (stopped)" : "");
    fmt::print(
        "node {}: {} rows read and {} pushed, {:.1f}% of the row accesses local; {} bytes "
        "sent, {} received\n",
        self, r.rows_pulled, r.rows_pushed, 100 * r.localShare(), r.bytes_out, r.bytes_in);
    if (r.sampling) {
      fmt::print(
          "node {}: sample scheme {}: {} sampled keys, {:.1f}% of them local; {} sampled keys "
          "read from other nodes\n",
          self, sampling::sampleSchemeName(job_->sampling->kind), r.sampling->scheme.handed_out,
          100 * r.sampleLocalShare(), r.sampling->remote_keys);
    }
    for (const auto& [split, metrics] : r.final) {
      std::string line;
      for (const ml::NamedMetric& m : metrics)
        line += fmt::format(" {} {:.4f}", m.name, m.value);
      fmt::print("node {}: {} of the owners' model:{}\n", self, split, line);
    }
    if (!r.rotation.empty()) {
      fmt::print("node {}: rotation: {}; {:.1f} s in {} sub-epoch {}\n", self, r.rotation,
                 r.barrier_seconds, r.barriers, job_->rotation_barrier ? "barriers" : "hand-offs");
    }
    if (r.technique == ps::SparseTechnique::kNups || r.technique == ps::SparseTechnique::kAuto) {
      const ps::RowAccessStats& a = r.access;
      fmt::print(
          "node {}: {}: {} hot keys replicated ({:.1f}% of the expected accesses), {:.1f}% of "
          "the row accesses served by replicas; {} sync rounds, {} bytes sent by the sync, "
          "replicas {:.0f} ms old on average ({:.0f} ms at most){}\n",
          self, ps::sparseTechniqueName(r.technique), a.replicated_keys, 100 * r.replica_share,
          a.keys_local + a.keys_remote > 0 ? 100.0 * static_cast<double>(a.keys_replica) /
                                                 static_cast<double>(a.keys_local + a.keys_remote)
                                           : 0.0,
          a.replica_rounds, a.replica_bytes_sent, 1000 * a.replica_staleness_mean_s,
          1000 * a.replica_staleness_max_s,
          a.replica_lost_deltas > 0
              ? fmt::format("; {} node deltas lost with dead nodes", a.replica_lost_deltas)
              : std::string());
    }
    if (!r.departed_peers.empty()) {
      fmt::print("node {}: node(s) {} left before the end\n", self,
                 fmt::join(r.departed_peers, ", "));
    }
    if (r.failed_pulls + r.failed_pushes > 0) {
      fmt::print("node {}: {} read(s) and {} push(es) failed because an owner was down\n", self,
                 r.failed_pulls, r.failed_pushes);
    }
    std::fflush(stdout);
  }
  void stop() override { peer_.stop(); }

 private:
  static ps::SparsePsOptions optionsOf(const SparseNodeJob& job, const ps::PsOptions& ps) {
    ps::SparsePsOptions options;
    options.ps = ps;
    options.train = job.train;
    options.sampling = job.sampling;
    options.technique = job.technique;
    options.rotation_blocks = job.rotation_blocks;
    options.rotation_barrier = job.rotation_barrier;
    options.cuts = job.cuts;
    if (!job.stragglers.empty()) {
      // The straggler's extra time per clock, drawn from the run's seed and this node's id as
      // dense PS mode draws it per step (faults/straggler.h).
      auto injector =
          std::make_shared<faults::StragglerInjector>(job.stragglers, job.self, job.train.seed);
      options.after_step = [injector](std::chrono::nanoseconds compute) {
        injector->waitAfterStep(compute);
      };
      options.train.startFields.emplace_back("stragglers", job.stragglers.text);
    }
    if (job.technique == ps::SparseTechnique::kNups) {
      options.replication = job.replication;
      options.replication.accesses = expectedAccesses(job);
    } else if (job.technique == ps::SparseTechnique::kAuto) {
      // Every member's shard, as every node computes them (the same seed and data).
      options.replication = job.replication;
      for (const std::vector<size_t>& shard : job.member_shards)
        options.replication.node_accesses.push_back(expectedAccesses(job, shard));
    }
    return options;
  }

  std::shared_ptr<SparseNodeJob> job_;
  ps::SparsePsPeer peer_;
};

class SparseConsensusSession : public NodeSession {
 public:
  SparseConsensusSession(node::Node& node, std::shared_ptr<SparseNodeJob> job,
                         const consensus::SparseLayout& layout,
                         const consensus::ConsensusOptions& consensus, const SparseNodeArgs& sparse)
      : job_(std::move(job)),
        peer_(node, *job_->workload, job_->shard, layout,
              optionsOf(*job_, consensus, sparse.gossip)) {}

  void run() override {
    const consensus::SparseConsensusReport r = peer_.run();
    const uint32_t self = job_->self;
    const double rounds = static_cast<double>(std::max<int64_t>(r.rounds_done - r.first_round, 1));
    if (job_->cuts.resumed) {
      fmt::print("node {}: resumed from cut {} at round {}\n", self, job_->cuts.resumed->header.cut,
                 r.first_round);
    } else if (r.first_round > 0) {
      fmt::print("node {}: rejoined at round {} with a neighbor's tables and optimizer state\n",
                 self, r.first_round);
    }
    fmt::print(
        "node {}: {} epoch(s), {} rounds ({} per epoch) on {} of {} {} points in {:.1f} s "
        "({:.1f} s waiting for neighbors), {:.0f} points/s{}\n",
        self, r.epochs_done, r.rounds_done, r.rounds_per_epoch, job_->shard.size(),
        job_->workload->trainPoints(), job_->data_name, r.train_seconds, r.wait_seconds,
        r.points_per_second, r.stopped ? " (stopped)" : "");
    fmt::print(
        "node {}: {:.0f} rows ({:.0f} bytes of rows) sent per round to its neighbors; {} bytes "
        "sent, {} received\n",
        self, static_cast<double>(r.rows_sent) / rounds,
        static_cast<double>(r.share_bytes) / rounds, r.bytes_out, r.bytes_in);
    for (const auto& [split, metrics] : r.final) {
      std::string line;
      for (const ml::NamedMetric& m : metrics)
        line += fmt::format(" {} {:.4f}", m.name, m.value);
      fmt::print("node {}: {} of its replica:{}\n", self, split, line);
    }
    if (r.final.empty() && !r.replica.empty()) {
      // The other nodes evaluate their own replica on the final split only.
      std::string line;
      for (const ml::NamedMetric& m : r.replica)
        line += fmt::format(" {} {:.4f}", m.name, m.value);
      fmt::print("node {}: {} of its replica:{}\n", self, job_->workload->evalSplits().back(),
                 line);
    }
    if (!r.departed_peers.empty()) {
      fmt::print("node {}: neighbor(s) {} left before the end\n", self,
                 fmt::join(r.departed_peers, ", "));
    }
    if (r.shares_refused > 0) {
      fmt::print("node {}: {} row share frame(s) from neighbors refused (see the log)\n", self,
                 r.shares_refused);
    }
    std::fflush(stdout);
  }
  void stop() override { peer_.stop(); }

 private:
  static consensus::SparseConsensusOptions optionsOf(const SparseNodeJob& job,
                                                     const consensus::ConsensusOptions& c,
                                                     const consensus::SparseGossipFlags& gossip) {
    consensus::SparseConsensusOptions options;
    options.backup = c.backup;
    options.mixing = c.mixing;
    options.staleness = c.staleness;
    options.chunk_floats = c.chunk_floats;
    options.stall_timeout = c.stall_timeout;
    options.round_timeout = c.round_timeout;
    options.report_every = c.report_every;
    options.finish_timeout = c.finish_timeout;
    options.rejoin = c.rejoin;
    options.catchup_timeout = c.catchup_timeout;
    options.gossip = gossip;
    options.train = job.train;
    options.cuts = job.cuts;
    // The hot rows: each table's most accessed rows by the data's expected accesses (the same
    // on every node: the data and the ties' order are).
    const std::vector<std::vector<double>> accesses = expectedAccesses(job);
    const std::vector<ml::SparseTable*> tables = job.workload->tables();
    for (size_t t = 0; t < tables.size() && t < accesses.size(); ++t) {
      if (accesses[t].size() != tables[t]->rows()) break;
      sampling::HotSetChoice hot = sampling::chooseHotSet(
          accesses[t], consensus::rowWireBytes(tables[t]->dim()), gossip.hot_bytes);
      options.hot.push_back(std::move(hot.keys));
    }
    return options;
  }

  std::shared_ptr<SparseNodeJob> job_;
  consensus::SparseConsensusPeer peer_;
};

}  // namespace

std::unique_ptr<NodeSession> sparseConsensusSession(node::Node& node,
                                                    std::shared_ptr<SparseNodeJob> job,
                                                    const consensus::SparseLayout& layout,
                                                    const consensus::ConsensusOptions& consensus,
                                                    const SparseNodeArgs& sparse) {
  return std::make_unique<SparseConsensusSession>(node, std::move(job), layout, consensus, sparse);
}

std::unique_ptr<NodeSession> sparsePsSession(node::Node& node, std::shared_ptr<SparseNodeJob> job,
                                             const std::vector<uint32_t>& members,
                                             const ps::PsOptions& ps) {
  return std::make_unique<SparsePsSession>(node, std::move(job), members, ps);
}

namespace {

// The cuts of `job`'s node (run::planCuts): a sparse model's header, its steps the epochs.
// CommandFailure 2 for a bad --resume folder.
void planSparseCuts(SparseNodeJob& job, const modes::TrainingContext& context,
                    std::string_view mode, uint32_t nodes) {
  run::NodeCheckpointHeader header;
  header.cluster = context.topology.name;
  header.node = job.self;
  header.nodes = nodes;
  header.mode = std::string(mode);
  header.model = job.workload->spec();
  size_t parameters = 0;
  for (const ml::SparseTable* table : job.workload->tables())
    parameters += table->values().size();
  header.fingerprint = run::modelFingerprint(header.model, parameters);
  header.seed = job.train.seed;
  try {
    run::planCuts(job.cuts, context.settings.run, header, job.train.epochs);
  } catch (const run::NodeCheckpointError& e) {
    throw CommandFailure(2, fmt::format("node {}: {}", job.self, e.what()));
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, fmt::format("node {}: {}", job.self, e.what()));
  }
}

}  // namespace

SparsePlan planSparseTraining(const modes::Mode& mode, const modes::TrainingContext& context,
                              const SparseNodeArgs& sparse) {
  std::vector<node::NodeId> members;
  for (const topology::NodeSpec& n : context.topology.nodes)
    members.push_back(n.id);
  const node::NodeId self = context.self.id;
  const std::shared_ptr<SparseNodeJob> job =
      loadJobFor(context.settings.run, sparse, self, members, mode.sparse);
  planSparseCuts(*job, context, mode.sparse == modes::SparseTraining::kPs ? "ps" : "consensus",
                 static_cast<uint32_t>(members.size()));
  SparsePlan plan;
  switch (mode.sparse) {
    case modes::SparseTraining::kPs: {
      // Sparse models train in PS mode on any number of nodes, one included (docs/sparse-ps.md).
      for (node::NodeId id : members) {
        if (id != self) plan.peers.push_back(id);
      }
      const ps::PsOptions& options = context.settings.ps;
      plan.doing =
          fmt::format("owning its share of the rows, staleness {}", options.staleness.toString());
      // --stragglers with the node's own attribute (checked up front by checkModeArgs' caller).
      node::Result<faults::StragglerProfile> stragglers =
          context.settings.run.stragglers.combinedWith(context.self.stragglers);
      if (!stragglers.ok()) {
        throw CommandFailure(2, fmt::format("node {}: {}", self, stragglers.message()));
      }
      job->stragglers = std::move(stragglers).value();
      plan.start = [job, members, options](node::Node& node) {
        return sparsePsSession(node, job, members, options);
      };
      return plan;
    }
    case modes::SparseTraining::kConsensus: {
      // Gossip with the topology neighbors, connected to them only (docs/sparse-consensus.md).
      consensus::SparseLayout layout;
      layout.self = self;
      layout.neighbors = context.self.neighbors;
      for (const topology::NodeSpec& n : context.topology.nodes) {
        layout.members.push_back(n.id);
        layout.degrees[n.id] = n.neighbors.size();
        layout.graph[n.id] = n.neighbors;
      }
      plan.peers = layout.neighbors;
      plan.doing = fmt::format("gossiping changed rows with neighbors [{}]",
                               fmt::join(layout.neighbors, ", "));
      const consensus::ConsensusOptions& options = context.settings.consensus;
      plan.start = [job, layout, options, sparse](node::Node& node) {
        return sparseConsensusSession(node, job, layout, options, sparse);
      };
      return plan;
    }
    case modes::SparseTraining::kNone:
      break;
  }
  throw std::logic_error(fmt::format("mode {} trains no sparse model", mode.name));
}

}  // namespace chorus::cli
