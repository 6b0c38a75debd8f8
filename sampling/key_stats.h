// Key-access statistics and hot-set selection: which keys are accessed often enough to be
// worth replicating on every node (NuPS) or sending every round (consensus mode).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace chorus::sampling {

using Key = uint64_t;

// Approximate access counts in fixed memory: a count-min sketch whose rows are hashed with
// XXH3 under different seeds. estimate(k) never undercounts; it overcounts by at most
// e * total / width with probability 1 - exp(-depth).
class CountMinSketch {
 public:
  // width and depth must be >= 1 (std::invalid_argument otherwise).
  CountMinSketch(size_t width, size_t depth);
  void add(Key key, uint64_t count = 1);
  uint64_t estimate(Key key) const;
  uint64_t total() const { return total_; }
  size_t width() const { return width_; }
  size_t depth() const { return depth_; }

 private:
  size_t slot(size_t row, Key key) const;

  size_t width_, depth_;
  std::vector<uint64_t> cells_;  // depth rows of width counters
  uint64_t total_ = 0;
};

// Exact counts, for a pre-scan of the training data.
class ExactCounts {
 public:
  void add(Key key, uint64_t count = 1) {
    counts_[key] += count;
    total_ += count;
  }
  uint64_t count(Key key) const {
    auto it = counts_.find(key);
    return it == counts_.end() ? 0 : it->second;
  }
  uint64_t total() const { return total_; }
  const std::unordered_map<Key, uint64_t>& counts() const { return counts_; }

 private:
  std::unordered_map<Key, uint64_t> counts_;
  uint64_t total_ = 0;
};

struct HotKey {
  Key key;
  uint64_t count;
};

// The hot set: keys ranked by access count (ties by key, so every node picks the same set),
// taken while their total size fits `budget_bytes` (each key costs `bytes_per_key`) and their
// count is at least `min_count`. Candidates must be unique.
std::vector<HotKey> selectHotSet(std::span<const HotKey> candidates, uint64_t bytes_per_key,
                                 uint64_t budget_bytes, uint64_t min_count = 1);

}  // namespace chorus::sampling
