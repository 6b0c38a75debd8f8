// The node's any-thread face: construction, listen/connect (resolved on the caller's thread),
// the mailbox crossing into the loop, the blocking waits, shutdown, and the public API. What
// runs on the loop thread is in node/router.cc. Thread rules: docs/threading.md.
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
#include "node/node_impl.h"

namespace chorus::node {

int64_t steadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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

Node::Impl::Impl(NodeOptions options)
    : options_(std::move(options)),
      logger_(makeNodeLogger(options_)),
      limits_{options_.max_frame_bytes, options_.max_verifier_depth, options_.max_verifier_tables},
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

Status Node::Impl::listen() {
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

Status Node::Impl::connect(std::vector<PeerAddress> peers) {
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

SharedFrame Node::Impl::encode(wire::Body type, const BodyWriter& write_body, size_t size_hint,
                               Attachment attachment) {
  EnvelopeHeader header{options_.self, options_.cluster, next_sequence_.fetch_add(1),
                        steadyNowNs()};
  return encodeFrame(header, type, write_body, size_hint, std::move(attachment));
}

SharedFrame Node::Impl::encode(MessageType type, const BodyWriter& write_message, size_t size_hint,
                               Attachment attachment) {
  assert(type.service != nullptr && type.service->id != kRuntimeService);
  EnvelopeHeader header{options_.self, options_.cluster, next_sequence_.fetch_add(1),
                        steadyNowNs()};
  return encodeFrame(header, type, write_message, size_hint, std::move(attachment));
}

void Node::Impl::send(NodeId to, const SharedFrame& frame, const SendCallback& done,
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

void Node::Impl::broadcast(const std::vector<NodeId>& to, const SharedFrame& frame,
                           const SendCallback& done, const SendOptions& options) {
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

void Node::Impl::sendTransient(NodeId to, const SharedFrame& frame, const SendCallback& done) {
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

void Node::Impl::setHandler(MessageType type, FrameHandler handler) {
  assert(type.service != nullptr && type.service->id != kRuntimeService);
  onLoopOrNow([this, type, handler = std::move(handler)]() mutable {
    registerServiceFromLoop(type.service);
    handlers_[messageKind(type.service->id, type.kind)] = std::move(handler);
  });
}

bool Node::Impl::deliverForTesting(NodeId from, const InboundFrame& frame) {
  // Only without a loop thread: handlers_ belongs to it once it runs.
  if (running_.load()) return false;
  const ServiceSpec* service = frame.verifiedService();
  if (service == nullptr) return false;
  auto handler = handlers_.find(messageKind(service->id, frame.kind()));
  if (handler == handlers_.end() || !handler->second) return false;
  handler->second(from, frame);
  return true;
}

void Node::Impl::setAttachmentPlacer(MessageType type, AttachmentPlacer placer) {
  assert(type.service != nullptr && type.service->id != kRuntimeService);
  onLoopOrNow([this, type, placer = std::move(placer)]() mutable {
    registerServiceFromLoop(type.service);
    placers_[messageKind(type.service->id, type.kind)] = std::move(placer);
  });
}

void Node::Impl::registerServiceFromLoop(const ServiceSpec* service) {
  auto [it, added] = services_.emplace(service->id, service);
  // Two services with one id is a programming error (the mode registry's test checks the ids
  // are distinct); the first keeps the id.
  assert(added || it->second == service);
  if (!added && it->second != service) {
    logger_->error("service id {} is taken by \"{}\": \"{}\" cannot have it", service->id,
                   it->second->name, service->name);
  }
}

const ServiceSpec* Node::Impl::serviceFromLoop(ServiceId id) const {
  auto it = services_.find(id);
  return it == services_.end() ? nullptr : it->second;
}

void Node::Impl::setEventHandler(EventHandler handler) {
  auto apply = [this, handler = std::move(handler)]() mutable {
    event_handler_ = std::move(handler);
  };
  if (!loop_.started() || loop_.onLoopThread()) {
    apply();
  } else {
    loop_.post(std::move(apply));
  }
}

InboundStats Node::Impl::inboundStats() const {
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

void Node::Impl::shutdown(milliseconds linger) {
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

void Node::Impl::onLoopOrNow(std::function<void()> apply) {
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

Status Node::Impl::runOnLoop(std::function<Status()> fn) {
  if (loop_.onLoopThread()) return fn();
  auto promise = std::make_shared<std::promise<Status>>();
  auto future = promise->get_future();
  if (!loop_.post([promise, fn = std::move(fn)] { promise->set_value(fn()); })) {
    return {ErrorCode::kShutdown, "node loop is not running"};
  }
  return future.get();
}

uint64_t Node::Impl::startTimer(milliseconds period, std::function<void()> fire) {
  if (!running_.load()) return 0;
  const uint64_t id = next_timer_.fetch_add(1);
  const auto ms = static_cast<uint64_t>(std::max<int64_t>(1, period.count()));
  auto arm = [this, id, ms, fire = std::move(fire)]() mutable {
    if (stopped_ || cancelled_timers_.erase(id) > 0) return;
    uv::HandlePtr<uv::Timer> timer = uv::Timer::create(loop_.uvLoop());
    timer->startFromLoop(ms, ms, std::move(fire));
    timers_[id] = std::move(timer);
  };
  if (loop_.onLoopThread()) {
    arm();
  } else if (!loop_.post(std::move(arm))) {
    return 0;
  }
  return id;
}

void Node::Impl::stopTimer(uint64_t id) {
  // Closing the handle from inside its own callback is safe: the wrapper is freed in the close
  // callback, after the running call returned. A stop that overtakes its timer's arming (both
  // posted) cancels it.
  onLoopOrNow([this, id] {
    if (timers_.erase(id) == 0 && id < next_timer_.load()) cancelled_timers_.insert(id);
  });
}

Node::Node(NodeOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Node::~Node() = default;
void Node::setHandler(MessageType type, FrameHandler handler) {
  impl_->setHandler(type, std::move(handler));
}
void Node::setAttachmentPlacer(MessageType type, AttachmentPlacer placer) {
  impl_->setAttachmentPlacer(type, std::move(placer));
}
void Node::sendTransient(NodeId to, const SharedFrame& frame, const SendCallback& done) {
  impl_->sendTransient(to, frame, done);
}
bool Node::deliverForTesting(NodeId from, const InboundFrame& frame) {
  return impl_->deliverForTesting(from, frame);
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
SharedFrame Node::encode(MessageType type, const BodyWriter& write_message, size_t size_hint,
                         Attachment attachment) {
  return impl_->encode(type, write_message, size_hint, std::move(attachment));
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
uint64_t Node::startTimer(std::chrono::milliseconds period, std::function<void()> fire) {
  return impl_->startTimer(period, std::move(fire));
}
void Node::stopTimer(uint64_t id) {
  impl_->stopTimer(id);
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
