#include "sampling/alias_sampler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace chorus::sampling {

AliasSampler::AliasSampler(std::span<const double> weights) {
  const size_t n = weights.size();
  if (n == 0) throw std::invalid_argument("cannot sample from an empty distribution");
  double largest = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(weights[i]) || weights[i] < 0) {
      throw std::invalid_argument("weight " + std::to_string(i) + " is negative or not finite");
    }
    largest = std::max(largest, weights[i]);
  }
  if (!(largest > 0)) throw std::invalid_argument("the weights sum to zero");
  // Summed as fractions of the largest weight, at most n: finite weights can sum to infinity
  // ({1e308, 1e308, 0}), and every weight / inf is 0, which drew the zero-weight item too.
  double sum = 0;
  for (size_t i = 0; i < n; ++i)
    sum += weights[i] / largest;
  normalized_.resize(n);
  prob_.resize(n);
  alias_.resize(n);
  // Vose's method: scaled probabilities split into those below and above the mean (1).
  std::vector<double> scaled(n);
  std::vector<uint64_t> small, large;
  for (size_t i = 0; i < n; ++i) {
    normalized_[i] = weights[i] / largest / sum;
    scaled[i] = normalized_[i] * static_cast<double>(n);
    (scaled[i] < 1.0 ? small : large).push_back(i);
  }
  while (!small.empty() && !large.empty()) {
    uint64_t s = small.back(), l = large.back();
    small.pop_back();
    prob_[s] = scaled[s];
    alias_[s] = l;
    scaled[l] = (scaled[l] + scaled[s]) - 1.0;
    if (scaled[l] < 1.0) {
      large.pop_back();
      small.push_back(l);
    }
  }
  // What remains is 1 up to rounding.
  for (uint64_t i : large) {
    prob_[i] = 1.0;
    alias_[i] = i;
  }
  for (uint64_t i : small) {
    prob_[i] = 1.0;
    alias_[i] = i;
  }
}

std::vector<double> unigramWeights(std::span<const uint64_t> counts, double power) {
  std::vector<double> w(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    w[i] = std::pow(static_cast<double>(counts[i]), power);
  }
  return w;
}

std::vector<double> zipfWeights(size_t n, double exponent) {
  std::vector<double> w(n);
  for (size_t i = 0; i < n; ++i)
    w[i] = 1.0 / std::pow(static_cast<double>(i + 1), exponent);
  return w;
}

}  // namespace chorus::sampling
