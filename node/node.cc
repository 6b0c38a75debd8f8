// The node as a router: it owns the loop, the listener and the connections, hands frames of a
// connection in its handshake to that connection's Handshake and frames of an established peer
// to the handler of their body type, and wires the units that do the rest: Membership (who is
// expected and connected, the ready wait), Dialer (attempts and backoff), Liveness (heartbeats,
// peer time-outs), LinkShaper (inside each Connection). Thread rules: docs/threading.md.
#include "node/node.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <csignal>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "node/address.h"
#include "node/connection.h"
#include "node/dialer.h"
#include "node/event_loop.h"
#include "node/handshake.h"
#include "node/liveness.h"
#include "node/membership.h"
#include "node/uv_handles.h"

namespace chorus::node {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int64_t steadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* peerEventName(PeerEventKind kind) {
  switch (kind) {
    case PeerEventKind::kUp:
      return "up";
    case PeerEventKind::kDown:
      return "down";
    case PeerEventKind::kLeft:
      return "left";
    case PeerEventKind::kRefused:
      return "refused";
    case PeerEventKind::kSlow:
      return "slow";
    case PeerEventKind::kDrained:
      return "drained";
  }
  return "unknown";
}

class Node::Impl {
 public:
  explicit Impl(NodeOptions options)
      : options_(std::move(options)),
        logger_(makeNodeLogger(options_)),
        limits_{options_.max_frame_bytes, options_.max_verifier_depth,
                options_.max_verifier_tables},
        budget_(options_.inbound_budget_bytes != 0
                    ? options_.inbound_budget_bytes
                    : 2 * (uint64_t{options_.max_frame_bytes} + kFramePrefixBytes)),
        loop_(logger_),
        membership_(options_, *logger_),
        dialer_(loop_.uvLoop(), options_, *logger_,
                [this](NodeId peer, const sockaddr_storage& address, const std::string& text) {
                  return openAttemptFromLoop(peer, address, text);
                }),
        liveness_(
            loop_.uvLoop(), options_.heartbeat_interval, options_.peer_timeout,
            [this] { return establishedFromLoop(); },
            [this] {
              const int64_t echo = steadyNowNs();
              return encode(wire::Body::Heartbeat, [echo](flatbuffers::FlatBufferBuilder& b) {
                return wire::CreateHeartbeat(b, echo).Union();
              });
            }) {
    handshake_settings_.cluster = options_.cluster;
    handshake_settings_.self = options_.self;
    handshake_settings_.key = options_.cluster_key;
    handshake_settings_.run_fingerprint = options_.run_fingerprint;
    handshake_settings_.member_refusal = [this](NodeId id) { return memberRefusalFromLoop(id); };
    for (NodeId id : options_.members) {
      if (id != options_.self) peers_[id];
    }
  }

  ~Impl() { shutdown(milliseconds(0)); }

  // ---- any thread ----

  Status listen() {
    if (Status status = validateOptions(options_); !status.ok()) return status;
    if (loop_.started()) return {ErrorCode::kInvalidArgument, "listen() was already called"};
    sockaddr_storage address{};
    if (Status status = resolveAddress(options_.listen_host, options_.listen_port, &address);
        !status.ok()) {
      return status;
    }
    loop_.start();
    running_.store(true);
    Status status = runOnLoop([this, address] { return listenFromLoop(address); });
    if (!status.ok()) shutdown(milliseconds(0));
    return status;
  }

  Status connect(std::vector<PeerAddress> peers) {
    if (!running_.load()) return {ErrorCode::kShutdown, "connect() needs a listening node"};
    std::vector<std::pair<PeerAddress, sockaddr_storage>> resolved;
    std::set<NodeId> seen;
    for (auto& peer : peers) {
      if (!membership_.isMember(peer.id)) {
        return {ErrorCode::kInvalidArgument,
                fmt::format("peer {} is not another member of cluster \"{}\"", peer.id,
                            options_.cluster)};
      }
      if (!seen.insert(peer.id).second) {
        return {ErrorCode::kInvalidArgument, fmt::format("peer {} listed twice", peer.id)};
      }
      sockaddr_storage address{};
      if (peer.id > options_.self) {
        if (Status status = resolveAddress(peer.host, peer.port, &address); !status.ok()) {
          return {status.code(), fmt::format("peer {}: {}", peer.id, status.message())};
        }
      }
      resolved.emplace_back(std::move(peer), address);
    }
    membership_.expect({seen.begin(), seen.end()});
    return runOnLoop([this, resolved] {
      // The lower id dials; the others are expected to dial this node.
      for (const auto& [peer, address] : resolved) {
        if (peer.id > options_.self) {
          dialer_.addFromLoop(peer.id, address, fmt::format("{}:{}", peer.host, peer.port));
        }
      }
      return Status{};
    });
  }

