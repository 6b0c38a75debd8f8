#include "run/peer_settlement.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace chorus::run {

PeerSettlement settlePeers(std::unique_lock<std::mutex>& lock, std::condition_variable& changed,
                           const std::vector<uint32_t>& others, const std::set<uint32_t>& done,
                           const std::set<uint32_t>& down, const bool& stopped,
                           const SettleOptions& options, spdlog::logger& log) {
  using Clock = std::chrono::steady_clock;
  auto missing = [&] {
    std::vector<uint32_t> out;
    for (uint32_t m : others) {
      if (!done.count(m) && !down.count(m)) out.push_back(m);
    }
    return out;
  };
  const Clock::time_point deadline = Clock::now() + options.timeout;
  Clock::time_point next_report = Clock::now() + options.report_every;
  while (!stopped && !missing().empty() && Clock::now() < deadline) {
    if (options.has_work && options.has_work()) {
      lock.unlock();
      options.work();
      lock.lock();
      continue;
    }
    changed.wait_until(lock, std::min(deadline, next_report));
    if (Clock::now() >= next_report && !stopped) {
      next_report += options.report_every;
      const std::vector<uint32_t> waiting = missing();
      if (!waiting.empty()) {
        log.info("finished; waiting for node(s) {} to finish", fmt::join(waiting, ", "));
      }
    }
  }
  PeerSettlement settlement;
  for (uint32_t m : others) {
    if (done.count(m)) {
      settlement.finished.push_back(m);
    } else if (down.count(m)) {
      settlement.departed.push_back(m);
    } else {
      settlement.unsettled.push_back(m);
    }
  }
  if (!settlement.unsettled.empty()) {
    log.warn("node(s) {} did not finish within {} s; leaving anyway",
             fmt::join(settlement.unsettled, ", "), options.timeout.count() / 1000.0);
  }
  return settlement;
}

}  // namespace chorus::run
