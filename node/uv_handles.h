// RAII wrappers for the libuv handles the runtime uses. Internal header: <uv.h> stays out of
// the public API (node/node.h).
//
// Each wrapper is non-copyable and non-movable, lives on the heap, sets handle.data = this and
// frees itself only in its close callback. Owners hold it through HandlePtr, whose deleter
// starts the close. Every method must run on the loop thread (hence "FromLoop").
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "node/frame.h"
#include "node/status.h"

namespace chorus::node::uv {

// An error value for a failed libuv call: "<what>: <uv error name> (<message>)".
Status uvError(int rc, std::string_view what, ErrorCode code = ErrorCode::kIo);

template <typename Derived, typename UvHandle>
class Handle {
 public:
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&&) = delete;
  Handle& operator=(Handle&&) = delete;

  // Starts closing; the object deletes itself in the close callback, after running the
  // callback set with setOnClosed(). Idempotent.
  void closeFromLoop() {
    if (closing_) return;
    closing_ = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&handle_), &Handle::onClosed);
  }
  // Runs once in the close callback, just before the memory is freed.
  void setOnClosed(std::function<void()> on_closed) { on_closed_ = std::move(on_closed); }
  // True once closeFromLoop() ran.
  bool closing() const { return closing_; }
  // The libuv handle.
  UvHandle* get() { return &handle_; }

 protected:
  Handle() = default;
  ~Handle() = default;
  // Must be called right after uv_*_init succeeded.
  void bindData() { handle_.data = static_cast<Derived*>(this); }

  UvHandle handle_{};

 private:
  static void onClosed(uv_handle_t* handle) {
    auto* self = static_cast<Derived*>(handle->data);
    auto on_closed = std::move(self->on_closed_);
    if (on_closed) on_closed();
    delete self;
  }

  bool closing_ = false;
  std::function<void()> on_closed_;
};

// Closes (never deletes directly) the handle it owns.
struct HandleCloser {
  template <typename T>
  void operator()(T* handle) const {
    handle->closeFromLoop();
  }
};
template <typename T>
using HandlePtr = std::unique_ptr<T, HandleCloser>;

// uv_timer_t.
class Timer : public Handle<Timer, uv_timer_t> {
 public:
  // A stopped timer on `loop`.
  static HandlePtr<Timer> create(uv_loop_t* loop);
  // (Re)arms: `fire` runs after `timeout_ms`, then every `repeat_ms` when non-zero.
  void startFromLoop(uint64_t timeout_ms, uint64_t repeat_ms, std::function<void()> fire);
  // Disarms without closing.
  void stopFromLoop();

 private:
  friend class Handle<Timer, uv_timer_t>;
  Timer() = default;
  ~Timer() = default;
  static void onTimer(uv_timer_t* timer);
  std::function<void()> fire_;
};

// uv_async_t: the doorbell other threads ring.
class Async : public Handle<Async, uv_async_t> {
 public:
  // `wake` runs on the loop thread after one or more send() calls (libuv coalesces them).
  static HandlePtr<Async> create(uv_loop_t* loop, std::function<void()> wake);
  // Thread-safe.
  void send() { uv_async_send(&handle_); }

 private:
  friend class Handle<Async, uv_async_t>;
  Async() = default;
  ~Async() = default;
  static void onWake(uv_async_t* async);
  std::function<void()> wake_;
};

// uv_tcp_t, for listeners and connections. Every completion callback fires exactly once,
// including when the handle is closed first (then with a kClosed / cancelled status).
class Tcp : public Handle<Tcp, uv_tcp_t> {
 public:
  // Supplies the memory the next read fills.
  using AllocFn = std::function<std::span<uint8_t>()>;
  // Bytes read (> 0), or a negative libuv error (UV_EOF at end of stream).
  using ReadFn = std::function<void(ssize_t nread)>;
  using DoneFn = std::function<void(const Status&)>;

  static HandlePtr<Tcp> create(uv_loop_t* loop);

