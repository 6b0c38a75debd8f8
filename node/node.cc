#include "node/node.h"

#include <fmt/format.h>
#include <netdb.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "node/connection.h"
#include "node/event_loop.h"
#include "node/launch_env.h"
#include "node/uv_handles.h"

namespace chorus::node {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int64_t steadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::shared_ptr<spdlog::logger> makeLogger(const NodeOptions& options) {
  std::vector<spdlog::sink_ptr> sinks = options.log_sinks;
  if (sinks.empty()) {
    // One stderr sink shared by every node of the process, so lines never interleave.
    static const auto stderr_sink = [] {
      // Colour only for a person at a terminal: mpirun and srun hand their ranks a pseudo
      // terminal and then mix the lines into one stream, where the codes show raw. NO_COLOR
      // (no-color.org) turns it off too.
      bool launched = std::getenv("NO_COLOR") != nullptr;
      for (const char* rank : kRankVariables)
        launched = launched || std::getenv(rank) != nullptr;
      return std::make_shared<spdlog::sinks::stderr_color_sink_mt>(
          launched ? spdlog::color_mode::never : spdlog::color_mode::automatic);
    }();
    sinks.push_back(stderr_sink);
  }
  auto logger = std::make_shared<spdlog::logger>(fmt::format("node {}", options.self),
                                                 sinks.begin(), sinks.end());
  logger->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  logger->set_level(options.log_level);
  logger->flush_on(spdlog::level::warn);
  return logger;
}

// Resolves host:port on the calling thread (never the loop thread: getaddrinfo blocks).
Status resolveAddress(const std::string& host, uint16_t port, sockaddr_storage* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return {ErrorCode::kInvalidArgument,
            fmt::format("cannot resolve host \"{}\": {}", host, gai_strerror(rc))};
  }
  // Prefer IPv4: "localhost" then means 127.0.0.1 on every machine.
  const addrinfo* pick = found;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  }
  std::memset(out, 0, sizeof(*out));
  std::memcpy(out, pick->ai_addr, pick->ai_addrlen);
  freeaddrinfo(found);
  return {};
}

// Counters one peer's connection updates on the loop thread and anyone may read.
struct PeerCounters {
  std::atomic<bool> connected{false};
  std::atomic<bool> slow{false};
  std::atomic<uint64_t> bytes_in{0};
  std::atomic<uint64_t> bytes_out{0};
  std::atomic<uint64_t> frames_in{0};
  std::atomic<uint64_t> frames_out{0};
  std::atomic<uint64_t> queued_bytes{0};
  std::atomic<uint64_t> times_up{0};
  std::atomic<uint64_t> frames_lost{0};
};

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

std::chrono::microseconds linkWorstCase(const NodeOptions& o) {
  const auto retransmissions = o.link_loss > 0 ? o.link_rto * ((1 << kMaxLinkRetransmissions) - 1)
                                               : std::chrono::microseconds(0);
  return o.link_delay + o.link_jitter + retransmissions;
}

std::string runDifference(std::string_view ours, std::string_view theirs, NodeId peer,
                          NodeId self) {
  if (ours.empty() || theirs.empty() || ours == theirs) return {};
  using Settings = std::vector<std::pair<std::string, std::string>>;
  const auto parse = [](std::string_view text) {
    Settings out;
    while (!text.empty()) {
      const size_t end = std::min(text.find('\n'), text.size());
      const std::string_view line = text.substr(0, end);
      text.remove_prefix(std::min(end + 1, text.size()));
      if (line.empty()) continue;
      const size_t eq = line.find('=');
      out.emplace_back(std::string(line.substr(0, eq)),
                       eq == std::string_view::npos ? "" : std::string(line.substr(eq + 1)));
    }
    return out;
  };
  const Settings mine = parse(ours), other = parse(theirs);
  const auto lookup = [](const Settings& settings, const std::string& key) -> std::string {
    for (const auto& [k, v] : settings) {
      if (k == key) return k + "=" + v;
    }
    return key + " unset";
  };
  std::vector<std::string> keys;
  for (const auto& [k, v] : mine)
    keys.push_back(k);
  for (const auto& [k, v] : other)
    keys.push_back(k);
  for (const std::string& key : keys) {
    const std::string a = lookup(mine, key), b = lookup(other, key);
    if (a != b) {
      return fmt::format(
          "node {} runs with {}, node {} with {}: every node of a cluster must run with the same "
          "mode, model, data and training options",
          peer, b, self, a);
    }
  }
  return {};
}

