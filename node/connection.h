// One TCP connection between two nodes: reads frames through a FrameDecoder, writes shared
// frames, tracks queued bytes, and closes with a sticky first error. Protocol decisions
// (handshake, sender checks, dispatch) belong to the Node. Internal header; loop thread only.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "node/chunk_pool.h"
#include "node/frame.h"
#include "node/frame_cipher.h"
#include "node/link_shaper.h"
#include "node/protocol.h"
#include "node/send_policy.h"
#include "node/status.h"
#include "node/uv_handles.h"

namespace chorus::node {

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
    // A frame drew a loss (setLinkShape) and waits for its retransmissions.
    std::function<void(Connection&)> on_frame_lost;
  };

  Connection(uv_loop_t* loop, uv::HandlePtr<uv::Tcp> tcp, Role role, FrameLimits limits,
             Hooks hooks);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Writes of at most this many TCP packets (uv::writeSliceFor; 0: uncut). Set before start.
  void setWriteSlicePackets(size_t packets) { write_slice_packets_ = packets; }
  // Fault injection: every frame written goes through a LinkShaper (delay, jitter, loss) before
  // it reaches the socket, in order (docs/stragglers.md). Inactive shape: frames go at once.
  // Set before start.
  void setLinkShape(const LinkShape& shape);
  // The most bytes queued on this connection (send-side backpressure; 0: no limit). Set before
  // start.
  void setQueueLimit(size_t bytes) { queue_limit_ = bytes; }
  // Where inbound attachments go (FrameDecoder::setPlacer). Set before start.
  void setPlacer(FrameDecoder::Placer placer) { decoder_.setPlacer(std::move(placer)); }
  // The services whose messages are verified on arrival (FrameDecoder::setServices). Set
  // before start.
  void setServices(FrameDecoder::ServiceLookup services) {
    decoder_.setServices(std::move(services));
  }
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
  // Every frame queued from now on is sealed with `key` (node/frame_cipher.h) when it is handed
  // to the socket, in wire order. Frames queued before stay clear.
  void sealOutboundFromLoop(const SessionKey& key);
  // Every frame read from the next one on must be sealed with `key`; one that does not open
  // closes the connection (kBadFrame). Call between frames (from on_frame).
  void openInboundFromLoop(const SessionKey& key);
  // Frames written from now on are sealed.
  bool sealsOutbound() const { return sealer_ != nullptr; }
  // Starts reading, TCP_NODELAY and the write slice. The socket must be connected.
  void startFromLoop();
  // Queues a frame; `done` fires exactly once (at once with the sticky error when closed).
  // With no write in flight the frame goes to libuv at once; otherwise it waits and every
  // frame queued meanwhile leaves when the write in flight completes, in writes of at most
  // uv::writeSliceFor(MSS, packets) bytes each. A frame that would take the queue above its
  // limit is handled by `options.when_full` (send_policy.h): refused with kOverloaded, or older
  // frames of its kind not yet handed to the socket are dropped (their `done` fires with
  // kOverloaded) to make room. A frame always fits an empty queue.
  void writeFromLoop(SharedFrame frame, std::function<void(const Status&)> done,
                     const SendOptions& options = {});
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
  // Frames dropped for a newer one of their kind, and frames refused for a full queue.
  uint64_t framesSuperseded() const { return frames_superseded_; }
  uint64_t framesRefused() const { return frames_refused_; }
  // "peer N (host:port)" once known, else "host:port".
  const std::string& description() const { return description_; }
  void setDescription(std::string description) { description_ = std::move(description); }

  // Protocol state owned by the Node.
  NodeId peer = 0;           // claimed (acceptor, after Hello) or dialed (dialer) id
  bool peer_known = false;   // `peer` is meaningful
  bool established = false;  // handshake completed
  bool sent_leave = false;   // we wrote Leave on this connection
  bool handshaking = false;  // an accepted connection counted against the handshake cap
  Clock::time_point last_receive = Clock::now();
  Clock::time_point last_send = Clock::now();

 private:
  // Hands pending frames to libuv as one request: every one on a clear connection or with
  // `everything`; else on a sealed connection one chunk's worth (sealPendingFromLoop).
  void flushFromLoop(bool everything = false);
  // Seals pending frames from the front into chunks (at most `max_chunks`), appending them to
  // `frames`; returns how many pending writes were sealed to their end. A frame cut at a
  // chunk's end stays first in pending_, begun in the sealer.
  size_t sealPendingFromLoop(size_t first, size_t max_chunks, std::vector<SharedFrame>* frames);
  void queueFromLoop(QueuedWrite write);
  // Makes room for a frame of `bytes` under the queue limit as `when_full` says, moving the
  // frames it drops to *dropped; false: no room.
  bool admitFromLoop(size_t bytes, uint32_t kind, WhenFull when_full,
                     std::vector<QueuedWrite>* dropped);
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
  size_t queued_bytes_ = 0;  // pending + in flight + held by the shaper
  size_t queue_limit_ = 0;
  uint64_t frames_superseded_ = 0;
  uint64_t frames_refused_ = 0;
  size_t write_slice_packets_ = 2;
  std::vector<QueuedWrite> pending_;
  int writes_in_flight_ = 0;
  std::unique_ptr<LinkShaper> shaper_;      // only with an active LinkShape
  std::unique_ptr<FrameSealer> sealer_;     // once the handshake derived the session keys
  std::shared_ptr<ChunkPool> seal_chunks_;  // what large sealed frames are written through
  std::string description_;
};

}  // namespace chorus::node
