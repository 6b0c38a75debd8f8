// Peer liveness: one timer per node that, for every established connection, closes the ones
// silent for longer than peer_timeout (a peer-down event follows) and writes a Heartbeat on the
// ones this node has not written to for heartbeat_interval. Any inbound frame counts as a sign
// of life (Connection::last_receive). Internal header; loop thread only.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "node/frame.h"
#include "node/uv_handles.h"

namespace chorus::node {

class Connection;

class Liveness {
 public:
  using Clock = std::chrono::steady_clock;
  // `established` lists the connections to watch; `heartbeat` encodes one Heartbeat frame.
  Liveness(uv_loop_t* loop, std::chrono::milliseconds heartbeat_interval,
           std::chrono::milliseconds peer_timeout,
           std::function<std::vector<Connection*>()> established,
           std::function<SharedFrame()> heartbeat);
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Ticks every min(heartbeat_interval, peer_timeout / 4).
  void startFromLoop();
  void stopFromLoop() { timer_.reset(); }
  // One check of every connection at `now`.
  void tickFromLoop(Clock::time_point now);

 private:
  uv_loop_t* loop_;
  std::chrono::milliseconds heartbeat_interval_;
  std::chrono::milliseconds peer_timeout_;
  std::function<std::vector<Connection*>()> established_;
  std::function<SharedFrame()> heartbeat_;
  uv::HandlePtr<uv::Timer> timer_;
};

}  // namespace chorus::node
