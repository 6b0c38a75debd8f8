// Seeded random numbers whose sequences are the same on every platform and standard library.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace chorus::ml {

// A splitmix64 step: derives independent seeds for sub-streams (per layer, per epoch, per node)
// from one user seed, so that streams never overlap by accident.
inline uint64_t mixSeed(uint64_t seed, uint64_t stream) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// std::mt19937_64's bit sequence is fixed by the C++ standard, but std::*_distribution are not;
// so the distributions used for initialization, shuffling and sharding are written out here.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  // Uniform 64 random bits.
  uint64_t bits() { return engine_(); }
  // The engine itself, for samplers that draw from it (sampling::NegativeSampler).
  std::mt19937_64& engine() { return engine_; }
  // Uniform double in [0, 1).
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n); n must be > 0. Lemire's multiply-shift, bias < 2^-32 for n < 2^32.
  uint64_t below(uint64_t n) {
    __extension__ using Wide = unsigned __int128;
    return static_cast<uint64_t>((static_cast<Wide>(engine_()) * n) >> 64);
  }
  // Standard normal (Box-Muller; the second value is cached).
  double normal() {
    if (hasSpare_) {
      hasSpare_ = false;
      return spare_;
    }
    double u1 = uniform();
    while (u1 <= 0.0)
      u1 = uniform();
    const double u2 = uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(2.0 * M_PI * u2);
    hasSpare_ = true;
    return radius * std::cos(2.0 * M_PI * u2);
  }
  // Gamma(shape, 1) by Marsaglia-Tsang; shape > 0.
  double gamma(double shape) {
    if (shape < 1.0) {
      double u = uniform();
      while (u <= 0.0)
        u = uniform();
      return gamma(shape + 1.0) * std::pow(u, 1.0 / shape);
    }
    const double d = shape - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x = normal();
      double v = 1.0 + c * x;
      if (v <= 0.0) continue;
      v = v * v * v;
      const double u = uniform();
      if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
      if (u > 0.0 && std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
    }
  }
  // Fisher-Yates shuffle of a random-access range.
  template <typename It>
  void shuffle(It first, It last) {
    const auto n = static_cast<uint64_t>(last - first);
    for (uint64_t i = n; i > 1; --i) {
      const uint64_t j = below(i);
      std::swap(first[i - 1], first[j]);
    }
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool hasSpare_ = false;
};

}  // namespace chorus::ml
