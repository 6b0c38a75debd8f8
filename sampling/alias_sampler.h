// O(1) draws from a fixed discrete distribution (Walker / Vose alias method), and the
// distributions chorus samples keys from.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace chorus::sampling {

// Uniform in [0, n) from one draw of a 64-bit engine (Lemire's multiply-shift; bias below 2^-32
// for n < 2^32), written out so that draws do not depend on the standard library.
template <typename Rng>
uint64_t uniformBelow(Rng& rng, uint64_t n) {
  __extension__ using Wide = unsigned __int128;
  return static_cast<uint64_t>((static_cast<Wide>(rng()) * n) >> 64);
}

// Draws index i with probability weights[i] / sum(weights) in O(1) per draw after O(n) setup.
class AliasSampler {
 public:
  // Weights must be finite and >= 0 with a positive sum; throws std::invalid_argument
  // otherwise (naming the first bad index).
  explicit AliasSampler(std::span<const double> weights);

  // One draw; `rng` is any 64-bit engine (each caller brings its own, seeded).
  template <typename Rng>
  uint64_t operator()(Rng& rng) const {
    const uint64_t column = uniformBelow(rng, prob_.size());
    const double coin = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // uniform in [0, 1)
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