  Status waitClusterReady(milliseconds timeout) { return membership_.waitReady(timeout, running_); }

  SharedFrame encode(wire::Body type, const BodyWriter& write_body, size_t size_hint = 0,
                     Attachment attachment = {}) {
    EnvelopeHeader header{options_.self, options_.cluster, next_sequence_.fetch_add(1),
                          steadyNowNs()};
    return encodeFrame(header, type, write_body, size_hint, std::move(attachment));
  }

  void send(NodeId to, const SharedFrame& frame, const SendCallback& done,
            const SendOptions& options) {
    assert(frame != nullptr);
    if (loop_.onLoopThread()) {
      sendFromLoop(to, frame, done, options);
      return;
    }
    if (!running_.load() ||
        !loop_.post([this, to, frame, done, options] { sendFromLoop(to, frame, done, options); })) {
      if (done)
        done(to, {ErrorCode::kShutdown, fmt::format("node {} is not running", options_.self)});
    }
  }

  void broadcast(const std::vector<NodeId>& to, const SharedFrame& frame, const SendCallback& done,
                 const SendOptions& options) {
    assert(frame != nullptr);
    if (loop_.onLoopThread()) {
      for (NodeId peer : to)
        sendFromLoop(peer, frame, done, options);
      return;
    }
    // One closure for all peers: the frame is shared, never copied per connection.
    if (!running_.load() || !loop_.post([this, to, frame, done, options] {
          for (NodeId peer : to)
            sendFromLoop(peer, frame, done, options);
        })) {
      for (NodeId peer : to) {
        if (done)
          done(peer, {ErrorCode::kShutdown, fmt::format("node {} is not running", options_.self)});
      }
    }
  }

  void sendTransient(NodeId to, const SharedFrame& frame, const SendCallback& done) {
    assert(frame != nullptr);
    if (!loop_.onLoopThread()) {
      // Off the loop the bytes cannot be written before this returns: copy them all.
      send(to, frame->tailCopy(0), done, {});
      return;
    }
    Connection* connection = connectionForSendFromLoop(to, done);
    if (connection == nullptr) return;
    connection->writeTransientFromLoop(frame, [to, done](const Status& status) {
      if (done) done(to, status);
    });
  }

  bool post(std::function<void()> fn) { return running_.load() && loop_.post(std::move(fn)); }

  void setFrameHandler(wire::Body type, FrameHandler handler) {
    onLoopOrNow([this, type, handler = std::move(handler)]() mutable {
      handlers_[type] = std::move(handler);
    });
  }

  void setAttachmentPlacer(wire::Body type, AttachmentPlacer placer) {
    onLoopOrNow(
        [this, type, placer = std::move(placer)]() mutable { placers_[type] = std::move(placer); });
  }

  void setEventHandler(EventHandler handler) {
    auto apply = [this, handler = std::move(handler)]() mutable {
      event_handler_ = std::move(handler);
    };
    if (!loop_.started() || loop_.onLoopThread()) {
      apply();
    } else {
      loop_.post(std::move(apply));
    }
  }

  InboundStats inboundStats() const {
    InboundStats out;
    out.budget_bytes = budget_.budget();
    out.reserved_bytes = budget_.reserved();
    out.peak_reserved_bytes = budget_.peak();
    out.refused_frames = budget_.refused();
    out.oversized_handshakes = oversized_handshakes_.load();
    out.handshaking = handshaking_.load();
    out.refused_connections = refused_connections_.load();
    return out;
  }

  void shutdown(milliseconds linger) {
    assert(!loop_.onLoopThread());
    std::lock_guard shutdown_lock(shutdown_mutex_);
    if (!loop_.started() || shut_down_) return;
    if (linger.count() > 0 && loop_.post([this, linger] { beginLeaveFromLoop(linger); })) {
      membership_.waitNoConnections(linger + milliseconds(100));
    }
    running_.store(false);
    loop_.post([this] { closeAllFromLoop(); });
    loop_close_result_ = loop_.join();
    shut_down_ = true;
    membership_.wakeAll();
    logger_->debug("stopped; uv_loop_close() returned {}", loop_close_result_);
  }

  PeerStats stats(NodeId peer) const { return membership_.stats(peer); }
  PeerStats totals() const { return membership_.totals(); }
  std::vector<NodeId> connectedPeers() const { return membership_.connected(); }
  uint16_t port() const { return port_.load(); }
  int loopCloseResult() const { return loop_close_result_; }
  bool onLoopThread() const { return loop_.onLoopThread(); }

