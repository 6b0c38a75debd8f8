#include "cli/sparse_node.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "cli/commands.h"
#include "ml/dataset.h"
#include "ml/kge_workload.h"
#include "ml/mf_workload.h"
#include "ml/ratings.h"
#include "ml/sharding.h"
#include "ml/triples.h"
#include "node/node.h"
#include "ps/sparse_ps_peer.h"

namespace chorus::cli {

namespace {

namespace defaults = sparse_defaults;

// The flags of chorus node that a sparse model does not take yet, and why.
const std::vector<std::pair<std::string, std::string>> kNotForSparse = {
    {"--rounds", "a sparse run is measured in --epochs"},
    {"--eval-every",
     "it counts steps; a sparse model evaluates every N epochs: --eval-every-epochs"},
    {"--target-acc", "an image model's accuracy target"},
    {"--save", "checkpoints of sparse PS runs are not implemented yet"},
    {"--resume", "checkpoints of sparse PS runs are not implemented yet"},
    {"--stragglers", "straggler injection is not wired into sparse PS runs yet"},
    {"--rejoin", "a sparse PS node cannot rejoin yet"},
    {"--key-floats", "a sparse model's key is one embedding row"},
    {"--no-cache", "sparse PS workers read every row from its owner"},
    {"--owner-momentum", "sparse models train with --optimizer adagrad or sgd"},
    {"--async-rounds", "a sparse run is measured in --epochs"},
    {"--keep-best", "model selection is not implemented in PS mode yet"},
    {"--time-limit", "a time limit is not implemented in PS mode yet"},
    {"--write-data", "chorus train --model mf writes the data"}};

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
  return train;
}

}  // namespace

struct SparseNodeJob {
  std::string data_name;
  std::string source;
  ml::KgData graph;
  ml::RatingsData ratings;
  std::unique_ptr<ml::SparseWorkload> workload;
  std::vector<size_t> shard;
  ml::SparseTrainOptions train;
  std::optional<sampling::SampleSchemeOptions> sampling;
  std::string out_dir;
  uint32_t self = 0;
};

bool isSparseModel(const std::string& model) {
  return isMf(model) || isKgeModel(model);
}

void addSparseNodeOptions(CLI::App& node, SparseNodeArgs& args) {
  addSparseOptions(node, args.flags);
  node.add_option("--sample-scheme", args.sampleScheme,
                  "KGE in PS mode: draw the negatives through the PS's sampling primitives with "
                  "this scheme: naive, preloc, pool, postpone or onlylocal (default: the model "
                  "draws them i.i.d. per step, as naive); see docs/sampling.md");
  node.add_option("--sample-reuse", args.sampleReuse,
                  "KGE in PS mode, --sample-scheme pool or postpone: times each drawn group of "
                  "keys is handed out (default 16)");
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
          "distmult (knowledge-graph embeddings, sparse PS mode)");
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
                         const ps::PsOptions& ps, const modes::Mode& mode) {
  const std::string& model = run.model.name;
  if (mode.sparse == modes::SparseTraining::kNone) {
    throw CommandFailure(2, fmt::format("{} mode for sparse models (--model {}) is not "
                                        "implemented yet: train them with --mode {}",
                                        mode.name, model, modes::sparseModeNames()));
  }
  refuse(sparse, kDenseOnlyFlags, model, "an image model's flag");
  for (const auto& [flag, why] : kNotForSparse)
    refuse(sparse, {flag}, model, why);
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
    ps::SparsePsOptions options;
    options.ps = ps;
    options.train = trainOptions(run, sparse);
    options.sampling = sampleSchemeOf(sparse);
    ps::validateSparsePsOptions(options);
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
  return s;
}

std::shared_ptr<SparseNodeJob> loadSparseNodeJob(const run::RunOptions& run,
                                                 const SparseNodeArgs& sparse, uint32_t self,
                                                 const std::vector<uint32_t>& members) {
  auto job = std::make_shared<SparseNodeJob>();
  job->self = self;
  job->data_name = dataName(run, sparse);
  job->out_dir = run.out_dir;
  const SparseFlags& f = sparse.flags;
  try {
    job->train = trainOptions(run, sparse);
    job->sampling = sampleSchemeOf(sparse);
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
      job->train.startFields = {{"data", job->data_name},
                                {"source", job->source},
                                {"negatives", f.negatives},
                                {"loss", f.loss},
                                {"reg", f.reg.empty() ? "n3" : f.reg},
                                {"reciprocal", kge.reciprocal ? "true" : "false"},
                                {"share_negatives", kge.sharedNegatives ? "true" : "false"},
                                {"reg_weight", fmt::format("{}", kge.regWeight)}};
    }
    job->train.metricsPath = run::nodeMetricsPath(run.out_dir, self);
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
  // The same split on every node (the seed's), each taking its own part.
  ml::Shards shards =
      ml::shardIid(job->workload->trainPoints(), static_cast<int>(sorted.size()), run.seed);
  job->shard = std::move(shards[rank]);
  return job;
}

namespace {

class SparsePsSession : public NodeSession {
 public:
  SparsePsSession(node::Node& node, std::shared_ptr<SparseNodeJob> job,
                  const std::vector<uint32_t>& members, const ps::PsOptions& ps)
      : job_(std::move(job)),
        peer_(node, *job_->workload, job_->shard, members, optionsOf(*job_, ps)) {}

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
    return options;
  }

  std::shared_ptr<SparseNodeJob> job_;
  ps::SparsePsPeer peer_;
};

}  // namespace

std::unique_ptr<NodeSession> sparsePsSession(node::Node& node, std::shared_ptr<SparseNodeJob> job,
                                             const std::vector<uint32_t>& members,
                                             const ps::PsOptions& ps) {
  return std::make_unique<SparsePsSession>(node, std::move(job), members, ps);
}

SparsePlan planSparseTraining(const modes::Mode& mode, const modes::TrainingContext& context,
                              const SparseNodeArgs& sparse) {
  std::vector<node::NodeId> members;
  for (const topology::NodeSpec& n : context.topology.nodes)
    members.push_back(n.id);
  const node::NodeId self = context.self.id;
  const std::shared_ptr<SparseNodeJob> job =
      loadSparseNodeJob(context.settings.run, sparse, self, members);
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
      plan.start = [job, members, options](node::Node& node) {
        return sparsePsSession(node, job, members, options);
      };
      return plan;
    }
    case modes::SparseTraining::kNone:
      break;
  }
  throw std::logic_error(fmt::format("mode {} trains no sparse model", mode.name));
}

}  // namespace chorus::cli
