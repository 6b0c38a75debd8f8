#include "ml/train.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "ml/checkpoint.h"

namespace chorus::ml {

size_t countCorrect(const Matrix& logits, std::span<const int32_t> labels) {
  size_t correct = 0;
  for (Eigen::Index s = 0; s < logits.cols(); ++s) {
    Eigen::Index best = 0;
    logits.col(s).maxCoeff(&best);
    if (best == labels[static_cast<size_t>(s)]) ++correct;
  }
  return correct;
}

size_t evaluationBatch(const Model& model) {
  // Measured 2026-11-23 (Release, cifar-cnn on 4000 samples): 1.09 s and +577 MB at peak with
  // batches of 1000, 1.05 s and +51 MB with the 64 this picks; lenet 0.33 s at 1000, 0.34 s
  // at the 117 this picks. mlp is 3x slower at 128 than at 1000, and its activations are
  // small: it keeps 1000.
  constexpr size_t kActivationBytes = size_t{16} << 20;
  const size_t per_sample = std::max<size_t>(1, model.activationFloatsPerSample()) * sizeof(float);
  return std::clamp<size_t>(kActivationBytes / per_sample, 64, 1000);
}

Evaluation evaluate(Model& model, const Dataset& data, bool withConfusion, size_t batchSize) {
  if (!(data.shape == model.spec().input) || data.classes != model.spec().classes) {
    throw std::invalid_argument(fmt::format("data set {} ({}, {} classes) does not fit model {}",
                                            data.name, data.shape.toString(), data.classes,
                                            model.spec().toString()));
  }
  Evaluation result;
  result.classes = data.classes;
  result.samples = data.size();
  if (withConfusion)
    result.confusion.assign(static_cast<size_t>(data.classes) * static_cast<size_t>(data.classes),
                            0);
  if (data.size() == 0) return result;
  if (batchSize == 0) batchSize = evaluationBatch(model);
  Matrix batch;
  std::vector<int32_t> labels;
  std::vector<size_t> indices;
  const Augmentation none;
  Rng unused(0);
  double lossSum = 0.0;
  size_t correct = 0;
  for (size_t first = 0; first < data.size(); first += batchSize) {
    const size_t count = std::min(batchSize, data.size() - first);
    indices.resize(count);
    for (size_t i = 0; i < count; ++i)
      indices[i] = first + i;
    gatherBatch(data, indices, batch, labels, none, unused);
    const Matrix& logits = model.forward(batch);
    lossSum += softmaxCrossEntropy(logits, labels, nullptr) * static_cast<double>(count);
    for (Eigen::Index s = 0; s < logits.cols(); ++s) {
      Eigen::Index best = 0;
      logits.col(s).maxCoeff(&best);
      const int32_t truth = labels[static_cast<size_t>(s)];
      if (best == truth) ++correct;
      if (withConfusion) ++result.confusion[static_cast<size_t>(truth * data.classes + best)];
    }
  }
  result.loss = lossSum / static_cast<double>(data.size());
  result.accuracy = static_cast<double>(correct) / static_cast<double>(data.size());
  return result;
}

std::string formatConfusion(const Evaluation& evaluation) {
  const int classes = evaluation.classes;
  if (evaluation.confusion.size() != static_cast<size_t>(classes) * static_cast<size_t>(classes))
    return {};
  std::string text = "confusion matrix (rows: true label, columns: predicted)\n      ";
  for (int c = 0; c < classes; ++c)
    text += fmt::format("{:>6}", c);
  text += '\n';
  for (int r = 0; r < classes; ++r) {
    text += fmt::format("{:>6}", r);
    for (int c = 0; c < classes; ++c) {
      text += fmt::format(
          "{:>6}", evaluation.confusion[static_cast<size_t>(r) * static_cast<size_t>(classes) +
                                        static_cast<size_t>(c)]);
    }
    text += '\n';
  }
  return text;
}

namespace {}  // namespace

void validateTrainOptions(const TrainOptions& options) {
  if (options.epochs < 0) throw std::invalid_argument("--epochs must be >= 0");
  if (options.batchSize == 0) throw std::invalid_argument("--batch must be > 0");
  if (!(options.learningRate > 0.0) || !std::isfinite(options.learningRate)) {
    throw std::invalid_argument("--lr must be a positive number");
  }
  if (options.warmupEpochs < 0.0) throw std::invalid_argument("--warmup-epochs must be >= 0");
  if (options.schedule == "step" && !(options.stepEpochs > 0.0)) {
    throw std::invalid_argument("--schedule step needs --step-epochs > 0");
  }
  if (options.logEverySteps <= 0) throw std::invalid_argument("--log-every must be > 0");
  if (options.cropPadding < 0) throw std::invalid_argument("--crop-padding must be >= 0");
  LrSchedule::parseKind(options.schedule);
  if (options.model.dropout < 0.0f || options.model.dropout >= 1.0f) {
    throw std::invalid_argument("--dropout must be in [0, 1)");
  }
}

namespace {

std::string percent(double fraction) {
  return fmt::format("{:.2f}%", 100.0 * fraction);
}

}  // namespace

TrainReport trainOnData(const TrainOptions& options, const DataSplit& data,
                        ProgressReporter& progress) {
  validateTrainOptions(options);
  const Dataset& train = data.train;
  const Dataset& test = data.test;
  ModelSpec spec = options.model;
  spec.input = train.shape;
  spec.classes = train.classes;
  auto model = Model::create(spec, options.seed);

  const size_t trainSize =
      options.trainLimit == 0 ? train.size() : std::min(options.trainLimit, train.size());
  if (trainSize == 0) throw std::invalid_argument("no training samples");
  EpochSampler sampler(allIndices(trainSize), options.batchSize, options.seed);
  const auto stepsPerEpoch = static_cast<int64_t>(sampler.batchesPerEpoch());

  LrSchedule schedule;
  schedule.kind = LrSchedule::parseKind(options.schedule);
  schedule.baseLr = options.learningRate;
  schedule.warmupSteps = scheduleSteps(options.warmupEpochs, stepsPerEpoch);
  schedule.stepEvery = scheduleSteps(options.stepEpochs, stepsPerEpoch);
  if (schedule.warmupSteps == 1) {
    // The ramp is base*(step+1)/warmupSteps: one step of it is the full rate.
    progress.line(fmt::format(
        "--warmup-epochs {} is one step at {} steps per epoch, and a warm-up of one step has no "
        "effect (it starts at the full rate)",
        options.warmupEpochs, stepsPerEpoch));
  }
  schedule.gamma = options.stepGamma;
  schedule.totalSteps = options.epochs * stepsPerEpoch;
  SgdOptimizer optimizer(options.sgd, schedule, model->size());

  int64_t firstEpoch = 0;
  if (!options.resumePath.empty()) {
    Checkpoint checkpoint = loadCheckpoint(options.resumePath);
    checkCompatible(checkpoint, options.resumePath, spec.toString(), model->size());
    // The seed picks the shuffle order, the augmentation and, with --data synthetic, the data
    // itself: another seed would not continue the saved run but silently start a different one.
    if (checkpoint.seed != options.seed) {
      throw CheckpointError(
          fmt::format("{}: written with --seed {}, this run uses --seed {}: pass --seed {} to "
                      "resume",
                      options.resumePath, checkpoint.seed, options.seed, checkpoint.seed));
    }
    std::copy(checkpoint.params.begin(), checkpoint.params.end(), model->params().begin());
    if (!optimizer.state().empty()) {
      if (checkpoint.optimizerState.empty()) {
        progress.line(fmt::format("{}: no optimizer state stored; momentum restarts from zero",
                                  options.resumePath));
      } else {
        std::copy(checkpoint.optimizerState.begin(), checkpoint.optimizerState.end(),
                  optimizer.state().begin());
      }
    } else if (!checkpoint.optimizerState.empty()) {
      // Changing hyper-parameters on resume is allowed (as with --lr); it is said, not refused.
      progress.line(fmt::format(
          "{}: holds momentum velocity, but this run has --momentum 0: the velocity is dropped",
          options.resumePath));
    }
    optimizer.setStepCount(checkpoint.step);
    firstEpoch = checkpoint.epoch;
    progress.line(fmt::format("resumed from {} at epoch {}, step {}", options.resumePath,
                              checkpoint.epoch, checkpoint.step));
  }

  MetricsWriter metrics(options.metricsPath);
  metrics.write(MetricsEvent("start")
                    .add("model", spec.toString())
                    .add("parameters", static_cast<uint64_t>(model->size()))
                    .add("data", train.name)
                    .add("source", data.source)
                    .add("train_samples", static_cast<uint64_t>(trainSize))
                    .add("test_samples", static_cast<uint64_t>(test.size()))
                    .add("batch", static_cast<uint64_t>(options.batchSize))
                    .add("lr", options.learningRate)
                    .add("schedule", options.schedule)
                    .add("seed", options.seed)
                    .add("start_epoch", firstEpoch));

  TrainReport report;
  report.parameters = model->size();
  report.modelSpec = spec.toString();
  Augmentation augmentation;
  augmentation.enabled = options.augment;
  augmentation.padding = options.cropPadding;
  augmentation.flip = options.flip;
  Matrix batch;
  std::vector<int32_t> labels;
  double trainSeconds = 0.0;
  int64_t samplesSeen = 0;

  auto saveIfAsked = [&](int64_t epochsDone) {
    if (options.savePath.empty()) return;
    Checkpoint checkpoint;
    checkpoint.modelSpec = spec.toString();
    checkpoint.step = optimizer.stepCount();
    checkpoint.epoch = epochsDone;
    checkpoint.seed = options.seed;
    checkpoint.params.assign(model->params().begin(), model->params().end());
    checkpoint.optimizerState.assign(optimizer.state().begin(), optimizer.state().end());
    saveCheckpoint(options.savePath, checkpoint);
  };

  // Loss and accuracy since the last "step" event; an event can span an epoch boundary.
  double windowLoss = 0.0;
  size_t windowCorrect = 0, windowSamples = 0;
  for (int64_t epoch = firstEpoch; epoch < options.epochs; ++epoch) {
    sampler.startEpoch(epoch);
    Rng augmentRng(mixSeed(options.seed, 0xA0000 + static_cast<uint64_t>(epoch)));
    const auto epochStart = std::chrono::steady_clock::now();
    double epochLoss = 0.0;
    size_t epochCorrect = 0, epochSamples = 0;
    int64_t stepInEpoch = 0;
    for (auto indices = sampler.next(); !indices.empty(); indices = sampler.next()) {
      gatherBatch(train, indices, batch, labels, augmentation, augmentRng);
      const double loss = model->forwardBackward(batch, labels);
      if (!std::isfinite(loss)) {
        throw std::runtime_error(
            fmt::format("training diverged (loss {}) at epoch {}, step {}: lower --lr", loss,
                        epoch + 1, stepInEpoch + 1));
      }
      const size_t correct = countCorrect(model->logits(), labels);
      const double lr = optimizer.currentLr();
      optimizer.step(model->params(), model->grads());
      ++stepInEpoch;
      epochLoss += loss * static_cast<double>(indices.size());
      epochCorrect += correct;
      epochSamples += indices.size();
      windowLoss += loss * static_cast<double>(indices.size());
      windowCorrect += correct;
      windowSamples += indices.size();
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - epochStart).count();
      const double rate = elapsed > 0.0 ? static_cast<double>(epochSamples) / elapsed : 0.0;
      if (optimizer.stepCount() % options.logEverySteps == 0) {
        metrics.write(MetricsEvent("step")
                          .add("epoch", epoch + 1)
                          .add("step", optimizer.stepCount())
                          .add("loss", windowLoss / static_cast<double>(windowSamples))
                          .add("accuracy", static_cast<double>(windowCorrect) /
                                               static_cast<double>(windowSamples))
                          .add("lr", lr)
                          .add("samples_per_s", rate));
        windowLoss = 0.0;
        windowCorrect = windowSamples = 0;
      }
      progress.update(fmt::format(
          "epoch {}/{} step {}/{} {:.0f} samples/s loss {:.4f} acc {}", epoch + 1, options.epochs,
          stepInEpoch, stepsPerEpoch, rate, epochLoss / static_cast<double>(epochSamples),
          percent(static_cast<double>(epochCorrect) / static_cast<double>(epochSamples))));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - epochStart).count();
    trainSeconds += seconds;
    samplesSeen += static_cast<int64_t>(epochSamples);
    const double meanLoss = epochLoss / static_cast<double>(std::max<size_t>(epochSamples, 1));
    const double trainAccuracy =
        static_cast<double>(epochCorrect) / static_cast<double>(std::max<size_t>(epochSamples, 1));
    const Evaluation evaluation = evaluate(*model, test);
    report.epochLosses.push_back(meanLoss);
    report.epochTestAccuracy.push_back(evaluation.accuracy);
    progress.line(fmt::format(
        "epoch {}/{}: train loss {:.4f} acc {} | test loss {:.4f} acc {} | {:.1f} s, {:.0f} "
        "samples/s",
        epoch + 1, options.epochs, meanLoss, percent(trainAccuracy), evaluation.loss,
        percent(evaluation.accuracy), seconds, static_cast<double>(epochSamples) / seconds));
    metrics.write(MetricsEvent("epoch")
                      .add("epoch", epoch + 1)
                      .add("step", optimizer.stepCount())
                      .add("loss", meanLoss)
                      .add("accuracy", trainAccuracy)
                      .add("test_loss", evaluation.loss)
                      .add("test_accuracy", evaluation.accuracy)
                      .add("epoch_seconds", seconds)
                      .add("train_seconds", trainSeconds));
    saveIfAsked(epoch + 1);
  }
  progress.finish();

