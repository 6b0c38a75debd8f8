#include "ml/batches.h"

#include <algorithm>
#include <cassert>
#include <numeric>

namespace chorus::ml {

EpochSampler::EpochSampler(std::vector<size_t> indices, size_t batchSize, uint64_t seed,
                           bool dropLast)
    : indices_(std::move(indices)), batchSize_(batchSize), seed_(seed), dropLast_(dropLast) {
  assert(batchSize_ > 0);
  order_ = indices_;
}

void EpochSampler::startEpoch(int64_t epoch) {
  order_ = indices_;
  Rng rng(mixSeed(seed_, static_cast<uint64_t>(epoch)));
  rng.shuffle(order_.begin(), order_.end());
  position_ = 0;
}

std::span<const size_t> EpochSampler::next() {
  if (position_ >= order_.size()) return {};
  const size_t count = std::min(batchSize_, order_.size() - position_);
  if (dropLast_ && count < batchSize_) {
    position_ = order_.size();
    return {};
  }
  std::span<const size_t> batch(order_.data() + position_, count);
  position_ += count;
  return batch;
}

size_t EpochSampler::batchesPerEpoch() const {
  return dropLast_ ? indices_.size() / batchSize_ : (indices_.size() + batchSize_ - 1) / batchSize_;
}

bool augments(const Augmentation& augmentation, const Dataset& data) {
  return augmentation.enabled && data.shape.height > 1 && data.shape.width > 1;
}

AugmentDraw drawAugmentation(const Augmentation& augmentation, Rng& rng) {
  AugmentDraw draw;
  const int pad = augmentation.padding;
  if (pad > 0) {
    draw.dy = static_cast<int>(rng.below(static_cast<uint64_t>(2 * pad + 1))) - pad;
    draw.dx = static_cast<int>(rng.below(static_cast<uint64_t>(2 * pad + 1))) - pad;
  }
  draw.flip = augmentation.flip && (rng.bits() & 1) != 0;
  return draw;
}

void gatherBatch(const Dataset& data, std::span<const size_t> indices, Matrix& batch,
                 std::vector<int32_t>& labels, const Augmentation& augmentation, Rng& rng) {
  const size_t dim = data.dim();
  const auto count = static_cast<Eigen::Index>(indices.size());
  batch.resize(static_cast<Eigen::Index>(dim), count);
  labels.resize(indices.size());
  const int channels = data.shape.channels;
  const int height = data.shape.height;
  const int width = data.shape.width;
  const bool augment = augments(augmentation, data);
  for (Eigen::Index s = 0; s < count; ++s) {
    const size_t index = indices[static_cast<size_t>(s)];
    assert(index < data.size());
    labels[static_cast<size_t>(s)] = data.labels[index];
    const float* src = data.features.data() + index * dim;
    float* dst = batch.col(s).data();
    if (!augment) {
      std::copy(src, src + dim, dst);
      continue;
    }
    const auto [dy, dx, flip] = drawAugmentation(augmentation, rng);
    for (int y = 0; y < height; ++y) {
      const int sy = y + dy;
      for (int x = 0; x < width; ++x) {
        const int sx0 = flip ? width - 1 - x : x;
        const int sx = sx0 + dx;
        float* out = dst + (y * width + x) * channels;
        if (sy < 0 || sy >= height || sx < 0 || sx >= width) {
          std::fill(out, out + channels, 0.0f);
        } else {
          const float* in = src + (sy * width + sx) * channels;
          std::copy(in, in + channels, out);
        }
      }
    }
  }
}

std::vector<size_t> allIndices(size_t n) {
  std::vector<size_t> indices(n);
  std::iota(indices.begin(), indices.end(), size_t{0});
  return indices;
}

}  // namespace chorus::ml
