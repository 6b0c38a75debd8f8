// Node::Impl: the runtime's state and the methods that run it. Internal header, shared by
// node/node.cc (the any-thread face: validation, the mailbox crossing, the blocking waits, the
// public API) and node/router.cc (the loop thread: connections, handshake glue, dispatch by
// message type, Leave). Thread rules: docs/threading.md.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "node/connection.h"
#include "node/dialer.h"
#include "node/event_loop.h"
#include "node/handshake.h"
#include "node/liveness.h"
#include "node/membership.h"
#include "node/node.h"
#include "node/repeated_log.h"
#include "node/uv_handles.h"

namespace chorus::node {

using std::chrono::milliseconds;

// Nanoseconds on the steady clock (Header.send_time_ns, Heartbeat.echo_time_ns).
int64_t steadyNowNs();

class Node::Impl {
 public:
  explicit Impl(NodeOptions options);
  ~Impl() { shutdown(milliseconds(0)); }

  // ---- any thread: the public Node API, one for one (node/node.h says what each does) ----

  Status listen();
  Status connect(std::vector<PeerAddress> peers);
  Status waitClusterReady(milliseconds timeout) { return membership_.waitReady(timeout, running_); }
  // A runtime message (the node's own frames: handshake, heartbeat, Leave).
  SharedFrame encode(wire::Body type, const BodyWriter& write_body, size_t size_hint = 0,
                     Attachment attachment = {});
  SharedFrame encode(MessageType type, const BodyWriter& write_message, size_t size_hint = 0,
                     Attachment attachment = {});
  void send(NodeId to, const SharedFrame& frame, const SendCallback& done,
            const SendOptions& options);
  void broadcast(const std::vector<NodeId>& to, const SharedFrame& frame, const SendCallback& done,
                 const SendOptions& options);
  void sendTransient(NodeId to, const SharedFrame& frame, const SendCallback& done);
  bool post(std::function<void()> fn) { return running_.load() && loop_.post(std::move(fn)); }
  uint64_t startTimer(milliseconds period, std::function<void()> fire);
  void stopTimer(uint64_t id);
  void setHandler(MessageType type, FrameHandler handler);
  void setAttachmentPlacer(MessageType type, AttachmentPlacer placer);
  void setEventHandler(EventHandler handler);
  bool deliverForTesting(NodeId from, const InboundFrame& frame);
  InboundStats inboundStats() const;
  void shutdown(milliseconds linger);
  PeerStats stats(NodeId peer) const { return membership_.stats(peer); }
  PeerStats totals() const { return membership_.totals(); }
  std::vector<NodeId> connectedPeers() const { return membership_.connected(); }
  uint16_t port() const { return port_.load(); }
  int loopCloseResult() const { return loop_close_result_; }
  bool onLoopThread() const { return loop_.onLoopThread(); }

  NodeOptions options_;  // fixed after construction
  std::shared_ptr<spdlog::logger> logger_;

 private:
  // One member's established connection and its flow-control state.
  struct PeerLink {
    Connection* connection = nullptr;
    bool slow = false;
  };
  // An open connection and, until it is established, its handshake.
  struct OpenConnection {
    std::unique_ptr<Connection> connection;
    std::unique_ptr<Handshake> handshake;
  };

  // Before the loop starts, or on it: now; else on the loop, and returns once it ran there, so
  // that a handler set from another thread is in place for the next frame that arrives (a
  // frame arriving between the call and a posted install was dropped as "no handler").
  void onLoopOrNow(std::function<void()> apply);

  // Runs `fn` on the loop thread and waits for its Status.
  Status runOnLoop(std::function<Status()> fn);
  void checkLoopThread() const { assert(loop_.onLoopThread()); }

  // ---- loop thread (node/router.cc) ----

  // Binds and listens, starts the liveness timer.
  Status listenFromLoop(const sockaddr_storage& address);
  // A connection with this node's limits, link shape, queue limit and a fresh Handshake (a
  // dialer's with the `dialed` peer).
  Connection* createConnectionFromLoop(uv::HandlePtr<uv::Tcp> tcp, Connection::Role role,
                                       NodeId dialed = 0);
  // The counters of an established connection's peer, or null.
  PeerCounters* countersFor(const Connection& c);
  // The established connections (for Liveness).
  std::vector<Connection*> establishedFromLoop();
  // Accepts one connection, within the handshake cap, and arms its handshake deadline.
  void onIncomingConnectionFromLoop(const Status& status);

