#include "node/connection.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <iterator>
#include <limits>

#include "node/event_loop.h"

namespace chorus::node {
namespace {

// Sealed writes go through chunks of this size (ChunkPool): large enough that the per-write
// cost (a flush, its libuv requests and callback) is small against sealing it (about 0.1 ms
// here), small enough that the two a busy connection keeps cost little memory. Pending sealed
// frames of at most kSmallSealBytes in all are sealed into one buffer of their exact size
// instead, from the heap (a connection that only sends small frames holds no chunk).
constexpr size_t kSealChunkBytes = 512 * 1024;
constexpr size_t kIdleSealChunks = 2;  // one being written while the next is filled
constexpr size_t kSmallSealBytes = 64 * 1024;

}  // namespace

Connection::Connection(uv_loop_t* loop, uv::HandlePtr<uv::Tcp> tcp, Role role, FrameLimits limits,
                       Hooks hooks)
    : loop_(loop), tcp_(std::move(tcp)), role_(role), decoder_(limits), hooks_(std::move(hooks)) {
  // The owner learns that it may delete this object only once the socket's close callback ran,
  // i.e. after libuv completed (or cancelled) every request that points back here.
  tcp_->setOnClosed([this] { releaseFromLoop(); });
}

void Connection::setLinkShape(const LinkShape& shape) {
  if (!shape.active()) {
    shaper_.reset();
    return;
  }
  shaper_ = std::make_unique<LinkShaper>(
      loop_, shape,
      [this](std::vector<QueuedWrite> due) {
        if (!open()) return;
        for (auto& write : due)
          pending_.push_back(std::move(write));
        if (writes_in_flight_ == 0) flushFromLoop();
      },
      [this] {
        if (hooks_.on_frame_lost) hooks_.on_frame_lost(*this);
      });
}

void Connection::liftFrameLimitFromLoop() {
  assert(EventLoop::onThreadOf(loop_));
  decoder_.setMaxFrameBytes(std::numeric_limits<uint32_t>::max());
}

void Connection::sealOutboundFromLoop(const SessionKey& key) {
  assert(EventLoop::onThreadOf(loop_));
  sealer_ = std::make_unique<FrameSealer>(key);
  seal_chunks_ = ChunkPool::create(kSealChunkBytes, kIdleSealChunks);
}

void Connection::openInboundFromLoop(const SessionKey& key) {
  assert(EventLoop::onThreadOf(loop_));
  decoder_.setOpener(std::make_unique<FrameOpener>(key));
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

void Connection::writeFromLoop(SharedFrame frame, std::function<void(const Status&)> done,
                               const SendOptions& options) {
  assert(EventLoop::onThreadOf(loop_));
  if (!open()) {
    if (done) done(error_);
    return;
  }
  const uint32_t kind = options.kind != 0 ? options.kind : frame->kind();
  std::vector<QueuedWrite> dropped;
  if (!admitFromLoop(frame->size(), kind, options.when_full, &dropped)) {
    frames_refused_ += 1;
    if (done) {
      done({ErrorCode::kOverloaded,
            fmt::format("{} bytes are queued to {} (at most {}): a frame of {} bytes was refused",
                        queued_bytes_, description_, queue_limit_, frame->size())});
    }
    return;
  }
  const size_t bytes = frame->size();
  queueFromLoop({std::move(frame), std::move(done), 0, kind, sealer_ != nullptr});
  for (auto& write : dropped) {
    if (write.done) {
      write.done({ErrorCode::kOverloaded,
                  fmt::format("superseded by a newer frame of its kind ({} bytes) while {} was "
                              "too far behind",
                              bytes, description_)});
    }
  }
}

bool Connection::admitFromLoop(size_t bytes, uint32_t kind, WhenFull when_full,
                               std::vector<QueuedWrite>* dropped) {
  if (queue_limit_ == 0 || queued_bytes_ == 0 || queued_bytes_ + bytes <= queue_limit_) {
    return true;
  }
  if (when_full != WhenFull::kDropOlderOfKind) return false;
  // Only frames nobody handed to the socket yet can go (a frame part of which the socket took
  // must be finished): the pending ones, then the ones the link shaper holds. Oldest first;
  // nothing is dropped unless dropping makes room.
  const auto droppable = [kind](const QueuedWrite& write) {
    return write.kind == kind && write.written_before == 0;
  };
  // The first pending frame may be partly sealed (and written): it must be finished.
  const size_t first_droppable = sealer_ != nullptr && sealer_->sealing() ? 1 : 0;
  size_t freeable = 0;
  for (size_t i = first_droppable; i < pending_.size(); ++i)
    freeable += droppable(pending_[i]) ? pending_[i].frame->size() : 0;
  if (shaper_) {
    for (const auto& held : shaper_->held())
      freeable += droppable(held.write) ? held.write.frame->size() : 0;
  }
  const size_t left = queued_bytes_ - freeable;
  if (left != 0 && left + bytes > queue_limit_) return false;
  const auto fits = [&] { return queued_bytes_ == 0 || queued_bytes_ + bytes <= queue_limit_; };
  const auto take = [&](QueuedWrite& write) {
    queued_bytes_ -= write.frame->size();
    frames_superseded_ += 1;
    dropped->push_back(std::move(write));
  };
  for (auto it =
           pending_.begin() + static_cast<ptrdiff_t>(std::min(first_droppable, pending_.size()));
       it != pending_.end() && !fits();) {
    if (droppable(*it)) {
      take(*it);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  if (shaper_) {
    auto& held = shaper_->held();
    for (auto it = held.begin(); it != held.end() && !fits();) {
      if (droppable(it->write)) {
        take(it->write);
        it = held.erase(it);
      } else {
        ++it;
      }
    }
  }
  return true;
}

void Connection::queueFromLoop(QueuedWrite write) {
  queued_bytes_ += write.frame->size();
  last_send = Clock::now();
  if (shaper_) {
    shaper_->holdFromLoop(std::move(write));
  } else {
    pending_.push_back(std::move(write));
    if (writes_in_flight_ == 0) flushFromLoop();
  }
  if (hooks_.on_queue_changed) hooks_.on_queue_changed(*this);
}

void Connection::writeTransientFromLoop(const SharedFrame& frame,
                                        std::function<void(const Status&)> done) {
  assert(EventLoop::onThreadOf(loop_));
  if (!open()) {
    if (done) done(error_);
    return;
  }
  if (sealer_) {
    // A sealed frame is written from a buffer of its own anyway: copy the frame now (its
    // attachment may change once this returns) and seal the copy in wire order at the flush.
    queueFromLoop({frame->tailCopy(0), std::move(done), 0, frame->kind(), true});
    return;
  }
  size_t written = 0;
  // Only with nothing queued or in flight (then libuv holds no write of ours either) may bytes
  // go straight to the socket; with a link fault (delay, jitter or loss) nothing does.
  if (!shaper_ && pending_.empty() && writes_in_flight_ == 0) {
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
  queueFromLoop({frame->tailCopy(written), std::move(done), written, frame->kind()});
}

void Connection::flushFromLoop(bool everything) {
  if (pending_.empty() || !open()) return;
  std::vector<SharedFrame> frames;
  frames.reserve(pending_.size());
  size_t taken = 0;  // pending writes that this request completes
  while (taken < pending_.size()) {
    if (!pending_[taken].seal) {
      // Queued before the handshake turned sealing on: written as they are.
      frames.push_back(pending_[taken].frame);
      ++taken;
      continue;
    }
    // Every later frame is sealed too. Sealing happens here, not when a frame is queued:
    // frames dropped from the queue (superseded) never take a record number, so the numbers
    // follow the wire order.
    taken += sealPendingFromLoop(taken, everything ? pending_.size() + 1 : 1, &frames);
    break;
  }
  auto batch = std::make_shared<std::vector<QueuedWrite>>(
      std::make_move_iterator(pending_.begin()),
      std::make_move_iterator(pending_.begin() + static_cast<ptrdiff_t>(taken)));
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(taken));
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

size_t Connection::sealPendingFromLoop(size_t first, size_t max_chunks,
                                       std::vector<SharedFrame>* frames) {
  size_t index = first;
  for (size_t chunk = 0; chunk < max_chunks && index < pending_.size(); ++chunk) {
    // A frame cut at the last chunk's end continues in a chunk; otherwise the sealed bytes of
    // what is pending, counted up to a chunk's worth, choose between a chunk and a small buffer.
    size_t need = 0;
    if (sealer_->sealing()) {
      need = kSealChunkBytes;
    } else {
      for (size_t i = index; i < pending_.size() && need <= kSmallSealBytes; ++i)
        need += FrameSealer::sealedSize(*pending_[i].frame);
    }
    const bool pooled = need > kSmallSealBytes;
    const size_t capacity = pooled ? seal_chunks_->chunkBytes() : need;
    std::unique_ptr<uint8_t[]> buffer =
        pooled ? seal_chunks_->take() : std::make_unique_for_overwrite<uint8_t[]>(capacity);
    size_t used = 0;
    while (index < pending_.size()) {
      if (!sealer_->sealing()) sealer_->begin(pending_[index].frame);
      used += sealer_->sealNext(buffer.get() + used, capacity - used);
      if (sealer_->sealing()) break;  // the buffer is full
      ++index;
    }
    if (pooled) {
      frames->push_back(seal_chunks_->frameOf(std::move(buffer), used));
    } else {
      uint8_t* bytes = buffer.release();
      // A DetachedBuffer without an allocator frees its bytes with delete[].
      frames->push_back(std::make_shared<const OutboundFrame>(
          flatbuffers::DetachedBuffer(nullptr, false, bytes, capacity, bytes, used), 0, 0));
    }
  }
  return index - first;
}

void Connection::failPendingFromLoop() {
  auto pending = std::move(pending_);
  pending_.clear();
  // Held writes were queued after the pending ones: they fail after them, in order.
  if (shaper_) {
    for (auto& held : shaper_->takeAllFromLoop())
      pending.push_back(std::move(held));
  }
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
    if (shaper_) shaper_->stopFromLoop();
    tcp_->closeFromLoop();
    return;
  }
  assert(!reason.ok());
  error_ = reason;
  deadline_.reset();
  failPendingFromLoop();
  if (shaper_) shaper_->stopFromLoop();
  if (hooks_.on_closing) hooks_.on_closing(*this, error_);
  tcp_->closeFromLoop();
}

void Connection::closeAfterFlushFromLoop(const Status& reason) {
  assert(EventLoop::onThreadOf(loop_));
  if (!open()) return;
  assert(!reason.ok());
  // Queued frames go to libuv before the FIN; held ones too, at once (a closing link does not
  // hold its last frames back).
  if (shaper_) shaper_->releaseFromLoop(true);
  flushFromLoop(/*everything=*/true);
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
