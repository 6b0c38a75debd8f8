#include "node/connection.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <limits>

#include "node/event_loop.h"

namespace chorus::node {

Connection::Connection(uv_loop_t* loop, uv::HandlePtr<uv::Tcp> tcp, Role role, FrameLimits limits,
                       Hooks hooks)
    : loop_(loop), tcp_(std::move(tcp)), role_(role), decoder_(limits), hooks_(std::move(hooks)) {
  // The owner learns that it may delete this object only once the socket's close callback ran,
  // i.e. after libuv completed (or cancelled) every request that points back here.
  tcp_->setOnClosed([this] { releaseFromLoop(); });
}

void Connection::setLinkDelay(std::chrono::microseconds delay, std::chrono::microseconds jitter,
                              uint64_t seed) {
  link_delay_ = delay;
  link_jitter_ = jitter;
  link_rng_.seed(seed);
}

void Connection::liftFrameLimitFromLoop() {
  assert(EventLoop::onThreadOf(loop_));
  decoder_.setMaxFrameBytes(std::numeric_limits<uint32_t>::max());
}

void Connection::startFromLoop() {
  assert(EventLoop::onThreadOf(loop_));
  if (!open()) return;
  description_ = description_.empty() ? tcp_->peerNameFromLoop() : description_;
  Status status = tcp_->setNoDelayFromLoop();
  tcp_->sliceWritesByMssFromLoop(write_slice_packets_);
  if (status.ok()) {
    status = tcp_->readStartFromLoop([this] { return decoder_.readBuffer(); },
                                     [this](ssize_t nread) { onReadFromLoop(nread); });
  }
  if (!status.ok()) closeFromLoop(status);
}

void Connection::onReadFromLoop(ssize_t nread) {
  if (!open()) return;
  if (nread < 0) {
    if (nread == UV_EOF) {
      Status truncated = decoder_.finish();
      closeFromLoop(truncated.ok() ? Status{ErrorCode::kClosed, "peer closed the connection"}
                                   : truncated);
    } else {
      closeFromLoop(uv::uvError(static_cast<int>(nread), "read"));
    }
    return;
  }
  if (hooks_.on_bytes_in) hooks_.on_bytes_in(*this, static_cast<size_t>(nread));
  last_receive = Clock::now();
  Status status = decoder_.commitRead(static_cast<size_t>(nread), [this](InboundFrame&& frame) {
    if (!open()) return false;
    return hooks_.on_frame(*this, std::move(frame)) && open();
  });
  if (!status.ok()) closeFromLoop(status);
}

void Connection::writeFromLoop(SharedFrame frame, std::function<void(const Status&)> done) {
  assert(EventLoop::onThreadOf(loop_));
  if (!open()) {
    if (done) done(error_);
    return;
  }
  queueFromLoop({std::move(frame), std::move(done)});
}

void Connection::queueFromLoop(PendingWrite write) {
  queued_bytes_ += write.frame->size();
  last_send = Clock::now();
  if (faultyLink()) {
    delayFromLoop(std::move(write));
  } else {
    pending_.push_back(std::move(write));
    if (writes_in_flight_ == 0) flushFromLoop();
  }
  if (hooks_.on_queue_changed) hooks_.on_queue_changed(*this);
}

void Connection::delayFromLoop(PendingWrite write) {
  std::chrono::microseconds extra{0};
  if (link_jitter_.count() > 0) {
    extra = std::chrono::microseconds(
        std::uniform_int_distribution<int64_t>(0, link_jitter_.count() - 1)(link_rng_));
  }
  // A lost segment stalls the link until it is retransmitted; each further loss of the same
  // segment doubles the time-out, as TCP's back-off does.
  if (link_loss_ > 0) {
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    bool lost = false;
    for (int retransmission = 0;
         retransmission < kMaxLinkRetransmissions && coin(link_rng_) < link_loss_;
         ++retransmission) {
      extra += link_rto_ * (int64_t{1} << retransmission);
      lost = true;
    }
    if (lost && hooks_.on_frame_lost) hooks_.on_frame_lost(*this);
  }
  Clock::time_point due = Clock::now() + link_delay_ + extra;
  // A TCP link delivers in order: a frame with a shorter draw waits for the one before it.
  if (!delayed_.empty()) due = std::max(due, delayed_.back().due);
  delayed_.push_back({due, std::move(write)});
  if (delayed_.size() == 1) releaseDelayedFromLoop(false);
}

void Connection::releaseDelayedFromLoop(bool all) {
  if (!open()) return;
  const Clock::time_point now = Clock::now();
  bool moved = false;
  while (!delayed_.empty() && (all || delayed_.front().due <= now)) {
    pending_.push_back(std::move(delayed_.front().write));
    delayed_.pop_front();
    moved = true;
  }
  if (moved && writes_in_flight_ == 0) flushFromLoop();
  if (delayed_.empty() || !open()) {
    if (delay_timer_) delay_timer_->stopFromLoop();
    return;
  }
  if (!delay_timer_) delay_timer_ = uv::Timer::create(loop_);
  // Rounded up: libuv's timers count whole milliseconds, and a frame must not leave early.
  const auto wait = std::chrono::ceil<std::chrono::milliseconds>(delayed_.front().due - now);
  delay_timer_->startFromLoop(static_cast<uint64_t>(std::max<int64_t>(wait.count(), 1)), 0,
                              [this] { releaseDelayedFromLoop(false); });
}

void Connection::writeTransientFromLoop(const SharedFrame& frame,
                                        std::function<void(const Status&)> done) {
  assert(EventLoop::onThreadOf(loop_));
  if (!open()) {
    if (done) done(error_);
    return;
  }
  size_t written = 0;
  // Only with nothing queued or in flight (then libuv holds no write of ours either) may bytes
  // go straight to the socket; with a link fault (delay, jitter or loss) nothing does.
  if (!faultyLink() && pending_.empty() && writes_in_flight_ == 0) {
    const Status status = tcp_->tryWriteFromLoop(frame, &written);
    if (!status.ok()) {
      if (done) done(status);
      closeFromLoop(status);
      return;
    }
    last_send = Clock::now();
    if (written == frame->size()) {
      if (hooks_.on_bytes_out) hooks_.on_bytes_out(*this, written);
      if (done) done({});
      return;
    }
  }
  queueFromLoop({frame->tailCopy(written), std::move(done), written});
}

void Connection::flushFromLoop() {
  if (pending_.empty() || !open()) return;
  auto batch = std::make_shared<std::vector<PendingWrite>>(std::move(pending_));
  pending_.clear();
  std::vector<SharedFrame> frames;
  frames.reserve(batch->size());
  for (const auto& write : *batch)
    frames.push_back(write.frame);
  ++writes_in_flight_;
  Status status = tcp_->writeFromLoop(std::move(frames), [this, batch](const Status& st) {
    --writes_in_flight_;
    const Status outcome = st.ok() ? st : (error_.ok() ? st : error_);
    for (auto& write : *batch) {
      queued_bytes_ -= write.frame->size();
      if (st.ok() && hooks_.on_bytes_out) {
        hooks_.on_bytes_out(*this, write.written_before + write.frame->size());
      }
    }
    // Flow-control events first, so a sender that waits for its callbacks also sees them.
    if (hooks_.on_queue_changed) hooks_.on_queue_changed(*this);
    for (auto& write : *batch) {
      if (write.done) write.done(outcome);
    }
    if (!st.ok()) {
      closeFromLoop(st);
      return;
    }
    flushFromLoop();
  });
  if (!status.ok()) {
    --writes_in_flight_;
    for (auto& write : *batch) {
      queued_bytes_ -= write.frame->size();
      if (write.done) write.done(status);
    }
    closeFromLoop(status);
  }
}

void Connection::failPendingFromLoop() {
  auto pending = std::move(pending_);
  pending_.clear();
  // Delayed writes were queued after the pending ones: they fail after them, in order.
  for (auto& delayed : delayed_)
    pending.push_back(std::move(delayed.write));
  delayed_.clear();
  for (auto& write : pending) {
    queued_bytes_ -= write.frame->size();
    if (write.done) write.done(error_);
  }
}

void Connection::closeFromLoop(const Status& reason) {
  assert(EventLoop::onThreadOf(loop_));
  if (!open()) {
    // Already failing (perhaps flushing): make sure the socket really goes away now.
    deadline_.reset();
    delay_timer_.reset();
    tcp_->closeFromLoop();
    return;
  }
  assert(!reason.ok());
  error_ = reason;
  deadline_.reset();
  delay_timer_.reset();
  failPendingFromLoop();
  if (hooks_.on_closing) hooks_.on_closing(*this, error_);
  tcp_->closeFromLoop();
}

void Connection::closeAfterFlushFromLoop(const Status& reason) {
  assert(EventLoop::onThreadOf(loop_));
  if (!open()) return;
  assert(!reason.ok());
  // Queued frames go to libuv before the FIN; delayed ones too, at once (a closing link does
  // not hold its last frames back).
  releaseDelayedFromLoop(true);
  flushFromLoop();
  if (!open()) return;
  error_ = reason;
  if (hooks_.on_closing) hooks_.on_closing(*this, error_);
  tcp_->readStopFromLoop();
  Status status = tcp_->shutdownFromLoop([this](const Status&) { closeFromLoop(error_); });
  if (!status.ok()) closeFromLoop(error_);
}

void Connection::armDeadlineFromLoop(std::chrono::milliseconds after, const Status& reason) {
  assert(EventLoop::onThreadOf(loop_));
  if (!deadline_) deadline_ = uv::Timer::create(loop_);
  deadline_->startFromLoop(static_cast<uint64_t>(after.count()), 0,
                           [this, reason] { closeFromLoop(reason); });
}

void Connection::disarmDeadlineFromLoop() {
  if (deadline_) deadline_->stopFromLoop();
}

void Connection::releaseFromLoop() {
  (void)tcp_.release();  // the handle frees itself right after this callback
  auto on_released = std::move(hooks_.on_released);
  if (on_released) on_released(*this);  // may delete this
}

}  // namespace chorus::node