  NodeOptions options_;
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
  void onLoopOrNow(std::function<void()> apply) {
    if (!loop_.started() || loop_.onLoopThread()) {
      apply();
      return;
    }
    std::promise<void> applied;
    std::future<void> done = applied.get_future();
    if (!loop_.post([&apply, &applied] {
          apply();
          applied.set_value();
        })) {
      return;  // the loop has stopped: no frame will arrive for the handler
    }
    done.wait();
  }

  // Runs `fn` on the loop thread and waits for its Status.
  Status runOnLoop(std::function<Status()> fn) {
    if (loop_.onLoopThread()) return fn();
    auto promise = std::make_shared<std::promise<Status>>();
    auto future = promise->get_future();
    if (!loop_.post([promise, fn = std::move(fn)] { promise->set_value(fn()); })) {
      return {ErrorCode::kShutdown, "node loop is not running"};
    }
    return future.get();
  }

  void checkLoopThread() const { assert(loop_.onLoopThread()); }

  // ---- loop thread ----

  Status listenFromLoop(const sockaddr_storage& address) {
    checkLoopThread();
    listener_ = uv::Tcp::create(loop_.uvLoop());
    const auto* addr = reinterpret_cast<const sockaddr*>(&address);
    Status status = listener_->bindFromLoop(addr);
    if (status.ok()) {
      status = listener_->listenFromLoop(
          128, [this](const Status& st) { onIncomingConnectionFromLoop(st); });
    }
    if (!status.ok()) {
      listener_.reset();
      return {status.code(), fmt::format("listen on {}:{}: {}", options_.listen_host,
                                         options_.listen_port, status.message())};
    }
    port_.store(listener_->localPortFromLoop());
    liveness_.startFromLoop();
    // An IPv6 host goes in brackets, as the topology file writes it ("[::1]:7100").
    const bool v6 = options_.listen_host.find(':') != std::string::npos;
    logger_->info("listening on {}{}{}:{} (cluster \"{}\", {} members{})", v6 ? "[" : "",
                  options_.listen_host, v6 ? "]" : "", port_.load(), options_.cluster,
                  options_.members.size(),
                  options_.cluster_key ? "; peers must prove the shared secret" : "");
    return {};
  }

  Connection* createConnectionFromLoop(uv::HandlePtr<uv::Tcp> tcp, Connection::Role role) {
    Connection::Hooks hooks;
    hooks.on_frame = [this](Connection& c, InboundFrame&& f) { return onFrameFromLoop(c, f); };
    hooks.on_closing = [this](Connection& c, const Status& s) { onClosingFromLoop(c, s); };
    hooks.on_released = [this](Connection& c) { onReleasedFromLoop(c); };
    hooks.on_queue_changed = [this](Connection& c) { onQueueChangedFromLoop(c); };
    hooks.on_bytes_in = [this](Connection& c, size_t n) {
      if (PeerCounters* counters = countersFor(c)) counters->bytes_in += n;
    };
    hooks.on_frame_lost = [this](Connection& c) {
      if (PeerCounters* counters = countersFor(c)) counters->frames_lost += 1;
    };
    hooks.on_bytes_out = [this](Connection& c, size_t n) {
      if (PeerCounters* counters = countersFor(c)) {
        counters->bytes_out += n;
        counters->frames_out += 1;
      }
    };
    auto connection = std::make_unique<Connection>(loop_.uvLoop(), std::move(tcp), role, limits_,
                                                   std::move(hooks));
    Connection* raw = connection.get();
    raw->setWriteSlicePackets(options_.write_slice_packets);
    // Each connection draws its own jitter stream: the seed, this node and the connection's
    // number (so a redialed link does not repeat the draws of the one before).
    raw->setLinkShape({options_.link_delay, options_.link_jitter, options_.link_loss,
                       options_.link_rto,
                       options_.link_seed * 0x9E3779B97F4A7C15ULL + options_.self * 1'000'003ULL +
                           ++connections_created_});
    raw->setQueueLimit(options_.max_queued_bytes);
    raw->setInboundBudget(&budget_);
    raw->limitFramesBeforeHandshake(std::min(kHandshakeFrameBytes, options_.max_frame_bytes));
    raw->setPlacer([this, raw](const wire::Envelope& envelope,
                               size_t bytes) -> std::unique_ptr<AttachmentLanding> {
      // Only an established peer's frames may land in a receiver's memory; anything else is
      // read into the frame's own buffer and then judged by onFrameFromLoop.
      if (!raw->established || envelope.header()->sender() != raw->peer) return nullptr;
      auto placer = placers_.find(envelope.body_type());
      if (placer == placers_.end() || !placer->second) return nullptr;
      return placer->second(raw->peer, envelope, bytes);
    });
    const auto handshake_role =
        role == Connection::Role::kDialer ? Handshake::Role::kDialer : Handshake::Role::kAcceptor;
    connections_.emplace(
        raw, OpenConnection{std::move(connection),
                            std::make_unique<Handshake>(handshake_role, handshake_settings_)});
    membership_.setOpenConnectionsFromLoop(connections_.size());
    return raw;
  }

