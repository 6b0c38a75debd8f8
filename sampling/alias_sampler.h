// O(1) draws from a fixed discrete distribution (Walker / Vose alias method), and the
// distributions chorus samples keys from.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace chorus::sampling {

// Draws index i with probability weights[i] / sum(weights) in O(1) per draw after O(n) setup.
class AliasSampler {
 public:
  // Weights must be finite and >= 0 with a positive sum; throws std::invalid_argument
  // otherwise (naming the first bad index).
  explicit AliasSampler(std::span<const double> weights);

  // One draw; `rng` is any 64-bit engine (each caller brings its own, seeded).
  template <typename Rng>
  uint64_t operator()(Rng& rng) const {
    uint64_t column = std::uniform_int_distribution<uint64_t>(0, prob_.size() - 1)(rng);
    double coin = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    return coin < prob_[column] ? column : alias_[column];
  }
  size_t size() const { return prob_.size(); }
  // The normalized probability of index i (for tests and sample-quality reports).
  double probability(size_t i) const { return normalized_[i]; }

 private:
  std::vector<double> prob_;
  std::vector<uint64_t> alias_;
  std::vector<double> normalized_;
};

// Weights proportional to count^power (word2vec's unigram^0.75 for negative sampling).
std::vector<double> unigramWeights(std::span<const uint64_t> counts, double power = 0.75);
// Zipf weights 1 / (rank + 1)^exponent for ranks 0..n-1 (key 0 the most frequent).
std::vector<double> zipfWeights(size_t n, double exponent);

}  // namespace chorus::sampling
