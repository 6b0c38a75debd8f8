// The loop thread's side of the node, a router: it accepts and dials connections, hands each
// frame of a connection still in its handshake to that connection's Handshake and carries out
// the step it answers, dispatches frames of established peers (the runtime's Heartbeat, Leave
// and a late Refuse here; a service's message to the handler of its service and kind), and
// turns closing connections into membership events. Every method runs on the loop thread.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cassert>

#include "node/node_impl.h"

namespace chorus::node {

using Clock = std::chrono::steady_clock;

Status Node::Impl::listenFromLoop(const sockaddr_storage& address) {
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

Connection* Node::Impl::createConnectionFromLoop(uv::HandlePtr<uv::Tcp> tcp, Connection::Role role,
                                                 NodeId dialed) {
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
  auto connection =
      std::make_unique<Connection>(loop_.uvLoop(), std::move(tcp), role, limits_, std::move(hooks));
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
  // A registered service's messages are verified by the decoder, before the placer or
  // onFrameFromLoop sees them.
  raw->setServices([this](ServiceId id) { return serviceFromLoop(id); });
  raw->setPlacer(
      [this, raw](const InboundFrame& frame, size_t bytes) -> std::unique_ptr<AttachmentLanding> {
        // Only an established peer's service frames may land in a receiver's memory; anything
        // else is read into the frame's own buffer and then judged by onFrameFromLoop.
        const ServiceSpec* service = frame.verifiedService();
        if (!raw->established || service == nullptr ||
            frame.envelope().header()->sender() != raw->peer) {
          return nullptr;
        }
        auto placer = placers_.find(messageKind(service->id, frame.kind()));
        if (placer == placers_.end() || !placer->second) return nullptr;
        return placer->second(raw->peer, frame, bytes);
      });
  const auto handshake_role =
      role == Connection::Role::kDialer ? Handshake::Role::kDialer : Handshake::Role::kAcceptor;
  connections_.emplace(
      raw, OpenConnection{std::move(connection), std::make_unique<Handshake>(
                                                     handshake_role, handshake_settings_, dialed)});
  membership_.setOpenConnectionsFromLoop(connections_.size());
  return raw;
}

PeerCounters* Node::Impl::countersFor(const Connection& c) {
  if (!c.peer_known || !c.established) return nullptr;
  return membership_.counters(c.peer);
}

std::vector<Connection*> Node::Impl::establishedFromLoop() {
  std::vector<Connection*> out;
  out.reserve(connections_.size());
  for (auto& [raw, open] : connections_) {
    if (raw->established) out.push_back(raw);
  }
  return out;
}

void Node::Impl::onIncomingConnectionFromLoop(const Status& status) {
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

Connection* Node::Impl::openAttemptFromLoop(NodeId peer, const sockaddr_storage& address,
                                            const std::string& address_text) {
  checkLoopThread();
  Connection* connection =
      createConnectionFromLoop(uv::Tcp::create(loop_.uvLoop()), Connection::Role::kDialer, peer);
  connection->peer = peer;
  connection->peer_known = true;
  connection->setDescription(fmt::format("peer {} ({})", peer, address_text));
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

void Node::Impl::onConnectedFromLoop(Connection& connection, const Status& status) {
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

void Node::Impl::armHandshakeDeadlineFromLoop(Connection& connection) {
  const Handshake& handshake = *connections_.at(&connection).handshake;
  connection.armDeadlineFromLoop(
      options_.handshake_timeout,
      {ErrorCode::kTimeout, fmt::format("no {} within the handshake timeout of {} ms",
                                        handshake.awaited(), options_.handshake_timeout.count())});
}

void Node::Impl::writeHandshakeFromLoop(Connection& connection, const HandshakeMessage& message) {
  connection.writeFromLoop(encode(message.type, handshakeBody(message, handshake_settings_)), {});
}

bool Node::Impl::onFrameFromLoop(Connection& connection, const InboundFrame& frame) {
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
  if (envelope.service() != kRuntimeService) return onServiceFrameFromLoop(connection, frame);
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
  // Runtime bodies this build knows (verifyFrame) are all handled above.
  return protocolErrorFromLoop(
      connection, fmt::format("unexpected {} after the handshake", wire::EnumNameBody(type)));
}

bool Node::Impl::onServiceFrameFromLoop(Connection& connection, const InboundFrame& frame) {
  const NodeId sender = connection.peer;
  const ServiceSpec* service = frame.verifiedService();
  if (service == nullptr) {
    // Another mode's traffic (or a newer build's): nothing here reads it. The connection
    // stays; a peer repeating it is logged a few times, then once in a while.
    if (unknown_services_.count(sender)) {
      logger_->warn("frame of service {} from peer {} dropped: no such service here ({} so far)",
                    frame.service(), sender, unknown_services_.countOf(sender));
    }
    return true;
  }
  const uint8_t kind = frame.kind();
  auto handler = handlers_.find(messageKind(service->id, kind));
  if (handler == handlers_.end() || !handler->second) {
    const char* name = service->kind_name(kind);
    logger_->debug("no handler for {} message {} from peer {}; dropped", service->name,
                   *name != '\0' ? std::string(name) : fmt::format("kind {}", kind), sender);
    return true;
  }
  handler->second(sender, frame);
  return connection.open();
}

bool Node::Impl::onHandshakeFrameFromLoop(Connection& connection, const wire::Envelope& envelope) {
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

bool Node::Impl::protocolErrorFromLoop(Connection& connection, std::string reason) {
  connection.closeFromLoop({ErrorCode::kProtocol, std::move(reason)});
  return false;
}

std::string Node::Impl::memberRefusalFromLoop(NodeId id) {
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

void Node::Impl::giveUpFromLoop(NodeId peer, const std::string& reason) {
  dialer_.giveUpFromLoop(peer);
  membership_.failFromLoop(reason);
}

void Node::Impl::refuseFromLoop(Connection& connection, NodeId id, const HandshakeMessage& refuse) {
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

void Node::Impl::endHandshakeFromLoop(Connection& connection) {
  if (!connection.handshaking) return;
  connection.handshaking = false;
  handshaking_ -= 1;
}

void Node::Impl::establishFromLoop(Connection& connection) {
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

void Node::Impl::handleLeaveFromLoop(Connection& connection, const wire::Envelope& envelope) {
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

void Node::Impl::sendLeaveFromLoop(Connection& connection, const std::string& reason) {
  connection.sent_leave = true;
  connection.writeFromLoop(encode(wire::Body::Leave,
                                  [&](flatbuffers::FlatBufferBuilder& b) {
                                    return wire::CreateLeaveDirect(b, reason.c_str()).Union();
                                  }),
                           {});
}

void Node::Impl::onClosingFromLoop(Connection& connection, const Status& status) {
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

void Node::Impl::onReleasedFromLoop(Connection& connection) {
  connections_.erase(&connection);
  membership_.setOpenConnectionsFromLoop(connections_.size());
}

void Node::Impl::onQueueChangedFromLoop(Connection& connection) {
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

Connection* Node::Impl::connectionForSendFromLoop(NodeId to, const SendCallback& done) {
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

void Node::Impl::sendFromLoop(NodeId to, const SharedFrame& frame, const SendCallback& done,
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

void Node::Impl::emitFromLoop(const PeerEvent& event) {
  if (stopped_ || !event_handler_) return;
  event_handler_(event);
}

void Node::Impl::beginLeaveFromLoop(milliseconds linger) {
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

void Node::Impl::closeAllFromLoop() {
  checkLoopThread();
  leaving_ = true;
  stopped_ = true;
  listener_.reset();
  liveness_.stopFromLoop();
  dialer_.stopFromLoop();
  timers_.clear();
  for (Connection* connection : snapshotFromLoop()) {
    connection->closeFromLoop({ErrorCode::kShutdown, "node shut down"});
  }
  // Closures still queued run inside stopFromLoop and see stopped_.
  loop_.stopFromLoop();
}

std::vector<Connection*> Node::Impl::snapshotFromLoop() {
  std::vector<Connection*> out;
  out.reserve(connections_.size());
  for (auto& entry : connections_)
    out.push_back(entry.first);
  return out;
}

}  // namespace chorus::node
