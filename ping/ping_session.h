// `chorus node --mode ping` on a started node: the Ping/Pong exchange with every peer, the
// lines it prints (one per peer, with the node's traffic counters, and the outcome) and its
// exit status. The node's lifecycle (signals, listen, connect, leave) is the caller's: the same
// for every mode (cli/node_cmd.cc).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "node/node.h"
#include "ping/ping_exchange.h"

namespace chorus::ping {

// Exit status of a ping exchange that failed (docs/errors.md): a peer's Pong missing, late or
// wrong.
inline constexpr int kPingFailedExit = 5;

// How a session ended: `exit_code` 0, or kPingFailedExit with `message` naming the node and why.
struct PingOutcome {
  int exit_code = 0;
  std::string message;
};

// Throws std::invalid_argument naming the flags when a ping of `options` plus a frame's envelope
// is larger than a frame may be (`max_frame_bytes`): it would close every connection it is sent
// on. Needs no port: `chorus launch` checks it before any node starts.
void validatePingFitsFrames(const PingOptions& options, size_t max_frame_bytes);

class PingSession {
 public:
  // Registers the exchange's handlers on `node`: construct it before the node listens, so no
  // early ping is missed. `node` must outlive this object.
  PingSession(node::Node& node, std::vector<NodeId> peers, PingOptions options);

  // Trainer thread, once, after the node is ready: exchanges the pings, prints what happened
  // with each peer and, on success, the outcome to `out`. Never throws for a peer's fault.
  PingOutcome run(std::FILE* out = stdout);
  // Any thread (a signal): ends run() early; it then reports the exchange interrupted.
  void stop();

 private:
  node::Node& node_;
  std::vector<NodeId> peers_;
  PingOptions options_;
  PingExchange exchange_;
};

}  // namespace chorus::ping
