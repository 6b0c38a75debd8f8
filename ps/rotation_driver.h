// The moving half of `--mf-schedule rotation` (docs/orion.md): one worker's clocks of a
// RotationPlan (ps/rotation.h) over sparse PS mode's data path, which must be the relocation
// shell's (`--technique lapse`): it moves whole column blocks with `localize`, their AdaGrad
// state with them.
//
// A block must not leave its holder before the holder is done with it. Two ways to make sure, at
// the first clock c0 of every sub-epoch but the run's first:
// - The neighbour hand-off (the default): the worker waits until the worker that held its next
//   column block in the previous sub-epoch announced clock c0 (SparseRowAccess::waitWorkerClock).
//   A worker announces c0 only once every push it made at the clocks below c0 completed, i.e.
//   was applied to the row's one copy (docs/ps-relocation.md, "SSP with moving keys"), so the
//   block's rows hold all its updates and the holder has moved on; only then does this worker
//   localize the block. The announcement is the hand-off message: the shell sends it to every
//   member anyway, so the hand-off costs no frame, and a worker waits for one neighbour (and its
//   own pushes), not for the slowest worker of the sub-epoch.
// - The all-worker barrier (`rotation-barrier`, kept to measure the hand-off against): the worker
//   reads one row it holds with `pullAt(c0)`, which waits until every worker announced c0: the
//   SSP gate with bound 0 on sub-epoch boundaries.
// Either way the rows are updated in the serial reference's order. Within a sub-epoch no two
// workers share a row, so the shell's reads run without a bound.
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
  // Worker `worker` of the job's `members` (sorted; plan.fitsWorkers(members.size())) on
  // `access`, whose key space `space` holds the plan's rows as table 0 and its columns as table 1
  // (MF's). `seed` makes the blocks' orders; `barrier`: the all-worker barrier instead of the
  // hand-off. `plan`, `access`, `space` and `log` must outlive the driver.
  RotationDriver(const RotationPlan& plan, SparseRowAccess& access, const KeySpace& space,
                 size_t worker, std::vector<NodeId> members, uint64_t seed, bool barrier,
                 spdlog::logger& log);

  // Trainer thread, before the step of clock `clock_in_epoch` of `epoch` (`clock`: the run's
  // clock, counted from 0). At a sub-epoch's first clock: the hand-off or the barrier (but at
  // clock 0), then the
  // worker's column blocks of the sub-epoch (at clock 0 its row blocks too) start moving here
  // (not waited for: a read of a row on its way waits for it at this node). Returns the clock's
  // batch, valid until the next call (possibly empty: a block smaller than its sub-epoch's
  // largest).
  std::span<const size_t> beginClock(int64_t epoch, int64_t clock_in_epoch, Clock clock);

  // Seconds spent waiting at sub-epoch starts so far (hand-offs or barriers), and their count.
  double barrierSeconds() const { return barrier_seconds_; }
  uint64_t barriers() const { return barriers_; }

  // The keys of row block r (table 0) and column block c (table 1), sorted.
  std::vector<Key> rowBlockKeys(size_t r) const;
  std::vector<Key> columnBlockKeys(size_t c) const;
  // The workers (indices into the members, sorted, this one included) that hold, in the
  // sub-epoch before, the column blocks this worker trains next: the hand-off waits for them.
  std::vector<size_t> previousHolders() const;

 private:
  // Waits until the sub-epoch starting at `clock` may take its column blocks.
  void synchronize(Clock clock);
  void noteFailure(Clock clock, const node::Status& status);

  const RotationPlan& plan_;
  SparseRowAccess& access_;
  const KeySpace& space_;
  size_t worker_;
  std::vector<NodeId> members_;
  size_t workers_;
  uint64_t seed_;
  bool barrier_;
  spdlog::logger& log_;
  Key barrier_key_ = 0;
  std::vector<float> barrier_row_;
  std::vector<size_t> order_;  // the current block's points, shuffled
  double barrier_seconds_ = 0;
  uint64_t barriers_ = 0;
  std::string last_error_;
};

}  // namespace chorus::ps
