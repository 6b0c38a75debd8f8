// The owner's SSP gate: which clocks a request may carry, what every worker's clock is, when a
// read may be answered (parking it until then), which workers stop counting after their down
// time-out, and, under BSP, the pushes held until their clock is complete. KvServer asks it
// before it touches the store and logs what it reports. Free of any networking and of the
// clock on the wall (callers pass `now`); single-threaded (the owner's loop thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ps/shard_map.h"
#include "ps/ssp.h"

namespace chorus::ps {

// An owner's view of one worker, as a rejoining owner takes it over.
struct WorkerView {
  WorkerId worker = 0;
  Clock clock = 0;
  bool counted = true;  // pulls wait for it (not dropped after its down time-out)
};

// A worker that announced clock `to` right after clock `from` (it rejoined after a restart):
// its updates of clocks from .. to - 1 never came.
struct ClockGap {
  WorkerId worker = 0;
  Clock from = 0;
  Clock to = 0;
};

struct GateOptions {
  // BSP: pushes are held until every live worker finished their clock (hold(), takeDue()).
  bool bsp = false;
  // A worker reported down stops counting after this long; zero: never.
  std::chrono::milliseconds down_timeout{10000};
  // How often parked reads are reported (waitReport()).
  std::chrono::milliseconds report_every{5000};
  // The highest clock a worker of this run can reach.
  Clock max_clock = Staleness::kInfinite;
};

class SspGate {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // Every worker at clock 0, all counted. Reads wait for the min_clock they carry (the worker
  // applied its staleness bound already).
  SspGate(const std::vector<WorkerId>& workers, GateOptions options);

  // A request's sender and clock before anything else looks at them: a worker of this run, at
  // a clock in 0..kClockCeiling (an impostor's INT64_MAX must move no clock).
  std::optional<std::string> checkSender(WorkerId worker, Clock clock, const char* what) const;
  // A clock the run can reach (GateOptions::max_clock).
  std::optional<std::string> checkWithinRun(Clock clock, const char* what) const;
  // A request at `clock` does not go back behind the worker's announced clock (accepted while
  // the worker's clock is a restored view it has not confirmed yet).
  std::optional<std::string> checkNotBehind(WorkerId worker, Clock clock, const char* what) const;
  // Does a request of `worker` at `clock` show that the job ran before this owner started?
  // `first` is the highest clock such a request can carry at the start of a job. nullopt: no;
  // false: it would, but the worker's connection dropped before (its announcements may have
  // been lost), so it shows nothing; true: yes.
  std::optional<bool> startedLate(WorkerId worker, Clock clock, Clock first) const;

  // What a PsClock did.
  struct Advance {
    std::optional<std::string> error;  // nothing changed
    std::optional<ClockGap> gap;       // clocks the worker skipped (a rejoin)
  };
  // `worker` finished every clock below `clock`: runs the parked reads this makes answerable,
  // in the order they were parked. A clock below a restored view that the worker has not
  // confirmed changes nothing.
  Advance advance(WorkerId worker, Clock clock);

  // Would a read waiting for `min_clock` be answered now (whenReady would not park it)?
  bool ready(Clock min_clock) const { return clocks_.ready(min_clock); }
  // Answers at once when every counted worker reached `min_clock`, else parks `release` until
  // then; true when it parked.
  bool whenReady(Clock min_clock, WorkerClocks::Release release, TimePoint now);

  // One push held by BSP.
  struct HeldPush {
    std::vector<uint64_t> keys;
    std::vector<float> grads;
  };
  // BSP: holds a push of `worker` at `clock`.
  void hold(WorkerId worker, Clock clock, HeldPush push);
  // The held pushes of every clock below the counted workers' minimum, taken out: per clock
  // (ascending), in worker order, in arrival order within one worker's clock.
  std::vector<std::pair<Clock, std::vector<HeldPush>>> takeDue();

  // `worker` went down (its connection dropped, `dropped`) or left: its time-out starts unless
  // it is not counted or finished. True when it started.
  bool workerDown(WorkerId worker, bool dropped, TimePoint now);
  // `worker` is up again; true when it counts again (it had been dropped after its time-out).
  bool workerUp(WorkerId worker);
  // `worker` ran all its clocks: its departure is expected.
  void workerFinished(WorkerId worker);
  // Workers whose down time-out passed by `now`, now no longer counted, with their clocks.
  std::vector<std::pair<WorkerId, Clock>> expire(TimePoint now);

  // Reads waiting longer than report_every: how many, the clock they need, who is behind it.
  struct WaitReport {
    size_t parked = 0;
    Clock needed = 0;
    std::vector<WorkerId> lagging;
  };
  // At most one report per report_every while reads stay parked.
  std::optional<WaitReport> waitReport(TimePoint now);

  // Another owner's view of the workers' clocks, as a rejoining node receives it from a peer
  // (PsCatchupReply), before restore() or anything else uses it: every worker of this run at
  // most once, each clock within the run (0..max_clock). A helper's INT64_MAX would otherwise
  // become a worker's clock here and the clock the rejoining worker resumes at.
  std::optional<std::string> checkViews(const std::vector<WorkerView>& views) const;
  // A restarted owner takes over another owner's clocks (forward only); every worker's clock is
  // unconfirmed until it announces one itself. The views passed checkViews().
  void restore(const std::vector<WorkerView>& views);
  std::vector<WorkerView> views() const;

  // The lowest clock among counted workers (Staleness::kInfinite when none counts).
  Clock minClock() const { return clocks_.minClock(); }
  // The clock `worker` announced last (0 for an unknown worker).
  Clock clockOf(WorkerId worker) const { return clocks_.clockOf(worker); }
  // Every worker's clock summed: the clocks the cluster has run.
  Clock total() const { return clocks_.total(); }
  // Every worker, in id order.
  std::vector<WorkerId> workers() const { return clocks_.workers(); }
  // Is `worker` a worker of this run?
  bool known(WorkerId worker) const { return clocks_.known(worker); }
  // Do reads wait for `worker` (known, not dropped after its down time-out)?
  bool counted(WorkerId worker) const { return clocks_.live(worker); }
  // Reads parked now.
  size_t parked() const { return clocks_.parked(); }
  const GateOptions& options() const { return options_; }

 private:
  GateOptions options_;
  WorkerClocks clocks_;
  std::set<WorkerId> unanchored_;  // restored clocks not yet confirmed by the worker itself
  // Workers whose connection dropped at least once: announcements may have been lost with it.
  std::set<WorkerId> dropped_;
  std::map<WorkerId, TimePoint> down_since_;
  std::set<WorkerId> finished_;
  // BSP: pushes by (clock, worker), in arrival order within one worker's clock.
  std::map<std::pair<Clock, WorkerId>, std::vector<HeldPush>> held_;
  std::optional<TimePoint> parked_since_;
  TimePoint next_report_{};
};

}  // namespace chorus::ps
