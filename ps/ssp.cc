#include "ps/ssp.h"

#include <fmt/format.h>

#include <charconv>

namespace chorus::ps {

WorkerClocks::WorkerClocks(const std::vector<WorkerId>& workers, Staleness staleness)
    : staleness_(staleness) {
  for (WorkerId w : workers) {
    clocks_[w] = 0;
    live_[w] = true;
  }
}

std::optional<std::string> WorkerClocks::advance(WorkerId worker, Clock clock) {
  auto it = clocks_.find(worker);
  if (it == clocks_.end()) return fmt::format("clock from unknown worker {}", worker);
  if (clock < it->second) {
    return fmt::format("clock of worker {} went backwards: {} after {}", worker, clock, it->second);
  }
  it->second = clock;
  releaseReady();
  return std::nullopt;
}

std::optional<Clock> WorkerClocks::exclude(WorkerId worker) {
  auto it = live_.find(worker);
  if (it == live_.end() || !it->second) return std::nullopt;
  it->second = false;
  releaseReady();
  return clocks_[worker];
}

void WorkerClocks::include(WorkerId worker, Clock clock) {
  live_[worker] = true;
  Clock& c = clocks_[worker];
  if (clock > c) c = clock;
}

Clock WorkerClocks::minClock() const {
  Clock m = Staleness::kInfinite;
  for (const auto& [w, c] : clocks_) {
    if (live_.at(w) && c < m) m = c;
  }
  return m;
}

Clock WorkerClocks::total() const {
  Clock sum = 0;
  for (const auto& [w, c] : clocks_)
    sum += c;
  return sum;
}

Clock WorkerClocks::clockOf(WorkerId worker) const {
  auto it = clocks_.find(worker);
  return it == clocks_.end() ? 0 : it->second;
}

bool WorkerClocks::ready(Clock reader_clock) const {
  return minClock() >= staleness_.requiredMinStep(reader_clock);
}

void WorkerClocks::whenReady(Clock reader_clock, Release release) {
  if (ready(reader_clock)) {
    release();
    return;
  }
  parked_.emplace(staleness_.requiredMinStep(reader_clock), std::move(release));
}

std::vector<WorkerId> WorkerClocks::laggingBehind(Clock clock) const {
  std::vector<WorkerId> out;
  for (const auto& [w, c] : clocks_) {
    if (live_.at(w) && c < clock) out.push_back(w);
  }
  return out;
}

void WorkerClocks::releaseReady() {
  const Clock min = minClock();
  // Take the ready ones out first: a release may park new pulls or advance clocks.
  std::vector<Release> ready;
  for (auto it = parked_.begin(); it != parked_.end() && it->first <= min;) {
    ready.push_back(std::move(it->second));
    it = parked_.erase(it);
  }
  for (auto& r : ready)
    r();
}

}  // namespace chorus::ps