  PeerCounters* countersFor(const Connection& c) {
    if (!c.peer_known || !c.established) return nullptr;
    return membership_.counters(c.peer);
  }

  std::vector<Connection*> establishedFromLoop() {
    std::vector<Connection*> out;
    out.reserve(connections_.size());
    for (auto& [raw, open] : connections_) {
      if (raw->established) out.push_back(raw);
    }
    return out;
  }

  void onIncomingConnectionFromLoop(const Status& status) {
    checkLoopThread();
    if (!status.ok()) {
      logger_->warn("incoming connection failed: {}", status.message());
      return;
    }
    auto tcp = uv::Tcp::create(loop_.uvLoop());
    if (Status accepted = listener_->acceptFromLoop(*tcp); !accepted.ok()) {
      logger_->warn("accept failed: {}", accepted.message());
      return;  // tcp closes itself
    }
    Connection* connection = createConnectionFromLoop(std::move(tcp), Connection::Role::kAcceptor);
    connection->startFromLoop();
    if (!connection->open()) return;
    if (leaving_) {
      connection->closeFromLoop({ErrorCode::kShutdown, "node is shutting down"});
      return;
    }
    // Anyone who reaches the port can open connections and say nothing: they are bounded, and
    // each has the handshake time-out.
    if (handshaking_.load() >= options_.max_handshaking_connections) {
      refused_connections_ += 1;
      connection->closeFromLoop(
          {ErrorCode::kOverloaded,
           fmt::format("{} connections are still in their handshake (at most {}): refused",
                       handshaking_.load(), options_.max_handshaking_connections)});
      return;
    }
    connection->handshaking = true;
    handshaking_ += 1;
    logger_->debug("accepted a connection from {}", connection->description());
    armHandshakeDeadlineFromLoop(*connection);
  }

  // Dialer: one attempt to `peer`.
  Connection* openAttemptFromLoop(NodeId peer, const sockaddr_storage& address,
                                  const std::string& address_text) {
    checkLoopThread();
    Connection* connection =
        createConnectionFromLoop(uv::Tcp::create(loop_.uvLoop()), Connection::Role::kDialer);
    connection->peer = peer;
    connection->peer_known = true;
    connection->setDescription(fmt::format("peer {} ({})", peer, address_text));
    connections_.at(connection).handshake =
        std::make_unique<Handshake>(Handshake::Role::kDialer, handshake_settings_, peer);
    connection->armDeadlineFromLoop(
        options_.connect_timeout,
        {ErrorCode::kTimeout, fmt::format("connect to {} timed out after {} ms", address_text,
                                          options_.connect_timeout.count())});
    Status status = connection->tcp().connectFromLoop(
        reinterpret_cast<const sockaddr*>(&address),
        [this, connection](const Status& st) { onConnectedFromLoop(*connection, st); });
    if (!status.ok()) connection->closeFromLoop(status);
    return connection;
  }

  void onConnectedFromLoop(Connection& connection, const Status& status) {
    checkLoopThread();
    if (!connection.open()) return;  // timed out or closed meanwhile; already handled
    if (!status.ok()) {
      connection.closeFromLoop(
          {status.code(),
           fmt::format("connect to {}: {}", connection.description(), status.message())});
      return;
    }
    connection.startFromLoop();
    if (!connection.open()) return;
    Handshake& handshake = *connections_.at(&connection).handshake;
    const HandshakeMessage hello = handshake.start();
    armHandshakeDeadlineFromLoop(connection);
    writeHandshakeFromLoop(connection, hello);
  }

  void armHandshakeDeadlineFromLoop(Connection& connection) {
    const Handshake& handshake = *connections_.at(&connection).handshake;
    connection.armDeadlineFromLoop(
        options_.handshake_timeout,
        {ErrorCode::kTimeout,
         fmt::format("no {} within the handshake timeout of {} ms", handshake.awaited(),
                     options_.handshake_timeout.count())});
  }

