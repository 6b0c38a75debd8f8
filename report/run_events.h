// What happened to the nodes of one run besides training: crashes, rejoins, and the updates the
// others lost or went on without. Read from the run's metrics files alone (docs/compare.md,
// "Crashes, rejoins and lost updates"), so a `chorus launch` folder, a compare folder and a copy
// of either report the same events. Pure functions: no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "report/run_metrics.h"

namespace chorus::report {

// One thing that happened to a run.
struct RunEvent {
  enum class Kind {
    kCrash,       // a life ended without a `final` line exactly at its crash:NODE@S term
    kStopped,     // a life ended without a `final` line otherwise (killed, or a real crash)
    kRejoin,      // a node took up the running job again (chorus node --rejoin)
    kDropped,     // PS: owners gave up on a worker; its updates from `step` on are lost
    kLostClocks,  // PS: a worker's updates of clocks step .. to_step - 1 are lost (it rejoined)
    kDeparted,    // a node left before the end and the others went on without it
    kFailedOps,   // PS: pushes (updates lost) and reads that failed while an owner was down
  };
  Kind kind = Kind::kCrash;
  uint32_t node = 0;  // whom it happened to (not kFailedOps)
  // kCrash, kStopped: the last round or clock the life finished (-1: none); kRejoin: the one it
  // took up the job at; kDropped, kLostClocks: the first clock lost.
  int64_t step = 0;
  // kLostClocks: the first clock not lost; kDropped: the last owner's first lost clock (owners
  // may give up on a worker at different clocks; equal to `step` when they agree).
  int64_t to_step = 0;
  std::optional<int64_t> crash_term;  // kCrash, kStopped: S of the node's crash:NODE@S term
  // When it happened on the accuracy plot's axis (seconds since the reference node's first life
  // began); nullopt: unknown, or not marked on the plot (see marked()).
  std::optional<double> time;
  uint64_t failed_pushes = 0, failed_pulls = 0;  // kFailedOps
  std::string text;                              // one clause for report.md and summary.csv
  std::string label;                             // a few words for the plot

  // Whether the accuracy plot marks it: crashes, stops and rejoins with a known time, and drops
  // of a node whose crash the files do not show.
  bool marked() const { return time.has_value(); }
};

// The events of a run, ordered by the round or clock they happened at (departures and failed
// operations, which have none, last).
std::vector<RunEvent> runEvents(const RunMetrics& metrics);

// Events of one or more runs, counted by what a reader asks first.
struct EventCounts {
  int crashes = 0;  // kCrash and kStopped
  int rejoins = 0;
  int dropped = 0;  // kDropped and kDeparted: nodes the others went on without
  uint64_t failed_pushes = 0, failed_pulls = 0;
  // Whether anything was counted.
  bool any() const { return crashes + rejoins + dropped > 0 || failed_pushes + failed_pulls > 0; }
};
// Adds the events of one run to `counts`.
void countEvents(const std::vector<RunEvent>& events, EventCounts& counts);
// "1 crash, 1 dropped, 101 failed pushes"; "—" when nothing happened.
std::string eventCountsText(const EventCounts& counts);

}  // namespace chorus::report
