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
#include "ml/dataset.h"
#include "ml/kge_workload.h"
#include "ml/train.h"
#include "ml/triples.h"

namespace chorus::cli {

namespace {

struct TrainFlags {
  ml::TrainOptions options;
  std::vector<int> hidden;
  bool noNormalize = false;
  bool noFlip = false;
  // Knowledge-graph embeddings (--model complex|distmult).
  ml::KgeConfig kge;
  std::string negatives = "256";
  std::string loss = "logistic";
  std::string reg = "n3";
  std::string optimizer = "adagrad";
  int64_t evalEvery = 1;
  double timeLimit = 0.0;
  double adagradInitial = 0.0;
  CLI::App* command = nullptr;  // to ask which flags were given
};

// The flags that only the dense image models take, and those only the KGE models take: each
// family refuses the other's, naming it, rather than ignoring it.
const char* const kDenseOnlyFlags[] = {
    "--synthetic-train", "--synthetic-test", "--limit",    "--no-normalize", "--hidden",
    "--dropout",         "--momentum",       "--nesterov", "--weight-decay", "--schedule",
    "--warmup-epochs",   "--step-epochs",    "--gamma",    "--augment",      "--crop-padding",
    "--no-flip",         "--confusion"};
const char* const kKgeOnlyFlags[] = {"--dim",        "--negatives",
                                     "--loss",       "--reg",
                                     "--reg-weight", "--adversarial-temperature",
                                     "--optimizer",  "--init-scale",
                                     "--eval-every", "--adagrad-initial",
                                     "--time-limit"};

bool isKgeModel(const std::string& model) {
  const auto& names = ml::kgeModelNames();
  return std::find(names.begin(), names.end(), model) != names.end();
}

bool given(const TrainFlags& flags, const char* name) {
  return flags.command->get_option(name)->count() > 0;
}

// `chorus train --model complex|distmult`: knowledge-graph embeddings on a triple folder.
void runKgeTrain(const TrainFlags& flags) {
  for (const char* name : kDenseOnlyFlags) {
    if (given(flags, name)) {
      throw CommandFailure(2, fmt::format("{} does not apply to --model {} (a knowledge-graph "
                                          "model); see chorus train --help",
                                          name, flags.options.model.name));
    }
  }
  const ml::TrainOptions& o = flags.options;
  const auto& imageSets = ml::datasetNames();
  if (std::find(imageSets.begin(), imageSets.end(), o.data.name) != imageSets.end()) {
    throw CommandFailure(2, fmt::format("--data {} is an image data set; --model {} trains on a "
                                        "knowledge graph (--data wn18rr, or any triple folder "
                                        "with --data-dir)",
                                        o.data.name, o.model.name));
  }
  ml::KgeConfig kge = flags.kge;
  ml::SparseTrainOptions train;
  try {
    kge.model = ml::parseKgeModel(o.model.name);
    kge.loss = ml::parseKgeLoss(flags.loss);
    kge.regularizer = ml::parseKgeRegularizer(flags.reg);
    if (flags.negatives == "all") {
      kge.allNegatives = true;
    } else {
      size_t used = 0;
      long long n = -1;
      try {
        n = std::stoll(flags.negatives, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != flags.negatives.size() || n < 1 || n > 1'000'000) {
        throw std::invalid_argument(fmt::format(
            "--negatives must be 'all' or a count in [1, 1000000], not '{}'", flags.negatives));
      }
      kge.negatives = static_cast<size_t>(n);
    }
    kge.validate();
    train.epochs = o.epochs;
    // The dense models' defaults (--batch 64, --lr 0.05 with momentum SGD) do not suit sparse
    // AdaGrad training; the KGE defaults apply unless the flags are given.
    train.batchSize = given(flags, "--batch") ? o.batchSize : 512;
    train.optimizer.kind = ml::parseSparseOptimizer(flags.optimizer);
    train.optimizer.lr = given(flags, "--lr") ? o.learningRate : 0.1;
    train.optimizer.initialAccumulator = flags.adagradInitial;
    train.seed = o.seed;
    train.evalEvery = flags.evalEvery;
    train.logEverySteps = o.logEverySteps;
    train.timeLimitSeconds = flags.timeLimit;
    train.metricsPath = o.metricsPath;
    train.savePath = o.savePath;
    train.resumePath = o.resumePath;
    ml::validateSparseTrainOptions(train);
  } catch (const std::invalid_argument& e) {
    throw CommandFailure(2, e.what());
  }
  ml::ProgressReporter progress(stderr, ml::ProgressReporter::isTerminal(stderr));
  ml::SparseTrainReport report;
  try {
    const std::string dir = ml::findTripleDir(o.data.name, o.data.dataDir);
    const ml::KgData data = ml::readTriples(dir);
    progress.line(fmt::format(
        "data: {} from {} ({} entities, {} relations; {} training, {} valid, {} test triples)",
        o.data.name, dir, data.entities(), data.relations(), data.train.size(), data.valid.size(),
        data.test.size()));
    ml::KgeWorkload workload(data, kge, o.seed);
    train.startFields = {{"data", o.data.name},
                         {"source", dir},
                         {"negatives", flags.negatives},
                         {"loss", flags.loss},
                         {"adversarial_temperature", fmt::format("{}", kge.adversarialTemperature)},
                         {"reg", flags.reg},
                         {"reg_weight", fmt::format("{}", kge.regWeight)}};
    report = ml::trainSparse(workload, train, progress);
  } catch (const std::invalid_argument& e) {
    progress.finish();
    throw CommandFailure(2, e.what());
  } catch (const std::exception& e) {
    progress.finish();
    throw CommandFailure(1, e.what());
  }
  std::printf("model: %s (%zu parameters)\n", report.spec.c_str(), report.parameters);
  std::printf("epochs: %lld, steps: %lld, training time: %.1f s, %.0f triples/s\n",
              static_cast<long long>(report.epochsDone), static_cast<long long>(report.steps),
              report.trainSeconds, report.pointsPerSecond);
  for (const auto& [split, metrics] : report.final) {
    std::string line = split + " (filtered, both directions):";
    for (const ml::NamedMetric& m : metrics)
      line += fmt::format(" {} {:.4f}", m.name, m.value);
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

void runTrain(const TrainFlags& flags) {
  if (isKgeModel(flags.options.model.name)) {
    runKgeTrain(flags);
    return;
  }
  for (const char* name : kKgeOnlyFlags) {
    if (given(flags, name)) {
      throw CommandFailure(2, fmt::format("{} applies only to the knowledge-graph models "
                                          "(--model complex or distmult)",
                                          name));
    }
  }
  {
    const auto& imageSets = ml::datasetNames();
    if (std::find(imageSets.begin(), imageSets.end(), flags.options.data.name) == imageSets.end()) {
      throw CommandFailure(2, fmt::format("--data {} needs a knowledge-graph model (--model "
                                          "complex or distmult); --model {} takes {}",
                                          flags.options.data.name, flags.options.model.name,
                                          fmt::join(imageSets, ", ")));
    }
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
      "Knowledge graphs: chorus train --data wn18rr --model complex --dim 200 --negatives 512\n"
      "  --loss ce --reg n3 --reg-weight 0.01 (filtered MRR and Hits@k on valid and test)");
  train
      ->add_option("--data", o.data.name,
                   "Data set: mnist, fashion-mnist, cifar10, synthetic (image models); wn18rr "
                   "or the name of any triple folder given with --data-dir (knowledge-graph "
                   "models)")
      ->capture_default_str();
  train->add_option("--data-dir", o.data.dataDir,
                    "Folder holding the data files (or their usual sub-folder mnist/, "
                    "fashion-mnist/, cifar-10-batches-bin/, <--data>/ for triples). Default: "
                    "$CHORUS_DATA, then data/ in the source tree, then /usr/share/datasets/ "
                    "(images). A triple folder holds train.txt, valid.txt, test.txt "
                    "(head<TAB>relation<TAB>tail), optionally entities.dict, relations.dict");
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
  models.insert(models.end(), ml::kgeModelNames().begin(), ml::kgeModelNames().end());
  train
      ->add_option("--model", o.model.name,
                   "Model: softmax, mlp, lenet, cifar-cnn (images); complex, distmult "
                   "(knowledge-graph embeddings, trained with sparse AdaGrad or SGD)")
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
  train->add_option("--epochs", o.epochs, "Passes over the training data")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}))
      ->capture_default_str();
  train
      ->add_option("--batch", o.batchSize, "Minibatch size (knowledge graphs: default 512 triples)")
      ->check(CLI::Range(size_t{1}, size_t{1'000'000}))
      ->capture_default_str();
  train->add_option("--lr", o.learningRate, "Base learning rate (knowledge graphs: default 0.1)")
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
                   "Seed of initialization, shuffling, augmentation, dropout and synthetic data")
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
  ml::KgeConfig& k = flags->kge;
  train
      ->add_option("--dim", k.dim,
                   "KGE: floats per embedding row (ComplEx: dim/2 complex numbers, so even)")
      ->check(CLI::Range(size_t{1}, size_t{100000}))
      ->capture_default_str();
  train
      ->add_option("--negatives", flags->negatives,
                   "KGE: negatives per positive, drawn uniformly for the head and again for the "
                   "tail; 'all' scores every entity (1-N scoring, as matrix products)")
      ->capture_default_str();
  train
      ->add_option("--loss", flags->loss,
                   "KGE: logistic (softplus on the positive and the negatives) or ce (softmax "
                   "cross-entropy of the positive against the negatives)")
      ->check(CLI::IsMember({"logistic", "ce"}))
      ->capture_default_str();
  train
      ->add_option("--adversarial-temperature", k.adversarialTemperature,
                   "KGE, --loss logistic: weight the negatives by softmax(T * score) (RotatE's "
                   "self-adversarial sampling); 0 weighs them equally")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  train
      ->add_option("--reg", flags->reg,
                   "KGE: regularizer of the rows a triple uses: none, l2 (sum x^2), n3 (sum "
                   "|x|^3, complex modulus for ComplEx)")
      ->check(CLI::IsMember({"none", "l2", "n3"}))
      ->capture_default_str();
  train->add_option("--reg-weight", k.regWeight, "KGE: weight of the regularizer per triple")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  train
      ->add_option("--optimizer", flags->optimizer,
                   "KGE: adagrad (per-parameter state kept per row) or sgd; both update only "
                   "the rows a step touched")
      ->check(CLI::IsMember({"adagrad", "sgd"}))
      ->capture_default_str();
  train
      ->add_option("--adagrad-initial", flags->adagradInitial,
                   "KGE, --optimizer adagrad: starting value of every accumulator. With 0 (as "
                   "torch) the first step moves every parameter with a non-zero gradient by "
                   "--lr, however small its gradient; TensorFlow starts at 0.1")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  train->add_option("--init-scale", k.initScale, "KGE: embeddings start as N(0, s^2) values")
      ->check(CLI::Range(1e-12, 1e3))
      ->capture_default_str();
  train
      ->add_option("--eval-every", flags->evalEvery,
                   "KGE: filtered MRR on the validation triples every N epochs (0: only at the "
                   "end, where valid and test are always evaluated)")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}))
      ->capture_default_str();
  train
      ->add_option("--time-limit", flags->timeLimit,
                   "KGE: stop after the epoch in which training time passes this many seconds "
                   "(0: no limit)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  flags->command = train;
  train->callback([flags] { runTrain(*flags); });
}

}  // namespace chorus::cli
