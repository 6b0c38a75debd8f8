#include "ml/mf.h"

#include <fmt/format.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "ml/rng.h"

namespace chorus::ml {

namespace {
// Rows as Eigen vectors: Eigen vectorizes the dot products (a plain loop's float sum cannot be
// reordered by the compiler, so it stays scalar) and the row updates. The common ranks get
// fixed-size vectors (W = rank), whose loops are unrolled into a few SIMD instructions; the
// others take the dynamic size (W = Eigen::Dynamic), which costs loop setup per row.
template <int W>
using RowMap = Eigen::Map<Eigen::Matrix<float, W, 1>>;
template <int W>
using ConstRowMap = Eigen::Map<const Eigen::Matrix<float, W, 1>>;

// Calls f.template operator()<W>() with W the rank when it is a common one, else Eigen::Dynamic.
template <typename F>
auto withRowWidth(size_t width, F&& f) {
  switch (width) {
    case 8:
      return f.template operator()<8>();
    case 16:
      return f.template operator()<16>();
    case 32:
      return f.template operator()<32>();
    case 64:
      return f.template operator()<64>();
    default:
      return f.template operator()<Eigen::Dynamic>();
  }
}
}  // namespace

SparseRowsBuilder::SparseRowsBuilder(size_t keySpace, size_t width)
    : width_(width), slotOf_(keySpace, -1) {}

float* SparseRowsBuilder::rowFor(uint64_t key) {
  int32_t& slot = slotOf_[key];
  if (slot < 0) {
    slot = static_cast<int32_t>(keys_.size());
    keys_.push_back(key);
    rows_.resize(keys_.size() * width_, 0.0f);
  }
  return rows_.data() + static_cast<size_t>(slot) * width_;
}

void SparseRowsBuilder::finish(SparseRows& out) {
  const size_t n = keys_.size();
  // (key, slot) pairs sort faster than slots compared through keys_.
  order_.resize(n);
  for (size_t slot = 0; slot < n; ++slot)
    order_[slot] = {keys_[slot], slot};
  std::sort(order_.begin(), order_.end());
  out.width = width_;
  out.keys.resize(n);
  out.values.resize(n * width_);
  for (size_t i = 0; i < n; ++i) {
    const auto [key, slot] = order_[i];
    out.keys[i] = key;
    std::copy_n(rows_.data() + slot * width_, width_, out.values.data() + i * width_);
    slotOf_[key] = -1;
  }
  keys_.clear();
  rows_.clear();
}

MfModel makeMfModel(uint64_t rows, uint64_t cols, int rank, double initStd, bool adagrad,
                    uint64_t seed) {
  MfModel model;
  auto init = [&](FactorTable& table, uint64_t n, uint64_t stream) {
    table.rows = n;
    table.width = static_cast<size_t>(rank);
    table.values.resize(n * table.width);
    Rng rng(mixSeed(seed, stream));
    for (float& v : table.values)
      v = static_cast<float>(initStd * rng.normal());
    if (adagrad) table.state.assign(table.values.size(), 0.0f);
  };
  init(model.rowFactors, rows, 0x3F0);
  init(model.colFactors, cols, 0x3F1);
  return model;
}

float mfPredict(std::span<const float> row, std::span<const float> col, float mean) {
  const auto width = static_cast<Eigen::Index>(row.size());
  return mean + ConstRowMap<Eigen::Dynamic>(row.data(), width)
                    .dot(ConstRowMap<Eigen::Dynamic>(col.data(), width));
}

MfBatchLoss mfGradient(const MfModel& model, std::span<const Rating> batch, double reg,
                       SparseRowsBuilder& rowGrads, SparseRowsBuilder& colGrads) {
  return mfGradient(model.rowFactors.values, model.colFactors.values, model.rowFactors.width,
                    model.mean, batch, reg, rowGrads, colGrads);
}

MfBatchLoss mfGradient(std::span<const float> rowTable, std::span<const float> colTable,
                       size_t width, float mean, std::span<const Rating> batch, double reg,
                       SparseRowsBuilder& rowGrads, SparseRowsBuilder& colGrads) {
  const auto w = static_cast<Eigen::Index>(width);
  const auto lambda = static_cast<float>(reg);
  return withRowWidth(width, [&]<int W>() {
    MfBatchLoss loss;
    for (const Rating& r : batch) {
      const ConstRowMap<W> u(rowTable.data() + size_t{r.row} * width, w);
      const ConstRowMap<W> v(colTable.data() + size_t{r.col} * width, w);
      const float e = mean + u.dot(v) - r.value;
      loss.squaredError += static_cast<double>(e) * e;
      loss.loss += 0.5 * (static_cast<double>(e) * e +
                          reg * (static_cast<double>(u.squaredNorm()) + v.squaredNorm()));
      RowMap<W>(rowGrads.rowFor(r.row), w) += e * v + lambda * u;
      RowMap<W>(colGrads.rowFor(r.col), w) += e * u + lambda * v;
    }
    return loss;
  });
}

void sgdApply(std::span<float> table, const SparseRows& grad, float lr) {
  const size_t width = grad.width;
  const auto w = static_cast<Eigen::Index>(width);
  withRowWidth(width, [&]<int W>() {
    for (size_t i = 0; i < grad.keys.size(); ++i) {
      RowMap<W>(table.data() + grad.keys[i] * width, w) -=
          lr * ConstRowMap<W>(grad.values.data() + i * width, w);
    }
    return 0;
  });
}

void adagradApply(std::span<float> table, std::span<float> state, const SparseRows& grad, float lr,
                  float eps) {
  const size_t width = grad.width;
  const auto w = static_cast<Eigen::Index>(width);
  withRowWidth(width, [&]<int W>() {
    for (size_t i = 0; i < grad.keys.size(); ++i) {
      auto param = RowMap<W>(table.data() + grad.keys[i] * width, w).array();
      auto sum = RowMap<W>(state.data() + grad.keys[i] * width, w).array();
      const auto g = ConstRowMap<W>(grad.values.data() + i * width, w).array();
      sum += g.square();
      param -= lr * g / (sum.sqrt() + eps);
    }
    return 0;
  });
}

double mfRmse(const MfModel& model, std::span<const Rating> ratings) {
  if (ratings.empty()) return 0.0;
  double sum = 0.0;
  for (const Rating& r : ratings) {
    const double e =
        mfPredict(model.rowFactors.row(r.row), model.colFactors.row(r.col), model.mean) - r.value;
    sum += e * e;
  }
  return std::sqrt(sum / static_cast<double>(ratings.size()));
}

void validateMfOptions(const MfOptions& o) {
  if (o.rank < 1 || o.rank > 4096) throw std::invalid_argument("--rank must be in 1..4096");
  if (!(o.reg >= 0.0 && std::isfinite(o.reg))) throw std::invalid_argument("--reg must be >= 0");
  if (o.optimizer != "sgd" && o.optimizer != "adagrad") {
    throw std::invalid_argument(
        fmt::format("--optimizer must be sgd or adagrad, not '{}'", o.optimizer));
  }
  if (!(o.learningRate > 0.0 && std::isfinite(o.learningRate))) {
    throw std::invalid_argument("--lr must be a positive number");
  }
  if (o.batchSize == 0) throw std::invalid_argument("--batch must be > 0");
  if (o.epochs < 0) throw std::invalid_argument("--epochs must be >= 0");
  if (!(o.initStd >= 0.0 && std::isfinite(o.initStd))) {
    throw std::invalid_argument("the initial factor scale must be >= 0");
  }
  if (o.logEverySteps <= 0) throw std::invalid_argument("--log-every must be > 0");
}

namespace {

std::string ratioText(double ratio) {
  return std::isfinite(ratio) ? fmt::format("{:.3f} x the noise floor", ratio)
                              : std::string("noise floor unknown");
}

}  // namespace

MfReport trainMf(const MfOptions& options, const RatingsData& data, ProgressReporter& progress) {
  validateMfOptions(options);
  if (data.train.empty()) throw std::invalid_argument("no training ratings");
  if (data.train.size() >= std::numeric_limits<uint32_t>::max()) {
    throw std::invalid_argument("more than 2^32 - 1 training ratings: not supported");
  }
  const bool adagrad = options.optimizer == "adagrad";
  MfModel model =
      makeMfModel(data.rows, data.cols, options.rank, options.initStd, adagrad, options.seed);
  if (options.globalMean) {
    double sum = 0.0;
    for (const Rating& r : data.train)
      sum += r.value;
    model.mean = static_cast<float>(sum / static_cast<double>(data.train.size()));
  }
  MfReport report;
  report.parameters = model.rowFactors.values.size() + model.colFactors.values.size();
  report.modelSpec = fmt::format("mf rank={} optimizer={} reg={} mean={}", options.rank,
                                 options.optimizer, options.reg, options.globalMean ? "on" : "off");
  report.noiseSigma = data.noiseSigma;

  MetricsWriter metrics(options.metricsPath);
  metrics.write(MetricsEvent("start")
                    .add("model", report.modelSpec)
                    .add("parameters", static_cast<uint64_t>(report.parameters))
                    .add("data", data.name)
                    .add("source", data.source)
                    .add("rows", data.rows)
                    .add("cols", data.cols)
                    .add("train_samples", static_cast<uint64_t>(data.train.size()))
                    .add("test_samples", static_cast<uint64_t>(data.test.size()))
                    .add("noise_sigma", data.noiseSigma)
                    .add("mean", static_cast<double>(model.mean))
                    .add("batch", static_cast<uint64_t>(options.batchSize))
                    .add("lr", options.learningRate)
                    .add("seed", options.seed));

  SparseRowsBuilder rowBuilder(data.rows, model.rowFactors.width);
  SparseRowsBuilder colBuilder(data.cols, model.colFactors.width);
  SparseRows rowGrad, colGrad;
  std::vector<uint32_t> order(data.train.size());
  std::vector<Rating> batch;
  batch.reserve(options.batchSize);
  const auto lr = static_cast<float>(options.learningRate);
  const int64_t stepsPerEpoch =
      static_cast<int64_t>((data.train.size() + options.batchSize - 1) / options.batchSize);
  double windowSquared = 0.0;
  size_t windowRatings = 0;
  int64_t steps = 0;
  for (int64_t epoch = 0; epoch < options.epochs; ++epoch) {
    // The order of an epoch depends only on (seed, epoch).
    std::iota(order.begin(), order.end(), uint32_t{0});
    Rng shuffle(mixSeed(options.seed, 0x5000 + static_cast<uint64_t>(epoch)));
    shuffle.shuffle(order.begin(), order.end());
    const auto start = std::chrono::steady_clock::now();
    // CPU time as well as wall time: on a machine shared with other jobs the wall time of a
    // one-thread run says more about the neighbours than about the code.
    const std::clock_t cpuStart = std::clock();
    double epochSquared = 0.0;
    int64_t stepInEpoch = 0;
    for (size_t first = 0; first < order.size(); first += options.batchSize) {
      const size_t count = std::min(options.batchSize, order.size() - first);
      batch.clear();
      for (size_t i = 0; i < count; ++i)
        batch.push_back(data.train[order[first + i]]);
      const MfBatchLoss loss = mfGradient(model, batch, options.reg, rowBuilder, colBuilder);
      if (!std::isfinite(loss.loss)) {
        throw std::runtime_error(
            fmt::format("training diverged (loss {}) at epoch {}, step {}: "
                        "lower --lr",
                        loss.loss, epoch + 1, stepInEpoch + 1));
      }
      rowBuilder.finish(rowGrad);
      colBuilder.finish(colGrad);
      if (adagrad) {
        adagradApply(model.rowFactors.values, model.rowFactors.state, rowGrad, lr);
        adagradApply(model.colFactors.values, model.colFactors.state, colGrad, lr);
      } else {
        sgdApply(model.rowFactors.values, rowGrad, lr);
        sgdApply(model.colFactors.values, colGrad, lr);
      }
      ++steps;
      ++stepInEpoch;
      epochSquared += loss.squaredError;
      windowSquared += loss.squaredError;
      windowRatings += count;
      if (steps % options.logEverySteps == 0 || stepInEpoch % 256 == 0) {
        const double elapsed =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double rate = elapsed > 0.0 ? static_cast<double>(first + count) / elapsed : 0.0;
        if (steps % options.logEverySteps == 0) {
          metrics.write(
              MetricsEvent("step")
                  .add("epoch", epoch + 1)
                  .add("step", steps)
                  .add("train_rmse", std::sqrt(windowSquared / static_cast<double>(windowRatings)))
                  .add("lr", options.learningRate)
                  .add("samples_per_s", rate));
          windowSquared = 0.0;
          windowRatings = 0;
        }
        progress.update(fmt::format("epoch {}/{} step {}/{} {:.0f} ratings/s train RMSE {:.4f}",
                                    epoch + 1, options.epochs, stepInEpoch, stepsPerEpoch, rate,
                                    std::sqrt(epochSquared / static_cast<double>(first + count))));
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report.trainSeconds += seconds;
    report.trainCpuSeconds += static_cast<double>(std::clock() - cpuStart) / CLOCKS_PER_SEC;
    const double trainRmse = std::sqrt(epochSquared / static_cast<double>(order.size()));
    const double testRmse = mfRmse(model, data.test);
    const double ratio = testRmse / data.noiseSigma;
    report.epochTrainRmse.push_back(trainRmse);
    report.epochTestRmse.push_back(testRmse);
    progress.line(fmt::format(
        "epoch {}/{}: train RMSE {:.4f} | test RMSE {:.4f} ({}) | {:.1f} s, {:.0f} ratings/s",
        epoch + 1, options.epochs, trainRmse, testRmse, ratioText(ratio), seconds,
        static_cast<double>(order.size()) / seconds));
    metrics.write(MetricsEvent("epoch")
                      .add("epoch", epoch + 1)
                      .add("step", steps)
                      .add("train_rmse", trainRmse)
                      .add("test_rmse", testRmse)
                      .add("noise_floor_ratio", ratio)
                      .add("epoch_seconds", seconds)
                      .add("train_seconds", report.trainSeconds));
  }
  progress.finish();
  report.epochs = options.epochs;
  report.steps = steps;
  report.testRmse = mfRmse(model, data.test);
  report.noiseFloorRatio = report.testRmse / data.noiseSigma;
  report.targetMet = report.noiseFloorRatio <= options.targetRatio;
  report.ratingsPerSecond = report.trainSeconds > 0.0
                                ? static_cast<double>(data.train.size()) *
                                      static_cast<double>(options.epochs) / report.trainSeconds
                                : 0.0;
  report.ratingsPerCpuSecond = report.trainCpuSeconds > 0.0
                                   ? static_cast<double>(data.train.size()) *
                                         static_cast<double>(options.epochs) /
                                         report.trainCpuSeconds
                                   : 0.0;
  metrics.write(MetricsEvent("summary")
                    .add("epochs", report.epochs)
                    .add("steps", report.steps)
                    .add("test_rmse", report.testRmse)
                    .add("noise_sigma", report.noiseSigma)
                    .add("noise_floor_ratio", report.noiseFloorRatio)
                    .add("target_ratio", options.targetRatio)
                    .addBool("target_met", report.targetMet)
                    .add("train_seconds", report.trainSeconds)
                    .add("train_cpu_seconds", report.trainCpuSeconds)
                    .add("samples_per_s", report.ratingsPerSecond)
                    .add("samples_per_cpu_s", report.ratingsPerCpuSecond));
  return report;
}

}  // namespace chorus::ml