  void writeHandshakeFromLoop(Connection& connection, const HandshakeMessage& message) {
    connection.writeFromLoop(encode(message.type, handshakeBody(message, handshake_settings_)), {});
  }

  bool onFrameFromLoop(Connection& connection, const InboundFrame& frame) {
    checkLoopThread();
    if (!connection.established) return onHandshakeFrameFromLoop(connection, frame.envelope());
    const wire::Envelope& envelope = frame.envelope();
    const wire::Body type = envelope.body_type();
    const NodeId sender = envelope.header()->sender();
    if (sender != connection.peer) {
      return protocolErrorFromLoop(
          connection, fmt::format("frame claims sender {} but the handshake established peer {}",
                                  sender, connection.peer));
    }
    if (PeerCounters* counters = countersFor(connection)) counters->frames_in += 1;
    switch (type) {
      case wire::Body::Hello:
      case wire::Body::Welcome:
      case wire::Body::Challenge:
      case wire::Body::Proof:
        return protocolErrorFromLoop(
            connection, fmt::format("unexpected {} after the handshake", wire::EnumNameBody(type)));
      case wire::Body::Refuse: {
        const auto* refuse = envelope.body_as_Refuse();
        connection.closeFromLoop(
            {ErrorCode::kRefused,
             fmt::format("refused by peer: {}", refuse->reason() ? refuse->reason()->str() : "")});
        return false;
      }
      case wire::Body::Heartbeat:
        return true;  // liveness was refreshed by the read itself
      case wire::Body::Leave:
        handleLeaveFromLoop(connection, envelope);
        return false;
      default:
        break;
    }
    auto handler = handlers_.find(type);
    if (handler == handlers_.end() || !handler->second) {
      logger_->debug("no handler for {} from peer {}; dropped", wire::EnumNameBody(type), sender);
      return true;
    }
    handler->second(sender, frame);
    return connection.open();
  }

  // Carries out what the connection's Handshake answers to one frame.
  bool onHandshakeFrameFromLoop(Connection& connection, const wire::Envelope& envelope) {
    Handshake& handshake = *connections_.at(&connection).handshake;
    const HandshakeStep step = handshake.onFrame(envelope, connection.description());
    const NodeId peer = handshake.peer();
    if (!step.log.empty()) {
      logger_->log(step.error_level ? spdlog::level::err : spdlog::level::warn, "{}", step.log);
    }
    if (!step.give_up.empty()) giveUpFromLoop(peer, step.give_up);
    using Outcome = HandshakeStep::Outcome;
    switch (step.outcome) {
      case Outcome::kContinue:
        if (step.reply) writeHandshakeFromLoop(connection, *step.reply);
        // The acceptor's Challenge starts the wait for the Proof.
        if (handshake.state() == HandshakeState::kAwaitingProof) {
          connection.peer = peer;  // claimed; peer_known only once the Proof checks out
          armHandshakeDeadlineFromLoop(connection);
        }
        return connection.open();
      case Outcome::kEstablished:
        if (connection.role() == Connection::Role::kAcceptor) {
          connection.peer = peer;
          connection.peer_known = true;
          connection.setDescription(fmt::format("peer {} ({})", peer, connection.description()));
        }
        if (step.reply) writeHandshakeFromLoop(connection, *step.reply);
        establishFromLoop(connection);
        return connection.open();
      case Outcome::kRefuse:
        refuseFromLoop(connection, peer, *step.reply);
        return false;
      case Outcome::kRefusedByPeer:
        emitFromLoop({PeerEventKind::kRefused, peer, step.reason});
        membership_.noteFromLoop(peer, "refused by the peer: " + step.reason);
        connection.closeFromLoop(
            {ErrorCode::kRefused, fmt::format("refused by peer: {}", step.reason)});
        return false;
      case Outcome::kProtocolError:
        return protocolErrorFromLoop(connection, step.reason);
    }
    return false;
  }

  bool protocolErrorFromLoop(Connection& connection, std::string reason) {
    connection.closeFromLoop({ErrorCode::kProtocol, std::move(reason)});
    return false;
  }

  // Acceptor: why a dialer claiming `id` (of this cluster) cannot be welcomed now, or "". With a
  // secret, asked only once the dialer proved it.
  std::string memberRefusalFromLoop(NodeId id) {
    if (id == options_.self) return fmt::format("node id {} is this node's own id", id);
    auto peer = peers_.find(id);
    if (peer == peers_.end()) {
      return fmt::format("node id {} is not a member of cluster \"{}\"", id, options_.cluster);
    }
    if (id > options_.self) {
      return fmt::format("node {} must not dial node {}: the lower id dials", id, options_.self);
    }
    if (leaving_) return "node is shutting down";
    if (peer->second.connection != nullptr) {
      return fmt::format("node id {} is already connected", id);
    }
    return {};
  }

