#include "cli/train_sparse.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "cli/commands.h"
#include "ml/dataset.h"
#include "ml/kge_workload.h"
#include "ml/sparse_stats.h"
#include "ml/sparse_train.h"
#include "ml/triples.h"

namespace chorus::cli {

const std::vector<std::string> kDenseOnlyFlags = {
    "--synthetic-train", "--synthetic-test", "--limit",    "--no-normalize", "--hidden",
    "--dropout",         "--momentum",       "--nesterov", "--weight-decay", "--schedule",
    "--warmup-epochs",   "--step-epochs",    "--gamma",    "--augment",      "--crop-padding",
    "--no-flip",         "--confusion"};
const std::vector<std::string> kMfOnlyFlags = {"--data-file",  "--test-share", "--mf-rows",
                                               "--mf-cols",    "--mf-cells",   "--mf-planted-rank",
                                               "--zipf-row",   "--zipf-col",   "--noise-sigma",
                                               "--write-data", "--rank"};
const std::vector<std::string> kKgeOnlyFlags = {"--dim",
                                                "--negatives",
                                                "--loss",
                                                "--adversarial-temperature",
                                                "--eval-every-epochs",
                                                "--adagrad-initial",
                                                "--time-limit",
                                                "--reciprocal",
                                                "--share-negatives",
                                                "--keep-best"};
const std::vector<std::string> kSparseFlags = {"--reg", "--reg-weight", "--optimizer",
                                               "--init-scale"};

namespace {

using sparse_defaults::kKgeBatch;
using sparse_defaults::kKgeLr;
using sparse_defaults::kMfBatch;
using sparse_defaults::kMfEpochs;
using sparse_defaults::kMfLr;

bool given(const CLI::App& app, const std::string& flag) {
  return app.count(flag) > 0;
}

// Refuses the first of `flags` that was given, saying whom it is for.
void refuseGiven(const CLI::App& app, const std::vector<std::string>& flags,
                 const std::string& model, const std::string& why) {
  for (const std::string& flag : flags) {
    if (given(app, flag)) {
      throw CommandFailure(2, fmt::format("{} does not apply to --model {} ({}); see chorus "
                                          "train --help",
                                          flag, model, why));
    }
  }
}

}  // namespace

void runTraining(ml::ProgressReporter& progress, const std::function<void()>& work) {
  try {
    work();
  } catch (const CommandFailure&) {
    progress.finish();
    throw;  // already says its exit status
  } catch (const std::invalid_argument& e) {
    progress.finish();
    throw CommandFailure(2, e.what());
  } catch (const std::exception& e) {
    progress.finish();
    throw CommandFailure(1, e.what());
  }
}

bool isKgeModel(const std::string& model) {
  const auto& names = ml::kgeModelNames();
  return std::find(names.begin(), names.end(), model) != names.end();
}

void runMfTrain(const CLI::App& app, const ml::TrainOptions& o, const SparseFlags& f) {
  if (o.data.name != "zipf-mf" && o.data.name != "ratings") {
    throw CommandFailure(2, "--model mf trains on --data zipf-mf or --data ratings");
  }
  refuseGiven(app, kDenseOnlyFlags, "mf", "an image model's flag");
  refuseGiven(app, kKgeOnlyFlags, "mf", "a knowledge-graph model's flag");
  // MF evaluates at the end only (its --eval-every meant KGE's epochs before, refused here too).
  refuseGiven(app, {"--eval-every"}, "mf", "it evaluates at the end");
  for (const char* dense : {"--data-dir", "--save", "--resume"}) {
    if (given(app, dense))
      throw CommandFailure(2, std::string(dense) + " does not apply to --model mf");
  }
  if ((o.data.name == "ratings") != !f.dataFile.empty()) {
    throw CommandFailure(
        2, "--data ratings needs --data-file FILE, and --data-file needs --data ratings");
  }
  if (o.data.name == "ratings") {
    for (const char* generator : {"--mf-rows", "--mf-cols", "--mf-cells", "--mf-planted-rank",
                                  "--zipf-row", "--zipf-col", "--noise-sigma"}) {
      if (given(app, generator)) {
        throw CommandFailure(2, std::string(generator) + " applies to --data zipf-mf only");
      }
    }
  }
  ml::MfOptions mf;
  try {
    mf = mfModelOptions(f);
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, e.what());
  }
  mf.epochs = given(app, "--epochs") ? o.epochs : kMfEpochs;
  mf.batchSize = given(app, "--batch") ? o.batchSize : kMfBatch;
  mf.learningRate = given(app, "--lr") ? o.learningRate : kMfLr;
  mf.seed = o.seed;
  mf.metricsPath = o.metricsPath;
  mf.logEverySteps = o.logEverySteps;
  ml::ZipfRatingsOptions zipf = f.zipf;
  zipf.seed = o.seed;
  ml::ProgressReporter progress(stderr, ml::ProgressReporter::isTerminal(stderr));
  ml::MfReport report;
  runTraining(progress, [&] {
    ml::validateMfOptions(mf);
    const auto start = std::chrono::steady_clock::now();
    const ml::RatingsData data = o.data.name == "ratings"
                                     ? ml::readRatings(f.dataFile, zipf.testShare, o.seed)
                                     : ml::makeZipfRatings(zipf);
    progress.line(fmt::format(
        "data: {} from {}: {} x {}, {} training and {} test ratings ({:.1f} s)", data.name,
        data.source, data.rows, data.cols, data.train.size(), data.test.size(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()));
    for (const std::string& line : ml::skewLines(ml::mfAccessStats(data)))
      progress.line(line);
    if (!f.writeData.empty()) {
      std::filesystem::create_directories(f.writeData);
      ml::writeRatingsCsv(f.writeData + "/train.csv", data.train);
      ml::writeRatingsCsv(f.writeData + "/test.csv", data.test);
      progress.line(fmt::format("wrote {}/train.csv and {}/test.csv", f.writeData, f.writeData));
    }
    report = ml::trainMf(mf, data, progress);
  });
  std::printf("model: %s (%zu parameters)\n", report.modelSpec.c_str(), report.parameters);
  std::printf(
      "epochs: %lld, steps: %lld, training time: %.1f s (%.1f s CPU), %.0f ratings/s (%.0f per "
      "CPU second)\n",
      static_cast<long long>(report.epochs), static_cast<long long>(report.steps),
      report.trainSeconds, report.trainCpuSeconds, report.ratingsPerSecond,
      report.ratingsPerCpuSecond);
  if (std::isfinite(report.noiseFloorRatio)) {
    std::printf("test: RMSE %.4f, %.3f x the noise floor %.4f (target <= %.2f: %s)\n",
                report.testRmse, report.noiseFloorRatio, report.noiseSigma, mf.targetRatio,
                report.targetMet ? "met" : "missed");
  } else {
    std::printf("test: RMSE %.4f (noise floor unknown for data read from a file)\n",
                report.testRmse);
  }
  std::fflush(stdout);
}

void runKgeTrain(const CLI::App& app, const ml::TrainOptions& o, const SparseFlags& f) {
  refuseGiven(app, kDenseOnlyFlags, o.model.name, "an image model's flag");
  refuseGiven(app, kMfOnlyFlags, o.model.name, "matrix factorization's flag");
  const auto& imageSets = ml::datasetNames();
  if (std::find(imageSets.begin(), imageSets.end(), o.data.name) != imageSets.end() ||
      o.data.name == "zipf-mf" || o.data.name == "ratings") {
    throw CommandFailure(2, fmt::format("--data {} is not a knowledge graph; --model {} trains "
                                        "on --data wn18rr, or any triple folder with --data-dir",
                                        o.data.name, o.model.name));
  }
  ml::KgeConfig kge;
  ml::SparseTrainOptions train;
  const std::string reg = f.reg.empty() ? "n3" : f.reg;
  try {
    kge = kgeModelConfig(o.model.name, f);
    train.epochs = o.epochs;
    train.batchSize = given(app, "--batch") ? o.batchSize : kKgeBatch;
    train.optimizer.kind = ml::parseSparseOptimizer(f.optimizer);
    train.optimizer.lr = given(app, "--lr") ? o.learningRate : kKgeLr;
    train.optimizer.initialAccumulator = f.adagradInitial;
    train.seed = o.seed;
    train.evalEvery = f.evalEvery;
    train.logEverySteps = o.logEverySteps;
    train.timeLimitSeconds = f.timeLimit;
    train.keepBest = f.keepBest;
    train.metricsPath = o.metricsPath;
    train.savePath = o.savePath;
    train.resumePath = o.resumePath;
    ml::validateSparseTrainOptions(train);
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, e.what());
  }
  ml::ProgressReporter progress(stderr, ml::ProgressReporter::isTerminal(stderr));
  ml::SparseTrainReport report;
  runTraining(progress, [&] {
    const std::string dir = ml::findTripleDir(o.data.name, o.data.dataDir);
    const ml::KgData data = ml::readTriples(dir);
    progress.line(fmt::format(
        "data: {} from {} ({} entities, {} relations; {} training, {} valid, {} test triples)",
        o.data.name, dir, data.entities(), data.relations(), data.train.size(), data.valid.size(),
        data.test.size()));
    // Shared negatives: N draws per step of batchSize triples.
    const double negativesPerTriple =
        kge.allNegatives ? 0.0
        : kge.sharedNegatives
            ? static_cast<double>(kge.negatives) / static_cast<double>(train.batchSize)
            : static_cast<double>(kge.negatives);
    for (const std::string& line : ml::skewLines(ml::kgAccessStats(data, negativesPerTriple)))
      progress.line(line);
    ml::KgeWorkload workload(data, kge, o.seed);
    train.startFields = {{"data", o.data.name},
                         {"source", dir},
                         {"negatives", f.negatives},
                         {"loss", f.loss},
                         {"adversarial_temperature", fmt::format("{}", kge.adversarialTemperature)},
                         {"reg", reg},
                         {"reciprocal", kge.reciprocal ? "true" : "false"},
                         {"share_negatives", kge.sharedNegatives ? "true" : "false"},
                         {"reg_weight", fmt::format("{}", kge.regWeight)}};
    report = ml::trainSparse(workload, train, progress);
  });
  std::printf("model: %s (%zu parameters)\n", report.spec.c_str(), report.parameters);
  std::printf("epochs: %lld, steps: %lld, training time: %.1f s, %.0f triples/s\n",
              static_cast<long long>(report.epochsDone), static_cast<long long>(report.steps),
              report.trainSeconds, report.pointsPerSecond);
  if (report.evaluatedEpoch != report.epochsDone) {
    std::printf("evaluated: the tables of epoch %lld (best valid MRR, --keep-best)\n",
                static_cast<long long>(report.evaluatedEpoch));
  }
  for (const auto& [split, metrics] : report.final) {
    std::string line = split + " (filtered, both directions):";
    for (const ml::NamedMetric& m : metrics)
      line += fmt::format(" {} {:.4f}", m.name, m.value);
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

ml::MfOptions mfModelOptions(const SparseFlags& f) {
  ml::MfOptions mf = f.mf;
  if (!f.reg.empty() && f.reg != "l2" && f.reg != "none") {
    throw std::invalid_argument("--model mf takes --reg l2 or none");
  }
  if (f.reg == "none") {
    mf.reg = 0;
  } else if (f.regWeight >= 0) {
    mf.reg = f.regWeight;
  }
  if (f.initScale >= 0) mf.initStd = f.initScale;
  mf.optimizer = f.optimizer;
  return mf;
}

ml::KgeConfig kgeModelConfig(const std::string& model, const SparseFlags& f) {
  ml::KgeConfig kge = f.kge;
  kge.model = ml::parseKgeModel(model);
  kge.loss = ml::parseKgeLoss(f.loss);
  kge.regularizer = ml::parseKgeRegularizer(f.reg.empty() ? "n3" : f.reg);
  if (f.regWeight >= 0) kge.regWeight = f.regWeight;
  if (f.initScale >= 0) kge.initScale = f.initScale;
  if (f.negatives == "all") {
    kge.allNegatives = true;
  } else {
    size_t used = 0;
    long long n = -1;
    try {
      n = std::stoll(f.negatives, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != f.negatives.size() || n < 1 || n > 1'000'000) {
      throw std::invalid_argument(fmt::format(
          "--negatives must be 'all' or a count in [1, 1000000], not '{}'", f.negatives));
    }
    kge.negatives = static_cast<size_t>(n);
  }
  kge.validate();
  return kge;
}

void addSparseOptions(CLI::App& train, SparseFlags& flags) {
  ml::MfOptions& mf = flags.mf;
  ml::ZipfRatingsOptions& z = flags.zipf;
  ml::KgeConfig& k = flags.kge;
  // Both sparse families.
  train
      .add_option("--reg", flags.reg,
                  "Sparse models: regularizer of the rows a data point uses: none, l2 (sum x^2), "
                  "n3 (sum |x|^3, complex modulus for ComplEx; KGE only). Default: l2 for mf, "
                  "n3 for complex and distmult")
      ->check(CLI::IsMember({"none", "l2", "n3"}));
  train.add_option("--reg-weight", flags.regWeight,
                   fmt::format("Sparse models: weight of the regularizer per data point "
                               "(default: {} for mf, {} for complex and distmult)",
                               mf.reg, k.regWeight));
  train
      .add_option("--optimizer", flags.optimizer,
                  "Sparse models: adagrad (state kept per row) or sgd; both update only the rows "
                  "a step touched")
      ->check(CLI::IsMember({"sgd", "adagrad"}))
      ->capture_default_str();
  train.add_option("--init-scale", flags.initScale,
                   fmt::format("Sparse models: rows start as N(0, s^2) values (default: {} for "
                               "mf, {} for complex and distmult)",
                               mf.initStd, k.initScale));
  // Matrix factorization.
  train
      .add_option("--data-file", flags.dataFile,
                  "--data ratings: the rating file (CSV user,item,rating[,timestamp] with a "
                  "header, or MovieLens user::item::rating::timestamp; plain or .gz)")
      ->check(CLI::ExistingFile);
  train
      .add_option("--test-share", z.testShare,
                  "--model mf: share of the ratings held out for the test RMSE")
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  train.add_option("--mf-rows", z.rows, "--data zipf-mf: rows (users)")->capture_default_str();
  train.add_option("--mf-cols", z.cols, "--data zipf-mf: columns (items)")->capture_default_str();
  train.add_option("--mf-cells", z.cells, "--data zipf-mf: revealed cells (train + test)")
      ->capture_default_str();
  train.add_option("--mf-planted-rank", z.rank, "--data zipf-mf: rank of the planted model")
      ->capture_default_str();
  train.add_option("--zipf-row", z.rowExponent, "--data zipf-mf: Zipf exponent of the rows")
      ->capture_default_str();
  train.add_option("--zipf-col", z.colExponent, "--data zipf-mf: Zipf exponent of the columns")
      ->capture_default_str();
  train
      .add_option("--noise-sigma", z.noiseSigma,
                  "--data zipf-mf: sigma of the Gaussian noise on the values (the noise floor of "
                  "the test RMSE; the signal has variance 1)")
      ->capture_default_str();
  train.add_option("--write-data", flags.writeData,
                   "--model mf: write the ratings trained on to FOLDER/train.csv and "
                   "FOLDER/test.csv (for bench/mf_reference.py)");
  train.add_option("--rank", mf.rank, "--model mf: rank of the row and column factors")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  // Knowledge-graph embeddings.
  train
      .add_option("--dim", k.dim,
                  "KGE: floats per embedding row (ComplEx: dim/2 complex numbers, so even)")
      ->check(CLI::Range(size_t{1}, size_t{100000}))
      ->capture_default_str();
  train
      .add_option("--negatives", flags.negatives,
                  "KGE: negatives per positive, drawn uniformly for the head and again for the "
                  "tail; 'all' scores every entity (1-N scoring, as matrix products)")
      ->capture_default_str();
  train
      .add_option("--loss", flags.loss,
                  "KGE: logistic (softplus on the positive and the negatives) or ce (softmax "
                  "cross-entropy of the positive against the negatives)")
      ->check(CLI::IsMember({"logistic", "ce"}))
      ->capture_default_str();
  train
      .add_option("--adversarial-temperature", k.adversarialTemperature,
                  "KGE, --loss logistic: weight the negatives by softmax(T * score) (RotatE's "
                  "self-adversarial sampling); 0 weighs them equally")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  train.add_flag("--reciprocal", k.reciprocal,
                 "KGE: reciprocal relations: a second embedding r' per relation, head prediction "
                 "(?, r, t) scored as tail prediction (t, r', ?) in training and evaluation (kbc, "
                 "ConvE)");
  train.add_flag(
      "--keep-best", flags.keepBest,
      "KGE: model selection on valid: evaluate valid and test at the end with the "
      "tables of the epoch with the best valid MRR (of those --eval-every-epochs evaluated) "
      "instead of the last epoch's (PS mode: node 0's evaluations; not with --mode consensus)");
  train.add_flag("--share-negatives", k.sharedNegatives,
                 "KGE: draw the --negatives N entities once per step and score every query of the "
                 "batch against them (matrix products: many negatives cost little) instead of N "
                 "fresh ones per query");
  train
      .add_option("--adagrad-initial", flags.adagradInitial,
                  "KGE, --optimizer adagrad: starting value of every accumulator. With 0 (as "
                  "torch) the first step moves every parameter with a non-zero gradient by --lr, "
                  "however small its gradient; TensorFlow starts at 0.1")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  train
      .add_option("--eval-every-epochs", flags.evalEvery,
                  "KGE: filtered MRR on the validation triples every N epochs (0: only at the "
                  "end, where valid and test are always evaluated). --eval-every counts steps")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}))
      ->capture_default_str();
  train
      .add_option("--time-limit", flags.timeLimit,
                  "KGE: stop after the epoch in which training time passes this many seconds "
                  "(0: no limit). PS mode: per node; a node whose time is up ends its remaining "
                  "clocks without steps, the others go on (not with --mode consensus)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
}

}  // namespace chorus::cli
