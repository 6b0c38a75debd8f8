// Minibatch iteration over a subset of a data set (a node's shard), per-epoch shuffling from a
// seed, and CIFAR-style augmentation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ml/dataset.h"
#include "ml/rng.h"
#include "ml/tensor.h"

namespace chorus::ml {

// Random crop with zero padding and horizontal flip, applied per sample while gathering a batch.
struct Augmentation {
  bool enabled = false;
  int padding = 4;   // crop a HxW window out of the image padded by this many zero pixels
  bool flip = true;  // mirror left-right with probability 1/2
};

// Visits a fixed set of sample indices in minibatches, in a fresh order every epoch. The order
// of epoch e depends only on (seed, e), so a restarted run can resume at any epoch.
class EpochSampler {
 public:
  // `indices` is the subset to visit (e.g. a shard); batchSize > 0. The last, smaller batch of
  // an epoch is kept unless dropLast.
  EpochSampler(std::vector<size_t> indices, size_t batchSize, uint64_t seed, bool dropLast = false);
  // Shuffles for epoch `epoch` and rewinds.
  void startEpoch(int64_t epoch);
  // The next batch's sample indices; empty at the end of the epoch.
  std::span<const size_t> next();
  // Batches per epoch.
  size_t batchesPerEpoch() const;
  // Samples visited per epoch.
  size_t size() const { return indices_.size(); }

 private:
  std::vector<size_t> indices_;
  std::vector<size_t> order_;
  size_t batchSize_;
  uint64_t seed_;
  bool dropLast_;
  size_t position_ = 0;
};

// The random part of one sample's augmentation.
struct AugmentDraw {
  int dy = 0;         // vertical shift of the crop window
  int dx = 0;         // horizontal shift
  bool flip = false;  // mirrored left-right
};

// Whether `augmentation` changes samples of `data` (it is enabled and they are images).
bool augments(const Augmentation& augmentation, const Dataset& data);

// Draws one sample's augmentation from `rng`, exactly as gatherBatch does per sample, so that a
// resumed run can replay the draws of the batches it skips and continue with the same crops.
AugmentDraw drawAugmentation(const Augmentation& augmentation, Rng& rng);

// Copies samples `indices` of `data` into `batch` (dim x count, one sample per column) and their
// labels into `labels`, augmenting with `rng` when augmentation.enabled (images only).
void gatherBatch(const Dataset& data, std::span<const size_t> indices, Matrix& batch,
                 std::vector<int32_t>& labels, const Augmentation& augmentation, Rng& rng);

// Indices 0..n-1.
std::vector<size_t> allIndices(size_t n);

}  // namespace chorus::ml
