// The peer runtime: one node of a chorus cluster. Owns a loop thread (libuv), a listener,
// one TCP connection per peer, framing, the handshake, heartbeats and backpressure.
// Thread model and error policy: docs/threading.md, docs/errors.md.
#pragma once

#include <spdlog/common.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/chorus_generated.h"
#include "node/frame.h"
#include "node/options.h"
#include "node/protocol.h"
#include "node/send_policy.h"
#include "node/service.h"
#include "node/status.h"

namespace spdlog {
class logger;
}

namespace chorus::node {

// Where a peer listens.
struct PeerAddress {
  NodeId id = 0;
  std::string host;  // IPv4/IPv6 literal or a resolvable name ("localhost")
  uint16_t port = 0;
};

enum class PeerEventKind {
  kUp,       // handshake completed (again)
  kDown,     // connection lost: closed, timed out, or closed by us after a bad frame
  kLeft,     // the peer said Leave: an orderly departure, not a failure
  kRefused,  // a handshake with this peer was refused (by it or by us); reason says why
  kSlow,     // queued bytes to the peer reached the high watermark
  kDrained,  // queued bytes to a slow peer fell to the low watermark
};
const char* peerEventName(PeerEventKind kind);

// A membership or flow-control event for the layer above.
struct PeerEvent {
  PeerEventKind kind = PeerEventKind::kUp;
  NodeId peer = 0;
  std::string reason;  // why (empty for kUp)
};

// Counters per peer, readable from any thread.
struct PeerStats {
  bool connected = false;
  bool slow = false;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t frames_in = 0;
  uint64_t frames_out = 0;
  uint64_t queued_bytes = 0;
  uint64_t times_up = 0;     // completed handshakes
  uint64_t frames_lost = 0;  // frames held back by link_loss (fault injection)
  // Send-side backpressure (NodeOptions::max_queued_bytes): frames dropped for a newer one of
  // their kind (WhenFull::kDropOlderOfKind), and frames refused because the queue was full.
  uint64_t frames_superseded = 0;
  uint64_t frames_refused = 0;
};

// Runs on the loop thread with the sender and the frame of a service message, whose message
// passed the service's Verifier (read it with messageOf<Root>(frame)); valid during the call.
using FrameHandler = std::function<void(NodeId from, const InboundFrame& frame)>;
// Runs on the loop thread when a service frame from an established peer announced an
// attachment of `bytes` (its message verified as for a FrameHandler): where to read it
// (FrameDecoder::Placer), or null for a buffer of the frame's own.
using AttachmentPlacer = std::function<std::unique_ptr<AttachmentLanding>(
    NodeId from, const InboundFrame& frame, size_t bytes)>;
// Runs on the loop thread.
using EventHandler = std::function<void(const PeerEvent& event)>;
// Fires exactly once per (frame, peer): ok once the bytes were handed to the kernel, else why
// not. Runs on the loop thread, or on the caller's thread when the node is not running.
using SendCallback = std::function<void(NodeId peer, const Status& status)>;

class Node {
 public:
  explicit Node(NodeOptions options);
  // Shuts down (without lingering) when still running.
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Sets the handler for one message type of a service, replacing any earlier one (an empty
  // handler removes it). The first call for a service registers it: from then on its messages
  // are verified with its spec (which must outlive the node); a frame of a service never
  // registered is dropped with a warning naming the peer. Before listen() or from any thread
  // after: it is in place when this returns (set on the loop thread; another thread waits for
  // it, so it must not hold what a loop callback waits for).
  void setHandler(MessageType type, FrameHandler handler);
  // Sets where attachments of one message type are read to; same threading as setHandler().
  void setAttachmentPlacer(MessageType type, AttachmentPlacer placer);
  // Sets the membership/flow-control event handler; same threading as setHandler().
  void setEventHandler(EventHandler handler);
  // Tests and fuzz targets only, on a node that never listened (no loop thread): hands `frame`,
  // which came out of a FrameDecoder that verified it with this node's services, to the handler
  // of its message type as if established peer `from` had sent it, on the calling thread. False
  // when no handler takes it (a running node drops such a frame, too). The seam through which a
  // fuzzer reaches a mode's real handlers without sockets (tests/fuzz/fuzz_ps_messages.cc).
  bool deliverForTesting(NodeId from, const InboundFrame& frame);

  // Binds the listener and starts the loop thread; port() then returns the bound port.
  Status listen();
  // Bound port (0 before listen()).
  uint16_t port() const;
  // Names the peers this node must be connected to, any subset of the other members (every
  // member in PS mode; the topology neighbors suffice for gossip): the ones with a higher id
  // are dialed (with capped exponential backoff, again after every loss); the others are
  // expected to dial us. waitClusterReady() counts these peers only. Call once, after listen().
  Status connect(std::vector<PeerAddress> peers);
  // Blocks until every peer given to connect() is connected, or `timeout`; the error lists
  // the peers still missing and the last reason seen for each.
  Status waitClusterReady(std::chrono::milliseconds timeout);
  // Same, with options().cluster_ready_timeout.
  Status waitClusterReady();

  // Serializes one frame of a service's message on the calling thread (header filled by the
  // node, with a fresh sequence number; `write_message` writes the service's root table:
  // encodeFrame()). Share the result between send()/broadcast() calls. `attachment` is
  // referenced, not copied (OutboundFrame).
  SharedFrame encode(MessageType type, const BodyWriter& write_message, size_t size_hint = 0,
                     Attachment attachment = {});
  // Queues a frame for one peer; any thread. `done` fires exactly once. A frame's attachment
  // must stay unchanged until then. When the peer's queue is full (max_queued_bytes) the frame
  // is refused with kOverloaded.
  void send(NodeId to, const SharedFrame& frame, const SendCallback& done = {});
  // The same, with what to do when the peer's queue is full (send_policy.h).
  void send(NodeId to, const SharedFrame& frame, const SendOptions& options,
            const SendCallback& done = {});
  // Loop thread: sends a frame whose attachment may change as soon as this returns. What the
  // socket does not take at once is copied (all of it when other frames are queued to `to`).
  void sendTransient(NodeId to, const SharedFrame& frame, const SendCallback& done = {});
  // Queues the same frame (one buffer) for each peer; `done` fires exactly once per peer.
  void broadcast(const std::vector<NodeId>& to, const SharedFrame& frame,
                 const SendCallback& done = {});
  // The same, with what to do when a peer's queue is full (send_policy.h).
  void broadcast(const std::vector<NodeId>& to, const SharedFrame& frame,
                 const SendOptions& options, const SendCallback& done = {});
  // Runs `fn` on the loop thread; false when the node no longer runs (fn is dropped).
  bool post(std::function<void()> fn);
  // A repeating timer on the loop thread: `fire` runs there every `period` (at least 1 ms; libuv
  // timers count whole milliseconds), first one period from now, until stopTimer() or shutdown.
  // Any thread, once listen() succeeded; returns the timer's id, or 0 when the node does not
  // run (nothing is armed).
  uint64_t startTimer(std::chrono::milliseconds period, std::function<void()> fire);
  // Disarms and closes timer `id` (unknown ids and repeats do nothing). Any thread: from another
  // one it returns once that is done on the loop, so `fire` never runs after this returns; from
  // `fire` itself, the running call completes and no later one starts.
  void stopTimer(uint64_t id);
  // True on this node's loop thread.
  bool onLoopThread() const;

  // Counters for one peer; any thread.
  PeerStats stats(NodeId peer) const;
  // Byte, frame and queue counters summed over every peer (the flags are false); any thread.
  PeerStats totals() const;
  // Peers with an established connection, sorted; any thread.
  std::vector<NodeId> connectedPeers() const;
  // The inbound budget and the handshake cap: what is held now, the peak, what was refused;
  // any thread.
  InboundStats inboundStats() const;

  // Orderly shutdown: sends Leave to every connected peer, waits up to `linger` for them to
  // answer or close, then closes everything and joins the loop thread. Idempotent; never on
  // the loop thread.
  void shutdown(std::chrono::milliseconds linger = std::chrono::milliseconds(2000));
  // uv_loop_close()'s result after shutdown() (0 means every handle was closed).
  int loopCloseResult() const;

  // This node's id.
  NodeId id() const;
  // The options the node runs with.
  const NodeOptions& options() const;
  // The node's logger (its name carries the node id).
  spdlog::logger& logger() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace chorus::node
