#include "node/link_shaper.h"

#include <algorithm>
#include <cassert>

#include "node/event_loop.h"

namespace chorus::node {

LinkShaper::LinkShaper(uv_loop_t* loop, const LinkShape& shape,
                       std::function<void(std::vector<QueuedWrite>)> release,
                       std::function<void()> on_lost)
    : loop_(loop),
      shape_(shape),
      release_(std::move(release)),
      on_lost_(std::move(on_lost)),
      rng_(shape.seed) {}

void LinkShaper::holdFromLoop(QueuedWrite write) {
  assert(EventLoop::onThreadOf(loop_));
  std::chrono::microseconds extra{0};
  if (shape_.jitter.count() > 0) {
    extra = std::chrono::microseconds(
        std::uniform_int_distribution<int64_t>(0, shape_.jitter.count() - 1)(rng_));
  }
  // A lost segment stalls the link until it is retransmitted; each further loss of the same
  // segment doubles the time-out, as TCP's back-off does.
  if (shape_.loss > 0) {
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    bool lost = false;
    for (int retransmission = 0;
         retransmission < kMaxLinkRetransmissions && coin(rng_) < shape_.loss; ++retransmission) {
      extra += shape_.rto * (int64_t{1} << retransmission);
      lost = true;
    }
    if (lost && on_lost_) on_lost_();
  }
  Clock::time_point due = Clock::now() + shape_.delay + extra;
  // A TCP link delivers in order: a frame with a shorter draw waits for the one before it.
  if (!held_.empty()) due = std::max(due, held_.back().due);
  held_.push_back({due, std::move(write)});
  if (held_.size() == 1) releaseFromLoop(false);
}

void LinkShaper::releaseFromLoop(bool all) {
  assert(EventLoop::onThreadOf(loop_));
  const Clock::time_point now = Clock::now();
  std::vector<QueuedWrite> due;
  while (!held_.empty() && (all || held_.front().due <= now)) {
    due.push_back(std::move(held_.front().write));
    held_.pop_front();
  }
  if (held_.empty()) {
    if (timer_) timer_->stopFromLoop();
  } else {
    if (!timer_) timer_ = uv::Timer::create(loop_);
    // Rounded up: libuv's timers count whole milliseconds, and a frame must not leave early.
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(held_.front().due - now);
    timer_->startFromLoop(static_cast<uint64_t>(std::max<int64_t>(wait.count(), 1)), 0,
                          [this] { releaseFromLoop(false); });
  }
  // Last: the release may close the connection, which stops this shaper.
  if (!due.empty()) release_(std::move(due));
}

std::vector<QueuedWrite> LinkShaper::takeAllFromLoop() {
  std::vector<QueuedWrite> out;
  out.reserve(held_.size());
  for (auto& held : held_)
    out.push_back(std::move(held.write));
  held_.clear();
  if (timer_) timer_->stopFromLoop();
  return out;
}

}  // namespace chorus::node
