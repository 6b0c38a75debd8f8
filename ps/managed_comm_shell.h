// Managed communication's network shell (docs/managed-comm.md): Bösen's server push under a
// per-node bandwidth budget. On a timer of the loop thread, the owner measures what its node
// sent (TokenBucket), picks the keys it owns that changed most since it last pushed them
// (ChangeTracker, by relative magnitude) and, while the budget allows, sends their fresh values
// to every worker as PsRowPush frames stamped with its minimum worker clock; its own worker gets
// them without the network. A worker keeps the rows in its SSP row cache (KvWorker::offerRows),
// so a read at clock c that finds rows stamped >= c - s needs no round trip; rows the budget
// did not refresh in time are pulled as before, which keeps the SSP guarantee whatever the
// budget. The cores are in ps/managed_comm.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "node/protocol.h"
#include "node/repeated_log.h"
#include "ps/codec.h"
#include "ps/key_space.h"
#include "ps/managed_comm.h"
#include "ps/ssp.h"

namespace chorus::node {
class Node;
class InboundFrame;
}  // namespace chorus::node

namespace chorus::ps {

class KvServer;
class KvWorker;

struct ManagedCommOptions {
  double bandwidth_mbps = 0;  // the node's budget in Mbit/s (> 0)
  // The most floats' bytes one PsRowPush carries (at least one key: a larger key goes alone).
  size_t message_bytes = size_t{256} << 10;
  // How often the sender looks for changed keys and budget.
  std::chrono::milliseconds period{5};
  // The bucket holds at most this many seconds of the rate (and at least one message to every
  // worker).
  double burst_s = 0.05;
};

// What managed communication did; any thread.
struct ManagedCommStats {
  uint64_t frames_sent = 0;    // PsRowPush frames (one per worker and message)
  uint64_t rows_sent = 0;      // rows in them (each counted once per worker)
  uint64_t managed_bytes = 0;  // their bytes, as charged to the budget
  uint64_t other_bytes = 0;    // everything else the node sent, as measured
  uint64_t rows_received = 0;  // rows other owners pushed to this worker
  uint64_t refused = 0;        // PsRowPush frames refused (named in the log)
};

// Owner -> worker: fresh `values` of `keys` (their floats one after the other, copied into the
// body), every update from clocks below `min_clock` in them (PsRowPush).
PsMessage rowPush(Clock min_clock, std::span<const Key> keys, std::span<const float> values);

// Parses and checks --bandwidth's value (Mbit/s; 0 = off); throws std::invalid_argument
// naming the flag.
void validateBandwidth(double mbps);

class ManagedComm {
 public:
  // `workers` are every member (self included: its worker is fed without the network).
  // Installs the PsRowPush handler on `node`. The node must be shut down before this object is
  // destroyed, and `server` and `worker` must outlive it.
  ManagedComm(node::Node& node, KvServer& server, KvWorker& worker, std::vector<NodeId> workers,
              ManagedCommOptions options);
  ~ManagedComm();
  ManagedComm(const ManagedComm&) = delete;
  ManagedComm& operator=(const ManagedComm&) = delete;

  // Any thread, once the node listens: arms the sender's timer (again after stop()).
  void start();
  // Any thread: disarms it; no send starts after this returns.
  void stop();
  ManagedCommStats stats() const;

 private:
  // Loop thread, on the timer: charges what the node sent, then sends the most changed keys
  // while the budget allows.
  void pump();
  // Loop thread: a PsRowPush from `from` (checked; a bad one is refused and logged).
  void onRowPush(NodeId from, const node::InboundFrame& frame);

  node::Node& node_;
  KvServer& server_;
  KvWorker& worker_;
  NodeId self_;
  std::vector<NodeId> others_;
  ManagedCommOptions options_;
  // Loop thread.
  std::optional<TokenBucket> bucket_;
  std::optional<ChangeTracker> tracker_;
  ScanPacer pacer_;
  node::RefusalLog refusals_;
  mutable std::mutex mu_;  // guards stats_ and timer_
  ManagedCommStats stats_;
  uint64_t timer_ = 0;
};

}  // namespace chorus::ps
