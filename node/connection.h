// One TCP connection between two nodes: reads frames through a FrameDecoder, writes shared
// frames, tracks queued bytes, and closes with a sticky first error. Protocol decisions
// (handshake, sender checks, dispatch) belong to the Node. Internal header; loop thread only.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "node/frame.h"
#include "node/protocol.h"
#include "node/status.h"
#include "node/uv_handles.h"

namespace chorus::node {

// Connection::setLinkLoss: the most retransmissions one frame may wait for (1 + 2 + 4
// time-outs), so that the longest stall is known and can be kept below the peer time-out.
inline constexpr int kMaxLinkRetransmissions = 3;

class Connection {
 public:
  enum class Role { kDialer, kAcceptor };
  using Clock = std::chrono::steady_clock;

  struct Hooks {
    // A verified frame arrived; return false to stop taking frames from this read.
    std::function<bool(Connection&, InboundFrame&&)> on_frame;
    // The connection failed or is being closed; fires exactly once with the first error.
    std::function<void(Connection&, const Status&)> on_closing;
    // The socket is closed and every request on it completed; the owner may now delete it.
    std::function<void(Connection&)> on_released;
    // Queued bytes changed (after a write was queued or completed).
    std::function<void(Connection&)> on_queue_changed;
    // Bytes moved, for the per-peer counters.
    std::function<void(Connection&, size_t bytes)> on_bytes_in;
    std::function<void(Connection&, size_t bytes)> on_bytes_out;
    // A frame drew a loss (setLinkLoss) and waits for its retransmissions.
    std::function<void(Connection&)> on_frame_lost;
  };

  Connection(uv_loop_t* loop, uv::HandlePtr<uv::Tcp> tcp, Role role, FrameLimits limits,
             Hooks hooks);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Writes of at most this many TCP packets (uv::writeSliceFor; 0: uncut). Set before start.
  void setWriteSlicePackets(size_t packets) { write_slice_packets_ = packets; }
  // Fault injection: every frame written waits `delay` plus a uniform draw from [0, jitter)
  // before it goes to the socket, never overtaking an earlier frame (a link with latency, for
  // experiments; docs/stragglers.md). Zero: frames go at once. Set before start.
  void setLinkDelay(std::chrono::microseconds delay, std::chrono::microseconds jitter,
                    uint64_t seed);
  // Fault injection: with `probability` a frame is lost as TCP would lose a segment, and waits
  // `rto` more, doubled for each further loss (at most kMaxLinkRetransmissions); the frames
  // behind it wait too. Draws from setLinkDelay's seed. Set before start.
  void setLinkLoss(double probability, std::chrono::microseconds rto) {
    link_loss_ = probability;
    link_rto_ = rto;
  }
  // Where inbound attachments go (FrameDecoder::setPlacer). Set before start.
  void setPlacer(FrameDecoder::Placer placer) { decoder_.setPlacer(std::move(placer)); }
  // The node-wide budget every inbound buffer is reserved from (FrameDecoder::setBudget).
  // Set before start.
  void setInboundBudget(InboundBudget* budget) { decoder_.setBudget(budget); }
  // Frames above `bytes` close the connection until liftFrameLimitFromLoop(): before the
  // handshake a peer is nobody, and a Hello fits in a few KiB. Set before start.
  void limitFramesBeforeHandshake(uint32_t bytes) {
    decoder_.setMaxFrameBytes(bytes, " before the handshake");
  }
  // The peer is authenticated: frames up to the full limit from the next one on.
  void liftFrameLimitFromLoop();
  // Starts reading, TCP_NODELAY and the write slice. The socket must be connected.
  void startFromLoop();
  // Queues a frame; `done` fires exactly once (at once with the sticky error when closed).
  // With no write in flight the frame goes to libuv at once; otherwise it waits and every
  // frame queued meanwhile leaves when the write in flight completes, in writes of at most
  // uv::writeSliceFor(MSS, packets) bytes each.
  void writeFromLoop(SharedFrame frame, std::function<void(const Status&)> done);
  // The same for a frame whose attachment may change once this returns: when nothing is queued
  // the socket takes what it can at once, and whatever it did not take is copied and queued.
  void writeTransientFromLoop(const SharedFrame& frame, std::function<void(const Status&)> done);
  // Closes now; pending writes complete with an error. First error wins; later calls no-op.
  void closeFromLoop(const Status& reason);
  // Records `reason`, stops reading, lets queued writes drain, sends FIN, then closes.
  void closeAfterFlushFromLoop(const Status& reason);
  // Arms the connection's single deadline (connect, handshake or linger); on expiry the
  // connection closes with `reason`.
  void armDeadlineFromLoop(std::chrono::milliseconds after, const Status& reason);
  void disarmDeadlineFromLoop();

