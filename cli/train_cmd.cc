// `chorus train`: single-node training, the baseline every distributed run is measured against.
// The training itself lives in chorus_ml (ml/train.h); this file only maps flags to options.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "ml/dataset.h"
#include "ml/mf.h"
#include "ml/ratings.h"
#include "ml/sparse_stats.h"
#include "ml/train.h"

namespace chorus::cli {

namespace {

// Matrix factorization (--model mf): the generator's and the model's own flags. --epochs,
// --batch, --lr, --seed, --out and --log-every are shared with the dense models; MF has its own
// defaults for the first three (kMf*) unless they are given.
struct MfFlags {
  ml::MfOptions mf;
  ml::ZipfRatingsOptions zipf;
  std::string dataFile;   // --data ratings
  std::string writeData;  // folder for train.csv and test.csv of the data trained on
  CLI::Option* epochs = nullptr;
  CLI::Option* batch = nullptr;
  CLI::Option* lr = nullptr;
  CLI::Option* data = nullptr;
};
constexpr int64_t kMfEpochs = 10;
constexpr size_t kMfBatch = 1000;
constexpr double kMfLr = 0.1;

struct TrainFlags {
  ml::TrainOptions options;
  std::vector<int> hidden;
  bool noNormalize = false;
  bool noFlip = false;
  MfFlags mf;
};

// The data sets of the sparse models, besides the dense ones of ml::datasetNames().
const std::vector<std::string>& trainDataNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = ml::datasetNames();
    all.insert(all.end(), {"zipf-mf", "ratings"});
    return all;
  }();
  return names;
}
const std::vector<std::string>& trainModelNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = ml::modelNames();
    all.push_back("mf");
    return all;
  }();
  return names;
}

