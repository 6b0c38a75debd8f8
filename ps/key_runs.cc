#include "ps/key_runs.h"

#include <fmt/format.h>

#include <limits>

namespace chorus::ps {

namespace {

void putVarint(uint64_t v, std::vector<uint8_t>& out) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v) | 0x80);
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}

// Reads one varint at `pos` (advanced past it); the error names the byte it starts at.
std::optional<std::string> getVarint(std::span<const uint8_t> bytes, size_t& pos, uint64_t& v) {
  const size_t start = pos;
  v = 0;
  for (unsigned shift = 0;; shift += 7) {
    if (pos == bytes.size()) {
      return fmt::format("key runs: the varint at byte {} is cut off by the end ({} bytes)", start,
                         bytes.size());
    }
    const uint8_t b = bytes[pos++];
    // The tenth byte may only carry the top bit of 64.
    if (shift == 63 && b > 1) {
      return fmt::format("key runs: the varint at byte {} is longer than 64 bits", start);
    }
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return std::nullopt;
  }
}

}  // namespace

void encodeKeyRuns(std::span<const Key> keys, std::vector<uint8_t>& out) {
  Key end = 0;  // one past the previous run
  size_t i = 0;
  while (i < keys.size()) {
    const Key first = keys[i];
    size_t n = 1;
    while (i + n < keys.size() && keys[i + n] == first + n)
      ++n;
    putVarint(first - end, out);
    putVarint(n - 1, out);
    end = first + n;  // wraps to 0 only after key 2^64 - 1, the last possible run
    i += n;
  }
}

std::optional<std::string> decodeKeyRuns(std::span<const uint8_t> bytes, size_t max_keys,
                                         std::vector<Key>& keys) {
  keys.clear();
  constexpr Key kMax = std::numeric_limits<Key>::max();
  Key next = 0;        // the lowest key the next run may start at
  bool ended = false;  // a run reached key 2^64 - 1: nothing may follow
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t at = pos;
    uint64_t gap = 0, more = 0;
    if (auto error = getVarint(bytes, pos, gap)) return error;
    if (auto error = getVarint(bytes, pos, more)) return error;
    if (ended || gap > kMax - next) {
      return fmt::format("key runs: the run at byte {} starts past key 2^64 - 1", at);
    }
    const Key first = next + gap;
    if (more > kMax - first) {
      return fmt::format("key runs: the run at byte {} (key {} and {} more) passes key 2^64 - 1",
                         at, first, more);
    }
    if (more >= max_keys - keys.size()) {
      return fmt::format(
          "key runs: the run at byte {} (key {} and {} more) makes more than the {} keys a "
          "request can name here",
          at, first, more, max_keys);
    }
    for (Key k = first;; ++k) {
      keys.push_back(k);
      if (k == first + more) break;
    }
    const Key last = first + more;
    if (last == kMax) {
      ended = true;
    } else {
      next = last + 1;
    }
  }
  return std::nullopt;
}

}  // namespace chorus::ps