Status validateOptions(const NodeOptions& o) {
  auto bad = [](std::string message) {
    return Status{ErrorCode::kInvalidArgument, std::move(message)};
  };
  if (o.cluster.empty()) return bad("cluster name is empty");
  if (o.cluster.size() > kMaxClusterNameBytes) {
    return bad(fmt::format("cluster name of {} bytes is longer than {} bytes", o.cluster.size(),
                           kMaxClusterNameBytes));
  }
  if (std::find(o.members.begin(), o.members.end(), o.self) == o.members.end()) {
    return bad(fmt::format("own id {} is not in the member list", o.self));
  }
  std::set<NodeId> unique(o.members.begin(), o.members.end());
  if (unique.size() != o.members.size()) return bad("member list holds a duplicate id");
  // A FlatBuffer stays below 2 GiB (its Verifier asserts so): 2047 MiB keeps a frame within it.
  if (o.max_frame_bytes < kMinEnvelopeBytes || o.max_frame_bytes > (2047u << 20)) {
    return bad(fmt::format("max_frame_bytes {} is outside [{}, 2047 MiB]", o.max_frame_bytes,
                           kMinEnvelopeBytes));
  }
  for (const auto& [name, value] : {std::pair{"connect_timeout", o.connect_timeout},
                                    {"handshake_timeout", o.handshake_timeout},
                                    {"cluster_ready_timeout", o.cluster_ready_timeout},
                                    {"heartbeat_interval", o.heartbeat_interval},
                                    {"peer_timeout", o.peer_timeout},
                                    {"dial_backoff_initial", o.dial_backoff_initial},
                                    {"dial_backoff_max", o.dial_backoff_max}}) {
    if (value.count() <= 0) return bad(fmt::format("{} must be positive", name));
  }
  if (o.heartbeat_interval >= o.peer_timeout) {
    return bad("heartbeat_interval must be shorter than peer_timeout");
  }
  if (o.dial_backoff_initial > o.dial_backoff_max) {
    return bad("dial_backoff_initial must not exceed dial_backoff_max");
  }
  if (o.write_slice_packets > kMaxWriteSlicePackets) {
    return bad(fmt::format("write_slice_packets {} is above {}", o.write_slice_packets,
                           kMaxWriteSlicePackets));
  }
  if (o.link_delay.count() < 0 || o.link_jitter.count() < 0) {
    return bad("link_delay and link_jitter must not be negative");
  }
  if (!(o.link_loss >= 0 && o.link_loss <= kMaxLinkLoss)) {
    return bad(fmt::format("link_loss {} is outside 0..{}", o.link_loss, kMaxLinkLoss));
  }
  if (o.link_loss > 0 && (o.link_rto.count() <= 0 || o.link_rto > std::chrono::seconds(10))) {
    return bad("link_rto must be above 0 and at most 10 s");
  }
  // A handshake takes up to four one-way trips (Hello, Challenge, Proof, Welcome), and a
  // heartbeat must still land within peer_timeout: a longer link delay would turn healthy
  // peers into failed ones.
  const auto link_worst = linkWorstCase(o);
  const char* link_terms = o.link_loss > 0
                               ? "link_delay + link_jitter + link_loss's retransmissions"
                               : "link_delay + link_jitter";
  if (link_worst * 4 >= o.handshake_timeout) {
    return bad(fmt::format("{} ({} ms) must be below a quarter of handshake_timeout ({} ms)",
                           link_terms, link_worst.count() / 1000.0, o.handshake_timeout.count()));
  }
  if (link_worst + o.heartbeat_interval >= o.peer_timeout) {
    return bad(fmt::format("{} + heartbeat_interval ({} ms) must be below peer_timeout ({} ms)",
                           link_terms, link_worst.count() / 1000.0 + o.heartbeat_interval.count(),
                           o.peer_timeout.count()));
  }
  if (o.inbound_budget_bytes != 0 &&
      o.inbound_budget_bytes < uint64_t{o.max_frame_bytes} + kFramePrefixBytes) {
    return bad(fmt::format("inbound_budget_bytes {} is below one frame of max_frame_bytes {}",
                           o.inbound_budget_bytes, o.max_frame_bytes));
  }
  if (o.max_handshaking_connections == 0) return bad("max_handshaking_connections must be >= 1");
  if (o.low_watermark > o.high_watermark || o.high_watermark == 0) {
    return bad("watermarks need 0 <= low_watermark <= high_watermark and high_watermark > 0");
  }
  return {};
}

