#include "ps/key_space.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace chorus::ps {

KeySpace::KeySpace(const ChunkLayout& layout) {
  if (layout.numKeys() == 0) return;
  tables_.push_back(KeyTable{.name = "model",
                             .first = 0,
                             .rows = layout.numKeys(),
                             .row_floats = layout.chunk(),
                             .floats = layout.total(),
                             .offset = 0});
  num_keys_ = layout.numKeys();
}

Key KeySpace::addTable(std::string name, Key first, size_t rows, size_t row_floats) {
  if (rows == 0 || row_floats == 0) {
    throw std::invalid_argument(
        fmt::format("table '{}' needs at least one row of at least one float", name));
  }
  if (first < keyEnd()) {
    throw std::invalid_argument(
        fmt::format("table '{}' starts at key {}, inside the tables before it (they end at key {})",
                    name, first, keyEnd()));
  }
  if (rows > std::numeric_limits<Key>::max() - first) {
    throw std::invalid_argument(
        fmt::format("table '{}' of {} rows from key {} passes key 2^64", name, rows, first));
  }
  const size_t offset = total();
  tables_.push_back(KeyTable{.name = std::move(name),
                             .first = first,
                             .rows = rows,
                             .row_floats = row_floats,
                             .floats = rows * row_floats,
                             .offset = offset});
  num_keys_ += rows;
  return first;
}

const KeyTable* KeySpace::tableOf(Key key) const {
  // The last table whose first key is <= key.
  auto it = std::upper_bound(tables_.begin(), tables_.end(), key,
                             [](Key k, const KeyTable& t) { return k < t.first; });
  if (it == tables_.begin()) return nullptr;
  --it;
  return it->contains(key) ? &*it : nullptr;
}

size_t KeySpace::offset(Key key) const {
  const KeyTable* table = tables_.size() == 1 ? &tables_.front() : tableOf(key);
  return table->offset + static_cast<size_t>(key - table->first) * table->row_floats;
}

size_t KeySpace::floatsOf(std::span<const Key> keys) const {
  size_t n = 0;
  for (Key key : keys)
    n += length(key);
  return n;
}

std::optional<std::string> KeySpace::check(std::span<const Key> keys,
                                           std::optional<size_t> floats) const {
  // One table (a dense model, or a space of one embedding table): sorted keys lie in it when
  // the first and the last do, and only its last row may be shorter, so the floats follow
  // without a lookup per key (issue 25: the per-key length was 12% of a 1-float-key profile).
  if (tables_.size() == 1 && !keys.empty()) {
    const KeyTable& t = tables_.front();
    bool sorted = true;
    for (size_t i = 1; i < keys.size(); ++i)
      sorted &= keys[i] > keys[i - 1];
    if (sorted && t.contains(keys.front()) && t.contains(keys.back())) {
      size_t n = keys.size() * t.row_floats;
      if (keys.back() == t.end() - 1) n = n - t.row_floats + t.length(keys.back());
      if (floats && *floats != n) {
        return fmt::format("wrong length: {} floats for {} key(s), which hold {}", *floats,
                           keys.size(), n);
      }
      return std::nullopt;
    }
    // Otherwise the general walk below names the first bad key.
  }
  size_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0 && keys[i] <= keys[i - 1]) {
      return fmt::format("keys must be sorted and unique: key {} follows key {}", keys[i],
                         keys[i - 1]);
    }
    const size_t len = length(keys[i]);
    if (len == 0) {
      if (tables_.size() == 1 && tables_.front().first == 0) {
        return fmt::format("unknown key {}: the model has keys 0..{}", keys[i], keyEnd() - 1);
      }
      return fmt::format("unknown key {}: no table holds it", keys[i]);
    }
    n += len;
  }
  if (floats && *floats != n) {
    return fmt::format("wrong length: {} floats for {} key(s), which hold {}", *floats, keys.size(),
                       n);
  }
  return std::nullopt;
}

std::vector<Key> KeySpace::allKeys() const {
  std::vector<Key> keys;
  keys.reserve(num_keys_);
  for (const KeyTable& t : tables_) {
    for (Key k = t.first; k < t.end(); ++k)
      keys.push_back(k);
  }
  return keys;
}

}  // namespace chorus::ps