  // A handshake with `peer` failed for a reason no retry changes: stop dialing it and end
  // waitClusterReady() at once with `reason`.
  void giveUpFromLoop(NodeId peer, const std::string& reason) {
    dialer_.giveUpFromLoop(peer);
    membership_.failFromLoop(reason);
  }

  // Writes our Refuse, records the reason for waitClusterReady's report, and closes once the
  // Refuse is written (or the handshake time-out passes).
  void refuseFromLoop(Connection& connection, NodeId id, const HandshakeMessage& refuse) {
    writeHandshakeFromLoop(connection, refuse);
    const std::string& refusal = refuse.text;
    // Only a member's refusal is kept for the report: any host that reaches the port may claim
    // any id, and a record per claimed id would grow without bound.
    if (membership_.isMember(id)) {
      emitFromLoop({PeerEventKind::kRefused, id, refusal});
      membership_.noteFromLoop(id, "refused: " + refusal);
    }
    connection.armDeadlineFromLoop(options_.handshake_timeout, {ErrorCode::kRefused, refusal});
    connection.closeAfterFlushFromLoop({ErrorCode::kRefused, refusal});
  }

  // An accepted connection left its handshake (established or closing).
  void endHandshakeFromLoop(Connection& connection) {
    if (!connection.handshaking) return;
    connection.handshaking = false;
    handshaking_ -= 1;
  }

  void establishFromLoop(Connection& connection) {
    PeerLink& link = peers_.at(connection.peer);
    endHandshakeFromLoop(connection);
    connection.liftFrameLimitFromLoop();
    connection.established = true;
    connection.disarmDeadlineFromLoop();
    connection.last_receive = Clock::now();
    connections_.at(&connection).handshake.reset();
    dialer_.onEstablishedFromLoop(connection.peer, &connection);
    link.connection = &connection;
    membership_.setUpFromLoop(connection.peer);
    logger_->info("{} up ({})", connection.description(),
                  connection.role() == Connection::Role::kDialer ? "dialed" : "accepted");
    emitFromLoop({PeerEventKind::kUp, connection.peer, ""});
  }

  void handleLeaveFromLoop(Connection& connection, const wire::Envelope& envelope) {
    const auto* leave = envelope.body_as_Leave();
    const std::string reason = leave->reason() ? leave->reason()->str() : "";
    if (!connection.sent_leave) {
      // Answer so the peer sees an orderly goodbye rather than a closed socket.
      sendLeaveFromLoop(connection, "acknowledging Leave");
    }
    connection.armDeadlineFromLoop(options_.handshake_timeout,
                                   {ErrorCode::kPeerLeft, "linger after Leave expired"});
    connection.closeAfterFlushFromLoop(
        {ErrorCode::kPeerLeft, reason.empty() ? "no reason given" : reason});
  }

  void sendLeaveFromLoop(Connection& connection, const std::string& reason) {
    connection.sent_leave = true;
    connection.writeFromLoop(encode(wire::Body::Leave,
                                    [&](flatbuffers::FlatBufferBuilder& b) {
                                      return wire::CreateLeaveDirect(b, reason.c_str()).Union();
                                    }),
                             {});
  }

  void onClosingFromLoop(Connection& connection, const Status& status) {
    checkLoopThread();
    endHandshakeFromLoop(connection);
    if (!connection.established && status.code() == ErrorCode::kBadFrame &&
        status.message().find(" before the handshake") != std::string::npos) {
      oversized_handshakes_ += 1;
    }
    if (!connection.peer_known) {
      const bool noisy =
          status.code() == ErrorCode::kBadFrame || status.code() == ErrorCode::kProtocol ||
          status.code() == ErrorCode::kTimeout || status.code() == ErrorCode::kOverloaded;
      logger_->log(noisy ? spdlog::level::warn : spdlog::level::debug,
                   "closing connection from {} before its handshake: {}", connection.description(),
                   status.toString());
      return;
    }
    auto found = peers_.find(connection.peer);
    if (found == peers_.end()) return;
    PeerLink& link = found->second;
    const NodeId peer = connection.peer;
    if (link.connection == &connection) {
      link.connection = nullptr;
      link.slow = false;
      membership_.setDownFromLoop(peer, status.toString());
      const bool left = status.code() == ErrorCode::kPeerLeft;
      if (left) {
        logger_->info("{} left: {}", connection.description(), status.message());
        emitFromLoop({PeerEventKind::kLeft, peer, status.toString()});
      } else {
        logger_->log(stopped_ ? spdlog::level::debug : spdlog::level::warn,
                     "{} down: closing its connection: {}", connection.description(),
                     status.toString());
        emitFromLoop({PeerEventKind::kDown, peer, status.toString()});
      }
      if (!leaving_ && !stopped_) dialer_.onLostFromLoop(peer, left);
      return;
    }
    if (dialer_.isAttempt(peer, &connection)) {
      membership_.noteFromLoop(peer, status.toString());
      dialer_.onAttemptFailedFromLoop(peer, connection.description(), status);
      return;
    }
    // A refused or duplicate connection that never became the peer's connection.
    logger_->log(status.code() == ErrorCode::kRefused ? spdlog::level::debug : spdlog::level::warn,
                 "closing connection from {}: {}", connection.description(), status.toString());
  }

