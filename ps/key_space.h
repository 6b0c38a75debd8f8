// The PS key space: which keys exist and how many floats each one holds. Keys are grouped in
// tables, each a range of keys with one row length (an embedding table: one key per row; a dense
// model: one table of fixed-length chunks of the flat parameter vector, the last one possibly
// shorter). Tables lie one after another in key order and may leave gaps; every table's rows
// also have a place in one flat buffer of all tables (a dense model's parameters). Free of any
// networking; O(log tables) per lookup, never O(keys).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ps/shard_map.h"

namespace chorus::ps {

// One table: keys [first, first + rows), each `row_floats` floats except that a chunked table's
// last row holds what is left of `floats`.
struct KeyTable {
  std::string name;
  Key first = 0;
  size_t rows = 0;
  size_t row_floats = 0;
  size_t floats = 0;  // of all rows together
  size_t offset = 0;  // where row `first` starts in the flat buffer of every table

  Key end() const { return first + rows; }
  bool contains(Key key) const { return key >= first && key < end(); }
  // Floats of `key` (a key of this table).
  size_t length(Key key) const {
    const size_t begin = static_cast<size_t>(key - first) * row_floats;
    return row_floats < floats - begin ? row_floats : floats - begin;
  }
};

class KeySpace {
 public:
  // No keys.
  KeySpace() = default;
  // A dense model cut into chunks: one table of layout.numKeys() keys from key 0 (implicit, so
  // that every user of a ChunkLayout works on its key space unchanged).
  KeySpace(const ChunkLayout& layout);  // NOLINT(google-explicit-constructor)

  // Appends a table of `rows` keys of `row_floats` floats each, from key `first` (at or after
  // the end of the last table; std::invalid_argument otherwise, or for rows or row_floats of 0
  // or a key range past 2^64). Returns the table's first key.
  Key addTable(std::string name, Key first, size_t rows, size_t row_floats);
  // The same, right after the last table.
  Key addTable(std::string name, size_t rows, size_t row_floats) {
    return addTable(std::move(name), keyEnd(), rows, row_floats);
  }

  // Number of keys (the tables' rows together, gaps not counted).
  size_t numKeys() const { return num_keys_; }
  // One past the highest key (0 for no keys).
  Key keyEnd() const { return tables_.empty() ? 0 : tables_.back().end(); }
  // Floats of every key together: the size of the flat buffer.
  size_t total() const {
    return tables_.empty() ? 0 : tables_.back().offset + tables_.back().floats;
  }
  // The table holding `key`, or null.
  const KeyTable* tableOf(Key key) const;
  bool contains(Key key) const { return tableOf(key) != nullptr; }
  // Floats of `key`; 0 for a key outside the space. Inline: every request asks it per key.
  size_t length(Key key) const {
    // One table (a dense model, or a space of one embedding table) is the common case.
    if (tables_.size() == 1) {
      const KeyTable& t = tables_.front();
      return t.contains(key) ? t.length(key) : 0;
    }
    const KeyTable* table = tableOf(key);
    return table ? table->length(key) : 0;
  }
  // First float of `key` in the flat buffer (a key in the space).
  size_t offset(Key key) const;
  // The slice of `flat` (total() floats) that `key` covers.
  std::span<float> slice(std::span<float> flat, Key key) const {
    return flat.subspan(offset(key), length(key));
  }
  // Floats of all `keys` together (keys in the space).
  size_t floatsOf(std::span<const Key> keys) const;
  // Why `keys` (with `floats` values, unchecked when nullopt) are no request on this space, or
  // nullopt: sorted and unique, every key in the space, and exactly their floats.
  std::optional<std::string> check(std::span<const Key> keys, std::optional<size_t> floats) const;
  // Every key, in order (O(keys): start-up and end-of-run reads only).
  std::vector<Key> allKeys() const;
  const std::vector<KeyTable>& tables() const { return tables_; }

 private:
  std::vector<KeyTable> tables_;
  size_t num_keys_ = 0;
};

}  // namespace chorus::ps