class Node::Impl {
 public:
  explicit Impl(NodeOptions options)
      : options_(std::move(options)),
        logger_(makeLogger(options_)),
        limits_{options_.max_frame_bytes, options_.max_verifier_depth,
                options_.max_verifier_tables},
        budget_(options_.inbound_budget_bytes != 0
                    ? options_.inbound_budget_bytes
                    : 2 * (uint64_t{options_.max_frame_bytes} + kFramePrefixBytes)),
        loop_(logger_),
        members_(options_.members.begin(), options_.members.end()) {
    for (NodeId id : options_.members) {
      if (id == options_.self) continue;
      counters_.emplace(id, std::make_unique<PeerCounters>());
      slots_[id].id = id;
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
      if (!members_.contains(peer.id) || peer.id == options_.self) {
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
    {
      std::lock_guard lock(mutex_);
      for (const auto& entry : resolved)
        expected_.insert(entry.first.id);
    }
    return runOnLoop([this, resolved] {
      for (const auto& [peer, address] : resolved) {
        PeerSlot& slot = slots_.at(peer.id);
        slot.expected = true;
        slot.we_dial = peer.id > options_.self;
        slot.address = address;
        slot.address_text = fmt::format("{}:{}", peer.host, peer.port);
        if (slot.we_dial) dialFromLoop(slot);
      }
      return Status{};
    });
  }

  Status waitClusterReady(milliseconds timeout) {
    std::unique_lock lock(mutex_);
    const auto missing = [this] {
      std::vector<NodeId> out;
      for (NodeId id : expected_) {
        if (!connected_.contains(id)) out.push_back(id);
      }
      return out;
    };
    const auto describe = [&](const std::vector<NodeId>& ids) {
      std::string list;
      for (NodeId id : ids) {
        auto reason = last_reason_.find(id);
        // The lower id dials: a lower peer not heard from has not reached this node.
        const char* none = id < options_.self ? "it dials this node and has not yet: not started?"
                                              : "no attempt seen yet";
        list += fmt::format("{}peer {} ({})", list.empty() ? "" : ", ", id,
                            reason == last_reason_.end() ? none : reason->second);
      }
      return list;
    };
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const auto done = [&] { return missing().empty() || !running_.load() || !fatal_.empty(); };
    // Wait in slices, saying every slice whom we still wait for: a person starting machines by
    // hand sees what is missing and why, instead of silence until the time-out.
    while (!done()) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      const auto slice = options_.ready_progress_interval.count() > 0
                             ? std::min<std::chrono::steady_clock::duration>(
                                   deadline - now, options_.ready_progress_interval)
                             : deadline - now;
      if (ready_cv_.wait_for(lock, slice, done)) break;
      if (std::chrono::steady_clock::now() < deadline) {
        const auto still = missing();
        logger_->info("still waiting for {} of {} peers: {}", still.size(), expected_.size(),
                      describe(still));
      }
    }
    if (!fatal_.empty()) return {ErrorCode::kRefused, fatal_};
    const auto still = missing();
    if (still.empty()) return {};
    return {ErrorCode::kTimeout, fmt::format("cluster \"{}\" not ready after {} ms: {} of {} peers "
                                             "missing: {}",
                                             options_.cluster, timeout.count(), still.size(),
                                             expected_.size(), describe(still))};
  }

  SharedFrame encode(wire::Body type, const BodyWriter& write_body, size_t size_hint = 0,
                     Attachment attachment = {}) {
    EnvelopeHeader header{options_.self, options_.cluster, next_sequence_.fetch_add(1),
                          steadyNowNs()};
    return encodeFrame(header, type, write_body, size_hint, std::move(attachment));
  }

  void send(NodeId to, const SharedFrame& frame, const SendCallback& done) {
    assert(frame != nullptr);
    if (loop_.onLoopThread()) {
      sendFromLoop(to, frame, done);
      return;
    }
    if (!running_.load() ||
        !loop_.post([this, to, frame, done] { sendFromLoop(to, frame, done); })) {
      if (done)
        done(to, {ErrorCode::kShutdown, fmt::format("node {} is not running", options_.self)});
    }
  }

  void broadcast(const std::vector<NodeId>& to, const SharedFrame& frame,
                 const SendCallback& done) {
    assert(frame != nullptr);
    if (loop_.onLoopThread()) {
      for (NodeId peer : to)
        sendFromLoop(peer, frame, done);
      return;
    }
    // One closure for all peers: the frame is shared, never copied per connection.
    if (!running_.load() || !loop_.post([this, to, frame, done] {
          for (NodeId peer : to)
            sendFromLoop(peer, frame, done);
        })) {
      for (NodeId peer : to) {
        if (done)
          done(peer, {ErrorCode::kShutdown, fmt::format("node {} is not running", options_.self)});
      }
    }
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

  void sendTransient(NodeId to, const SharedFrame& frame, const SendCallback& done) {
    assert(frame != nullptr);
    if (!loop_.onLoopThread()) {
      // Off the loop the bytes cannot be written before this returns: copy them all.
      send(to, frame->tailCopy(0), done);
      return;
    }
    Connection* connection = connectionForSendFromLoop(to, done);
    if (connection == nullptr) return;
    connection->writeTransientFromLoop(frame, [to, done](const Status& status) {
      if (done) done(to, status);
    });
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

  PeerStats stats(NodeId peer) const {
    PeerStats out;
    auto it = counters_.find(peer);
    if (it == counters_.end()) return out;
    const PeerCounters& c = *it->second;
    out.connected = c.connected.load();
    out.slow = c.slow.load();
    out.bytes_in = c.bytes_in.load();
    out.bytes_out = c.bytes_out.load();
    out.frames_in = c.frames_in.load();
    out.frames_out = c.frames_out.load();
    out.queued_bytes = c.queued_bytes.load();
    out.times_up = c.times_up.load();
    out.frames_lost = c.frames_lost.load();
    return out;
  }

  PeerStats totals() const {
    PeerStats out;
    for (const auto& [peer, c] : counters_) {
      out.bytes_in += c->bytes_in.load();
      out.bytes_out += c->bytes_out.load();
      out.frames_in += c->frames_in.load();
      out.frames_out += c->frames_out.load();
      out.queued_bytes += c->queued_bytes.load();
      out.times_up += c->times_up.load();
      out.frames_lost += c->frames_lost.load();
    }
    return out;
  }

  std::vector<NodeId> connectedPeers() const {
    std::lock_guard lock(mutex_);
    return {connected_.begin(), connected_.end()};
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
      std::unique_lock lock(mutex_);
      ready_cv_.wait_for(lock, linger + milliseconds(100),
                         [this] { return open_connections_ == 0; });
    }
    running_.store(false);
    loop_.post([this] { closeAllFromLoop(); });
    loop_close_result_ = loop_.join();
    shut_down_ = true;
    ready_cv_.notify_all();
    logger_->debug("stopped; uv_loop_close() returned {}", loop_close_result_);
  }

  uint16_t port() const { return port_.load(); }
  int loopCloseResult() const { return loop_close_result_; }
  bool onLoopThread() const { return loop_.onLoopThread(); }

  NodeOptions options_;
  std::shared_ptr<spdlog::logger> logger_;

 private:
  struct PeerSlot {
    NodeId id = 0;
    bool expected = false;  // named in connect()
    bool we_dial = false;   // our id is lower
    bool gave_up = false;   // a permanent refusal: never dialed again
    bool slow = false;
    sockaddr_storage address{};
    std::string address_text;
    Connection* connection = nullptr;  // established connection
    Connection* dialing = nullptr;     // dial attempt in progress
    milliseconds backoff{0};
    uv::HandlePtr<uv::Timer> redial_timer;
  };

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
    heartbeat_timer_ = uv::Timer::create(loop_.uvLoop());
    const auto tick = std::max<int64_t>(
        1, std::min(options_.heartbeat_interval.count(), options_.peer_timeout.count() / 4));
    heartbeat_timer_->startFromLoop(tick, tick, [this] { heartbeatTickFromLoop(); });
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
    raw->setLinkDelay(options_.link_delay, options_.link_jitter,
                      options_.link_seed * 0x9E3779B97F4A7C15ULL + options_.self * 1'000'003ULL +
                          ++connections_created_);
    raw->setLinkLoss(options_.link_loss, options_.link_rto);
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
    connections_.emplace(raw, std::move(connection));
    std::lock_guard lock(mutex_);
    open_connections_ = connections_.size();
    return raw;
  }

  PeerCounters* countersFor(const Connection& c) {
    if (!c.peer_known || !c.established) return nullptr;
    auto it = counters_.find(c.peer);
    return it == counters_.end() ? nullptr : it->second.get();
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
    connection->armDeadlineFromLoop(
        options_.handshake_timeout,
        {ErrorCode::kTimeout, fmt::format("no Hello within the handshake timeout of {} ms",
                                          options_.handshake_timeout.count())});
  }

  void dialFromLoop(PeerSlot& slot) {
    checkLoopThread();
    if (leaving_ || slot.connection != nullptr || slot.dialing != nullptr) return;
    Connection* connection =
        createConnectionFromLoop(uv::Tcp::create(loop_.uvLoop()), Connection::Role::kDialer);
    connection->peer = slot.id;
    connection->peer_known = true;
    connection->setDescription(fmt::format("peer {} ({})", slot.id, slot.address_text));
    slot.dialing = connection;
    logger_->debug("dialing peer {} at {}", slot.id, slot.address_text);
    connection->armDeadlineFromLoop(
        options_.connect_timeout,
        {ErrorCode::kTimeout, fmt::format("connect to {} timed out after {} ms", slot.address_text,
                                          options_.connect_timeout.count())});
    Status status = connection->tcp().connectFromLoop(
        reinterpret_cast<const sockaddr*>(&slot.address),
        [this, connection](const Status& st) { onConnectedFromLoop(*connection, st); });
    if (!status.ok()) connection->closeFromLoop(status);
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
    connection.armDeadlineFromLoop(
        options_.handshake_timeout,
        {ErrorCode::kTimeout, fmt::format("no Welcome within the handshake timeout of {} ms",
                                          options_.handshake_timeout.count())});
    const std::string cluster = options_.cluster;
    const NodeId self = options_.self;
    if (options_.cluster_key) {
      const HandshakeNonce nonce = newHandshakeNonce();
      connection.dialer_nonce.assign(nonce.begin(), nonce.end());
    }
    const std::vector<uint8_t>& nonce = connection.dialer_nonce;
    connection.writeFromLoop(encode(wire::Body::Hello,
                                    [&](flatbuffers::FlatBufferBuilder& b) {
                                      return wire::CreateHelloDirect(
                                                 b, cluster.c_str(), self, kProtocolVersion,
                                                 nonce.empty() ? nullptr : &nonce,
                                                 options_.run_fingerprint.c_str())
                                          .Union();
                                    }),
                             {});
  }

  bool onFrameFromLoop(Connection& connection, const InboundFrame& frame) {
    checkLoopThread();
    const wire::Envelope& envelope = frame.envelope();
    const wire::Body type = envelope.body_type();
    const NodeId sender = envelope.header()->sender();
    if (!connection.established) {
      if (connection.role() == Connection::Role::kAcceptor &&
          !connection.acceptor_nonce.empty()) {  // our Challenge is out
        if (sender != connection.peer) {
          return protocolErrorFromLoop(
              connection, fmt::format("Proof claims sender {} but the Hello came from node {}",
                                      sender, connection.peer));
        }
        if (type == wire::Body::Refuse) return refusedByPeerFromLoop(connection, envelope);
        if (type != wire::Body::Proof) {
          return protocolErrorFromLoop(
              connection,
              fmt::format("expected Proof after our Challenge, got {}", wire::EnumNameBody(type)));
        }
        handleProofFromLoop(connection, envelope);
        return connection.open();
      }
      if (connection.role() == Connection::Role::kAcceptor) {
        if (type != wire::Body::Hello) {
          return protocolErrorFromLoop(
              connection,
              fmt::format("expected Hello as the first frame, got {}", wire::EnumNameBody(type)));
        }
        handleHelloFromLoop(connection, envelope);
        return connection.open();
      }
      if (sender != connection.peer) {
        return protocolErrorFromLoop(
            connection, fmt::format("handshake answer claims sender {} but we dialed peer {}",
                                    sender, connection.peer));
      }
      if (type == wire::Body::Challenge) {
        handleChallengeFromLoop(connection, envelope);
        return connection.open();
      }
      if (type == wire::Body::Welcome) {
        if (options_.cluster_key && connection.acceptor_nonce.empty()) {
          const std::string refusal = fmt::format(
              "node {} accepted this node without proving the cluster's shared secret: it has no "
              "--secret-file; start every node with the same one",
              connection.peer);
          logger_->warn("refusing the Welcome of {}: {}", connection.description(), refusal);
          refuseFromLoop(connection, connection.peer, refusal);
          return false;
        }
        const auto* welcome = envelope.body_as_Welcome();
        if (welcome->node_id() != connection.peer ||
            welcome->protocol_version() != kProtocolVersion) {
          return protocolErrorFromLoop(
              connection, fmt::format("Welcome from node {} with protocol version {} (expected "
                                      "node {}, version {})",
                                      welcome->node_id(), welcome->protocol_version(),
                                      connection.peer, kProtocolVersion));
        }
        establishFromLoop(connection);
        return connection.open();
      }
      if (type == wire::Body::Refuse) return refusedByPeerFromLoop(connection, envelope);
      return protocolErrorFromLoop(
          connection, fmt::format("expected Welcome or Refuse, got {}", wire::EnumNameBody(type)));
    }
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

  // The peer refused the handshake before it completed (our Hello, Challenge or Proof): says so,
  // reports it and closes.
  bool refusedByPeerFromLoop(Connection& connection, const wire::Envelope& envelope) {
    const auto* refuse = envelope.body_as_Refuse();
    const std::string reason = refuse->reason() ? refuse->reason()->str() : "(no reason)";
    const char* ours = connection.role() == Connection::Role::kAcceptor ? "Challenge"
                       : connection.acceptor_nonce.empty()              ? "Hello"
                                                                        : "Proof";
    logger_->warn("{} (node {}) refused our {}: {}", connection.description(), connection.peer,
                  ours, reason);
    emitFromLoop({PeerEventKind::kRefused, connection.peer, reason});
    {
      std::lock_guard lock(mutex_);
      last_reason_[connection.peer] = "refused by the peer: " + reason;
    }
    // A dialer trusts the node at the topology's address to say when a retry is pointless; an
    // acceptor never ends its wait on the word of a connection that has not proved anything.
    if (refuse->permanent() && connection.role() == Connection::Role::kDialer) {
      giveUpFromLoop(connection.peer,
                     fmt::format("node {} refused this node: {}", connection.peer, reason));
    }
    connection.closeFromLoop({ErrorCode::kRefused, fmt::format("refused by peer: {}", reason)});
    return false;
  }

  bool protocolErrorFromLoop(Connection& connection, std::string reason) {
    connection.closeFromLoop({ErrorCode::kProtocol, std::move(reason)});
    return false;
  }

  void handleHelloFromLoop(Connection& connection, const wire::Envelope& envelope) {
    const auto* hello = envelope.body_as_Hello();
    const NodeId id = hello->node_id();
    const std::string cluster = hello->cluster() ? hello->cluster()->str() : "";
    std::string refusal;
    bool permanent = false;  // a retry would meet the same refusal
    const size_t nonce_bytes = hello->nonce() == nullptr ? 0 : hello->nonce()->size();
    if (envelope.header()->sender() != id) {
      refusal = fmt::format("Hello for node {} in a frame whose header says sender {}", id,
                            envelope.header()->sender());
    } else if (hello->protocol_version() != kProtocolVersion) {
      refusal = fmt::format("protocol version {} differs from this node's version {}",
                            hello->protocol_version(), kProtocolVersion);
      permanent = true;
    } else if (options_.cluster_key && nonce_bytes == 0) {
      // With a secret, nothing about the cluster (its name, members, who is connected) is said
      // before the dialer has proved it: the membership checks come after the Proof.
      refusal = fmt::format(
          "this cluster has a shared secret and node {} did not offer to prove it: start it "
          "with the cluster's --secret-file",
          id);
      permanent = true;
    } else if (options_.cluster_key && nonce_bytes != kHandshakeNonceBytes) {
      refusal = fmt::format("the Hello's nonce has {} bytes where a chorus node sends {}",
                            nonce_bytes, kHandshakeNonceBytes);
      permanent = true;
    } else if (options_.cluster_key) {
      // Checked after the Proof (memberRefusalFromLoop).
    } else if (cluster != options_.cluster) {
      refusal = fmt::format("cluster \"{}\" differs from this node's cluster \"{}\"", cluster,
                            options_.cluster);
      permanent = true;
    } else if (refusal = memberRefusalFromLoop(id); !refusal.empty()) {
      // as memberRefusalFromLoop says
    } else if (nonce_bytes > 0) {
      refusal = fmt::format(
          "node {} offers to prove a shared secret, but node {} has none: start every node with "
          "the same --secret-file",
          id, options_.self);
      permanent = true;
    }
    if (!refusal.empty()) {
      logger_->warn("refusing Hello from {} claiming node {}: {}", connection.description(), id,
                    refusal);
      refuseFromLoop(connection, id, refusal, permanent);
      return;
    }
    connection.peer_run = hello->run() ? hello->run()->str() : "";
    if (!options_.cluster_key) {
      admitFromLoop(connection, id);
      return;
    }
    // Prove the secret over the dialer's nonce and ask it to prove it over ours.
    connection.peer = id;  // claimed; peer_known only once the Proof checks out
    connection.dialer_nonce.assign(hello->nonce()->begin(), hello->nonce()->end());
    const HandshakeNonce nonce = newHandshakeNonce();
    connection.acceptor_nonce.assign(nonce.begin(), nonce.end());
    const HandshakeMac mac =
        handshakeMac(*options_.cluster_key, HandshakeRole::kAcceptor, options_.cluster,
                     options_.self, id, connection.dialer_nonce, connection.acceptor_nonce);
    connection.armDeadlineFromLoop(
        options_.handshake_timeout,
        {ErrorCode::kTimeout, fmt::format("no Proof within the handshake timeout of {} ms",
                                          options_.handshake_timeout.count())});
    connection.writeFromLoop(encode(wire::Body::Challenge,
                                    [&](flatbuffers::FlatBufferBuilder& b) {
                                      return wire::CreateChallenge(
                                                 b, b.CreateVector(connection.acceptor_nonce),
                                                 b.CreateVector(mac.data(), mac.size()))
                                          .Union();
                                    }),
                             {});
  }

  // Dialer: the acceptor proved the secret over our nonce (or did not); answer with our Proof.
  void handleChallengeFromLoop(Connection& connection, const wire::Envelope& envelope) {
    const auto* challenge = envelope.body_as_Challenge();
    const NodeId peer = connection.peer;
    std::string refusal;
    if (!options_.cluster_key) {
      refusal = fmt::format(
          "node {} asks for the cluster's shared secret, but node {} has none: start every node "
          "with the same --secret-file",
          peer, options_.self);
    } else if (challenge->nonce() == nullptr ||
               challenge->nonce()->size() != kHandshakeNonceBytes || challenge->mac() == nullptr) {
      refusal = fmt::format("node {} sent a Challenge without a {}-byte nonce or without a MAC",
                            peer, kHandshakeNonceBytes);
    } else {
      const std::span<const uint8_t> their_nonce(challenge->nonce()->data(),
                                                 challenge->nonce()->size());
      const HandshakeMac expected =
          handshakeMac(*options_.cluster_key, HandshakeRole::kAcceptor, options_.cluster, peer,
                       options_.self, connection.dialer_nonce, their_nonce);
      if (!handshakeMacMatches(expected, {challenge->mac()->data(), challenge->mac()->size()})) {
        refusal = fmt::format(
            "node {} failed the shared-secret challenge: its --secret-file (or its cluster name) "
            "differs from this node's",
            peer);
        // The node we dialed, at the topology's address, holds another secret: retrying
        // cannot help, so stop and say so (see giveUpFromLoop).
        giveUpFromLoop(peer, refusal);
      } else {
        connection.acceptor_nonce.assign(their_nonce.begin(), their_nonce.end());
      }
    }
    if (!refusal.empty()) {
      logger_->warn("refusing the Challenge of {}: {}", connection.description(), refusal);
      refuseFromLoop(connection, peer, refusal);
      return;
    }
    const HandshakeMac proof =
        handshakeMac(*options_.cluster_key, HandshakeRole::kDialer, options_.cluster, options_.self,
                     peer, connection.acceptor_nonce, connection.dialer_nonce);
    connection.writeFromLoop(
        encode(wire::Body::Proof,
               [&](flatbuffers::FlatBufferBuilder& b) {
                 return wire::CreateProof(b, b.CreateVector(proof.data(), proof.size())).Union();
               }),
        {});
  }

  // Acceptor: the dialer's answer to our Challenge.
  void handleProofFromLoop(Connection& connection, const wire::Envelope& envelope) {
    const auto* proof = envelope.body_as_Proof();
    const NodeId id = connection.peer;
    const HandshakeMac expected =
        handshakeMac(*options_.cluster_key, HandshakeRole::kDialer, options_.cluster, id,
                     options_.self, connection.acceptor_nonce, connection.dialer_nonce);
    std::string refusal;
    if (proof->mac() == nullptr ||
        !handshakeMacMatches(expected, {proof->mac()->data(), proof->mac()->size()})) {
      refusal = fmt::format(
          "node {} failed the shared-secret challenge: its --secret-file (or its cluster name) "
          "differs from this node's",
          id);
    } else {
      refusal = memberRefusalFromLoop(id);
    }
    connection.acceptor_nonce.clear();  // no longer awaiting a Proof
    if (!refusal.empty()) {
      logger_->warn("refusing the Proof from {} claiming node {}: {}", connection.description(), id,
                    refusal);
      refuseFromLoop(connection, id, refusal, /*permanent=*/proof->mac() != nullptr);
      return;
    }
    admitFromLoop(connection, id);
  }

  // Acceptor: why a dialer claiming `id` (of this cluster) cannot be welcomed now, or "". With a
  // secret, asked only once the dialer proved it.
  std::string memberRefusalFromLoop(NodeId id) {
    auto slot = slots_.find(id);
    if (id == options_.self) return fmt::format("node id {} is this node's own id", id);
    if (slot == slots_.end()) {
      return fmt::format("node id {} is not a member of cluster \"{}\"", id, options_.cluster);
    }
    if (id > options_.self) {
      return fmt::format("node {} must not dial node {}: the lower id dials", id, options_.self);
    }
    if (leaving_) return "node is shutting down";
    if (slot->second.connection != nullptr) {
      return fmt::format("node id {} is already connected", id);
    }
    return {};
  }

  // Acceptor, once the dialer is who it claims (or no secret is asked): welcomes it unless it
  // runs with other settings, which no retry would change.
  void admitFromLoop(Connection& connection, NodeId id) {
    const std::string difference =
        runDifference(options_.run_fingerprint, connection.peer_run, id, options_.self);
    if (difference.empty()) {
      welcomeFromLoop(connection, id);
      return;
    }
    logger_->error("refusing node {}: {}", id, difference);
    refuseFromLoop(connection, id, difference, /*permanent=*/true);
    // Only a peer that proved the secret can end this node's wait: without a secret anyone
    // could claim a member's id with other settings.
    if (options_.cluster_key) giveUpFromLoop(id, difference);
  }

  // A handshake with `peer` failed for a reason no retry changes: stop dialing it and end
  // waitClusterReady() at once with `reason`.
  void giveUpFromLoop(NodeId peer, const std::string& reason) {
    if (auto slot = slots_.find(peer); slot != slots_.end()) slot->second.gave_up = true;
    {
      std::lock_guard lock(mutex_);
      if (fatal_.empty()) fatal_ = reason;
    }
    ready_cv_.notify_all();
  }

  // Tells the peer why (Refuse), records the reason for waitClusterReady's report, and closes
  // once the Refuse is written (or the handshake time-out passes).
  void refuseFromLoop(Connection& connection, NodeId id, const std::string& refusal,
                      bool permanent = false) {
    connection.writeFromLoop(
        encode(wire::Body::Refuse,
               [&](flatbuffers::FlatBufferBuilder& b) {
                 return wire::CreateRefuseDirect(b, refusal.c_str(), permanent).Union();
               }),
        {});
    // Only a member's refusal is kept for the report: any host that reaches the port may claim
    // any id, and a record per claimed id would grow without bound.
    if (slots_.count(id) > 0) {
      emitFromLoop({PeerEventKind::kRefused, id, refusal});
      std::lock_guard lock(mutex_);
      last_reason_[id] = "refused: " + refusal;
    }
    connection.armDeadlineFromLoop(options_.handshake_timeout, {ErrorCode::kRefused, refusal});
    connection.closeAfterFlushFromLoop({ErrorCode::kRefused, refusal});
  }

  // Acceptor: the handshake succeeded.
  void welcomeFromLoop(Connection& connection, NodeId id) {
    connection.peer = id;
    connection.peer_known = true;
    connection.setDescription(fmt::format("peer {} ({})", id, connection.description()));
    const NodeId self = options_.self;
    connection.writeFromLoop(encode(wire::Body::Welcome,
                                    [&](flatbuffers::FlatBufferBuilder& b) {
                                      return wire::CreateWelcome(b, self, kProtocolVersion).Union();
                                    }),
                             {});
    establishFromLoop(connection);
  }

  // An accepted connection left its handshake (established or closing).
  void endHandshakeFromLoop(Connection& connection) {
    if (!connection.handshaking) return;
    connection.handshaking = false;
    handshaking_ -= 1;
  }

  void establishFromLoop(Connection& connection) {
    PeerSlot& slot = slots_.at(connection.peer);
    endHandshakeFromLoop(connection);
    connection.liftFrameLimitFromLoop();
    connection.established = true;
    connection.disarmDeadlineFromLoop();
    connection.last_receive = Clock::now();
    if (slot.dialing == &connection) slot.dialing = nullptr;
    slot.connection = &connection;
    slot.backoff = options_.dial_backoff_initial;
    PeerCounters& counters = *counters_.at(connection.peer);
    counters.connected = true;
    counters.times_up += 1;
    {
      std::lock_guard lock(mutex_);
      connected_.insert(connection.peer);
      last_reason_.erase(connection.peer);
    }
    ready_cv_.notify_all();
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
    auto found = slots_.find(connection.peer);
    if (found == slots_.end()) return;
    PeerSlot& slot = found->second;
    if (slot.connection == &connection) {
      slot.connection = nullptr;
      PeerCounters& counters = *counters_.at(slot.id);
      counters.connected = false;
      counters.queued_bytes = 0;
      {
        std::lock_guard lock(mutex_);
        connected_.erase(slot.id);
        last_reason_[slot.id] = status.toString();
      }
      ready_cv_.notify_all();
      if (slot.slow) {
        slot.slow = false;
        counters.slow = false;
      }
      if (status.code() == ErrorCode::kPeerLeft) {
        logger_->info("{} left: {}", connection.description(), status.message());
        emitFromLoop({PeerEventKind::kLeft, slot.id, status.toString()});
      } else {
        logger_->log(stopped_ ? spdlog::level::debug : spdlog::level::warn,
                     "{} down: closing its connection: {}", connection.description(),
                     status.toString());
        emitFromLoop({PeerEventKind::kDown, slot.id, status.toString()});
      }
      // A peer that left is redialed too: only the lower id dials, so a higher id restarted
      // (`--rejoin` after an orderly stop) could not come back otherwise. It returns as a new
      // process, not within milliseconds, so its redials start at the longest backoff.
      if (slot.we_dial) {
        const bool left = status.code() == ErrorCode::kPeerLeft;
        slot.backoff = left ? options_.dial_backoff_max : options_.dial_backoff_initial;
        scheduleDialFromLoop(slot, slot.backoff);
      }
      return;
    }
    if (slot.dialing == &connection) {
      slot.dialing = nullptr;
      {
        std::lock_guard lock(mutex_);
        last_reason_[slot.id] = status.toString();
      }
      if (slot.gave_up) {
        logger_->debug("not dialing {} again: {}", connection.description(), status.toString());
        return;
      }
      if (slot.backoff.count() == 0) slot.backoff = options_.dial_backoff_initial;
      const milliseconds delay = slot.backoff;
      slot.backoff = std::min(slot.backoff * 2, options_.dial_backoff_max);
      logger_->log(
          status.code() == ErrorCode::kRefused ? spdlog::level::warn : spdlog::level::debug,
          "dial to {} failed: {}; retrying in {} ms", connection.description(), status.toString(),
          delay.count());
      scheduleDialFromLoop(slot, delay);
      return;
    }
    // A refused or duplicate connection that never became the peer's connection.
    logger_->log(status.code() == ErrorCode::kRefused ? spdlog::level::debug : spdlog::level::warn,
                 "closing connection from {}: {}", connection.description(), status.toString());
  }

  void scheduleDialFromLoop(PeerSlot& slot, milliseconds delay) {
    if (leaving_ || stopped_) return;
    if (!slot.redial_timer) slot.redial_timer = uv::Timer::create(loop_.uvLoop());
    const NodeId id = slot.id;
    slot.redial_timer->startFromLoop(static_cast<uint64_t>(delay.count()), 0,
                                     [this, id] { dialFromLoop(slots_.at(id)); });
  }

  void onReleasedFromLoop(Connection& connection) {
    connections_.erase(&connection);
    {
      std::lock_guard lock(mutex_);
      open_connections_ = connections_.size();
    }
    ready_cv_.notify_all();
  }

  void onQueueChangedFromLoop(Connection& connection) {
    if (!connection.established) return;
    auto found = slots_.find(connection.peer);
    if (found == slots_.end() || found->second.connection != &connection) return;
    PeerSlot& slot = found->second;
    const size_t queued = connection.queuedBytes();
    PeerCounters& counters = *counters_.at(slot.id);
    counters.queued_bytes = queued;
    if (!slot.slow && queued >= options_.high_watermark) {
      slot.slow = true;
      counters.slow = true;
      emitFromLoop(
          {PeerEventKind::kSlow, slot.id,
           fmt::format("{} bytes queued (high watermark {})", queued, options_.high_watermark)});
    } else if (slot.slow && queued <= options_.low_watermark) {
      slot.slow = false;
      counters.slow = false;
      emitFromLoop(
          {PeerEventKind::kDrained, slot.id,
           fmt::format("{} bytes queued (low watermark {})", queued, options_.low_watermark)});
    }
  }

  void heartbeatTickFromLoop() {
    checkLoopThread();
    const auto now = Clock::now();
    SharedFrame heartbeat;
    std::vector<Connection*> snapshot;
    snapshot.reserve(connections_.size());
    for (auto& entry : connections_)
      snapshot.push_back(entry.first);
    for (Connection* connection : snapshot) {
      if (!connection->open() || !connection->established) continue;
      const auto silent = std::chrono::duration_cast<milliseconds>(now - connection->last_receive);
      if (silent > options_.peer_timeout) {
        connection->closeFromLoop(
            {ErrorCode::kTimeout,
             fmt::format("no frame from peer {} for {} ms (peer timeout {} ms)", connection->peer,
                         silent.count(), options_.peer_timeout.count())});
        continue;
      }
      if (now - connection->last_send >= options_.heartbeat_interval) {
        if (!heartbeat) {
          const int64_t echo = steadyNowNs();
          heartbeat = encode(wire::Body::Heartbeat, [echo](flatbuffers::FlatBufferBuilder& b) {
            return wire::CreateHeartbeat(b, echo).Union();
          });
        }
        connection->writeFromLoop(heartbeat, {});
      }
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
    auto found = slots_.find(to);
    if (found == slots_.end()) {
      return fail(ErrorCode::kNotConnected, fmt::format("peer {} is not a member", to));
    }
    Connection* connection = found->second.connection;
    if (connection == nullptr || !connection->open()) {
      return fail(ErrorCode::kNotConnected, fmt::format("peer {} is not connected", to));
    }
    return connection;
  }

  void sendFromLoop(NodeId to, const SharedFrame& frame, const SendCallback& done) {
    Connection* connection = connectionForSendFromLoop(to, done);
    if (connection == nullptr) return;
    connection->writeFromLoop(frame, [to, done](const Status& status) {
      if (done) done(to, status);
    });
  }

  void emitFromLoop(const PeerEvent& event) {
    if (stopped_ || !event_handler_) return;
    event_handler_(event);
  }

  void beginLeaveFromLoop(milliseconds linger) {
    checkLoopThread();
    leaving_ = true;
    listener_.reset();
    std::vector<Connection*> snapshot;
    for (auto& entry : connections_)
      snapshot.push_back(entry.first);
    for (auto& [id, slot] : slots_)
      slot.redial_timer.reset();
    for (Connection* connection : snapshot) {
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
    heartbeat_timer_.reset();
    for (auto& [id, slot] : slots_)
      slot.redial_timer.reset();
    std::vector<Connection*> snapshot;
    for (auto& entry : connections_)
      snapshot.push_back(entry.first);
    for (Connection* connection : snapshot) {
      connection->closeFromLoop({ErrorCode::kShutdown, "node shut down"});
    }
    // Closures still queued run inside stopFromLoop and see stopped_.
    loop_.stopFromLoop();
  }

  FrameLimits limits_;
  // Declared before loop_: frames handed to handlers hold reservations until they die.
  InboundBudget budget_;
  std::atomic<uint64_t> oversized_handshakes_{0};
  std::atomic<uint64_t> handshaking_{0};  // written on the loop thread only
  std::atomic<uint64_t> refused_connections_{0};
  EventLoop loop_;
  const std::set<NodeId> members_;
  std::map<NodeId, std::unique_ptr<PeerCounters>> counters_;  // fixed after construction
  std::atomic<uint64_t> next_sequence_{1};
  std::atomic<uint16_t> port_{0};
  std::atomic<bool> running_{false};

  mutable std::mutex mutex_;  // guards the fields below it up to the loop-only section
  std::condition_variable ready_cv_;
  std::set<NodeId> expected_;
  std::set<NodeId> connected_;
  std::map<NodeId, std::string> last_reason_;
  std::string fatal_;  // why waitClusterReady() fails at once (giveUpFromLoop); guarded by mutex_
  size_t open_connections_ = 0;

  std::mutex shutdown_mutex_;
  bool shut_down_ = false;
  int loop_close_result_ = 0;

  // Loop thread only.
  std::map<NodeId, PeerSlot> slots_;
  std::unordered_map<Connection*, std::unique_ptr<Connection>> connections_;
  uint64_t connections_created_ = 0;
  uv::HandlePtr<uv::Tcp> listener_;
  uv::HandlePtr<uv::Timer> heartbeat_timer_;
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
  impl_->send(to, frame, done);
}
void Node::broadcast(const std::vector<NodeId>& to, const SharedFrame& frame,
                     const SendCallback& done) {
  impl_->broadcast(to, frame, done);
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
