#include "sampling/negative_sampler.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace chorus::sampling {

uint64_t workerSeed(uint64_t seed, uint64_t worker) {
  // splitmix64 of the seed advanced by the worker's stride: consecutive workers get seeds that
  // share no structure, so mt19937_64 streams seeded from them are unrelated.
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (worker + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

NegativeSampler NegativeSampler::uniform(Key first, Key end) {
  if (end <= first) {
    throw std::invalid_argument("uniform sampler over an empty key range [" +
                                std::to_string(first) + ", " + std::to_string(end) + ")");
  }
  return NegativeSampler(first, end, std::nullopt);
}

NegativeSampler NegativeSampler::byFrequency(std::span<const uint64_t> counts, double alpha) {
  if (!(alpha >= 0.0) || !std::isfinite(alpha)) {
    throw std::invalid_argument("the frequency exponent alpha must be >= 0 and finite");
  }
  std::vector<double> weights(counts.size());
  for (size_t k = 0; k < counts.size(); ++k) {
    weights[k] = counts[k] == 0 ? 0.0 : std::pow(static_cast<double>(counts[k]), alpha);
  }
  // AliasSampler refuses an empty or all-zero distribution with its own message.
  return NegativeSampler(0, counts.size(), AliasSampler(weights));
}

double NegativeSampler::probability(Key key) const {
  if (key < first_ || key >= end_) return 0.0;
  if (alias_) return alias_->probability(key - first_);
  return 1.0 / static_cast<double>(end_ - first_);
}

std::vector<double> NegativeSampler::distribution() const {
  std::vector<double> pi(end_, 0.0);
  for (Key k = first_; k < end_; ++k)
    pi[k] = probability(k);
  return pi;
}

}  // namespace chorus::sampling
