// How often each key of a table will be accessed: the counts of a pre-scan of the training data
// plus the accesses that sampling adds, the share of all accesses a hot set takes, and a summary
// of the skew for the start-up log. The one place every mode asks "how often will key k be
// accessed". Keys of a table are dense ids 0..n-1 (one key space per table).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/key_stats.h"

namespace chorus::sampling {

// Access counts of one table's keys from a pre-scan: exact (one counter per key) when
// keySpace * 8 bytes fits `exactBudgetBytes`, else a count-min sketch of that size (depth 4),
// which never undercounts (see CountMinSketch).
class AccessCounts {
 public:
  // Counts for keys 0..keySpace-1 within about `exactBudgetBytes` of memory.
  explicit AccessCounts(uint64_t keySpace, uint64_t exactBudgetBytes = uint64_t{256} << 20);
  // Counts `count` accesses of `key` (key < keySpace).
  void add(Key key, uint64_t count = 1);
  // The accesses of `key`: exact, or the sketch's estimate (never below the truth).
  uint64_t count(Key key) const;
  // Whether counts are exact.
  bool exact() const { return !sketch_.has_value(); }
  // The key space's size.
  uint64_t keySpace() const { return keySpace_; }
  // All accesses counted.
  uint64_t total() const { return total_; }
  // count(k) for every key 0..keySpace-1.
  std::vector<uint64_t> dense() const;

 private:
  uint64_t keySpace_;
  uint64_t total_ = 0;
  std::vector<uint64_t> exact_;
  std::optional<CountMinSketch> sketch_;
};

// Expected accesses of every key in one pass over the data: counts[k] from the data itself plus
// dataPoints * drawsPerPoint * pi[k] from sampling (each data point draws drawsPerPoint keys from
// pi). NuPS's word-vector formula divided by the data size is this with pi = unigram^0.75; a KGE
// triple with n uniform negatives over E entities adds n / E per entity. `pi` must sum to 1 and
// have counts' size, or be empty (no sampling); std::invalid_argument otherwise.
std::vector<double> expectedAccesses(std::span<const uint64_t> counts, std::span<const double> pi,
                                     double drawsPerPoint, double dataPoints);

// The hot set of a table and what it covers.
struct HotSetChoice {
  std::vector<Key> keys;  // by expected accesses, most first; ties by key (every node agrees)
  double share = 0.0;     // their share of all expected accesses, in [0, 1]
};

// The most accessed keys whose rows (bytesPerKey each) fit budgetBytes, and the share of all
// accesses they take: the fraction of accesses a node serves locally when it holds them.
HotSetChoice chooseHotSet(std::span<const double> accesses, uint64_t bytesPerKey,
                          uint64_t budgetBytes);

// The share of all expected accesses that `keys` take (each key counted once).
double hotSetShare(std::span<const double> accesses, std::span<const Key> keys);

// How skewed the accesses of one table are.
struct SkewSummary {
  uint64_t keys = 0;          // the key space
  uint64_t accessedKeys = 0;  // keys with any access
  double accesses = 0.0;      // total
  // Shares of all accesses taken by the top 0.1%, 1% and 10% of the key space (at least one
  // key each).
  double top0_1 = 0.0, top1 = 0.0, top10 = 0.0;
};

// The skew of one table's expected accesses.
SkewSummary skewSummary(std::span<const double> accesses);

// One log line: "rows: 100000 keys (99817 accessed), 4.5M accesses; top 0.1% of keys take 31.2%,
// top 1% 52.0%, top 10% 80.4%".
std::string formatSkew(std::string_view table, const SkewSummary& summary);

// counts as doubles (expectedAccesses without sampling).
std::vector<double> asAccesses(std::span<const uint64_t> counts);

}  // namespace chorus::sampling
