// Sparse parameter tables: a key space of rows, each row `dim` floats, all rows in one contiguous
// buffer; sparse gradients (sorted unique keys + their rows, duplicates summed); and SGD /
// AdaGrad applied to a sparse gradient, row by row, with AdaGrad's state kept per row in a
// buffer laid out like the table (so a row and its state move together).
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ml/tensor.h"

namespace chorus::ml {

// Row keys are uint64 so that a PS can address rows directly; a table's keys are 0..rows-1.
using RowKey = uint64_t;

// One embedding table: rows() x dim() floats, row-major, in one aligned buffer. A whole table is
// one buffer for consensus averaging and checkpoints; a row is a slice for PS keys.
class SparseTable {
 public:
  SparseTable() = default;
  // A table of `rows` rows of `dim` floats, zero-filled. `name` names it in messages.
  SparseTable(std::string name, size_t rows, size_t dim);

  // Fills every value with N(0, scale^2) from `seed`.
  void initNormal(uint64_t seed, double scale);
  // The table's name ("entity", "relation", ...).
  const std::string& name() const { return name_; }
  // Number of rows (the key space is [0, rows)).
  size_t rows() const { return rows_; }
  // Floats per row.
  size_t dim() const { return dim_; }
  // Row `key` (unchecked: key < rows()). Valid while the table lives (the buffer never moves).
  float* row(RowKey key) { return values_.data() + key * dim_; }
  const float* row(RowKey key) const { return values_.data() + key * dim_; }
  // The whole buffer, rows one after another.
  std::span<float> values() { return values_; }
  std::span<const float> values() const { return values_; }

 private:
  std::string name_;
  size_t rows_ = 0;
  size_t dim_ = 0;
  AlignedFloats values_;
};

// The gradient of one table for one step: the rows it touched, keys sorted and unique, row i of
// `rows` belonging to keys[i]; contributions to the same key are already summed.
struct SparseGrad {
  size_t dim = 0;
  std::vector<RowKey> keys;
  AlignedFloats rows;  // keys.size() x dim

  // Number of rows touched.
  size_t size() const { return keys.size(); }
  // Gradient row i (of keys[i]).
  float* row(size_t i) { return rows.data() + i * dim; }
  const float* row(size_t i) const { return rows.data() + i * dim; }
  // True when every key of a `tableRows` table is present (keys are then 0..tableRows-1).
  bool isDense(size_t tableRows) const { return keys.size() == tableRows && tableRows > 0; }
};

// Collects gradient contributions to rows of one table during a step and hands them out as a
// SparseGrad. A slot array over the key space maps a key to its accumulator row, so adding to
// a row is O(1) with no hashing; buffers grow to the largest step seen and are reused, so a
// step does no per-key heap work. Two modes per step: sparse (rows touched one by one), or
// dense (every row, for 1-N scoring, where the caller writes the whole gradient at once).
class SparseGradAccumulator {
 public:
  SparseGradAccumulator() = default;
  // For a table of `rows` rows of `dim` floats.
  SparseGradAccumulator(size_t rows, size_t dim);

  // The accumulator row of `key` (zeroed on its first touch in this step); add to it. The
  // pointer is valid until the next row() of this accumulator (a new key may grow the buffer).
  float* row(RowKey key) {
    if (dense_) return buffer_.data() + key * dim_;
    uint32_t slot = slotOf_[key];
    if (slot == kNoSlot) slot = newSlot(key);
    return buffer_.data() + static_cast<size_t>(slot) * dim_;
  }
  // Switches this step to dense mode and returns the rows x dim buffer in key order, contents
  // unspecified: the caller must overwrite all of it before adding with row(). Must be called
  // before any row() of the step.
  float* beginDense();
  // Number of distinct keys touched so far in this step.
  size_t touched() const { return dense_ ? rows_ : keys_.size(); }
  // Moves the step's gradient into `out` (keys sorted, unique) and starts a new step. `out`'s
  // buffers are reused (swapped), so calling it every step allocates nothing once warm.
  void finish(SparseGrad& out);
  // Floats per row.
  size_t dim() const { return dim_; }

 private:
  static constexpr uint32_t kNoSlot = UINT32_MAX;
  uint32_t newSlot(RowKey key);

  size_t rows_ = 0;
  size_t dim_ = 0;
  bool dense_ = false;
  std::vector<uint32_t> slotOf_;  // per key: its slot this step, or kNoSlot
  std::vector<RowKey> keys_;      // keys in slot order
  AlignedFloats buffer_;          // slot rows
  std::vector<uint32_t> order_;   // scratch for sorting slots by key
};

// The optimizers a sparse table is trained with.
enum class SparseOptimizerKind { kSgd, kAdagrad };

// Parses "sgd" | "adagrad"; throws std::invalid_argument naming --optimizer otherwise.
SparseOptimizerKind parseSparseOptimizer(const std::string& name);
// The name parseSparseOptimizer() accepts.
const char* sparseOptimizerName(SparseOptimizerKind kind);

// Hyper-parameters of the sparse update.
struct SparseOptimizerConfig {
  SparseOptimizerKind kind = SparseOptimizerKind::kAdagrad;
  double lr = 0.1;
  double epsilon = 1e-10;  // AdaGrad: w -= lr * g / (sqrt(G) + epsilon), as torch.optim.Adagrad
  double initialAccumulator = 0.0;  // AdaGrad: G's starting value
};

// Updates only the rows of a table named by a sparse gradient. AdaGrad keeps one accumulator
// per parameter (G += g*g, element-wise, as torch.optim.Adagrad and kbc), stored per row in a
// buffer shaped like the table; SGD keeps no state. Rows that a step does not touch are not
// read or written (lazy update, as torch's sparse Adagrad).
class SparseOptimizer {
 public:
  // For `table` (its shape sizes the state).
  SparseOptimizer(SparseOptimizerConfig config, const SparseTable& table);
  // Applies `grad` (keys must be < table.rows(), row length table.dim()) to `table`.
  void apply(SparseTable& table, const SparseGrad& grad);
  // AdaGrad's accumulators (empty for SGD), rows like the table's; saved with checkpoints.
  std::span<float> state() { return state_; }
  std::span<const float> state() const { return state_; }
  // The rule and its hyper-parameters.
  const SparseOptimizerConfig& config() const { return config_; }

 private:
  SparseOptimizerConfig config_;
  AlignedFloats state_;
};

}  // namespace chorus::ml