  void onReleasedFromLoop(Connection& connection) {
    connections_.erase(&connection);
    membership_.setOpenConnectionsFromLoop(connections_.size());
  }

  void onQueueChangedFromLoop(Connection& connection) {
    if (!connection.established) return;
    auto found = peers_.find(connection.peer);
    if (found == peers_.end() || found->second.connection != &connection) return;
    PeerLink& link = found->second;
    const NodeId peer = found->first;
    const size_t queued = connection.queuedBytes();
    PeerCounters& counters = *membership_.counters(peer);
    counters.queued_bytes = queued;
    counters.frames_superseded = connection.framesSuperseded();
    counters.frames_refused = connection.framesRefused();
    if (!link.slow && queued >= options_.high_watermark) {
      link.slow = true;
      counters.slow = true;
      emitFromLoop(
          {PeerEventKind::kSlow, peer,
           fmt::format("{} bytes queued (high watermark {})", queued, options_.high_watermark)});
    } else if (link.slow && queued <= options_.low_watermark) {
      link.slow = false;
      counters.slow = false;
      emitFromLoop(
          {PeerEventKind::kDrained, peer,
           fmt::format("{} bytes queued (low watermark {})", queued, options_.low_watermark)});
    }
  }

  // The open connection to `to`, or null after failing `done` with why there is none.
  Connection* connectionForSendFromLoop(NodeId to, const SendCallback& done) {
    checkLoopThread();
    auto fail = [&](ErrorCode code, std::string message) -> Connection* {
      if (done) done(to, {code, std::move(message)});
      return nullptr;
    };
    if (stopped_)
      return fail(ErrorCode::kShutdown, fmt::format("node {} is shutting down", options_.self));
    auto found = peers_.find(to);
    if (found == peers_.end()) {
      return fail(ErrorCode::kNotConnected, fmt::format("peer {} is not a member", to));
    }
    Connection* connection = found->second.connection;
    if (connection == nullptr || !connection->open()) {
      return fail(ErrorCode::kNotConnected, fmt::format("peer {} is not connected", to));
    }
    return connection;
  }

  void sendFromLoop(NodeId to, const SharedFrame& frame, const SendCallback& done,
                    const SendOptions& options) {
    Connection* connection = connectionForSendFromLoop(to, done);
    if (connection == nullptr) return;
    const uint64_t refused = connection->framesRefused();
    connection->writeFromLoop(
        frame,
        [to, done](const Status& status) {
          if (done) done(to, status);
        },
        options);
    // A refused frame changes no queue, so the counters are brought up to date here.
    if (connection->framesRefused() != refused) {
      if (PeerCounters* counters = membership_.counters(to)) {
        counters->frames_refused = connection->framesRefused();
      }
    }
  }

  void emitFromLoop(const PeerEvent& event) {
    if (stopped_ || !event_handler_) return;
    event_handler_(event);
  }

  void beginLeaveFromLoop(milliseconds linger) {
    checkLoopThread();
    leaving_ = true;
    listener_.reset();
    dialer_.stopFromLoop();
    for (Connection* connection : snapshotFromLoop()) {
      if (!connection->open()) continue;
      if (!connection->established) {
        connection->closeFromLoop({ErrorCode::kShutdown, "node is shutting down"});
        continue;
      }
      logger_->debug("sending Leave to {}", connection->description());
      if (!connection->sent_leave) sendLeaveFromLoop(*connection, "node shutting down");
      connection->armDeadlineFromLoop(
          linger, {ErrorCode::kShutdown, fmt::format("no Leave from peer {} within {} ms",
                                                     connection->peer, linger.count())});
    }
  }

