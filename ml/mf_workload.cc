#include "ml/mf_workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace chorus::ml {

namespace {

const RatingsData& checkedData(const RatingsData& data, const MfOptions& options) {
  validateMfOptions(options);
  if (data.train.empty()) throw std::invalid_argument("no training ratings");
  return data;
}

}  // namespace

MfWorkload::MfWorkload(const RatingsData& data, const MfOptions& options)
    : data_(checkedData(data, options)),
      options_(options),
      rows_("row", data.rows, static_cast<size_t>(options.rank)),
      cols_("col", data.cols, static_cast<size_t>(options.rank)),
      rowBuilder_(data.rows, static_cast<size_t>(options.rank)),
      colBuilder_(data.cols, static_cast<size_t>(options.rank)) {
  // The factors trainMf() starts from (same seed, same values).
  const MfModel model =
      makeMfModel(data.rows, data.cols, options.rank, options.initStd, false, options.seed);
  std::copy(model.rowFactors.values.begin(), model.rowFactors.values.end(), rows_.values().begin());
  std::copy(model.colFactors.values.begin(), model.colFactors.values.end(), cols_.values().begin());
  if (options.globalMean) {
    double sum = 0.0;
    for (const Rating& r : data.train)
      sum += r.value;
    mean_ = static_cast<float>(sum / static_cast<double>(data.train.size()));
  }
}

std::string MfWorkload::spec() const {
  return fmt::format("mf rank={} reg={} mean={} rows={} cols={}", options_.rank, options_.reg,
                     options_.globalMean ? "on" : "off", data_.rows, data_.cols);
}

double MfWorkload::computeGradients(std::span<const size_t> points, Rng& rng,
                                    std::span<SparseGradAccumulator> grads) {
  drawStep(points, rng);
  return computeDrawnGradients(grads);
}

void MfWorkload::drawStep(std::span<const size_t> points, Rng& /*rng*/) {
  batch_.resize(points.size());
  for (size_t i = 0; i < points.size(); ++i)
    batch_[i] = data_.train[points[i]];
}

void MfWorkload::stepRows(std::span<std::vector<RowKey>> rows) {
  for (const Rating& r : batch_) {
    rows[0].push_back(r.row);
    rows[1].push_back(r.col);
  }
}

void MfWorkload::pointRows(std::span<const size_t> points,
                           std::span<std::vector<RowKey>> rows) const {
  for (const size_t i : points) {
    rows[0].push_back(data_.train[i].row);
    rows[1].push_back(data_.train[i].col);
  }
}

double MfWorkload::computeDrawnGradients(std::span<SparseGradAccumulator> grads) {
  if (batch_.empty()) return 0.0;
  const MfBatchLoss loss = mfGradient(rows_.values(), cols_.values(), rows_.dim(), mean_, batch_,
                                      options_.reg, rowBuilder_, colBuilder_);
  rowBuilder_.finish(rowGrad_);
  colBuilder_.finish(colGrad_);
  // The same summed gradient trainMf() applies, into the trainer's accumulators.
  const auto add = [](const SparseRows& from, SparseGradAccumulator& to) {
    for (size_t i = 0; i < from.keys.size(); ++i) {
      const std::span<const float> g = from.row(i);
      float* out = to.row(from.keys[i]);
      for (size_t j = 0; j < g.size(); ++j)
        out[j] += g[j];
    }
  };
  add(rowGrad_, grads[0]);
  add(colGrad_, grads[1]);
  return loss.loss / static_cast<double>(batch_.size());
}

std::vector<NamedMetric> MfWorkload::evaluate(const std::string& split) {
  if (split != "test") throw std::invalid_argument("unknown evaluation split '" + split + "'");
  double sum = 0.0;
  for (const Rating& r : data_.test) {
    const double e =
        mfPredict({rows_.row(r.row), rows_.dim()}, {cols_.row(r.col), cols_.dim()}, mean_) -
        r.value;
    sum += e * e;
  }
  const double rmse =
      data_.test.empty() ? 0.0 : std::sqrt(sum / static_cast<double>(data_.test.size()));
  std::vector<NamedMetric> metrics = {{"rmse", rmse}};
  if (std::isfinite(data_.noiseSigma) && data_.noiseSigma > 0) {
    metrics.push_back({"noise_floor_ratio", rmse / data_.noiseSigma});
  }
  return metrics;
}

}  // namespace chorus::ml
