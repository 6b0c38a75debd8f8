#include "run/membership.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace chorus::run {

Membership::Membership(NodeId self, const std::vector<NodeId>& members) {
  for (NodeId m : members) {
    if (m != self) others_.push_back(m);
  }
  std::sort(others_.begin(), others_.end());
  others_.erase(std::unique(others_.begin(), others_.end()), others_.end());
}

void Membership::finished(NodeId peer) {
  {
    std::lock_guard guard(mu_);
    done_.insert(peer);
  }
  changed_.notify_all();
}

void Membership::down(NodeId peer) {
  {
    std::lock_guard guard(mu_);
    down_.insert(peer);
  }
  changed_.notify_all();
}

void Membership::up(NodeId peer) {
  {
    std::lock_guard guard(mu_);
    down_.erase(peer);
  }
  changed_.notify_all();
}

void Membership::stop() {
  {
    std::lock_guard guard(mu_);
    stopped_ = true;
  }
  changed_.notify_all();
}

bool Membership::stopped() const {
  std::lock_guard guard(mu_);
  return stopped_;
}

bool Membership::isDown(NodeId peer) const {
  std::lock_guard guard(mu_);
  return down_.count(peer) > 0;
}

std::set<NodeId> Membership::downPeers() const {
  std::lock_guard guard(mu_);
  return down_;
}

PeerSettlement Membership::settle(const SettleOptions& options, spdlog::logger& log) {
  using Clock = std::chrono::steady_clock;
  const std::vector<NodeId>& peers = options.peers.empty() ? others_ : options.peers;
  std::unique_lock lock(mu_);
  auto missing = [&] {
    std::vector<NodeId> out;
    for (NodeId m : peers) {
      if (!done_.count(m) && !down_.count(m)) out.push_back(m);
    }
    return out;
  };
  const Clock::time_point deadline = Clock::now() + options.timeout;
  Clock::time_point next_report = Clock::now() + options.report_every;
  while (!stopped_ && !missing().empty() && Clock::now() < deadline) {
    if (options.has_work && options.has_work()) {
      lock.unlock();
      options.work();
      lock.lock();
      continue;
    }
    changed_.wait_until(lock, std::min(deadline, next_report));
    if (Clock::now() >= next_report && !stopped_) {
      next_report += options.report_every;
      const std::vector<NodeId> waiting = missing();
      if (!waiting.empty()) {
        log.info("finished; waiting for node(s) {} to finish", fmt::join(waiting, ", "));
      }
    }
  }
  PeerSettlement settlement;
  for (NodeId m : peers) {
    if (done_.count(m)) {
      settlement.finished.push_back(m);
    } else if (down_.count(m)) {
      settlement.departed.push_back(m);
    } else {
      settlement.unsettled.push_back(m);
    }
  }
  lock.unlock();
  if (!settlement.unsettled.empty()) {
    log.warn("node(s) {} did not finish within {} s; leaving anyway",
             fmt::join(settlement.unsettled, ", "), options.timeout.count() / 1000.0);
  }
  return settlement;
}

}  // namespace chorus::run
