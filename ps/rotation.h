// Orion's dependence-preserving schedule for matrix factorization (Wei et al., EuroSys 2019;
// `--mf-schedule rotation`, docs/orion.md), as a pure plan: no network, no clock.
//
// The rating matrix is cut into N x N blocks: N row blocks (sets of row ids) and N column blocks
// (sets of column ids). An epoch is N sub-epochs; at sub-epoch t the row block r is trained
// together with the column block (r + t) mod N. The N blocks of one sub-epoch share no row and no
// column, so they can be trained at the same time by different workers and the result is that of
// training them one after the other, in any order: the serial algorithm's. With W workers (N a
// multiple of W) worker w runs the row blocks [w * N / W, (w + 1) * N / W); the row factors of its
// blocks stay with it and the column blocks rotate, one step of the rotation per sub-epoch
// (ps/rotation_driver.h moves them).
//
// Every block of sub-epoch t is cut into the same number of clocks (slices), the batches of the
// largest block of that sub-epoch, so that every worker runs the same clocks (SSP's clocks line
// up) and a block's batches do not depend on how many workers run the plan: one worker visiting
// the blocks in the same order makes exactly the same steps.
//
// Zipf skew makes id ranges uneven. The ids are therefore packed into blocks by rating count
// (packedBlocks: the heaviest id first, each into the lightest block so far), so a hot column
// gets a block of its own and the others share the rest evenly; contiguous cuts (by rating
// count or by id) are kept to compare. Rows and columns of the Zipf generator are drawn
// independently, so even marginals give blocks of about 1/N^2 of the ratings each. A single
// column holding more than 1/N of the ratings still bounds an epoch from below: its ratings must
// be trained one after the other whatever the schedule (RotationBalance::floor_idle_share).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace chorus::ps {

// How the row and column ids are grouped into blocks.
enum class RotationCuts : uint8_t {
  kPacked,     // packedBlocks by rating count (the default)
  kByRatings,  // contiguous ranges of about 1/N of the ratings each (balancedCuts)
  kByIds,      // contiguous ranges of about 1/N of the ids each
};

// The N + 1 boundaries of `parts` contiguous ranges of the ids [0, counts.size()) whose summed
// counts are as near to 1/parts of the total as whole ids allow (range p is [cuts[p],
// cuts[p + 1]); a range may be empty when one id holds more than its share). Pure.
std::vector<uint64_t> balancedCuts(std::span<const uint64_t> counts, size_t parts);
// The boundaries of `parts` ranges of near-equal length over [0, ids).
std::vector<uint64_t> equalCuts(uint64_t ids, size_t parts);
// The part (0 .. parts - 1) of every id: the ids by descending count (ties: the smaller id
// first), each into the part with the smallest summed count so far (ties: the lower part). Any
// two parts then differ by at most the largest count; an id holding more than 1/parts of the
// total has a part to itself. Deterministic, so every node computes the same. Pure.
std::vector<uint32_t> packedBlocks(std::span<const uint64_t> counts, size_t parts);

// How even the blocks are (the load balance the schedule has before any time is measured).
// Time is taken as proportional to ratings throughout.
struct RotationBalance {
  uint64_t min_block = 0;  // ratings of the smallest and the largest of the N^2 blocks
  uint64_t max_block = 0;
  double mean_block = 0;
  // Per sub-epoch, the ratings of the busiest worker over the workers' mean, averaged over the
  // sub-epochs weighted by their ratings (sum of max / sum of mean; 1: even).
  double max_over_mean = 1;
  // Of the worker time of an epoch, the share a worker waits at sub-epoch barriers for the
  // slowest of its sub-epoch: (W * sum of max - sum) / (W * sum of max) = 1 - 1 / max_over_mean.
  double idle_share = 0;
  // The same with neighbour hand-offs (a worker starts a sub-epoch once the holders of its next
  // column blocks finished theirs, ps/rotation_driver.h), over kBalanceEpochs epochs from an
  // even start: 1 - ratings / (W * the last worker's finish).
  double handoff_idle_share = 0;
  // What no schedule that trains each column and each row on one worker at a time can avoid:
  // an epoch lasts at least as long as the hottest single column's (or row's) ratings take.
  // 1 - (ratings / W) / max(ratings / W, hottest column, hottest row).
  double floor_idle_share = 0;
};
// The epochs RotationBalance::handoff_idle_share is simulated over.
inline constexpr int kBalanceEpochs = 4;

// The blocks and the clocks of one run.
class RotationPlan {
 public:
  // `point_rows[i]`, `point_cols[i]`: the row and column of training point i, below `rows` and
  // `cols`; `blocks` (N >= 1) per dimension; `batch` points per clock at most. Throws
  // std::invalid_argument for a point outside the matrix, blocks 0 or batch 0.
  RotationPlan(std::span<const uint64_t> point_rows, std::span<const uint64_t> point_cols,
               uint64_t rows, uint64_t cols, size_t blocks, size_t batch,
               RotationCuts cuts = RotationCuts::kPacked);

  size_t blocks() const { return blocks_; }
  // The block of each row and column id, and the ids of each block (ascending).
  size_t rowBlockOf(uint64_t row) const { return row_block_of_[row]; }
  size_t colBlockOf(uint64_t col) const { return col_block_of_[col]; }
  const std::vector<uint64_t>& rowIds(size_t row_block) const { return row_ids_[row_block]; }
  const std::vector<uint64_t>& colIds(size_t col_block) const { return col_ids_[col_block]; }
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

  // The ratings worker `worker` of `workers` trains in sub-epoch `subepoch`.
  uint64_t workOf(size_t worker, size_t workers, size_t subepoch) const;
  RotationBalance balance(size_t workers) const;
  // "4x4 blocks of 1200-3400 ratings (mean 2000), 48 clocks per epoch, idle share 12.0% with
  // barriers, 8.0% with hand-offs (floor 0.0%) for 4 worker(s)".
  std::string describe(size_t workers) const;

 private:
  size_t blocks_;
  std::vector<uint32_t> row_block_of_, col_block_of_;
  std::vector<std::vector<uint64_t>> row_ids_, col_ids_;
  uint64_t hottest_row_ = 0, hottest_col_ = 0;  // ratings of the hottest single id
  std::vector<std::vector<size_t>> block_points_;
  std::vector<int64_t> slice_clocks_;
};

}  // namespace chorus::ps
