#include "ps/ssp_gate.h"

#include <fmt/format.h>

#include <algorithm>

namespace chorus::ps {

namespace {

// An owner answers a read once every counted worker reached the reader's min_clock: a
// WorkerClocks with bound 0 parks on that clock as given (the worker applied its staleness).
constexpr Staleness kExplicitMinClock{0};

}  // namespace

SspGate::SspGate(const std::vector<WorkerId>& workers, GateOptions options)
    : options_(options), clocks_(workers, kExplicitMinClock) {}

std::optional<std::string> SspGate::checkSender(WorkerId worker, Clock clock,
                                                const char* what) const {
  if (!clocks_.known(worker)) {
    return fmt::format("{} from node {}, which is not a worker of this run", what, worker);
  }
  if (clock < 0 || clock >= kClockCeiling) {
    return fmt::format("{} at clock {}, which no run reaches", what, clock);
  }
  return std::nullopt;
}

std::optional<std::string> SspGate::checkWithinRun(Clock clock, const char* what) const {
  if (clock > options_.max_clock) {
    return fmt::format("{} at clock {}, outside this run's clocks 0..{}", what, clock,
                       options_.max_clock);
  }
  return std::nullopt;
}

std::optional<std::string> SspGate::checkNotBehind(WorkerId worker, Clock clock,
                                                   const char* what) const {
  const Clock current = clocks_.clockOf(worker);
  // A restored clock is a helper's view, which may be ahead of what the worker still had in
  // flight to this owner: a push of clock 33 can arrive here after the helper heard clock 34.
  // Nothing reached this incarnation before, so such a request is no replay; it is accepted
  // until the worker's own next clock announcement anchors its clock here.
  if (clock < current && unanchored_.count(worker) == 0) {
    return fmt::format(
        "{} at clock {} but node {} already reached clock {} (clock going backwards)", what, clock,
        worker, current);
  }
  return std::nullopt;
}

std::optional<bool> SspGate::startedLate(WorkerId worker, Clock clock, Clock first) const {
  if (!clocks_.known(worker) || clocks_.clockOf(worker) != 0 || clock <= first) {
    return std::nullopt;
  }
  return dropped_.count(worker) == 0;
}

SspGate::Advance SspGate::advance(WorkerId worker, Clock clock) {
  Advance result;
  // Every clock is announced in order on a FIFO connection, so a jump means clocks the worker
  // never ran (a rejoin) or whose announcements were lost with a connection. After restore()
  // the clocks are another owner's view, which may be older or newer than what the worker had
  // in flight to this owner: the first clock heard from each worker then may jump without
  // anything lost, and clocks below the view change nothing.
  if (unanchored_.count(worker) > 0 && clock < clocks_.clockOf(worker)) return result;
  const bool anchored = unanchored_.erase(worker) == 0;
  const Clock before = clocks_.known(worker) ? clocks_.clockOf(worker) : clock;
  if (anchored && clock > before + 1 && before > 0) result.gap = ClockGap{worker, before, clock};
  result.error = clocks_.advance(worker, clock);
  if (clocks_.parked() == 0) parked_since_.reset();
  return result;
}

bool SspGate::whenReady(Clock min_clock, WorkerClocks::Release release, TimePoint now) {
  const bool parks = !clocks_.ready(min_clock);
  if (parks && !parked_since_) parked_since_ = now;
  clocks_.whenReady(min_clock, std::move(release));
  return parks;
}

void SspGate::hold(WorkerId worker, Clock clock, HeldPush push) {
  held_[{clock, worker}].push_back(std::move(push));
}

std::vector<std::pair<Clock, std::vector<SspGate::HeldPush>>> SspGate::takeDue() {
  std::vector<std::pair<Clock, std::vector<HeldPush>>> due;
  const Clock min = clocks_.minClock();
  auto it = held_.begin();
  while (it != held_.end() && it->first.first < min) {
    const Clock clock = it->first.first;
    if (due.empty() || due.back().first != clock) due.emplace_back(clock, std::vector<HeldPush>());
    for (HeldPush& push : it->second)
      due.back().second.push_back(std::move(push));
    it = held_.erase(it);
  }
  return due;
}

bool SspGate::workerDown(WorkerId worker, bool dropped, TimePoint now) {
  if (dropped) dropped_.insert(worker);
  if (!clocks_.live(worker) || finished_.count(worker)) return false;
  down_since_.emplace(worker, now);
  return true;
}

bool SspGate::workerUp(WorkerId worker) {
  down_since_.erase(worker);
  if (clocks_.live(worker)) return false;
  clocks_.include(worker, clocks_.clockOf(worker));
  return true;
}

void SspGate::workerFinished(WorkerId worker) {
  finished_.insert(worker);
  down_since_.erase(worker);
}

std::vector<std::pair<WorkerId, Clock>> SspGate::expire(TimePoint now) {
  std::vector<std::pair<WorkerId, Clock>> excluded;
  if (options_.down_timeout.count() <= 0) return excluded;
  for (auto it = down_since_.begin(); it != down_since_.end();) {
    if (now - it->second < options_.down_timeout) {
      ++it;
      continue;
    }
    const WorkerId worker = it->first;
    it = down_since_.erase(it);
    if (const std::optional<Clock> at = clocks_.exclude(worker)) excluded.emplace_back(worker, *at);
  }
  return excluded;
}

std::optional<SspGate::WaitReport> SspGate::waitReport(TimePoint now) {
  if (clocks_.parked() == 0) {
    parked_since_.reset();
    return std::nullopt;
  }
  if (!parked_since_) parked_since_ = now;
  if (now - *parked_since_ < options_.report_every || now < next_report_) return std::nullopt;
  next_report_ = now + options_.report_every;
  WaitReport report;
  report.parked = clocks_.parked();
  report.needed = *clocks_.lowestParked();
  report.lagging = clocks_.laggingBehind(report.needed);
  return report;
}

std::optional<std::string> SspGate::checkViews(const std::vector<WorkerView>& views) const {
  std::set<WorkerId> seen;
  for (const WorkerView& view : views) {
    if (!clocks_.known(view.worker)) {
      return fmt::format("a clock for node {}, which is not a worker of this run", view.worker);
    }
    if (!seen.insert(view.worker).second) {
      return fmt::format("two clocks for worker node {}", view.worker);
    }
    if (view.clock < 0 || view.clock >= kClockCeiling || view.clock > options_.max_clock) {
      return fmt::format("worker node {} at clock {}, outside this run's clocks 0..{}", view.worker,
                         view.clock, std::min(options_.max_clock, kClockCeiling - 1));
    }
  }
  return std::nullopt;
}

void SspGate::restore(const std::vector<WorkerView>& views) {
  for (const WorkerView& view : views) {
    if (!clocks_.known(view.worker)) continue;
    // Whether the helper still counted a worker is not taken over: that says how the helper's
    // link to it fared; this owner's own down time-outs decide.
    if (view.clock > clocks_.clockOf(view.worker)) clocks_.advance(view.worker, view.clock);
  }
  for (WorkerId worker : clocks_.workers())
    unanchored_.insert(worker);
}

std::vector<WorkerView> SspGate::views() const {
  std::vector<WorkerView> views;
  for (WorkerId worker : clocks_.workers())
    views.push_back({worker, clocks_.clockOf(worker), clocks_.live(worker)});
  return views;
}

}  // namespace chorus::ps
