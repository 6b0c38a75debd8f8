#include "ps/key_runs.h"

#include <fmt/format.h>

#include <limits>

namespace chorus::ps {

namespace {

// Writes one varint at `out`; returns one past its last byte.
inline uint8_t* putVarint(uint64_t v, uint8_t* out) {
  while (v >= 0x80) {
    *out++ = static_cast<uint8_t>(v) | 0x80;
    v >>= 7;
  }
  *out++ = static_cast<uint8_t>(v);
  return out;
}

enum class VarintRead : uint8_t { kOk, kCutOff, kTooLong };

// Reads one varint at `pos` (advanced past it). One-byte varints (most gaps and run lengths of
// keys spread by hashing) take the inline path: a call per varint was a tenth of the CPU per
// 1-float key (issue 25).
VarintRead getVarintSlow(std::span<const uint8_t> bytes, size_t& pos, uint64_t& v) {
  v = 0;
  for (unsigned shift = 0;; shift += 7) {
    if (pos == bytes.size()) return VarintRead::kCutOff;
    const uint8_t b = bytes[pos++];
    // The tenth byte may only carry the top bit of 64.
    if (shift == 63 && b > 1) return VarintRead::kTooLong;
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return VarintRead::kOk;
  }
}

inline VarintRead getVarint(std::span<const uint8_t> bytes, size_t& pos, uint64_t& v) {
  if (pos < bytes.size() && bytes[pos] < 0x80) {
    v = bytes[pos++];
    return VarintRead::kOk;
  }
  return getVarintSlow(bytes, pos, v);
}

// The error of a varint that starts at byte `start` and could not be read.
std::string varintError(VarintRead read, size_t start, size_t size, const char* what = "key runs") {
  if (read == VarintRead::kTooLong) {
    return fmt::format("{}: the varint at byte {} is longer than 64 bits", what, start);
  }
  return fmt::format("{}: the varint at byte {} is cut off by the end ({} bytes)", what, start,
                     size);
}

}  // namespace

size_t encodeKeyRuns(std::span<const Key> keys, uint8_t* out) {
  uint8_t* const begin = out;
  Key end = 0;  // one past the previous run
  size_t i = 0;
  while (i < keys.size()) {
    const Key first = keys[i];
    size_t n = 1;
    while (i + n < keys.size() && keys[i + n] == first + n)
      ++n;
    out = putVarint(first - end, out);
    out = putVarint(n - 1, out);
    end = first + n;  // wraps to 0 only after key 2^64 - 1, the last possible run
    i += n;
  }
  return static_cast<size_t>(out - begin);
}

void encodeKeyRuns(std::span<const Key> keys, std::vector<uint8_t>& out) {
  const size_t at = out.size();
  out.resize(at + keyRunsBound(keys.size()));
  out.resize(at + encodeKeyRuns(keys, out.data() + at));
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
    if (const VarintRead read = getVarint(bytes, pos, gap); read != VarintRead::kOk) {
      return varintError(read, at, bytes.size());
    }
    const size_t more_at = pos;
    if (const VarintRead read = getVarint(bytes, pos, more); read != VarintRead::kOk) {
      return varintError(read, more_at, bytes.size());
    }
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
    if (more == 0) {
      keys.push_back(first);  // most runs of keys spread by hashing
    } else {
      const size_t from = keys.size();
      keys.resize(from + more + 1);
      for (size_t i = 0; i <= more; ++i)
        keys[from + i] = first + i;
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

void encodeSlotRuns(std::span<const SlotRun> runs, std::vector<uint8_t>& out) {
  const size_t at = out.size();
  out.resize(at + slotRunsBound(runs.size()));
  uint8_t* p = out.data() + at;
  for (const SlotRun& run : runs) {
    p = putVarint(run.table, p);
    p = putVarint(run.slot, p);
    p = putVarint(run.rows - 1, p);
  }
  out.resize(static_cast<size_t>(p - out.data()));
}

std::optional<std::string> decodeSlotRuns(std::span<const uint8_t> bytes, size_t max_rows,
                                          std::vector<SlotRun>& runs) {
  runs.clear();
  constexpr uint64_t kMax32 = UINT32_MAX;
  size_t pos = 0, rows = 0;
  while (pos < bytes.size()) {
    const size_t at = pos;
    uint64_t field[3] = {0, 0, 0};
    for (uint64_t& v : field) {
      const size_t start = pos;
      if (const VarintRead read = getVarint(bytes, pos, v); read != VarintRead::kOk) {
        return varintError(read, start, bytes.size(), "slot runs");
      }
      if (v > kMax32) {
        return fmt::format("slot runs: the varint at byte {} ({}) is past 2^32 - 1", start, v);
      }
    }
    const uint64_t count = field[2] + 1;
    if (field[1] + count > kMax32 + 1) {
      return fmt::format("slot runs: the run at byte {} (slot {} and {} more) passes slot 2^32 - 1",
                         at, field[1], field[2]);
    }
    if (count > max_rows - rows) {
      return fmt::format(
          "slot runs: the run at byte {} ({} rows) makes more than the {} rows a request can name "
          "here",
          at, count, max_rows);
    }
    rows += count;
    runs.push_back(SlotRun{.table = static_cast<uint32_t>(field[0]),
                           .slot = static_cast<uint32_t>(field[1]),
                           .rows = static_cast<uint32_t>(count)});
  }
  return std::nullopt;
}

}  // namespace chorus::ps
