// Pearson's chi-square for the sampling tests, and how their critical values were derived.
//
// Critical values are the 0.9999 quantiles of the chi-square distribution (a significance level
// of 1e-4: a correct sampler fails about once in 10,000 seeds; the tests use fixed seeds, so a
// pass stays a pass). They were computed offline with /usr/bin/python3 and mpmath 1.2.1, by
// bisecting mpmath.gammainc(df / 2, 0, x / 2, regularized=True) = 0.9999 for x; the tests
// hard-code them so that they need no python.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace chorus::sampling::sampletest {

// Pearson's chi-square of `seen` (counts per key) against `n` draws from `pi`. A key seen that
// pi gives probability 0 makes it infinite (the sampler drew what it must not).
inline double chiSquare(const std::vector<uint64_t>& seen, const std::vector<double>& pi,
                        uint64_t n) {
  double chi = 0;
  for (size_t k = 0; k < seen.size(); ++k) {
    const double expected = k < pi.size() ? pi[k] * static_cast<double>(n) : 0.0;
    if (expected > 0) {
      chi += std::pow(static_cast<double>(seen[k]) - expected, 2) / expected;
    } else if (seen[k] > 0) {
      return std::numeric_limits<double>::infinity();
    }
  }
  return chi;
}

// Degrees of freedom of a test against `pi`: the keys it can draw, less one.
inline size_t degreesOfFreedom(const std::vector<double>& pi) {
  size_t cells = 0;
  for (double p : pi)
    cells += p > 0 ? 1 : 0;
  return cells - 1;
}

}  // namespace chorus::sampling::sampletest
