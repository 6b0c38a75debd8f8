// Who of a run's other members finished, who left, and the end-of-run wait for them, shared by
// both distributed modes: every node tells the peers that may still need it that it finished
// (TrainingDone) and waits until each of them has finished too or left, so that no node leaves
// while a peer may still need it (a neighbor's models in consensus mode, an owner's keys in PS
// mode, where that is every member).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <vector>

#include "run/node_id.h"

namespace spdlog {
class logger;
}

namespace chorus::run {

// Who of the other members finished, left first, or neither when the wait ended.
struct PeerSettlement {
  std::vector<NodeId> finished;
  std::vector<NodeId> departed;
  std::vector<NodeId> unsettled;
};

struct SettleOptions {
  // Whom to wait for: these members only (consensus mode: the neighbors); empty: others().
  std::vector<NodeId> peers;
  std::chrono::milliseconds timeout{120000};
  std::chrono::milliseconds report_every{5000};
  // Checked with the lock held at every wake-up: the caller has work to do while it waits (for
  // example a late request to answer); `work` then runs with the lock released.
  std::function<bool()> has_work;
  std::function<void()> work;
};

// The membership of one node's run: the other members' end-of-run state, and whether this node
// was stopped. One lock guards it; a mode keeps its own state that a wait depends on (answers,
// requests) under the same lock (lock(), then notify()), so that one condition wakes every wait.
// Any thread.
class Membership {
 public:
  // `members`: every id of the cluster; `self` is left out of others().
  Membership(NodeId self, const std::vector<NodeId>& members);
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // The other members, sorted.
  const std::vector<NodeId>& others() const { return others_; }

  // `peer` said TrainingDone.
  void finished(NodeId peer);
  // `peer` went down or left.
  void down(NodeId peer);
  // `peer` is connected (again).
  void up(NodeId peer);
  // Every wait returns at once, now and later.
  void stop();
  bool stopped() const;
  bool isDown(NodeId peer) const;
  // The members down now.
  std::set<NodeId> downPeers() const;

  // The lock of this membership, for the caller's own state that its waits depend on.
  std::unique_lock<std::mutex> lock() const { return std::unique_lock(mu_); }
  // Wakes every wait (after the caller changed its own state under lock()).
  void notify() { changed_.notify_all(); }
  // With `lock` held: waits until `ready()` (called with the lock held), stop() or the time-out;
  // returns ready() || stopped().
  template <typename Ready>
  bool waitFor(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout, Ready ready) {
    return changed_.wait_for(lock, timeout, [&] { return stopped_ || ready(); });
  }
  // With `lock` held: true when stop() was called (stopped() takes the lock itself).
  bool stoppedLocked() const { return stopped_; }
  // With `lock` held: whether `peer` is down now.
  bool isDownLocked(NodeId peer) const { return down_.count(peer) > 0; }

  // The end-of-run wait: until each of options.peers (default others()) finished or left, stop()
  // or the time-out; logs the members still missing every report_every, and those that never
  // settled at the end. The settlement names those peers only.
  PeerSettlement settle(const SettleOptions& options, spdlog::logger& log);

 private:
  std::vector<NodeId> others_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool stopped_ = false;
  std::set<NodeId> done_;
  std::set<NodeId> down_;
};

}  // namespace chorus::run
