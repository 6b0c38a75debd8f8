#include "ps/rotation.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace chorus::ps {

std::vector<uint64_t> equalCuts(uint64_t ids, size_t parts) {
  std::vector<uint64_t> cuts(parts + 1);
  for (size_t p = 0; p <= parts; ++p)
    cuts[p] = ids * p / parts;
  return cuts;
}

std::vector<uint64_t> balancedCuts(std::span<const uint64_t> counts, size_t parts) {
  if (parts == 0) throw std::invalid_argument("balancedCuts: 0 parts");
  std::vector<uint64_t> prefix(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i)
    prefix[i + 1] = prefix[i] + counts[i];
  const uint64_t total = prefix.back();
  if (total == 0) return equalCuts(counts.size(), parts);
  std::vector<uint64_t> cuts(parts + 1, 0);
  cuts[parts] = counts.size();
  for (size_t p = 1; p < parts; ++p) {
    const double target =
        static_cast<double>(total) * static_cast<double>(p) / static_cast<double>(parts);
    // The first boundary at or past the target, or the one before it when that is nearer.
    auto it = std::lower_bound(prefix.begin(), prefix.end(), target,
                               [](uint64_t v, double t) { return static_cast<double>(v) < t; });
    auto at = static_cast<uint64_t>(it - prefix.begin());
    if (at > 0 && target - static_cast<double>(prefix[at - 1]) <
                      static_cast<double>(prefix[std::min<uint64_t>(at, counts.size())]) - target) {
      --at;
    }
    cuts[p] = std::clamp<uint64_t>(at, cuts[p - 1], counts.size());
  }
  return cuts;
}

namespace {

size_t blockOf(const std::vector<uint64_t>& cuts, uint64_t id) {
  // The last boundary <= id; empty ranges are skipped since upper_bound passes them.
  return static_cast<size_t>(std::upper_bound(cuts.begin(), cuts.end(), id) - cuts.begin()) - 1;
}

}  // namespace

RotationPlan::RotationPlan(std::span<const uint64_t> point_rows,
                           std::span<const uint64_t> point_cols, uint64_t rows, uint64_t cols,
                           size_t blocks, size_t batch, RotationCuts cuts)
    : blocks_(blocks) {
  if (blocks == 0) throw std::invalid_argument("a rotation needs at least one block");
  if (batch == 0) throw std::invalid_argument("a rotation needs a batch of at least one point");
  if (point_rows.size() != point_cols.size()) {
    throw std::invalid_argument("a rotation needs a row and a column for every point");
  }
  std::vector<uint64_t> row_counts(rows, 0);
  std::vector<uint64_t> col_counts(cols, 0);
  for (size_t i = 0; i < point_rows.size(); ++i) {
    if (point_rows[i] >= rows || point_cols[i] >= cols) {
      throw std::invalid_argument(
          fmt::format("training point {} at ({}, {}) lies outside the {} x {} matrix", i,
                      point_rows[i], point_cols[i], rows, cols));
    }
    ++row_counts[point_rows[i]];
    ++col_counts[point_cols[i]];
  }
  if (cuts == RotationCuts::kByRatings) {
    row_cuts_ = balancedCuts(row_counts, blocks);
    col_cuts_ = balancedCuts(col_counts, blocks);
  } else {
    row_cuts_ = equalCuts(rows, blocks);
    col_cuts_ = equalCuts(cols, blocks);
  }
  block_points_.resize(blocks * blocks);
  for (size_t i = 0; i < point_rows.size(); ++i) {
    const size_t r = blockOf(row_cuts_, point_rows[i]);
    const size_t c = blockOf(col_cuts_, point_cols[i]);
    block_points_[r * blocks + c].push_back(i);
  }
  slice_clocks_.assign(blocks, 1);
  for (size_t t = 0; t < blocks; ++t) {
    for (size_t r = 0; r < blocks; ++r) {
      const size_t n = points(r, columnBlock(r, t)).size();
      slice_clocks_[t] = std::max(slice_clocks_[t], static_cast<int64_t>((n + batch - 1) / batch));
    }
  }
}

std::vector<size_t> RotationPlan::rowBlocksOf(size_t worker, size_t workers) const {
  std::vector<size_t> out;
  const size_t per = blocks_ / workers;
  for (size_t r = worker * per; r < (worker + 1) * per; ++r)
    out.push_back(r);
  return out;
}

std::vector<size_t> RotationPlan::shardOf(size_t worker, size_t workers) const {
  std::vector<size_t> shard;
  for (size_t r : rowBlocksOf(worker, workers)) {
    for (size_t c = 0; c < blocks_; ++c) {
      const std::span<const size_t> p = points(r, c);
      shard.insert(shard.end(), p.begin(), p.end());
    }
  }
  std::sort(shard.begin(), shard.end());
  return shard;
}

int64_t RotationPlan::clocksPerEpoch(size_t workers) const {
  int64_t sum = 0;
  for (const int64_t k : slice_clocks_)
    sum += k;
  return static_cast<int64_t>(blocks_ / workers) * sum;
}

RotationPlan::Slot RotationPlan::slotOf(int64_t clock, size_t worker, size_t workers) const {
  const auto per = static_cast<int64_t>(blocks_ / workers);
  Slot slot;
  for (size_t t = 0; t < blocks_; ++t) {
    const int64_t span = per * slice_clocks_[t];
    if (clock < span) {
      slot.subepoch = t;
      slot.slices = slice_clocks_[t];
      slot.row_block = worker * static_cast<size_t>(per) + static_cast<size_t>(clock / slot.slices);
      slot.col_block = columnBlock(slot.row_block, t);
      slot.slice = clock % slot.slices;
      slot.starts_subepoch = clock == 0;
      return slot;
    }
    clock -= span;
  }
  throw std::out_of_range(fmt::format("clock {} is past the epoch's {} clocks",
                                      clock + clocksPerEpoch(workers), clocksPerEpoch(workers)));
}

RotationBalance RotationPlan::balance(size_t workers) const {
  RotationBalance b;
  uint64_t total = 0;
  b.min_block = UINT64_MAX;
  for (const std::vector<size_t>& p : block_points_) {
    b.min_block = std::min<uint64_t>(b.min_block, p.size());
    b.max_block = std::max<uint64_t>(b.max_block, p.size());
    total += p.size();
  }
  b.mean_block = static_cast<double>(total) / static_cast<double>(block_points_.size());
  double busy = 0;
  double span = 0;
  const size_t per = blocks_ / workers;
  for (size_t t = 0; t < blocks_; ++t) {
    uint64_t slowest = 0;
    uint64_t sum = 0;
    for (size_t w = 0; w < workers; ++w) {
      uint64_t work = 0;
      for (size_t r = w * per; r < (w + 1) * per; ++r)
        work += points(r, columnBlock(r, t)).size();
      slowest = std::max(slowest, work);
      sum += work;
    }
    busy += static_cast<double>(sum);
    span += static_cast<double>(workers) * static_cast<double>(slowest);
  }
  b.idle_share = span > 0 ? 1.0 - busy / span : 0.0;
  return b;
}

std::string RotationPlan::describe(size_t workers) const {
  const RotationBalance b = balance(workers);
  return fmt::format(
      "{}x{} blocks of {}-{} ratings (mean {:.0f}), {} clocks per epoch, idle share {:.1f}% for "
      "{} worker(s)",
      blocks_, blocks_, b.min_block, b.max_block, b.mean_block, clocksPerEpoch(workers),
      100 * b.idle_share, workers);
}

}  // namespace chorus::ps
