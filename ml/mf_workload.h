// Matrix factorization as a sparse workload: the row (user) and column (item) factor tables of
// ml/mf.h as SparseTables, its gradient (mfGradient) for a batch of training ratings, test RMSE
// as the quality. What sparse PS mode trains for --model mf (`chorus train --model mf` runs
// ml::trainMf on the same model and gradient).
#pragma once

#include <string>
#include <vector>

#include "ml/mf.h"
#include "ml/sparse_data.h"
#include "ml/sparse_train.h"

namespace chorus::ml {

// MF training and evaluation over one rating matrix. Keeps a reference to `data`, which must
// outlive it.
class MfWorkload : public SparseWorkload {
 public:
  // The model trainMf() starts from with `options` (rank, initial scale, seed, global mean;
  // the optimizer is the trainer's). Throws std::invalid_argument for bad options or no
  // training ratings.
  MfWorkload(const RatingsData& data, const MfOptions& options);

  std::string spec() const override;
  std::vector<SparseTable*> tables() override { return {&rows_, &cols_}; }
  size_t trainPoints() const override { return data_.train.size(); }
  // The batch's mean loss (squared error and L2 on the rows each rating touches, halved) and
  // its summed gradient, as trainMf() steps on.
  double computeGradients(std::span<const size_t> points, Rng& rng,
                          std::span<SparseGradAccumulator> grads) override;
  // MF draws nothing: the rows are those of the batch's ratings.
  void drawStep(std::span<const size_t> points, Rng& rng) override;
  void stepRows(std::span<std::vector<RowKey>> rows) override;
  // The ratings' rows and columns.
  void pointRows(std::span<const size_t> points,
                 std::span<std::vector<RowKey>> rows) const override;
  double computeDrawnGradients(std::span<SparseGradAccumulator> grads) override;
  // "test".
  std::vector<std::string> evalSplits() const override { return {"test"}; }
  // rmse, and noise_floor_ratio when the data's noise sigma is known.
  std::vector<NamedMetric> evaluate(const std::string& split) override;
  bool higherIsBetter() const override { return false; }

 private:
  const RatingsData& data_;
  MfOptions options_;
  float mean_ = 0.0f;
  SparseTable rows_, cols_;
  std::vector<Rating> batch_;
  SparseRowsBuilder rowBuilder_, colBuilder_;
  SparseRows rowGrad_, colGrad_;
};

}  // namespace chorus::ml
