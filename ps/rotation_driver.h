// The moving half of `--mf-schedule rotation` (docs/orion.md): one worker's clocks of a
// RotationPlan (ps/rotation.h) over sparse PS mode's data path, which must be the relocation
// shell's (`--technique lapse`): it moves whole column blocks with `localize`, their AdaGrad
// state with them.
//
// The sub-epoch barrier: at the first clock c0 of every sub-epoch but the run's first, the worker
// reads one row it holds with `pullAt(c0)`, which waits at the reader until every worker
// announced clock c0. A worker announces c0 only once every push it made at the clocks below c0
// completed, i.e. was applied to the row's one copy (docs/ps-relocation.md, "SSP with moving
// keys"). So when the read returns, every worker finished the previous sub-epoch and its pushes
// are in the rows, and only then does this worker localize its next column block: a block is never
// taken from its holder before the holder is done with it. This is the SSP gate with bound 0 on
// sub-epoch boundaries, built from the shell's own clock machinery rather than a new hand-off
// message: the shell already keeps the contract it needs (announcements after completed pushes),
// and a barrier over all workers costs one round of clock announcements per sub-epoch, which the
// workers send anyway. Within a sub-epoch no two workers share a row, so the shell's reads run
// without a bound (the run's reads never wait for another worker's clock there).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ps/key_space.h"
#include "ps/rotation.h"
#include "ps/sparse_row_access.h"

namespace spdlog {
class logger;
}

namespace chorus::ps {

class RotationDriver {
 public:
  // Worker `worker` of `workers` (plan.fitsWorkers(workers)) on `access`, whose key space
  // `space` holds the plan's rows as table 0 and its columns as table 1 (MF's). `seed` makes the
  // blocks' orders. `plan`, `access`, `space` and `log` must outlive the driver.
  RotationDriver(const RotationPlan& plan, SparseRowAccess& access, const KeySpace& space,
                 size_t worker, size_t workers, uint64_t seed, spdlog::logger& log);

  // Trainer thread, before the step of clock `clock_in_epoch` of `epoch` (`clock`: the run's
  // clock, counted from 0). At a sub-epoch's first clock: the barrier (but at clock 0), then the
  // worker's column blocks of the sub-epoch (at clock 0 its row blocks too) start moving here
  // (not waited for: a read of a row on its way waits for it at this node). Returns the clock's
  // batch, valid until the next call (possibly empty: a block smaller than its sub-epoch's
  // largest).
  std::span<const size_t> beginClock(int64_t epoch, int64_t clock_in_epoch, Clock clock);

  // Seconds spent in the barrier so far, and barriers passed.
  double barrierSeconds() const { return barrier_seconds_; }
  uint64_t barriers() const { return barriers_; }

  // The keys of row block r (table 0) and column block c (table 1), sorted.
  std::vector<Key> rowBlockKeys(size_t r) const;
  std::vector<Key> columnBlockKeys(size_t c) const;

 private:
  void barrier(Clock clock);

  const RotationPlan& plan_;
  SparseRowAccess& access_;
  const KeySpace& space_;
  size_t worker_;
  size_t workers_;
  uint64_t seed_;
  spdlog::logger& log_;
  Key barrier_key_ = 0;
  std::vector<float> barrier_row_;
  std::vector<size_t> order_;  // the current block's points, shuffled
  double barrier_seconds_ = 0;
  uint64_t barriers_ = 0;
  std::string last_error_;
};

}  // namespace chorus::ps
