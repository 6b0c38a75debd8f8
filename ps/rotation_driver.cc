#include "ps/rotation_driver.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "ml/rng.h"

namespace chorus::ps {

RotationDriver::RotationDriver(const RotationPlan& plan, SparseRowAccess& access,
                               const KeySpace& space, size_t worker, std::vector<NodeId> members,
                               uint64_t seed, bool barrier, spdlog::logger& log)
    : plan_(plan),
      access_(access),
      space_(space),
      worker_(worker),
      members_(std::move(members)),
      workers_(members_.size()),
      seed_(seed),
      barrier_(barrier),
      log_(log) {
  if (!plan_.fitsWorkers(workers_) || worker_ >= workers_) {
    throw std::invalid_argument(
        fmt::format("a rotation of {} blocks cannot run on {} workers", plan_.blocks(), workers_));
  }
  if (space_.tables().size() != 2) {
    throw std::invalid_argument("a rotation needs a row table and a column table (MF's)");
  }
  // The barrier reads a row this worker holds all run (its first row block's first row), so
  // that the read itself sends nothing; with no such row, any key.
  for (size_t r : plan_.rowBlocksOf(worker_, workers_)) {
    const std::vector<Key> keys = rowBlockKeys(r);
    if (!keys.empty()) {
      barrier_key_ = keys.front();
      break;
    }
  }
  barrier_row_.resize(space_.length(barrier_key_));
}

std::vector<Key> RotationDriver::rowBlockKeys(size_t r) const {
  const KeyTable& table = space_.tables()[0];
  std::vector<Key> keys;
  for (const uint64_t row : plan_.rowIds(r))
    keys.push_back(table.first + row);
  return keys;
}

std::vector<Key> RotationDriver::columnBlockKeys(size_t c) const {
  const KeyTable& table = space_.tables()[1];
  std::vector<Key> keys;
  for (const uint64_t col : plan_.colIds(c))
    keys.push_back(table.first + col);
  return keys;
}

std::vector<size_t> RotationDriver::previousHolders() const {
  // Row block r's next column block is the one row block r + 1 trains now (the rotation).
  const size_t per = plan_.blocks() / workers_;
  std::vector<size_t> holders;
  for (size_t r : plan_.rowBlocksOf(worker_, workers_))
    holders.push_back(((r + 1) % plan_.blocks()) / per);
  std::sort(holders.begin(), holders.end());
  holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
  return holders;
}

void RotationDriver::noteFailure(Clock clock, const node::Status& status) {
  if (status.ok() || status.code() == node::ErrorCode::kShutdown ||
      status.message() == last_error_) {
    return;
  }
  // A worker died: the others go on, and the run is no longer the serial algorithm's.
  log_.warn("rotation: the {} at clock {} failed ({}); the blocks move on anyway",
            barrier_ ? "barrier" : "hand-off", clock, status.message());
  last_error_ = status.message();
}

void RotationDriver::synchronize(Clock clock) {
  const auto start = std::chrono::steady_clock::now();
  if (barrier_) {
    noteFailure(clock, access_.wait(access_.pullAt(clock, std::span<const Key>(&barrier_key_, 1),
                                                   barrier_row_)));
  } else {
    // This worker's own pushes too (it is among the holders when it runs several row blocks),
    // so its reads of the block follow them as the serial reference's do.
    std::vector<size_t> holders = previousHolders();
    if (std::find(holders.begin(), holders.end(), worker_) == holders.end())
      holders.push_back(worker_);
    for (const size_t h : holders)
      noteFailure(clock, access_.waitWorkerClock(members_[h], clock));
  }
  barrier_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++barriers_;
}

std::span<const size_t> RotationDriver::beginClock(int64_t epoch, int64_t clock_in_epoch,
                                                   Clock clock) {
  const RotationPlan::Slot slot = plan_.slotOf(clock_in_epoch, worker_, workers_);
  if (slot.starts_subepoch) {
    if (clock > 0) synchronize(clock);
    std::vector<Key> keys;
    for (size_t r : plan_.rowBlocksOf(worker_, workers_)) {
      if (clock == 0) {
        const std::vector<Key> rows = rowBlockKeys(r);
        keys.insert(keys.end(), rows.begin(), rows.end());
      }
      const std::vector<Key> cols = columnBlockKeys(plan_.columnBlock(r, slot.subepoch));
      keys.insert(keys.end(), cols.begin(), cols.end());
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    // Not waited for: the shell queues a read or push of a row on its way here until it
    // arrives; a failed localize is harmless (the row is read where it is) and counted.
    if (!keys.empty()) access_.localize(keys, [](const node::Status&) {});
  }
  if (slot.slice == 0) {
    // A block's order depends on (seed, epoch, block) only: one worker visiting the blocks
    // makes the same batches as N workers.
    const std::span<const size_t> points = plan_.points(slot.row_block, slot.col_block);
    order_.assign(points.begin(), points.end());
    const uint64_t block = slot.row_block * plan_.blocks() + slot.col_block;
    ml::Rng shuffle(ml::mixSeed(
        seed_, 0x0A1011000000ULL + static_cast<uint64_t>(epoch) * plan_.blocks() * plan_.blocks() +
                   block));
    shuffle.shuffle(order_.begin(), order_.end());
  }
  // sparseClockBatch's cut (ps/sparse_ps_peer.h), inlined to keep this file free of the loop.
  const uint64_t n = order_.size();
  const auto begin = static_cast<size_t>(n * static_cast<uint64_t>(slot.slice) /
                                         static_cast<uint64_t>(slot.slices));
  const auto end = static_cast<size_t>(n * static_cast<uint64_t>(slot.slice + 1) /
                                       static_cast<uint64_t>(slot.slices));
  return std::span<const size_t>(order_).subspan(begin, end - begin);
}

}  // namespace chorus::ps
