#include "sampling/key_stats.h"

#include <xxhash.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace chorus::sampling {

CountMinSketch::CountMinSketch(size_t width, size_t depth) : width_(width), depth_(depth) {
  if (width == 0 || depth == 0) {
    throw std::invalid_argument("a count-min sketch needs width and depth of at least 1");
  }
  cells_.assign(width * depth, 0);
}

size_t CountMinSketch::slot(size_t row, Key key) const {
  return row * width_ + XXH3_64bits_withSeed(&key, sizeof(key), row + 1) % width_;
}

void CountMinSketch::add(Key key, uint64_t count) {
  for (size_t r = 0; r < depth_; ++r)
    cells_[slot(r, key)] += count;
  total_ += count;
}

uint64_t CountMinSketch::estimate(Key key) const {
  uint64_t best = std::numeric_limits<uint64_t>::max();
  for (size_t r = 0; r < depth_; ++r)
    best = std::min(best, cells_[slot(r, key)]);
  return best;
}

std::vector<HotKey> selectHotSet(std::span<const HotKey> candidates, uint64_t bytes_per_key,
                                 uint64_t budget_bytes, uint64_t min_count) {
  std::vector<HotKey> ranked(candidates.begin(), candidates.end());
  std::sort(ranked.begin(), ranked.end(), [](const HotKey& a, const HotKey& b) {
    return a.count != b.count ? a.count > b.count : a.key < b.key;
  });
  uint64_t fit = bytes_per_key == 0 ? ranked.size() : budget_bytes / bytes_per_key;
  size_t take = 0;
  while (take < ranked.size() && take < fit && ranked[take].count >= min_count)
    ++take;
  ranked.resize(take);
  return ranked;
}

}  // namespace chorus::sampling