  void closeAllFromLoop() {
    checkLoopThread();
    leaving_ = true;
    stopped_ = true;
    listener_.reset();
    liveness_.stopFromLoop();
    dialer_.stopFromLoop();
    for (Connection* connection : snapshotFromLoop()) {
      connection->closeFromLoop({ErrorCode::kShutdown, "node shut down"});
    }
    // Closures still queued run inside stopFromLoop and see stopped_.
    loop_.stopFromLoop();
  }

  // The open connections, copied: closing one may release another from the map.
  std::vector<Connection*> snapshotFromLoop() {
    std::vector<Connection*> out;
    out.reserve(connections_.size());
    for (auto& entry : connections_)
      out.push_back(entry.first);
    return out;
  }

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
  std::map<wire::Body, FrameHandler> handlers_;
  std::map<wire::Body, AttachmentPlacer> placers_;
  EventHandler event_handler_;
  bool leaving_ = false;
  bool stopped_ = false;
};

Node::Node(NodeOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Node::~Node() = default;
void Node::setHandler(wire::Body type, MessageHandler handler) {
  FrameHandler on_frame;
  if (handler) {
    on_frame = [handler = std::move(handler)](NodeId from, const InboundFrame& frame) {
      handler(from, frame.envelope());
    };
  }
  impl_->setFrameHandler(type, std::move(on_frame));
}
void Node::setFrameHandler(wire::Body type, FrameHandler handler) {
  impl_->setFrameHandler(type, std::move(handler));
}
void Node::setAttachmentPlacer(wire::Body type, AttachmentPlacer placer) {
  impl_->setAttachmentPlacer(type, std::move(placer));
}
void Node::sendTransient(NodeId to, const SharedFrame& frame, const SendCallback& done) {
  impl_->sendTransient(to, frame, done);
}
void Node::setEventHandler(EventHandler handler) {
  impl_->setEventHandler(std::move(handler));
}
Status Node::listen() {
  // libuv writes to sockets with write()/writev(), which raise SIGPIPE when the peer is gone.
  // A dead peer must become a Down event, never the end of the process, so the runtime ignores
  // SIGPIPE process-wide (once) before it opens any socket; the write then fails with EPIPE.
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { std::signal(SIGPIPE, SIG_IGN); });
  return impl_->listen();
}
uint16_t Node::port() const {
  return impl_->port();
}
Status Node::connect(std::vector<PeerAddress> peers) {
  return impl_->connect(std::move(peers));
}
Status Node::waitClusterReady() {
  return impl_->waitClusterReady(impl_->options_.cluster_ready_timeout);
}
Status Node::waitClusterReady(std::chrono::milliseconds timeout) {
  return impl_->waitClusterReady(timeout);
}
SharedFrame Node::encode(wire::Body type, const BodyWriter& write_body, size_t size_hint,
                         Attachment attachment) {
  return impl_->encode(type, write_body, size_hint, std::move(attachment));
}
void Node::send(NodeId to, const SharedFrame& frame, const SendCallback& done) {
  impl_->send(to, frame, done, {});
}
void Node::send(NodeId to, const SharedFrame& frame, const SendOptions& options,
                const SendCallback& done) {
  impl_->send(to, frame, done, options);
}
void Node::broadcast(const std::vector<NodeId>& to, const SharedFrame& frame,
                     const SendCallback& done) {
  impl_->broadcast(to, frame, done, {});
}
void Node::broadcast(const std::vector<NodeId>& to, const SharedFrame& frame,
                     const SendOptions& options, const SendCallback& done) {
  impl_->broadcast(to, frame, done, options);
}
bool Node::post(std::function<void()> fn) {
  return impl_->post(std::move(fn));
}
bool Node::onLoopThread() const {
  return impl_->onLoopThread();
}
PeerStats Node::stats(NodeId peer) const {
  return impl_->stats(peer);
}
PeerStats Node::totals() const {
  return impl_->totals();
}
std::vector<NodeId> Node::connectedPeers() const {
  return impl_->connectedPeers();
}
InboundStats Node::inboundStats() const {
  return impl_->inboundStats();
}
void Node::shutdown(std::chrono::milliseconds linger) {
  impl_->shutdown(linger);
}
int Node::loopCloseResult() const {
  return impl_->loopCloseResult();
}
NodeId Node::id() const {
  return impl_->options_.self;
}
const NodeOptions& Node::options() const {
  return impl_->options_;
}
spdlog::logger& Node::logger() const {
  return *impl_->logger_;
}

}  // namespace chorus::node
