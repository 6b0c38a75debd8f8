// Ping/Pong traffic between a node and its peers: each side sends K pings with a
// deterministic payload to every peer, checks that each Pong echoes it exactly, and answers
// the peers' pings. Used by `chorus node --mode ping` and by tests. Built on the runtime's
// public API only (node/node.h); the runtime does not know it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "node/node.h"

namespace chorus::ping {

using node::Node;
using node::NodeId;
using node::Status;

struct PingOptions {
  uint32_t pings_per_peer = 3;               // K, the same on every node
  size_t payload_bytes = 1024;               // bytes per ping payload
  std::chrono::milliseconds timeout{10000};  // for the whole exchange
  uint64_t seed = 1;                         // payload generator seed (same on every node)
};

// What happened with one peer.
struct PeerPingReport {
  NodeId peer = 0;
  uint32_t pongs_verified = 0;  // our pings echoed correctly
  uint32_t pings_answered = 0;  // the peer's pings we answered
  double rtt_min_us = 0;
  double rtt_mean_us = 0;
  double rtt_max_us = 0;
};

struct PingReport {
  Status status;                      // ok when every exchange completed and verified
  std::vector<PeerPingReport> peers;  // sorted by peer id
  std::chrono::milliseconds elapsed{0};
};

// The payload node `from` sends to node `to` in ping `nonce` (deterministic in the seed).
std::vector<uint8_t> pingPayload(uint64_t seed, NodeId from, NodeId to, uint64_t nonce,
                                 size_t bytes);

class PingExchange {
 public:
  // Registers the Ping and Pong handlers on `node`; do it before node.connect() so no early
  // ping is missed. `node` must outlive this object.
  PingExchange(Node& node, const std::vector<NodeId>& peers, PingOptions options);
  // Unregisters the handlers.
  ~PingExchange();
  PingExchange(const PingExchange&) = delete;
  PingExchange& operator=(const PingExchange&) = delete;

  // Sends K pings to each peer (one outstanding per peer) and waits until every Pong came
  // back verified and every peer's K pings were answered, or the timeout. Call once.
  PingReport run();
  // Ends a running (or future) run() early with `why`; any thread.
  void cancel(const Status& why);

  struct State;

 private:
  Node& node_;
  std::shared_ptr<State> state_;
};

}  // namespace chorus::ping
