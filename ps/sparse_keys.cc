#include "ps/sparse_keys.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace chorus::ps {

KeySpace sparseKeySpace(std::span<ml::SparseTable* const> tables) {
  KeySpace space;
  for (const ml::SparseTable* table : tables)
    space.addTable(table->name(), table->rows(), table->dim());
  return space;
}

void gatherTables(const KeySpace& space, std::span<ml::SparseTable* const> tables,
                  std::span<float> flat) {
  for (size_t t = 0; t < tables.size(); ++t) {
    const KeyTable& table = space.tables()[t];
    std::copy(tables[t]->values().begin(), tables[t]->values().end(),
              flat.begin() + static_cast<std::ptrdiff_t>(table.offset));
  }
}

void scatterTables(const KeySpace& space, std::span<const float> flat,
                   std::span<ml::SparseTable* const> tables) {
  for (size_t t = 0; t < tables.size(); ++t) {
    const KeyTable& table = space.tables()[t];
    const auto begin = flat.begin() + static_cast<std::ptrdiff_t>(table.offset);
    std::copy(begin, begin + static_cast<std::ptrdiff_t>(table.floats),
              tables[t]->values().begin());
  }
}

StepKeys::StepKeys(const KeySpace& space) : space_(space) {
  for (const KeyTable& table : space_.tables())
    seen_.emplace_back(table.rows, 0);
}

void StepKeys::assign(std::span<std::vector<ml::RowKey>> rows) {
  keys_.clear();
  floats_ = 0;
  for (size_t t = 0; t < rows.size() && t < seen_.size(); ++t) {
    const KeyTable& table = space_.tables()[t];
    std::vector<uint8_t>& seen = seen_[t];
    const size_t begin = keys_.size();
    for (ml::RowKey row : rows[t]) {
      if (row >= table.rows) {
        throw std::out_of_range(
            fmt::format("row {} of table '{}', which has {} rows", row, table.name, table.rows));
      }
      if (seen[row] != 0) continue;
      seen[row] = 1;
      keys_.push_back(table.first + row);
    }
    // Sorted within the table; tables lie in key order, so keys_ is sorted as a whole.
    std::sort(keys_.begin() + static_cast<std::ptrdiff_t>(begin), keys_.end());
    for (size_t i = begin; i < keys_.size(); ++i)
      seen[keys_[i] - table.first] = 0;
    floats_ += (keys_.size() - begin) * table.row_floats;
    rows[t].clear();
  }
}

void StepKeys::scatter(std::span<const float> values,
                       std::span<ml::SparseTable* const> tables) const {
  const float* from = values.data();
  size_t t = 0;
  for (Key key : keys_) {
    while (!space_.tables()[t].contains(key))
      ++t;
    const KeyTable& table = space_.tables()[t];
    std::copy_n(from, table.row_floats, tables[t]->row(key - table.first));
    from += table.row_floats;
  }
}

void appendGrad(const KeyTable& table, const ml::SparseGrad& grad, std::vector<Key>& keys,
                std::vector<float>& floats) {
  for (size_t i = 0; i < grad.size(); ++i) {
    keys.push_back(table.first + grad.keys[i]);
    floats.insert(floats.end(), grad.row(i), grad.row(i) + grad.dim);
  }
}

}  // namespace chorus::ps
