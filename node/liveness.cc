#include "node/liveness.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

#include "node/connection.h"
#include "node/event_loop.h"

namespace chorus::node {

Liveness::Liveness(uv_loop_t* loop, std::chrono::milliseconds heartbeat_interval,
                   std::chrono::milliseconds peer_timeout,
                   std::function<std::vector<Connection*>()> established,
                   std::function<SharedFrame()> heartbeat)
    : loop_(loop),
      heartbeat_interval_(heartbeat_interval),
      peer_timeout_(peer_timeout),
      established_(std::move(established)),
      heartbeat_(std::move(heartbeat)) {}

void Liveness::startFromLoop() {
  assert(EventLoop::onThreadOf(loop_));
  timer_ = uv::Timer::create(loop_);
  const auto tick =
      std::max<int64_t>(1, std::min(heartbeat_interval_.count(), peer_timeout_.count() / 4));
  timer_->startFromLoop(tick, tick, [this] { tickFromLoop(Clock::now()); });
}

void Liveness::tickFromLoop(Clock::time_point now) {
  assert(EventLoop::onThreadOf(loop_));
  SharedFrame heartbeat;  // one frame for every connection that needs one
  for (Connection* connection : established_()) {
    if (!connection->open() || !connection->established) continue;
    const auto silent =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - connection->last_receive);
    if (silent > peer_timeout_) {
      connection->closeFromLoop(
          {ErrorCode::kTimeout,
           fmt::format("no frame from peer {} for {} ms (peer timeout {} ms)", connection->peer,
                       silent.count(), peer_timeout_.count())});
      continue;
    }
    if (now - connection->last_send >= heartbeat_interval_) {
      if (!heartbeat) heartbeat = heartbeat_();
      connection->writeFromLoop(heartbeat, {});
    }
  }
}

}  // namespace chorus::node