// `chorus train --model mf`: generate or read ratings, print their skew, train, compare the test
// RMSE with the noise floor.
void runMfTrain(const CLI::App& app, const TrainFlags& flags) {
  const ml::TrainOptions& o = flags.options;
  const MfFlags& f = flags.mf;
  if (o.data.name != "zipf-mf" && o.data.name != "ratings") {
    throw CommandFailure(2, "--model mf trains on --data zipf-mf or --data ratings");
  }
  // The dense models' flags would be silently ignored: refuse them.
  for (const char* dense :
       {"--data-dir",     "--synthetic-train", "--synthetic-test", "--limit",    "--no-normalize",
        "--hidden",       "--dropout",         "--momentum",       "--nesterov", "--weight-decay",
        "--schedule",     "--warmup-epochs",   "--step-epochs",    "--gamma",    "--augment",
        "--crop-padding", "--no-flip",         "--save",           "--resume",   "--confusion"}) {
    if (app.count(dense) > 0)
      throw CommandFailure(2, std::string(dense) + " does not apply to --model mf");
  }
  if ((o.data.name == "ratings") != !f.dataFile.empty()) {
    throw CommandFailure(
        2, "--data ratings needs --data-file FILE, and --data-file needs --data ratings");
  }
  if (o.data.name == "ratings") {
    for (const char* generator : {"--mf-rows", "--mf-cols", "--mf-cells", "--mf-planted-rank",
                                  "--zipf-row", "--zipf-col", "--noise-sigma"}) {
      if (app.count(generator) > 0) {
        throw CommandFailure(2, std::string(generator) + " applies to --data zipf-mf only");
      }
    }
  }
  ml::MfOptions mf = f.mf;
  mf.epochs = f.epochs->count() > 0 ? o.epochs : kMfEpochs;
  mf.batchSize = f.batch->count() > 0 ? o.batchSize : kMfBatch;
  mf.learningRate = f.lr->count() > 0 ? o.learningRate : kMfLr;
  mf.seed = o.seed;
  mf.metricsPath = o.metricsPath;
  mf.logEverySteps = o.logEverySteps;
  ml::ZipfRatingsOptions zipf = f.zipf;
  zipf.seed = o.seed;
  ml::ProgressReporter progress(stderr, ml::ProgressReporter::isTerminal(stderr));
  ml::MfReport report;
  try {
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
  } catch (const std::invalid_argument& e) {
    progress.finish();
    throw CommandFailure(2, e.what());
  } catch (const std::exception& e) {
    progress.finish();
    throw CommandFailure(1, e.what());
  }
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

// The flags of --model mf and its data sets.
void addMfOptions(CLI::App* train, TrainFlags& flags) {
  MfFlags& f = flags.mf;
  ml::MfOptions& mf = f.mf;
  ml::ZipfRatingsOptions& z = f.zipf;
  train
      ->add_option("--data-file", f.dataFile,
                   "--data ratings: the rating file (CSV user,item,rating[,timestamp] with a "
                   "header, or MovieLens user::item::rating::timestamp; plain or .gz)")
      ->check(CLI::ExistingFile);
  train
      ->add_option("--test-share", z.testShare,
                   "--model mf: share of the ratings held out for the test RMSE")
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  train->add_option("--mf-rows", z.rows, "--data zipf-mf: rows (users)")->capture_default_str();
  train->add_option("--mf-cols", z.cols, "--data zipf-mf: columns (items)")->capture_default_str();
  train->add_option("--mf-cells", z.cells, "--data zipf-mf: revealed cells (train + test)")
      ->capture_default_str();
  train->add_option("--mf-planted-rank", z.rank, "--data zipf-mf: rank of the planted model")
      ->capture_default_str();
  train->add_option("--zipf-row", z.rowExponent, "--data zipf-mf: Zipf exponent of the rows")
      ->capture_default_str();
  train->add_option("--zipf-col", z.colExponent, "--data zipf-mf: Zipf exponent of the columns")
      ->capture_default_str();
  train
      ->add_option("--noise-sigma", z.noiseSigma,
                   "--data zipf-mf: sigma of the Gaussian noise on the values (the noise floor "
                   "of the test RMSE; the signal has variance 1)")
      ->capture_default_str();
  train->add_option("--write-data", f.writeData,
                    "--model mf: write the ratings trained on to FOLDER/train.csv and "
                    "FOLDER/test.csv (for bench/mf_reference.py)");
  train->add_option("--rank", mf.rank, "--model mf: rank of the row and column factors")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  train->add_option("--reg", mf.reg, "--model mf: L2 coefficient on the rows each rating touches")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  train->add_option("--optimizer", mf.optimizer, "--model mf: sgd or adagrad")
      ->check(CLI::IsMember({"sgd", "adagrad"}))
      ->capture_default_str();
  train->add_option("--init-std", mf.initStd, "--model mf: factors start as N(0, init-std^2)")
      ->check(CLI::Range(0.0, 10.0))
      ->capture_default_str();
}

void runTrain(const CLI::App& app, TrainFlags& flags) {
  if (flags.options.model.name == "mf" && flags.mf.data->count() == 0) {
    flags.options.data.name = "zipf-mf";
  }
  if (flags.options.model.name == "mf") return runMfTrain(app, flags);
  if (flags.options.data.name == "zipf-mf" || flags.options.data.name == "ratings") {
    throw CommandFailure(2, "--data " + flags.options.data.name + " needs --model mf");
  }
  for (const char* mf : {"--data-file", "--test-share", "--mf-rows", "--mf-cols", "--mf-cells",
                         "--mf-planted-rank", "--zipf-row", "--zipf-col", "--noise-sigma",
                         "--write-data", "--rank", "--reg", "--optimizer", "--init-std"}) {
    if (app.count(mf) > 0) throw CommandFailure(2, std::string(mf) + " applies to --model mf only");
  }
  ml::TrainOptions options = flags.options;
  options.model.hidden = flags.hidden;
  options.data.normalize = !flags.noNormalize;
  options.flip = !flags.noFlip;
  options.data.syntheticSeed = options.seed;
  if (options.model.name != "mlp" && !flags.hidden.empty()) {
    throw CommandFailure(2, "--hidden applies only to --model mlp");
  }
  ml::ProgressReporter progress(stderr, ml::ProgressReporter::isTerminal(stderr));
  ml::TrainReport report;
  // Bad flags exit with 2, bad files and failed runs with 1; a live progress line is ended
  // first so that the error starts on its own line.
  try {
    report = ml::trainSingleNode(options, progress);
  } catch (const std::invalid_argument& e) {
    progress.finish();
    throw CommandFailure(2, e.what());
  } catch (const std::exception& e) {
    progress.finish();
    throw CommandFailure(1, e.what());
  }
  std::printf("model: %s (%zu parameters)\n", report.modelSpec.c_str(), report.parameters);
  std::printf("epochs: %lld, steps: %lld, training time: %.1f s, %.0f samples/s\n",
              static_cast<long long>(report.epochsDone), static_cast<long long>(report.steps),
              report.trainSeconds, report.samplesPerSecond);
  std::printf("test: loss %.4f, accuracy %.2f%% (%zu samples)\n", report.test.loss,
              100.0 * report.test.accuracy, report.test.samples);
  if (options.confusion) std::printf("%s", ml::formatConfusion(report.test).c_str());
  std::fflush(stdout);
}

}  // namespace

