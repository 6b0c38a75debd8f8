#include "node/finite.h"

#include <bit>
#include <cmath>
#include <cstdint>

namespace chorus::node {
namespace {

// A float is NaN or infinite exactly when its exponent bits are all ones.
constexpr uint32_t kExponent = 0x7f800000u;

}  // namespace

bool allFinite(std::span<const float> values) {
  // The largest magnitude's bits, as integers: no floating-point comparison (which NaN would
  // poison) and no branch. Sixteen lanes of fixed width, so that -O2's vectorizer (which takes
  // only loops it can vectorize whole) turns each step into two or four vector max operations.
  constexpr size_t kLanes = 16;
  uint32_t lanes[kLanes] = {};
  const float* p = values.data();
  const size_t whole = values.size() - values.size() % kLanes;
  for (size_t i = 0; i < whole; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const uint32_t magnitude = std::bit_cast<uint32_t>(p[i + j]) & 0x7fffffffu;
      lanes[j] = magnitude > lanes[j] ? magnitude : lanes[j];
    }
  }
  uint32_t largest = 0;
  for (size_t i = whole; i < values.size(); ++i) {
    const uint32_t magnitude = std::bit_cast<uint32_t>(p[i]) & 0x7fffffffu;
    largest = magnitude > largest ? magnitude : largest;
  }
  for (const uint32_t lane : lanes)
    largest = lane > largest ? lane : largest;
  return largest < kExponent;
}

std::optional<size_t> firstNonFinite(std::span<const float> values) {
  if (allFinite(values)) return std::nullopt;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) return i;
  }
  return std::nullopt;
}

size_t countNonFinite(std::span<const float> values) {
  size_t count = 0;
  for (const float v : values)
    count += (std::bit_cast<uint32_t>(v) & kExponent) == kExponent ? 1 : 0;
  return count;
}

}  // namespace chorus::node
