#include "consensus/partial_sum.h"

#include <algorithm>

namespace chorus::consensus {

SumLedger::Verdict SumLedger::admit(size_t size, std::span<const NodeId> models) {
  if (size != sum_.size()) return Verdict::kWrongSize;
  size_t counted = 0;
  for (NodeId id : models) {
    if (std::binary_search(models_.begin(), models_.end(), id)) counted += 1;
  }
  if (counted == models.size() && counted > 0) return Verdict::kAlreadyCounted;
  if (counted > 0) return Verdict::kOverlaps;
  models_.insert(models_.end(), models.begin(), models.end());
  std::sort(models_.begin(), models_.end());
  return Verdict::kAdded;
}

SumLedger::Verdict SumLedger::add(std::span<const double> values, std::span<const NodeId> models) {
  const Verdict verdict = admit(values.size(), models);
  if (verdict != Verdict::kAdded) return verdict;
  for (size_t i = 0; i < values.size(); ++i)
    sum_[i] += values[i];
  return verdict;
}

SumLedger::Verdict SumLedger::add(std::span<const float> values, std::span<const NodeId> models) {
  const Verdict verdict = admit(values.size(), models);
  if (verdict != Verdict::kAdded) return verdict;
  for (size_t i = 0; i < values.size(); ++i)
    sum_[i] += static_cast<double>(values[i]);
  return verdict;
}

void splitWide(std::span<const double> sum, std::vector<float>& hi, std::vector<float>& lo) {
  hi.resize(sum.size());
  lo.resize(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) {
    hi[i] = static_cast<float>(sum[i]);
    lo[i] = static_cast<float>(sum[i] - static_cast<double>(hi[i]));
  }
}

std::vector<double> joinWide(std::span<const float> hi, std::span<const float> lo) {
  std::vector<double> out(hi.size());
  for (size_t i = 0; i < hi.size(); ++i) {
    out[i] = static_cast<double>(hi[i]) + (i < lo.size() ? static_cast<double>(lo[i]) : 0.0);
  }
  return out;
}

}  // namespace chorus::consensus