void addTrainCommand(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  ml::TrainOptions& o = flags->options;
  o.data.name = "fashion-mnist";
  o.model.name = "mlp";
  CLI::App* train = app.add_subcommand(
      "train",
      "Train one model on one node (no networking): the baseline for distributed runs.\n"
      "Prints a progress line (live on a terminal), the test accuracy after every epoch and a\n"
      "summary; optional JSON-lines metrics (--out) and checkpoints (--save, --resume).\n"
      "Example: chorus train --data fashion-mnist --model mlp --epochs 5 --batch 64 --lr 0.05\n"
      "Matrix factorization on Zipf-skewed ratings: chorus train --model mf --data zipf-mf");
  flags->mf.data =
      train
          ->add_option("--data", o.data.name,
                       "Data set: mnist, fashion-mnist, cifar10, synthetic; zipf-mf (generated) "
                       "or ratings (--data-file) for --model mf (its default: zipf-mf)")
          ->check(CLI::IsMember(trainDataNames()))
          ->capture_default_str();
  train->add_option("--data-dir", o.data.dataDir,
                    "Folder holding the data files (or their usual sub-folder mnist/, "
                    "fashion-mnist/, cifar-10-batches-bin/). Default: $CHORUS_DATA, then data/ "
                    "in the source tree, then /usr/share/datasets/");
  train
      ->add_option("--synthetic-train", o.data.syntheticTrain,
                   "Training samples of --data synthetic")
      ->check(CLI::Range(size_t{1}, size_t{10'000'000}))
      ->capture_default_str();
  train->add_option("--synthetic-test", o.data.syntheticTest, "Test samples of --data synthetic")
      ->check(CLI::Range(size_t{1}, size_t{10'000'000}))
      ->capture_default_str();
  train->add_option("--limit", o.trainLimit, "Train on the first N training samples only (0 = all)")
      ->capture_default_str();
  train->add_flag("--no-normalize", flags->noNormalize,
                  "Keep pixels in [0, 1] instead of per-channel mean/std standardization");
  train->add_option("--model", o.model.name, "Model: softmax, mlp, lenet, cifar-cnn, mf")
      ->check(CLI::IsMember(trainModelNames()))
      ->capture_default_str();
  train
      ->add_option("--hidden", flags->hidden,
                   "mlp hidden layer sizes, comma separated (default 256,128)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1'000'000));
  train
      ->add_option("--dropout", o.model.dropout,
                   "Dropout rate before the output layer (mlp, lenet, cifar-cnn)")
      ->check(CLI::Range(0.0, 0.95))
      ->capture_default_str();
  flags->mf.epochs =
      train
          ->add_option("--epochs", o.epochs,
                       fmt::format("Passes over the training data (mf: default {})", kMfEpochs))
          ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}))
          ->capture_default_str();
  flags->mf.batch = train
                        ->add_option("--batch", o.batchSize,
                                     fmt::format("Minibatch size (mf: default {})", kMfBatch))
                        ->check(CLI::Range(size_t{1}, size_t{1'000'000}))
                        ->capture_default_str();
  flags->mf.lr = train
                     ->add_option("--lr", o.learningRate,
                                  fmt::format("Base learning rate (mf: default {})", kMfLr))
                     ->check(CLI::Range(1e-9, 100.0))
                     ->capture_default_str();
  train->add_option("--momentum", o.sgd.momentum, "SGD momentum (0 = plain SGD)")
      ->check(CLI::Range(0.0, 0.999))
      ->capture_default_str();
  train->add_flag("--nesterov", o.sgd.nesterov, "Nesterov momentum");
  train->add_option("--weight-decay", o.sgd.weightDecay, "L2 weight decay (all parameters)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  train->add_option("--schedule", o.schedule, "Learning-rate schedule: constant, step, cosine")
      ->check(CLI::IsMember({"constant", "step", "cosine"}))
      ->capture_default_str();
  train
      ->add_option("--warmup-epochs", o.warmupEpochs,
                   "Linear learning-rate warm-up length in epochs (any schedule)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  train
      ->add_option("--step-epochs", o.stepEpochs,
                   "--schedule step: multiply the rate by --gamma every this many epochs")
      ->check(CLI::Range(0.0, 1e6));
  train->add_option("--gamma", o.stepGamma, "--schedule step: decay factor")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  train
      ->add_option(
          "--seed", o.seed,
          "Seed of initialization, shuffling, augmentation, dropout, synthetic and zipf-mf data")
      ->capture_default_str();
  train->add_flag("--augment", o.augment,
                  "Augment training images: random crop (see --crop-padding) and horizontal flip");
  train
      ->add_option("--crop-padding", o.cropPadding,
                   "--augment: crop from the image padded by this many zero pixels")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  train->add_flag("--no-flip", flags->noFlip,
                  "--augment: no horizontal flips (digits are not symmetric)");
  train->add_option("--out", o.metricsPath,
                    "Write metrics as JSON lines (one object per event) to this file");
  train->add_option("--log-every", o.logEverySteps, "A 'step' metrics event every N steps")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000'000}))
      ->capture_default_str();
  train->add_option("--save", o.savePath,
                    "Write a checkpoint to this file after every epoch (atomic replace)");
  train
      ->add_option("--resume", o.resumePath,
                   "Start from this checkpoint (same model flags); continues at its epoch")
      ->check(CLI::ExistingFile);
  train->add_flag("--confusion", o.confusion, "Print the test confusion matrix at the end");
  addMfOptions(train, *flags);
  train->callback([flags, train] { runTrain(*train, *flags); });
}

}  // namespace chorus::cli
