// Sparse tables as PS keys: each embedding row is one key, the tables lie one after another in
// key order (table t's row r is key first_t + r), and a key's value is its row (the table's dim
// floats). StepKeys turns the rows a training step touches into the sorted, unique keys a
// worker pulls, and puts the pulled values back into the tables' rows; appendGrad() turns a
// table's sparse gradient into the keys and floats of a push. Free of any networking; work and
// memory per step grow with the rows the step touches, never with the tables' sizes (after
// the constructor).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ml/sparse_table.h"
#include "ps/key_space.h"

namespace chorus::ps {

// One table per SparseTable, in the given order, from key 0, named as the tables.
KeySpace sparseKeySpace(std::span<ml::SparseTable* const> tables);

// Copies every table into `flat` (space.total() floats, the tables one after another) and back.
// The tables must be those the space was made from.
void gatherTables(const KeySpace& space, std::span<ml::SparseTable* const> tables,
                  std::span<float> flat);
void scatterTables(const KeySpace& space, std::span<const float> flat,
                   std::span<ml::SparseTable* const> tables);

// The keys one step pulls. Reused across steps (no per-step allocation once warm).
class StepKeys {
 public:
  // For `space` (made by sparseKeySpace(); kept by reference, must outlive this).
  explicit StepKeys(const KeySpace& space);

  // Takes the rows the step touches: rows[t] are rows of table t (unsorted, may repeat; each
  // below the table's rows, else std::out_of_range naming the table). Clears `rows`.
  void assign(std::span<std::vector<ml::RowKey>> rows);
  // The step's keys, sorted and unique.
  std::span<const Key> keys() const { return keys_; }
  // Floats of all keys() together (the pull's buffer size).
  size_t floats() const { return floats_; }
  // Copies pulled `values` (keys() order, floats() floats) into the tables' rows.
  void scatter(std::span<const float> values, std::span<ml::SparseTable* const> tables) const;

 private:
  const KeySpace& space_;
  std::vector<std::vector<uint8_t>> seen_;  // per table and row: already in keys_ this step
  std::vector<Key> keys_;
  size_t floats_ = 0;
};

// Appends `grad` (a gradient of table `table` of the space, keys sorted) as the keys of the
// space and their floats: pushes of the tables in table order are then sorted as a whole.
void appendGrad(const KeyTable& table, const ml::SparseGrad& grad, std::vector<Key>& keys,
                std::vector<float>& floats);

}  // namespace chorus::ps