  report.test = evaluate(*model, test, options.confusion);
  report.epochsDone = std::max(firstEpoch, options.epochs);
  report.steps = optimizer.stepCount();
  report.trainSeconds = trainSeconds;
  report.samplesPerSecond =
      trainSeconds > 0.0 ? static_cast<double>(samplesSeen) / trainSeconds : 0.0;
  MetricsEvent summary("summary");
  summary.add("epochs", report.epochsDone)
      .add("steps", report.steps)
      .add("test_loss", report.test.loss)
      .add("test_accuracy", report.test.accuracy)
      .add("train_seconds", trainSeconds)
      .add("samples_per_s", report.samplesPerSecond);
  if (options.confusion) {
    summary.addRaw("confusion", fmt::format("[{}]", fmt::join(report.test.confusion, ",")));
  }
  metrics.write(summary);
  return report;
}

TrainReport trainSingleNode(const TrainOptions& options, ProgressReporter& progress) {
  validateTrainOptions(options);
  const DataSplit data = loadDataset(options.data);
  progress.line(fmt::format("data: {} from {} ({} training, {} test samples, {})",
                            options.data.name, data.source, data.train.size(), data.test.size(),
                            data.train.shape.toString()));
  return trainOnData(options, data, progress);
}

}  // namespace chorus::ml
