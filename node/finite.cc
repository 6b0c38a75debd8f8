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
  // The largest magnitude's bits, as integers: an OR-free max reduction that vectorizes at -O2
  // without any floating-point comparison (which NaN would poison).
  uint32_t largest = 0;
  for (const float v : values) {
    const uint32_t magnitude = std::bit_cast<uint32_t>(v) & 0x7fffffffu;
    largest = magnitude > largest ? magnitude : largest;
  }
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