  // Dialer: one attempt to `peer`.
  Connection* openAttemptFromLoop(NodeId peer, const sockaddr_storage& address,
                                  const std::string& address_text);
  // Dialer: TCP connected; the Handshake writes the Hello.
  void onConnectedFromLoop(Connection& connection, const Status& status);
  // The connection's deadline for the frame its Handshake awaits.
  void armHandshakeDeadlineFromLoop(Connection& connection);
  void writeHandshakeFromLoop(Connection& connection, const HandshakeMessage& message);
  // Every verified inbound frame: to the Handshake until established, then dispatch by body
  // type. False stops reading from this connection for now.
  bool onFrameFromLoop(Connection& connection, const InboundFrame& frame);
  // A service's frame from an established peer: to the handler of its (service, kind).
  bool onServiceFrameFromLoop(Connection& connection, const InboundFrame& frame);
  // Registers `service` (the first handler or placer set for it); a second spec with the same
  // id is a programming error.
  void registerServiceFromLoop(const ServiceSpec* service);
  // The spec of a registered service, or null.
  const ServiceSpec* serviceFromLoop(ServiceId id) const;

  // Carries out what the connection's Handshake answers to one frame.
  bool onHandshakeFrameFromLoop(Connection& connection, const wire::Envelope& envelope);
  bool protocolErrorFromLoop(Connection& connection, std::string reason);

  // Acceptor: why a dialer claiming `id` (of this cluster) cannot be welcomed now, or "". With a
  // secret, asked only once the dialer proved it.
  std::string memberRefusalFromLoop(NodeId id);

  // A handshake with `peer` failed for a reason no retry changes: stop dialing it and end
  // waitClusterReady() at once with `reason`.
  void giveUpFromLoop(NodeId peer, const std::string& reason);

  // Writes our Refuse, records the reason for waitClusterReady's report, and closes once the
  // Refuse is written (or the handshake time-out passes).
  void refuseFromLoop(Connection& connection, NodeId id, const HandshakeMessage& refuse);

  // An accepted connection left its handshake (established or closing).
  void endHandshakeFromLoop(Connection& connection);
  // The handshake completed: the peer is up (Membership, Dialer, an event).
  void establishFromLoop(Connection& connection);
  // Leave received: answered with Leave, closed after flushing.
  void handleLeaveFromLoop(Connection& connection, const wire::Envelope& envelope);
  void sendLeaveFromLoop(Connection& connection, const std::string& reason);
  // A connection closes: a down/left event for a member's connection, a retry for an attempt.
  void onClosingFromLoop(Connection& connection, const Status& status);
  // Its socket is closed: the connection is deleted.
  void onReleasedFromLoop(Connection& connection);
  // Queued bytes changed: the counters, and kSlow/kDrained at the watermarks.
  void onQueueChangedFromLoop(Connection& connection);

  // The open connection to `to`, or null after failing `done` with why there is none.
  Connection* connectionForSendFromLoop(NodeId to, const SendCallback& done);
  void sendFromLoop(NodeId to, const SharedFrame& frame, const SendCallback& done,
                    const SendOptions& options);
  void emitFromLoop(const PeerEvent& event);
  // Shutdown, step 1: stop listening and dialing, Leave on every established connection.
  void beginLeaveFromLoop(milliseconds linger);
  // Shutdown, step 3: close every handle, stop the loop.
  void closeAllFromLoop();

  // The open connections, copied: closing one may release another from the map.
  std::vector<Connection*> snapshotFromLoop();

  FrameLimits limits_;
  // Declared before loop_: frames handed to handlers hold reservations until they die.
  InboundBudget budget_;
  std::atomic<uint64_t> oversized_handshakes_{0};
  std::atomic<uint64_t> handshaking_{0};  // written on the loop thread only
  std::atomic<uint64_t> refused_connections_{0};
  EventLoop loop_;
  Membership membership_;  // any thread (its own lock)
  std::atomic<uint64_t> next_sequence_{1};
  std::atomic<uint16_t> port_{0};
  std::atomic<bool> running_{false};
  std::mutex shutdown_mutex_;
  bool shut_down_ = false;
  int loop_close_result_ = 0;

  // Loop thread only (the units' handles live on the loop).
  HandshakeSettings handshake_settings_;
  Dialer dialer_;
  Liveness liveness_;
  std::map<NodeId, PeerLink> peers_;  // every other member; fixed keys
  std::unordered_map<Connection*, OpenConnection> connections_;
  uint64_t connections_created_ = 0;
  uv::HandlePtr<uv::Tcp> listener_;
  // By messageKind(service, kind).
  std::map<ServiceId, const ServiceSpec*> services_;
  std::map<uint32_t, FrameHandler> handlers_;
  std::map<uint32_t, AttachmentPlacer> placers_;
  // Frames of services this node has not registered, per peer (dropped and logged).
  RefusalLog unknown_services_;
  EventHandler event_handler_;
  // Node::startTimer's timers, by id (ids from next_timer_, any thread).
  std::map<uint64_t, uv::HandlePtr<uv::Timer>> timers_;
  std::atomic<uint64_t> next_timer_{1};
  std::set<uint64_t> cancelled_timers_;  // stopped before they were armed
  bool leaving_ = false;
  bool stopped_ = false;
};

}  // namespace chorus::node