  Status bindFromLoop(const sockaddr* address);
  // `on_connection` runs per pending connection (accept it with acceptFromLoop).
  Status listenFromLoop(int backlog, std::function<void(const Status&)> on_connection);
  Status acceptFromLoop(Tcp& client);
  // On success `done` fires exactly once later; on a returned error it never fires.
  Status connectFromLoop(const sockaddr* address, DoneFn done);
  Status readStartFromLoop(AllocFn alloc, ReadFn read);
  void readStopFromLoop();
  // Writes the frames back to back, in writes of at most the write slice each (one writev
  // each; a frame may span two); the frames stay alive until `done`. On success `done` fires
  // exactly once later, with the first error of any slice; on a returned error it never fires.
  Status writeFromLoop(std::vector<SharedFrame> frames, DoneFn done);
  // Writes as much of `frame` as the socket takes at once (uv_try_write, cut as
  // writeFromLoop cuts), into `written`; an error other than "would block" is returned. Only
  // when libuv holds no write of this handle, or the bytes would overtake it.
  Status tryWriteFromLoop(const SharedFrame& frame, size_t* written);
  // Caps the bytes of each write at writeSliceFor(MSS, packets), the MSS read again for every
  // write that may need cutting: the kernel's MSS starts at half the peer's first window
  // (32 KiB on loopback) and grows during the first exchanges. 0 packets: no cap.
  void sliceWritesByMssFromLoop(size_t packets) { slice_packets_ = packets; }
  // Caps the bytes of each write at `bytes` instead (0: one write per writeFromLoop call).
  void setWriteSliceFromLoop(size_t bytes) {
    slice_packets_ = 0;
    write_slice_ = bytes;
  }
  // The connection's current maximum segment size (TCP_MAXSEG), or 0 when the kernel does not
  // say.
  size_t maxSegmentFromLoop();
  // Sends FIN after queued writes; same callback contract as writeFromLoop.
  Status shutdownFromLoop(DoneFn done);
  Status setNoDelayFromLoop();
  // Bound local port (0 when unknown).
  uint16_t localPortFromLoop();
  // "host:port" of the remote end, or "?" when unknown.
  std::string peerNameFromLoop();

 private:
  friend class Handle<Tcp, uv_tcp_t>;
  Tcp() = default;
  ~Tcp() = default;
  // The write slice for a batch of `total` bytes (0: no cut).
  size_t sliceForBatchFromLoop(size_t total);
  std::function<void(const Status&)> on_connection_;
  AllocFn alloc_;
  ReadFn read_;
  size_t write_slice_ = 0;
  size_t slice_packets_ = 0;  // > 0: the cap follows the MSS
};

// The most payload bytes the kernel puts into one packet it hands to the device: a 64 KiB GSO
// packet less one byte and the room it keeps for headers (Linux's tcp_tso_autosize()).
inline constexpr size_t kLargestPacketPayload = 64 * 1024 - 1 - 320;
// No packet of whole segments filling at most kLargestPacketPayload carries less than this.
inline constexpr size_t kSmallestPacketPayload = kLargestPacketPayload / 2;

// The buffers of consecutive writes that carry `frames` in order, each write at most `slice`
// bytes (0: one write). A frame larger than what is left of a write continues in the next.
std::vector<std::vector<uv_buf_t>> sliceForWrites(const std::vector<SharedFrame>& frames,
                                                  size_t slice);

// Bytes per write for a connection with this MSS: `packets` of the largest packets TCP builds
// (whole segments filling at most kLargestPacketPayload, and at least one), or 0 (no cap) when
// the MSS is unknown or `packets` is 0. Two is the default (NodeOptions::write_slice_packets).
// With BBR, the Linux default on many distributions, the kernel paces each socket itself when
// the qdisc does not, and a flow that was idle may send two packets at once before the pacing
// timer holds the rest. A larger write makes its third packet wait for a timer that fires on
// whichever CPU, so segments of one connection leave from two CPUs and arrive out of order; the
// reordering lowers BBR's bandwidth estimate and more packets wait for timers. On loopback
// (MSS 65,483) request/reply traffic in writes of 131,072 bytes ran at half the speed of
// writes of 130,966, with 15-20 times the pacing timers (bench/README).
size_t writeSliceFor(size_t mss, size_t packets);

// Formats a sockaddr as "host:port".
std::string formatAddress(const sockaddr* address);

}  // namespace chorus::node::uv