  // The TCP handle (for connect on a dialing connection).
  uv::Tcp& tcp() { return *tcp_; }
  // The sticky error (ok while open).
  const Status& error() const { return error_; }
  bool open() const { return error_.ok(); }
  Role role() const { return role_; }
  // Bytes written by us and not yet completed.
  size_t queuedBytes() const { return queued_bytes_; }
  // "peer N (host:port)" once known, else "host:port".
  const std::string& description() const { return description_; }
  void setDescription(std::string description) { description_ = std::move(description); }

  // Protocol state owned by the Node.
  NodeId peer = 0;           // claimed (acceptor, after Hello) or dialed (dialer) id
  bool peer_known = false;   // `peer` is meaningful
  bool established = false;  // handshake completed
  bool sent_leave = false;   // we wrote Leave on this connection
  bool handshaking = false;  // an accepted connection counted against the handshake cap
  // With a cluster secret: the dialer's nonce (sent in Hello, or received in it), and the
  // acceptor's (sent in Challenge, or received in it; an acceptor holding one awaits the Proof).
  std::vector<uint8_t> dialer_nonce;
  std::vector<uint8_t> acceptor_nonce;
  std::string peer_run;  // acceptor: the run fingerprint of the dialer's Hello
  Clock::time_point last_receive = Clock::now();
  Clock::time_point last_send = Clock::now();

 private:
  struct PendingWrite {
    SharedFrame frame;
    std::function<void(const Status&)> done;
    size_t written_before = 0;  // bytes of the same frame the socket took at once
  };
  struct DelayedWrite {
    Clock::time_point due;
    PendingWrite write;
  };
  // Hands every pending frame to libuv as one request.
  void flushFromLoop();
  // Holds a write until its link delay has passed (queued bytes already count it).
  void delayFromLoop(PendingWrite write);
  // Moves the delayed writes that are due (all of them with `all`) to pending_ and flushes.
  void releaseDelayedFromLoop(bool all);
  void queueFromLoop(PendingWrite write);
  void failPendingFromLoop();
  void onReadFromLoop(ssize_t nread);
  void releaseFromLoop();

  uv_loop_t* loop_;
  uv::HandlePtr<uv::Tcp> tcp_;
  uv::HandlePtr<uv::Timer> deadline_;
  Role role_;
  FrameDecoder decoder_;
  Hooks hooks_;
  Status error_;
  size_t queued_bytes_ = 0;  // pending + in flight
  size_t write_slice_packets_ = 2;
  std::vector<PendingWrite> pending_;
  int writes_in_flight_ = 0;
  std::chrono::microseconds link_delay_{0};
  std::chrono::microseconds link_jitter_{0};
  double link_loss_ = 0;
  std::chrono::microseconds link_rto_{0};
  // Any link fault is set: every frame goes through delayed_.
  bool faultyLink() const {
    return link_delay_.count() > 0 || link_jitter_.count() > 0 || link_loss_ > 0;
  }
  std::mt19937_64 link_rng_;
  std::deque<DelayedWrite> delayed_;  // due times never decrease
  uv::HandlePtr<uv::Timer> delay_timer_;
  std::string description_;
};

}  // namespace chorus::node
