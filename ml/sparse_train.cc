#include "ml/sparse_train.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "ml/batches.h"
#include "ml/checkpoint.h"

namespace chorus::ml {

void validateSparseTrainOptions(const SparseTrainOptions& options) {
  if (options.epochs < 0) throw std::invalid_argument("--epochs must be >= 0");
  if (options.batchSize == 0) throw std::invalid_argument("--batch must be > 0");
  if (!(options.optimizer.lr > 0.0) || !std::isfinite(options.optimizer.lr)) {
    throw std::invalid_argument("--lr must be a positive number");
  }
  if (options.evalEvery < 0) throw std::invalid_argument("--eval-every-epochs must be >= 0");
  if (options.logEverySteps <= 0) throw std::invalid_argument("--log-every must be > 0");
  if (!(options.timeLimitSeconds >= 0.0)) {
    throw std::invalid_argument("--time-limit must be >= 0");
  }
}

std::string formatMetrics(const std::vector<NamedMetric>& metrics) {
  std::string text;
  for (const NamedMetric& m : metrics) {
    if (!text.empty()) text += ' ';
    text += fmt::format("{} {:.4f}", m.name, m.value);
  }
  return text;
}

void addMetrics(MetricsEvent& event, const std::string& prefix,
                const std::vector<NamedMetric>& metrics) {
  for (const NamedMetric& m : metrics)
    event.add(prefix + m.name, m.value);
}

namespace {

// A checkpoint holds the tables one after another as its parameters, and AdaGrad's state of
// each table in the same order (none with SGD).
Checkpoint makeCheckpoint(SparseWorkload& workload, const std::vector<SparseOptimizer>& optimizers,
                          int64_t step, int64_t epoch, uint64_t seed) {
  Checkpoint checkpoint;
  checkpoint.modelSpec = workload.spec();
  checkpoint.step = step;
  checkpoint.epoch = epoch;
  checkpoint.seed = seed;
  for (SparseTable* table : workload.tables())
    checkpoint.params.insert(checkpoint.params.end(), table->values().begin(),
                             table->values().end());
  for (const SparseOptimizer& optimizer : optimizers)
    checkpoint.optimizerState.insert(checkpoint.optimizerState.end(), optimizer.state().begin(),
                                     optimizer.state().end());
  return checkpoint;
}

}  // namespace

SparseTrainReport trainSparse(SparseWorkload& workload, const SparseTrainOptions& options,
                              ProgressReporter& progress) {
  validateSparseTrainOptions(options);
  const std::vector<SparseTable*> tables = workload.tables();
  std::vector<SparseOptimizer> optimizers;
  std::vector<SparseGradAccumulator> accumulators;
  std::vector<SparseGrad> grads(tables.size());
  size_t parameters = 0;
  for (SparseTable* table : tables) {
    optimizers.emplace_back(options.optimizer, *table);
    accumulators.emplace_back(table->rows(), table->dim());
    parameters += table->values().size();
  }
  const size_t points = workload.trainPoints();
  if (points == 0) throw std::invalid_argument("no training data points");
  EpochSampler sampler(allIndices(points), options.batchSize, options.seed);
  const auto stepsPerEpoch = static_cast<int64_t>(sampler.batchesPerEpoch());

  int64_t firstEpoch = 0;
  int64_t step = 0;
  if (!options.resumePath.empty()) {
    const Checkpoint checkpoint = loadCheckpoint(options.resumePath);
    checkCompatible(checkpoint, options.resumePath, workload.spec(), parameters);
    if (checkpoint.seed != options.seed) {
      throw CheckpointError(
          fmt::format("{}: written with --seed {}, this run uses --seed {}: pass --seed {} to "
                      "resume",
                      options.resumePath, checkpoint.seed, options.seed, checkpoint.seed));
    }
    size_t stateSize = 0;
    for (const SparseOptimizer& optimizer : optimizers)
      stateSize += optimizer.state().size();
    if (checkpoint.optimizerState.size() != stateSize) {
      throw CheckpointError(fmt::format(
          "{}: holds {} optimizer state values, --optimizer {} needs {}: resume with the "
          "optimizer it was written with",
          options.resumePath, checkpoint.optimizerState.size(),
          sparseOptimizerName(options.optimizer.kind), stateSize));
    }
    size_t offset = 0;
    for (SparseTable* table : tables) {
      std::copy_n(checkpoint.params.begin() + static_cast<std::ptrdiff_t>(offset),
                  table->values().size(), table->values().begin());
      offset += table->values().size();
    }
    offset = 0;
    for (SparseOptimizer& optimizer : optimizers) {
      std::copy_n(checkpoint.optimizerState.begin() + static_cast<std::ptrdiff_t>(offset),
                  optimizer.state().size(), optimizer.state().begin());
      offset += optimizer.state().size();
    }
    firstEpoch = checkpoint.epoch;
    step = checkpoint.step;
    progress.line(fmt::format("resumed from {} at epoch {}, step {}", options.resumePath,
                              checkpoint.epoch, checkpoint.step));
  }

  MetricsWriter metrics(options.metricsPath);
  MetricsEvent start("start");
  start.add("model", workload.spec())
      .add("parameters", static_cast<uint64_t>(parameters))
      .add("train_points", static_cast<uint64_t>(points))
      .add("batch", static_cast<uint64_t>(options.batchSize))
      .add("optimizer", sparseOptimizerName(options.optimizer.kind))
      .add("lr", options.optimizer.lr)
      .add("seed", options.seed)
      .add("start_epoch", firstEpoch);
  for (const auto& [key, value] : options.startFields)
    start.add(key, value);
  metrics.write(start);

  SparseTrainReport report;
  report.parameters = parameters;
  report.spec = workload.spec();
  const std::vector<std::string> splits = workload.evalSplits();
  double trainSeconds = 0.0;
  int64_t pointsSeen = 0;
  double windowLoss = 0.0;
  size_t windowPoints = 0;
  // keepBest: the tables of the best epoch on the first split so far (empty: none yet).
  std::vector<std::vector<float>> bestTables;
  double bestQuality = 0.0;
  int64_t bestEpoch = 0;
  const auto improves = [&](double quality) {
    return bestTables.empty() ||
           (workload.higherIsBetter() ? quality > bestQuality : quality < bestQuality);
  };
  const auto keepIfBest = [&](double quality, int64_t epochNumber) {
    if (!options.keepBest || !improves(quality)) return;
    bestTables.resize(tables.size());
    for (size_t i = 0; i < tables.size(); ++i)
      bestTables[i].assign(tables[i]->values().begin(), tables[i]->values().end());
    bestQuality = quality;
    bestEpoch = epochNumber;
  };
  int64_t epoch = firstEpoch;
  for (; epoch < options.epochs; ++epoch) {
    sampler.startEpoch(epoch);
    // The workload's sampling stream of epoch e depends only on (seed, e): a resumed run draws
    // the negatives an uninterrupted one would have.
    Rng rng(mixSeed(options.seed, 0x5EED0000 + static_cast<uint64_t>(epoch)));
    const auto epochStart = std::chrono::steady_clock::now();
    double epochLoss = 0.0;
    size_t epochPoints = 0;
    int64_t stepInEpoch = 0;
    for (auto batch = sampler.next(); !batch.empty(); batch = sampler.next()) {
      const double loss = workload.computeGradients(batch, rng, accumulators);
      if (!std::isfinite(loss)) {
        throw std::runtime_error(
            fmt::format("training diverged (loss {}) at epoch {}, step {}: "
                        "lower --lr",
                        loss, epoch + 1, stepInEpoch + 1));
      }
      for (size_t i = 0; i < tables.size(); ++i) {
        accumulators[i].finish(grads[i]);
        optimizers[i].apply(*tables[i], grads[i]);
      }
      ++step;
      ++stepInEpoch;
      epochLoss += loss * static_cast<double>(batch.size());
      epochPoints += batch.size();
      windowLoss += loss * static_cast<double>(batch.size());
      windowPoints += batch.size();
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - epochStart).count();
      const double rate = elapsed > 0.0 ? static_cast<double>(epochPoints) / elapsed : 0.0;
      if (step % options.logEverySteps == 0) {
        metrics.write(MetricsEvent("step")
                          .add("epoch", epoch + 1)
                          .add("step", step)
                          .add("loss", windowLoss / static_cast<double>(windowPoints))
                          .add("lr", options.optimizer.lr)
                          .add("points_per_s", rate));
        windowLoss = 0.0;
        windowPoints = 0;
      }
      progress.update(fmt::format("epoch {}/{} step {}/{} {:.0f} points/s loss {:.4f}", epoch + 1,
                                  options.epochs, stepInEpoch, stepsPerEpoch, rate,
                                  epochLoss / static_cast<double>(epochPoints)));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - epochStart).count();
    trainSeconds += seconds;
    pointsSeen += static_cast<int64_t>(epochPoints);
    const double meanLoss = epochLoss / static_cast<double>(std::max<size_t>(epochPoints, 1));
    report.epochLosses.push_back(meanLoss);
    MetricsEvent event("epoch");
    event.add("epoch", epoch + 1)
        .add("step", step)
        .add("loss", meanLoss)
        .add("epoch_seconds", seconds)
        .add("train_seconds", trainSeconds)
        .add("points_per_s", static_cast<double>(epochPoints) / seconds);
    std::string line =
        fmt::format("epoch {}/{}: train loss {:.4f} | {:.1f} s, {:.0f} points/s", epoch + 1,
                    options.epochs, meanLoss, seconds, static_cast<double>(epochPoints) / seconds);
    const bool last = epoch + 1 == options.epochs;
    if (!splits.empty() && options.evalEvery > 0 && (epoch + 1) % options.evalEvery == 0 && !last) {
      const auto evalStart = std::chrono::steady_clock::now();
      const std::vector<NamedMetric> quality = workload.evaluate(splits.front());
      const double evalSeconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - evalStart).count();
      addMetrics(event, splits.front() + "_", quality);
      event.add("eval_seconds", evalSeconds);
      if (!quality.empty()) keepIfBest(quality.front().value, epoch + 1);
      line +=
          fmt::format(" | {}: {} ({:.1f} s)", splits.front(), formatMetrics(quality), evalSeconds);
    }
    metrics.write(event);
    progress.line(line);
    if (!options.savePath.empty()) {
      saveCheckpoint(options.savePath,
                     makeCheckpoint(workload, optimizers, step, epoch + 1, options.seed));
    }
    if (options.timeLimitSeconds > 0.0 && trainSeconds >= options.timeLimitSeconds) {
      if (!last) {
        progress.line(fmt::format("--time-limit {} s reached after epoch {}: stopping",
                                  options.timeLimitSeconds, epoch + 1));
      }
      ++epoch;
      break;
    }
  }
  progress.finish();

  report.epochsDone = std::max(firstEpoch, epoch);
  report.steps = step;
  report.trainSeconds = trainSeconds;
  report.pointsPerSecond =
      trainSeconds > 0.0 ? static_cast<double>(pointsSeen) / trainSeconds : 0.0;
  // Model selection: the last epoch was not evaluated yet; if it is not better on the first split
  // than the best kept one, the kept tables are evaluated instead.
  report.evaluatedEpoch = report.epochsDone;
  std::vector<NamedMetric> firstQuality;
  double firstEvalSeconds = 0.0;
  if (!bestTables.empty() && !splits.empty()) {
    const auto evalStart = std::chrono::steady_clock::now();
    firstQuality = workload.evaluate(splits.front());
    firstEvalSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - evalStart).count();
    if (!firstQuality.empty() && !improves(firstQuality.front().value)) {
      for (size_t i = 0; i < tables.size(); ++i)
        std::copy(bestTables[i].begin(), bestTables[i].end(), tables[i]->values().begin());
      report.evaluatedEpoch = bestEpoch;
      progress.line(fmt::format(
          "--keep-best: evaluating the tables of epoch {} ({} {} {:.4f}; epoch {}: {:.4f})",
          bestEpoch, splits.front(), firstQuality.front().name, bestQuality, report.epochsDone,
          firstQuality.front().value));
      firstQuality.clear();
    }
  }
  MetricsEvent summary("summary");
  summary.add("epochs", report.epochsDone)
      .add("evaluated_epoch", report.evaluatedEpoch)
      .add("steps", report.steps)
      .add("train_seconds", trainSeconds)
      .add("points_per_s", report.pointsPerSecond);
  for (const std::string& split : splits) {
    const auto evalStart = std::chrono::steady_clock::now();
    const bool reuse = split == splits.front() && !firstQuality.empty();
    std::vector<NamedMetric> quality = reuse ? firstQuality : workload.evaluate(split);
    const double evalSeconds =
        reuse ? firstEvalSeconds
              : std::chrono::duration<double>(std::chrono::steady_clock::now() - evalStart).count();
    addMetrics(summary, split + "_", quality);
    summary.add(split + "_eval_seconds", evalSeconds);
    report.final.emplace_back(split, std::move(quality));
  }
  metrics.write(summary);
  return report;
}

void addSparseRunSummary(MetricsEvent& summary, const SparseRunSummary& run) {
  summary.add("epochs", run.epochs)
      .add("evaluated_epoch", run.epochs)
      .add("steps", run.steps)
      .add("train_seconds", run.train_seconds)
      .add("wait_seconds", run.wait_seconds)
      .add("points_per_s", run.points_per_s)
      .add("bytes_out", run.bytes_out)
      .add("bytes_in", run.bytes_in)
      .addBool("stopped", run.stopped);
}

std::vector<std::pair<std::string, std::vector<NamedMetric>>> evaluateSplitsInto(
    SparseWorkload& workload, const std::vector<std::string>& splits, MetricsEvent& summary) {
  std::vector<std::pair<std::string, std::vector<NamedMetric>>> out;
  for (const std::string& split : splits) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<NamedMetric> quality = workload.evaluate(split);
    addMetrics(summary, split + "_", quality);
    summary.add(split + "_eval_seconds",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    out.emplace_back(split, std::move(quality));
  }
  return out;
}

}  // namespace chorus::ml
