#include "node/dialer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cassert>

#include "node/event_loop.h"

namespace chorus::node {

Dialer::Dialer(uv_loop_t* loop, const NodeOptions& options, spdlog::logger& log, OpenAttempt open)
    : loop_(loop), options_(options), log_(log), open_(std::move(open)) {}

void Dialer::addFromLoop(NodeId peer, const sockaddr_storage& address, std::string address_text) {
  assert(EventLoop::onThreadOf(loop_));
  Target& target = targets_[peer];
  target.address = address;
  target.address_text = std::move(address_text);
  dialFromLoop(peer);
}

bool Dialer::isAttempt(NodeId peer, const Connection* connection) const {
  auto it = targets_.find(peer);
  return it != targets_.end() && it->second.attempt == connection;
}

void Dialer::dialFromLoop(NodeId peer) {
  assert(EventLoop::onThreadOf(loop_));
  Target& target = targets_.at(peer);
  target.armed = std::chrono::milliseconds(0);
  if (stopped_ || target.connected || target.attempt != nullptr) return;
  log_.debug("dialing peer {} at {}", peer, target.address_text);
  target.attempt = open_(peer, target.address, target.address_text);
}

void Dialer::onEstablishedFromLoop(NodeId peer, const Connection* connection) {
  assert(EventLoop::onThreadOf(loop_));
  auto it = targets_.find(peer);
  if (it == targets_.end()) return;
  Target& target = it->second;
  if (target.attempt == connection) target.attempt = nullptr;
  target.connected = true;
  target.backoff = options_.dial_backoff_initial;
}

void Dialer::onAttemptFailedFromLoop(NodeId peer, const std::string& description,
                                     const Status& why) {
  assert(EventLoop::onThreadOf(loop_));
  Target& target = targets_.at(peer);
  target.attempt = nullptr;
  if (target.gave_up) {
    log_.debug("not dialing {} again: {}", description, why.toString());
    return;
  }
  if (target.backoff.count() == 0) target.backoff = options_.dial_backoff_initial;
  // A failure at the socket (kIo: connection refused, nothing listens there yet) is what a
  // peer still starting gives, or a crashed one being restarted: on a cluster starting 64
  // processes on one machine the first ones to listen reached the longest backoff before the
  // last one listened, and connecting ended up to the whole backoff after it. Such an attempt
  // costs a SYN and a reset, so it is retried at most an eighth of the longest backoff apart
  // (250 ms by default); time-outs and refused handshakes keep backing off to the longest.
  const std::chrono::milliseconds cap =
      why.code() == ErrorCode::kIo
          ? std::max(options_.dial_backoff_max / 8, std::chrono::milliseconds(1))
          : options_.dial_backoff_max;
  const std::chrono::milliseconds delay = std::min(target.backoff, cap);
  target.backoff = std::min(target.backoff * 2, options_.dial_backoff_max);
  log_.log(why.code() == ErrorCode::kRefused ? spdlog::level::warn : spdlog::level::debug,
           "dial to {} failed: {}; retrying in {} ms", description, why.toString(), delay.count());
  scheduleFromLoop(peer, delay);
}

void Dialer::onLostFromLoop(NodeId peer, bool left) {
  assert(EventLoop::onThreadOf(loop_));
  auto it = targets_.find(peer);
  if (it == targets_.end()) return;
  Target& target = it->second;
  target.connected = false;
  // A peer that left is redialed too: only the lower id dials, so a higher id restarted
  // (`--rejoin` after an orderly stop) could not come back otherwise. It returns as a new
  // process, not within milliseconds, so its redials start at the longest backoff.
  target.backoff = left ? options_.dial_backoff_max : options_.dial_backoff_initial;
  scheduleFromLoop(peer, target.backoff);
}

void Dialer::giveUpFromLoop(NodeId peer) {
  assert(EventLoop::onThreadOf(loop_));
  if (auto it = targets_.find(peer); it != targets_.end()) it->second.gave_up = true;
}

void Dialer::stopFromLoop() {
  assert(EventLoop::onThreadOf(loop_));
  stopped_ = true;
  for (auto& [peer, target] : targets_) {
    target.redial_timer.reset();
    target.armed = std::chrono::milliseconds(0);
  }
}

std::chrono::milliseconds Dialer::armedRetry(NodeId peer) const {
  auto it = targets_.find(peer);
  return it == targets_.end() ? std::chrono::milliseconds(0) : it->second.armed;
}

void Dialer::scheduleFromLoop(NodeId peer, std::chrono::milliseconds delay) {
  assert(EventLoop::onThreadOf(loop_));
  if (stopped_) return;
  Target& target = targets_.at(peer);
  if (!target.redial_timer) target.redial_timer = uv::Timer::create(loop_);
  target.armed = delay;
  target.redial_timer->startFromLoop(static_cast<uint64_t>(delay.count()), 0,
                                     [this, peer] { dialFromLoop(peer); });
}

}  // namespace chorus::node
