// `chorus train`: single-node training, the baseline every distributed run is measured against.
// The training itself lives in chorus_ml (ml/train.h); this file only maps flags to options.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/train_sparse.h"
#include "ml/dataset.h"
#include "ml/train.h"

namespace chorus::cli {

namespace {

struct TrainFlags {
  ml::TrainOptions options;
  std::vector<int> hidden;
  bool noNormalize = false;
  bool noFlip = false;
  SparseFlags sparse;
  CLI::Option* data = nullptr;  // --data, to tell whether it was given
};

void runTrain(const CLI::App& app, TrainFlags& flags) {
  const std::string& model = flags.options.model.name;
  if (model == "mf") {
    if (flags.data->count() == 0) flags.options.data.name = "zipf-mf";
    return runMfTrain(app, flags.options, flags.sparse);
  }
  if (isKgeModel(model)) {
    if (flags.data->count() == 0) flags.options.data.name = "wn18rr";
    return runKgeTrain(app, flags.options, flags.sparse);
  }
  const std::pair<const std::vector<std::string>*, const char*> families[] = {
      {&kMfOnlyFlags, "--model mf only"},
      {&kKgeOnlyFlags, "the knowledge-graph models only (--model complex or distmult)"},
      {&kSparseFlags, "the sparse models only (--model mf, complex or distmult)"}};
  for (const auto& [flags_of, whom] : families) {
    for (const std::string& flag : *flags_of) {
      if (app.count(flag) > 0) throw CommandFailure(2, fmt::format("{} applies to {}", flag, whom));
    }
  }
  const std::string& data = flags.options.data.name;
  if (data == "zipf-mf" || data == "ratings") {
    throw CommandFailure(2, fmt::format("--data {} needs --model mf", data));
  }
  const auto& imageSets = ml::datasetNames();
  if (std::find(imageSets.begin(), imageSets.end(), data) == imageSets.end()) {
    throw CommandFailure(2, fmt::format("--data {}: --model {} takes {}; knowledge graphs are for "
                                        "--model complex or distmult",
                                        data, model, fmt::join(imageSets, ", ")));
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
  runTraining(progress, [&] { report = ml::trainSingleNode(options, progress); });
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
      "Matrix factorization on Zipf-skewed ratings: chorus train --model mf --data zipf-mf\n"
      "Knowledge graphs: chorus train --data wn18rr --model complex --dim 200 --negatives 512\n"
      "  --loss ce --reg n3 --reg-weight 0.01 (filtered MRR and Hits@k on valid and test)");
  flags->data = train
                    ->add_option("--data", o.data.name,
                                 "Data set: mnist, fashion-mnist, cifar10, synthetic (image "
                                 "models); zipf-mf (generated) or ratings (--data-file) for "
                                 "--model mf, its default zipf-mf; wn18rr or the name of any "
                                 "triple folder given with --data-dir for the knowledge-graph "
                                 "models, their default wn18rr")
                    ->capture_default_str();
  train->add_option("--data-dir", o.data.dataDir,
                    "Folder holding the data files (or their usual sub-folder mnist/, "
                    "fashion-mnist/, cifar-10-batches-bin/, <--data>/ for triples). Default: "
                    "$CHORUS_DATA, then data/ in the source tree, then /usr/share/datasets/. A "
                    "triple folder holds train.txt, valid.txt, test.txt (head<TAB>relation<TAB>"
                    "tail, plain or .gz), optionally entities.dict, relations.dict");
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
  std::vector<std::string> models = ml::modelNames();
  models.push_back("mf");
  models.insert(models.end(), ml::kgeModelNames().begin(), ml::kgeModelNames().end());
  train
      ->add_option("--model", o.model.name,
                   "Model: softmax, mlp, lenet, cifar-cnn (images); mf (matrix factorization); "
                   "complex, distmult (knowledge-graph embeddings)")
      ->check(CLI::IsMember(models))
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
  train->add_option("--epochs", o.epochs, "Passes over the training data (mf: default 10)")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}))
      ->capture_default_str();
  train
      ->add_option("--batch", o.batchSize,
                   "Minibatch size (mf: default 1000 ratings; knowledge graphs: 512 triples)")
      ->check(CLI::Range(size_t{1}, size_t{1'000'000}))
      ->capture_default_str();
  train->add_option("--lr", o.learningRate, "Base learning rate (sparse models: default 0.1)")
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
      ->add_option("--seed", o.seed,
                   "Seed of initialization, shuffling, augmentation, dropout, negative samples, "
                   "synthetic and zipf-mf data")
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
  addSparseOptions(*train, flags->sparse);
  train->callback([flags, train] { runTrain(*train, *flags); });
}

}  // namespace chorus::cli
