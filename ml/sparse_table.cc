#include "ml/sparse_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "ml/rng.h"

namespace chorus::ml {

SparseTable::SparseTable(std::string name, size_t rows, size_t dim)
    : name_(std::move(name)), rows_(rows), dim_(dim), values_(rows * dim, 0.0f) {}

void SparseTable::initNormal(uint64_t seed, double scale) {
  Rng rng(seed);
  for (float& v : values_)
    v = static_cast<float>(scale * rng.normal());
}

SparseGradAccumulator::SparseGradAccumulator(size_t rows, size_t dim)
    : rows_(rows), dim_(dim), slotOf_(rows, kNoSlot) {
  if (rows >= kNoSlot) throw std::invalid_argument("a sparse table is limited to 2^32-1 rows");
}

uint32_t SparseGradAccumulator::newSlot(RowKey key) {
  const auto slot = static_cast<uint32_t>(keys_.size());
  slotOf_[key] = slot;
  keys_.push_back(key);
  const size_t need = keys_.size() * dim_;
  // Grow geometrically: resize() of an aligned vector keeps old rows, and the buffer is kept
  // across steps, so after the first few steps this never allocates.
  if (buffer_.size() < need) buffer_.resize(std::max(need, 2 * buffer_.size()));
  std::memset(buffer_.data() + static_cast<size_t>(slot) * dim_, 0, dim_ * sizeof(float));
  return slot;
}

float* SparseGradAccumulator::beginDense() {
  if (!keys_.empty()) throw std::logic_error("beginDense() after row() in the same step");
  dense_ = true;
  if (buffer_.size() < rows_ * dim_) buffer_.resize(rows_ * dim_);
  return buffer_.data();
}

void SparseGradAccumulator::finish(SparseGrad& out) {
  out.dim = dim_;
  if (dense_) {
    out.keys.resize(rows_);
    std::iota(out.keys.begin(), out.keys.end(), RowKey{0});
    // The caller's buffer becomes the gradient and the gradient's old buffer our next one.
    buffer_.resize(rows_ * dim_);
    std::swap(out.rows, buffer_);
    dense_ = false;
    return;
  }
  const size_t n = keys_.size();
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0u);
  std::sort(order_.begin(), order_.end(),
            [this](uint32_t a, uint32_t b) { return keys_[a] < keys_[b]; });
  out.keys.resize(n);
  if (out.rows.size() < n * dim_) out.rows.resize(n * dim_);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t slot = order_[i];
    out.keys[i] = keys_[slot];
    std::memcpy(out.rows.data() + i * dim_, buffer_.data() + static_cast<size_t>(slot) * dim_,
                dim_ * sizeof(float));
    slotOf_[keys_[slot]] = kNoSlot;
  }
  keys_.clear();
}

SparseOptimizerKind parseSparseOptimizer(const std::string& name) {
  if (name == "sgd") return SparseOptimizerKind::kSgd;
  if (name == "adagrad") return SparseOptimizerKind::kAdagrad;
  throw std::invalid_argument("--optimizer must be sgd or adagrad, not '" + name + "'");
}

const char* sparseOptimizerName(SparseOptimizerKind kind) {
  return kind == SparseOptimizerKind::kSgd ? "sgd" : "adagrad";
}

SparseOptimizer::SparseOptimizer(SparseOptimizerConfig config, const SparseTable& table)
    : config_(config) {
  if (config_.kind == SparseOptimizerKind::kAdagrad) {
    state_.assign(table.rows() * table.dim(), static_cast<float>(config_.initialAccumulator));
  }
}

void SparseOptimizer::apply(SparseTable& table, const SparseGrad& grad) {
  const size_t dim = table.dim();
  const auto lr = static_cast<float>(config_.lr);
  const bool dense = grad.isDense(table.rows());
  // A dense gradient is one pass over the whole buffer (contiguous, vectorized as one loop).
  const size_t runs = dense ? 1 : grad.size();
  const size_t runLength = dense ? table.rows() * dim : dim;
  for (size_t i = 0; i < runs; ++i) {
    const RowKey key = dense ? 0 : grad.keys[i];
    float* __restrict w = table.row(key);
    const float* __restrict g = grad.row(i);
    if (config_.kind == SparseOptimizerKind::kSgd) {
      for (size_t j = 0; j < runLength; ++j)
        w[j] -= lr * g[j];
    } else {
      const auto eps = static_cast<float>(config_.epsilon);
      float* __restrict s = state_.data() + key * dim;
      for (size_t j = 0; j < runLength; ++j) {
        s[j] += g[j] * g[j];
        w[j] -= lr * g[j] / (std::sqrt(s[j]) + eps);
      }
    }
  }
}

}  // namespace chorus::ml
