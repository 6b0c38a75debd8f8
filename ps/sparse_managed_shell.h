// Managed communication for sparse PS mode's rows at their homes (--technique classic with
// --bandwidth; docs/managed-comm.md, "Sparse rows"): the network shell of ps/sparse_managed.h.
// On a timer of the loop thread, the owner charges what its node sent to the budget (the dense
// path's TokenBucket), and while it allows sends every worker its announcements and the values
// of its most-changed rows (SparseRowPusher) as PsRowPush frames; its own worker's copy gets
// them without the network. The worker's copy (ManagedRowCache) serves the reads its owners
// vouched for recently enough under SSP; the shell's user pulls the others from their owners,
// which keeps the SSP bound whatever the budget.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "node/repeated_log.h"
#include "ps/managed_comm.h"
#include "ps/managed_comm_shell.h"
#include "ps/sparse_managed.h"

namespace chorus::node {
class Node;
class InboundFrame;
}  // namespace chorus::node

namespace chorus::ps {

class KvServer;

// What it did; any thread.
struct SparseManagedStats {
  ManagedCommStats comm;
  uint64_t cache_hits = 0;    // row reads served by the copy
  uint64_t cache_misses = 0;  // row reads left to pull
};

class SparseManagedComm {
 public:
  // `server` holds this node's home rows; `owner` names every key's home; `members` every node
  // (self included); `model` every key's initial floats (ManagedRowCache). Installs the PsRowPush
  // handler on `node`, which must be shut down before this object is destroyed; `server` and
  // `space` must outlive it. std::invalid_argument for a bad budget or model.
  SparseManagedComm(node::Node& node, KvServer& server, const KeySpace& space,
                    ManagedRowCache::OwnerOf owner, std::vector<NodeId> members,
                    std::vector<float> model, Staleness staleness, ManagedCommOptions options);
  ~SparseManagedComm();
  SparseManagedComm(const SparseManagedComm&) = delete;
  SparseManagedComm& operator=(const SparseManagedComm&) = delete;

  // Any thread, once the node listens: arms the sender's timer.
  void start();
  // Any thread: disarms it; no send starts after this returns.
  void stop();
  // Any thread: ManagedRowCache::read under the lock, counted.
  size_t read(std::span<const Key> keys, Clock clock, std::span<float> out,
              std::vector<size_t>& missing);
  SparseManagedStats stats() const;

 private:
  // Loop thread, on the timer: charges what the node sent, then one SparseRowPusher pass.
  void pump();
  // Loop thread: a PsRowPush from `from` (checked; a bad one is refused and logged).
  void onRowPush(NodeId from, const node::InboundFrame& frame);
  // Loop thread: one frame to every other worker and to this node's own copy.
  void send(const RowFrame& frame, Clock min_clock);

  node::Node& node_;
  KvServer& server_;
  NodeId self_;
  std::vector<NodeId> others_;
  ManagedCommOptions options_;
  // Loop thread.
  std::optional<TokenBucket> bucket_;
  std::optional<SparseRowPusher> pusher_;
  ScanPacer pacer_;
  node::RefusalLog refusals_;
  mutable std::mutex mu_;  // guards cache_, stats_ and timer_
  ManagedRowCache cache_;
  SparseManagedStats stats_;
  uint64_t timer_ = 0;
};

}  // namespace chorus::ps
