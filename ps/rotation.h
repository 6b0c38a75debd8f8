// Orion's dependence-preserving schedule for matrix factorization (Wei et al., EuroSys 2019;
// `--mf-schedule rotation`, docs/orion.md), as a pure plan: no network, no clock.
//
// The rating matrix is cut into N x N blocks: N row blocks (contiguous ranges of row ids) and N
// column blocks (contiguous ranges of column ids). An epoch is N sub-epochs; at sub-epoch t the
// row block r is trained together with the column block (r + t) mod N. The N blocks of one
// sub-epoch share no row and no column, so they can be trained at the same time by different
// workers and the result is that of training them one after the other, in any order: the serial
// algorithm's. With W workers (N a multiple of W) worker w runs the row blocks
// [w * N / W, (w + 1) * N / W); the row factors of its blocks stay with it and the column blocks
// rotate, one step of the rotation per sub-epoch (ps/rotation_driver.h moves them).
//
// Every block of sub-epoch t is cut into the same number of clocks (slices), the batches of the
// largest block of that sub-epoch, so that every worker runs the same clocks (SSP's clocks line
// up) and a block's batches do not depend on how many workers run the plan: one worker visiting
// the blocks in the same order makes exactly the same steps.
//
// Zipf skew makes id ranges uneven; the cuts are chosen by rating count (each range holds about
// 1/N of the ratings: balancedCuts) unless `cuts` says id ranges. Rows and columns of the Zipf
// generator are drawn independently, so balanced marginals give blocks of about 1/N^2 of the
// ratings each; a single row or column holding more than 1/N of the ratings cannot be split and
// leaves its block the largest (RotationBalance says by how much).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace chorus::ps {

// How the row and column ranges are cut.
enum class RotationCuts : uint8_t {
  kByRatings,  // each range holds about 1/N of the ratings (the default)
  kByIds,      // each range holds about 1/N of the ids
};

// The N + 1 boundaries of `parts` contiguous ranges of the ids [0, counts.size()) whose summed
// counts are as near to 1/parts of the total as whole ids allow (range p is [cuts[p],
// cuts[p + 1]); a range may be empty when one id holds more than its share). Pure.
std::vector<uint64_t> balancedCuts(std::span<const uint64_t> counts, size_t parts);
// The boundaries of `parts` ranges of near-equal length over [0, ids).
std::vector<uint64_t> equalCuts(uint64_t ids, size_t parts);

// How even the blocks are (the load balance the schedule has before any time is measured).
struct RotationBalance {
  uint64_t min_block = 0;  // ratings of the smallest and the largest of the N^2 blocks
  uint64_t max_block = 0;
  double mean_block = 0;
  // Of the worker time of an epoch, the share a worker waits for the slowest of its sub-epoch,
  // when time is proportional to ratings: sum over sub-epochs of (W * max - sum) / (W * sum of
  // max).
  double idle_share = 0;
};

// The blocks and the clocks of one run.
class RotationPlan {
 public:
  // `point_rows[i]`, `point_cols[i]`: the row and column of training point i, below `rows` and
  // `cols`; `blocks` (N >= 1) per dimension; `batch` points per clock at most. Throws
  // std::invalid_argument for a point outside the matrix, blocks 0 or batch 0.
  RotationPlan(std::span<const uint64_t> point_rows, std::span<const uint64_t> point_cols,
               uint64_t rows, uint64_t cols, size_t blocks, size_t batch,
               RotationCuts cuts = RotationCuts::kByRatings);

  size_t blocks() const { return blocks_; }
  // N + 1 boundaries each: row block r holds the rows [rowCuts()[r], rowCuts()[r + 1]).
  const std::vector<uint64_t>& rowCuts() const { return row_cuts_; }
  const std::vector<uint64_t>& colCuts() const { return col_cuts_; }
  // The column block trained with row block `row_block` at sub-epoch `subepoch`.
  size_t columnBlock(size_t row_block, size_t subepoch) const {
    return (row_block + subepoch) % blocks_;
  }
  // The training points of block (r, c), ascending.
  std::span<const size_t> points(size_t row_block, size_t col_block) const {
    return block_points_[row_block * blocks_ + col_block];
  }
  // The clocks (slices) every block of sub-epoch `subepoch` is cut into (at least 1).
  int64_t sliceClocks(size_t subepoch) const { return slice_clocks_[subepoch]; }

  // Can `workers` workers run this plan (N a multiple of W, W >= 1)?
  bool fitsWorkers(size_t workers) const { return workers >= 1 && blocks_ % workers == 0; }
  // The row blocks of worker `worker` of `workers` (consecutive).
  std::vector<size_t> rowBlocksOf(size_t worker, size_t workers) const;
  // The training points of those row blocks (ascending): the worker's shard.
  std::vector<size_t> shardOf(size_t worker, size_t workers) const;
  // The clocks of one epoch, the same for every worker: (N / W) * sum of sliceClocks.
  int64_t clocksPerEpoch(size_t workers) const;

  // Where clock `clock` (0-based within the epoch) of worker `worker` of `workers` falls.
  struct Slot {
    size_t subepoch = 0;
    size_t row_block = 0;
    size_t col_block = 0;
    int64_t slice = 0;             // of `slices`
    int64_t slices = 0;            // sliceClocks(subepoch)
    bool starts_subepoch = false;  // the worker's first clock of the sub-epoch
  };
  Slot slotOf(int64_t clock, size_t worker, size_t workers) const;

  RotationBalance balance(size_t workers) const;
  // "4x4 blocks of 1,200-3,400 ratings (mean 2,000), idle share 12.0% for 4 workers".
  std::string describe(size_t workers) const;

 private:
  size_t blocks_;
  std::vector<uint64_t> row_cuts_, col_cuts_;
  std::vector<std::vector<size_t>> block_points_;
  std::vector<int64_t> slice_clocks_;
};

}  // namespace chorus::ps
