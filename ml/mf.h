// Matrix factorization: a rating r(i, j) is predicted as mean + dot(U_i, V_j), U the row (user)
// factors and V the column (item) factors, each a table of rank-wide rows in one contiguous
// buffer. Squared loss with L2 on the rows a rating touches; a minibatch step yields its gradient
// as sparse rows (sorted unique keys, duplicates summed); SGD or AdaGrad (state per row, laid out
// like the table) apply it. The math is free functions over spans, so that another table type
// (the generic sparse table of the KGE models) can call it unchanged.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ml/metrics.h"
#include "ml/sparse_data.h"

namespace chorus::ml {

// Rows of `width` floats for the keys 0..rows-1, row after row in one buffer, with the optimizer
// state (AdaGrad's sums of squared gradients) in a second buffer of the same layout.
struct FactorTable {
  size_t rows = 0;
  size_t width = 0;
  std::vector<float> values;  // rows x width
  std::vector<float> state;   // rows x width for AdaGrad, else empty

  // The row of `key` (key < rows).
  std::span<float> row(uint64_t key) { return {values.data() + key * width, width}; }
  // The row of `key` (key < rows), read-only.
  std::span<const float> row(uint64_t key) const { return {values.data() + key * width, width}; }
};

// A sparse gradient of one table: sorted unique keys and one row of `width` floats per key.
struct SparseRows {
  size_t width = 0;
  std::vector<uint64_t> keys;
  std::vector<float> values;  // keys.size() x width

  // The gradient row of the i-th key.
  std::span<const float> row(size_t i) const { return {values.data() + i * width, width}; }
};

// Sums gradient rows by key in O(1) per row (a slot per key of the key space) and hands them
// out as SparseRows with sorted keys. Reused across steps; one per table and trainer thread.
class SparseRowsBuilder {
 public:
  // For keys 0..keySpace-1 and rows of `width` floats.
  SparseRowsBuilder(size_t keySpace, size_t width);
  // The accumulator row of `key`, zero on the first call for it since the last finish().
  float* rowFor(uint64_t key);
  // Moves the accumulated rows into `out`, keys ascending, and starts empty again.
  void finish(SparseRows& out);

 private:
  size_t width_;
  std::vector<int32_t> slotOf_;                     // key -> slot, -1 when untouched
  std::vector<uint64_t> keys_;                      // touched keys, in order of first touch
  std::vector<float> rows_;                         // slot-major accumulators
  std::vector<std::pair<uint64_t, size_t>> order_;  // (key, slot), sorted by finish()
};

// The model's parameters: both factor tables and the global mean added to every prediction.
struct MfModel {
  FactorTable rowFactors;
  FactorTable colFactors;
  float mean = 0.0f;  // the mean training rating when MfOptions::globalMean, else 0 (not trained)
};

// A model with rows x rank and cols x rank factors drawn from N(0, initStd^2) from `seed` (same
// seed, same model), and AdaGrad state when `adagrad`.
MfModel makeMfModel(uint64_t rows, uint64_t cols, int rank, double initStd, bool adagrad,
                    uint64_t seed);

// mean + dot(row, col).
float mfPredict(std::span<const float> row, std::span<const float> col, float mean);

// The loss of one minibatch and what it consists of.
struct MfBatchLoss {
  double loss = 0.0;          // sum over the batch of (e^2 + reg (|U_i|^2 + |V_j|^2)) / 2
  double squaredError = 0.0;  // sum of e^2, e = prediction - rating
};

// Gradient of the batch's summed loss (a rating's L2 term on the two rows it touches, counted
// once per rating) with respect to the rows the batch touches, accumulated into the builders
// (call finish() on them for the SparseRows). Every rating is evaluated at the same parameters.
MfBatchLoss mfGradient(const MfModel& model, std::span<const Rating> batch, double reg,
                       SparseRowsBuilder& rowGrads, SparseRowsBuilder& colGrads);
// The same over bare row-major tables of `width` floats per row (any table type can call it).
MfBatchLoss mfGradient(std::span<const float> rowTable, std::span<const float> colTable,
                       size_t width, float mean, std::span<const Rating> batch, double reg,
                       SparseRowsBuilder& rowGrads, SparseRowsBuilder& colGrads);

// w -= lr * g for the gradient's rows of `table` (width grad.width, row-major).
void sgdApply(std::span<float> table, const SparseRows& grad, float lr);

// AdaGrad on the gradient's rows only, as torch.optim.Adagrad does with sparse gradients:
// s += g^2, w -= lr * g / (sqrt(s) + eps), elementwise; `state` has the table's layout.
void adagradApply(std::span<float> table, std::span<float> state, const SparseRows& grad, float lr,
                  float eps = 1e-10f);

// Root mean squared error of the model on `ratings` (0 for none).
double mfRmse(const MfModel& model, std::span<const Rating> ratings);

// Everything `chorus train --model mf` can set.
struct MfOptions {
  int rank = 16;
  double reg = 0.001;                 // L2 coefficient, per rating on the rows it touches
  std::string optimizer = "adagrad";  // sgd | adagrad
  double learningRate = 0.1;
  size_t batchSize = 1000;
  int64_t epochs = 10;
  double initStd = 0.1;  // factors start as N(0, initStd^2)
  bool globalMean = true;
  uint64_t seed = 1;  // initialization and shuffling
  std::string metricsPath;
  int64_t logEverySteps = 1000;
  double targetRatio = 1.05;  // the noise-floor target: test RMSE <= targetRatio x sigma
};

// What a run achieved.
struct MfReport {
  std::vector<double> epochTrainRmse;  // over the epoch's batches, before each step
  std::vector<double> epochTestRmse;
  double testRmse = 0.0;
  double noiseSigma = 0.0;       // NaN for data read from a file
  double noiseFloorRatio = 0.0;  // testRmse / noiseSigma (NaN without a known sigma)
  bool targetMet = false;        // noiseFloorRatio <= targetRatio
  int64_t epochs = 0;
  int64_t steps = 0;
  double trainSeconds = 0.0;  // training loop only (no evaluation)
  double ratingsPerSecond = 0.0;
  double trainCpuSeconds = 0.0;  // CPU time of this process in the training loop
  double ratingsPerCpuSecond = 0.0;
  size_t parameters = 0;
  std::string modelSpec;
};

// Throws std::invalid_argument naming the flag when an option is out of range.
void validateMfOptions(const MfOptions& options);

// Trains on one thread: every epoch visits the training ratings in a fresh order (depending only
// on seed and epoch), in minibatches; test RMSE after every epoch; JSON-lines metrics (start,
// step, epoch, summary) when options.metricsPath is set. Throws std::invalid_argument for bad
// options, std::runtime_error for an unwritable metrics file or a diverged run.
MfReport trainMf(const MfOptions& options, const RatingsData& data, ProgressReporter& progress);

}  // namespace chorus::ml
