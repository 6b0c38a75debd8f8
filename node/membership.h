// Who this node must be connected to, who is, and why the others are not: the cluster-ready
// wait, the per-peer counters and the reason a permanent refusal ended the wait. The loop
// thread writes; any thread reads (atomics, and one mutex for the sets and reasons).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "node/node.h"

namespace chorus::node {

// Counters one peer's connection updates on the loop thread and anyone may read.
struct PeerCounters {
  std::atomic<bool> connected{false};
  std::atomic<bool> slow{false};
  std::atomic<uint64_t> bytes_in{0};
  std::atomic<uint64_t> bytes_out{0};
  std::atomic<uint64_t> frames_in{0};
  std::atomic<uint64_t> frames_out{0};
  std::atomic<uint64_t> queued_bytes{0};
  std::atomic<uint64_t> times_up{0};
  std::atomic<uint64_t> frames_lost{0};
  std::atomic<uint64_t> frames_superseded{0};
  std::atomic<uint64_t> frames_refused{0};
};

class Membership {
 public:
  // Every member but `self` gets counters (fixed from here on).
  Membership(const NodeOptions& options, spdlog::logger& log);

  // ---- any thread ----
  bool isMember(NodeId id) const { return counters_.contains(id); }
  // The counters of another member, or null.
  PeerCounters* counters(NodeId id) const;
  // Names the peers the ready wait counts (connect()).
  void expect(const std::vector<NodeId>& peers);
  // Blocks until every expected peer is connected, the node stops, a permanent refusal, or
  // `timeout`; the error lists the peers still missing and the last reason seen for each.
  Status waitReady(std::chrono::milliseconds timeout, const std::atomic<bool>& running);
  PeerStats stats(NodeId peer) const;
  PeerStats totals() const;
  std::vector<NodeId> connected() const;
  // Blocks until `open_connections()` is 0 or `timeout` (shutdown's linger).
  void waitNoConnections(std::chrono::milliseconds timeout);
  // Wakes every waiter (the node stopped).
  void wakeAll() { changed_.notify_all(); }

  // ---- loop thread ----
  void setUpFromLoop(NodeId peer);
  // The connection to `peer` was lost for `reason`.
  void setDownFromLoop(NodeId peer, const std::string& reason);
  // Keeps `reason` for the ready wait's report (a failed attempt, a refusal).
  void noteFromLoop(NodeId peer, const std::string& reason);
  // A permanent refusal: the ready wait ends at once with `reason` (the first one wins).
  void failFromLoop(const std::string& reason);
  void setOpenConnectionsFromLoop(size_t open);

 private:
  const NodeOptions& options_;
  spdlog::logger& log_;
  std::map<NodeId, std::unique_ptr<PeerCounters>> counters_;  // fixed after construction

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable changed_;
  std::set<NodeId> expected_;
  std::set<NodeId> connected_;
  std::map<NodeId, std::string> last_reason_;
  std::string fatal_;
  size_t open_connections_ = 0;
};

}  // namespace chorus::node
