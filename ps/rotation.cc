#include "ps/rotation.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
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

std::vector<uint32_t> packedBlocks(std::span<const uint64_t> counts, size_t parts) {
  if (parts == 0) throw std::invalid_argument("packedBlocks: 0 parts");
  std::vector<uint32_t> order(counts.size());
  std::iota(order.begin(), order.end(), uint32_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return counts[a] > counts[b]; });
  // The lightest part on top; ties: the lower part.
  using Load = std::pair<uint64_t, uint32_t>;
  std::priority_queue<Load, std::vector<Load>, std::greater<>> lightest;
  for (size_t p = 0; p < parts; ++p)
    lightest.emplace(0, static_cast<uint32_t>(p));
  std::vector<uint32_t> part(counts.size(), 0);
  for (const uint32_t id : order) {
    auto [load, p] = lightest.top();
    lightest.pop();
    part[id] = p;
    lightest.emplace(load + counts[id], p);
  }
  return part;
}

namespace {

// The block of every id from N + 1 contiguous boundaries.
std::vector<uint32_t> blocksFromCuts(const std::vector<uint64_t>& cuts, uint64_t ids) {
  std::vector<uint32_t> block(ids, 0);
  for (size_t b = 0; b + 1 < cuts.size(); ++b) {
    for (uint64_t id = cuts[b]; id < cuts[b + 1]; ++id)
      block[id] = static_cast<uint32_t>(b);
  }
  return block;
}

std::vector<uint32_t> blocksOf(std::span<const uint64_t> counts, size_t parts, RotationCuts cuts) {
  switch (cuts) {
    case RotationCuts::kPacked:
      return packedBlocks(counts, parts);
    case RotationCuts::kByRatings:
      return blocksFromCuts(balancedCuts(counts, parts), counts.size());
    case RotationCuts::kByIds:
      break;
  }
  return blocksFromCuts(equalCuts(counts.size(), parts), counts.size());
}

std::vector<std::vector<uint64_t>> idsOf(const std::vector<uint32_t>& block_of, size_t parts) {
  std::vector<std::vector<uint64_t>> ids(parts);
  for (uint64_t id = 0; id < block_of.size(); ++id)
    ids[block_of[id]].push_back(id);
  return ids;
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
  row_block_of_ = blocksOf(row_counts, blocks, cuts);
  col_block_of_ = blocksOf(col_counts, blocks, cuts);
  row_ids_ = idsOf(row_block_of_, blocks);
  col_ids_ = idsOf(col_block_of_, blocks);
  for (const uint64_t n : row_counts)
    hottest_row_ = std::max(hottest_row_, n);
  for (const uint64_t n : col_counts)
    hottest_col_ = std::max(hottest_col_, n);
  block_points_.resize(blocks * blocks);
  for (size_t i = 0; i < point_rows.size(); ++i) {
    const size_t r = row_block_of_[point_rows[i]];
    const size_t c = col_block_of_[point_cols[i]];
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

uint64_t RotationPlan::workOf(size_t worker, size_t workers, size_t subepoch) const {
  const size_t per = blocks_ / workers;
  uint64_t work = 0;
  for (size_t r = worker * per; r < (worker + 1) * per; ++r)
    work += points(r, columnBlock(r, subepoch)).size();
  return work;
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
  const auto w_count = static_cast<double>(workers);
  double slowest_sum = 0;
  for (size_t t = 0; t < blocks_; ++t) {
    uint64_t slowest = 0;
    for (size_t w = 0; w < workers; ++w)
      slowest = std::max(slowest, workOf(w, workers, t));
    slowest_sum += static_cast<double>(slowest);
  }
  const double ratings = static_cast<double>(total);
  if (slowest_sum > 0) {
    b.max_over_mean = slowest_sum / (ratings / w_count);
    b.idle_share = 1.0 - ratings / (w_count * slowest_sum);
  }
  // Hand-offs: a worker starts sub-epoch k once it finished k - 1 and so did the holders at
  // k - 1 of its column blocks of k (row block r's next column block was row block r + 1's).
  const size_t per = blocks_ / workers;
  std::vector<double> finish(workers, 0.0);
  std::vector<double> next(workers, 0.0);
  for (int e = 0; e < kBalanceEpochs; ++e) {
    for (size_t t = 0; t < blocks_; ++t) {
      for (size_t w = 0; w < workers; ++w) {
        double start = finish[w];
        for (size_t r = w * per; r < (w + 1) * per; ++r)
          start = std::max(start, finish[((r + 1) % blocks_) / per]);
        next[w] = start + static_cast<double>(workOf(w, workers, t));
      }
      finish.swap(next);
    }
  }
  const double makespan = *std::max_element(finish.begin(), finish.end());
  if (makespan > 0) b.handoff_idle_share = 1.0 - kBalanceEpochs * ratings / (w_count * makespan);
  const double floor = std::max(
      {ratings / w_count, static_cast<double>(hottest_col_), static_cast<double>(hottest_row_)});
  if (floor > 0) b.floor_idle_share = 1.0 - ratings / w_count / floor;
  return b;
}

std::string RotationPlan::describe(size_t workers) const {
  const RotationBalance b = balance(workers);
  return fmt::format(
      "{}x{} blocks of {}-{} ratings (mean {:.0f}), {} clocks per epoch, busiest worker "
      "{:.2f}x the mean per sub-epoch, idle share {:.1f}% with barriers, {:.1f}% with hand-offs "
      "(floor {:.1f}%) for {} worker(s)",
      blocks_, blocks_, b.min_block, b.max_block, b.mean_block, clocksPerEpoch(workers),
      b.max_over_mean, 100 * b.idle_share, 100 * b.handoff_idle_share, 100 * b.floor_idle_share,
      workers);
}

}  // namespace chorus::ps
