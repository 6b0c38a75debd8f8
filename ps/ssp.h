// Stale Synchronous Parallel bookkeeping (Ho et al., NeurIPS 2013), free of any networking.
//
// Clocks: every worker starts at clock 0. During iteration c it reads parameters and pushes
// updates tagged c; clock() then moves it to c + 1. A worker at clock c must see every update
// from clocks <= c - s - 1 of all workers, and its own. An owner knows worker w has sent all
// updates of clocks < clock(w) (connections are FIFO: the Clock message follows the pushes),
// so it may answer a pull from a worker at clock c once every live worker's clock is >= c - s.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "node/protocol.h"
#include "run/staleness_bound.h"

namespace chorus::ps {

using Clock = int64_t;
using WorkerId = node::NodeId;  // a worker is a node: the same id

// No run reaches this clock (2^40): a clock from a peer at or above it is refused before it is
// used, which keeps every sum of workers' clocks far from overflowing.
inline constexpr int64_t kClockCeiling = int64_t{1} << 40;

// The staleness bound s: 0 is BSP, infinite is fully asynchronous (one type and grammar for
// both modes, the flag, compare's variants and the metrics: run/staleness_bound.h).
using Staleness = run::StalenessBound;

// The owner's view of every worker's clock, with the pulls parked until the slowest catches
// up. Single-threaded (the owner's loop thread).
class WorkerClocks {
 public:
  using Release = std::function<void()>;

  WorkerClocks(const std::vector<WorkerId>& workers, Staleness staleness);

  // Records that `worker` reached `clock`. Errors (as a message, nothing changed): unknown
  // worker, a clock going backwards. Runs the parked pulls this makes answerable, in the
  // order they were parked.
  std::optional<std::string> advance(WorkerId worker, Clock clock);
  // Removes a worker from the minimum (it is down and its time-out passed); releases pulls
  // that were waiting only for it. Returns the clock it had.
  std::optional<Clock> exclude(WorkerId worker);
  // Puts an excluded worker back at `clock` (it came back and caught up).
  void include(WorkerId worker, Clock clock);

  // Can a pull from a worker at `reader_clock` be answered now?
  bool ready(Clock reader_clock) const;
  // Answers at once when ready, else parks `release` until it is.
  void whenReady(Clock reader_clock, Release release);

  // Minimum clock over live workers (kInfinite when none is live).
  Clock minClock() const;
  Clock clockOf(WorkerId worker) const;
  // Sum of every worker's clock, excluded ones included: the clocks the cluster has run.
  Clock total() const;
  // Live workers whose clock is below `clock`: who a parked read is waiting for.
  std::vector<WorkerId> laggingBehind(Clock clock) const;
  size_t parked() const { return parked_.size(); }
  // The lowest minimum clock a parked pull waits for (nullopt when none is parked).
  std::optional<Clock> lowestParked() const {
    if (parked_.empty()) return std::nullopt;
    return parked_.begin()->first;
  }
  // Every worker, in id order.
  std::vector<WorkerId> workers() const {
    std::vector<WorkerId> out;
    for (const auto& [w, c] : clocks_)
      out.push_back(w);
    return out;
  }
  bool known(WorkerId worker) const { return clocks_.count(worker) > 0; }
  // Is `worker` counted in the minimum (known and not excluded)?
  bool live(WorkerId worker) const {
    auto it = live_.find(worker);
    return it != live_.end() && it->second;
  }

 private:
  void releaseReady();

  Staleness staleness_;
  std::map<WorkerId, Clock> clocks_;
  std::map<WorkerId, bool> live_;
  std::multimap<Clock, Release> parked_;  // by required minimum clock, FIFO within a clock
};

// A worker's cache of rows read from owners, each stamped with the owner's minimum worker clock
// at the time of the read (every update from clocks below it was included). A read at clock c
// is served from the cache when the stamp is >= c - s.
class RowCacheRule {
 public:
  explicit RowCacheRule(Staleness staleness) : staleness_(staleness) {}
  // Is a row stamped `row_clock` fresh enough for a read at `reader_clock`?
  bool fresh(Clock row_clock, Clock reader_clock) const {
    return staleness_.infinite() || row_clock >= staleness_.requiredMinStep(reader_clock);
  }

 private:
  Staleness staleness_;
};

}  // namespace chorus::ps
