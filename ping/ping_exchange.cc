#include "ping/ping_exchange.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>

#include "ping/ping_service.h"

namespace chorus::ping {

using node::ErrorCode;
using node::SharedFrame;

namespace {

using Clock = std::chrono::steady_clock;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<uint8_t> pingPayload(uint64_t seed, NodeId from, NodeId to, uint64_t nonce,
                                 size_t bytes) {
  uint64_t state = seed ^ (static_cast<uint64_t>(from) << 40) ^ (static_cast<uint64_t>(to) << 20) ^
                   (nonce * 0x2545f4914f6cdd1dULL);
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t word = splitmix64(state);
    for (size_t j = 0; j < 8 && i + j < bytes; ++j)
      out[i + j] = static_cast<uint8_t>(word >> (8 * j));
  }
  return out;
}

struct PingExchange::State {
  struct PerPeer {
    uint64_t outstanding_nonce = 0;  // 0 when none
    Clock::time_point sent_at;
    uint32_t pongs_verified = 0;
    uint32_t pings_answered = 0;
    double rtt_sum_us = 0;
    double rtt_min_us = std::numeric_limits<double>::infinity();
    double rtt_max_us = 0;
  };

  Node* node = nullptr;
  PingOptions options;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<NodeId, PerPeer> peers;  // guarded by mutex
  Status error;                     // first failure; guarded by mutex
  bool started = false;             // guarded by mutex

  bool completeLocked() const {
    for (const auto& [id, p] : peers) {
      if (p.pongs_verified < options.pings_per_peer || p.pings_answered < options.pings_per_peer) {
        return false;
      }
    }
    return true;
  }

  void failLocked(Status status) {
    if (error.ok()) error = std::move(status);
    changed.notify_all();
  }

  // Loop thread. Makes the next ping to `peer` outstanding (caller holds the mutex) and returns
  // it for sendPing(), which the caller calls after unlocking: a send to a peer that is not
  // connected fails at once, and its callback takes the mutex.
  SharedFrame nextPingLocked(NodeId peer, PerPeer& p) {
    const uint64_t nonce = p.pongs_verified + 1;
    const auto payload = pingPayload(options.seed, node->id(), peer, nonce, options.payload_bytes);
    p.outstanding_nonce = nonce;
    p.sent_at = Clock::now();
    return node->encode(messageType(wire::Body::Ping),
                        messageWriter(wire::Body::Ping,
                                      [&](flatbuffers::FlatBufferBuilder& b) {
                                        return wire::CreatePingDirect(b, nonce, &payload).Union();
                                      }),
                        payload.size());
  }

  void sendPing(NodeId peer, const SharedFrame& frame) {
    std::weak_ptr<State> weak = self;
    node->send(peer, frame, [weak](NodeId to, const Status& status) {
      if (status.ok()) return;
      if (auto state = weak.lock()) {
        std::lock_guard lock(state->mutex);
        state->failLocked(
            {status.code(), fmt::format("ping to peer {} failed: {}", to, status.message())});
      }
    });
  }

  void onPing(NodeId from, const node::InboundFrame& frame) {
    const auto* ping = messageOf(frame).body_as_Ping();
    std::vector<uint8_t> payload;
    if (ping->payload() != nullptr)
      payload.assign(ping->payload()->begin(), ping->payload()->end());
    const uint64_t nonce = ping->nonce();
    auto pong =
        node->encode(messageType(wire::Body::Pong),
                     messageWriter(wire::Body::Pong,
                                   [&](flatbuffers::FlatBufferBuilder& b) {
                                     return wire::CreatePongDirect(b, nonce, &payload).Union();
                                   }),
                     payload.size());
    node->send(from, pong);
    std::lock_guard lock(mutex);
    auto it = peers.find(from);
    if (it != peers.end()) {
      it->second.pings_answered += 1;
      changed.notify_all();
    }
  }

  void onPong(NodeId from, const node::InboundFrame& frame) {
    SharedFrame next;
    {
      std::lock_guard lock(mutex);
      next = checkPongLocked(from, *messageOf(frame).body_as_Pong());
    }
    if (next) sendPing(from, next);
  }

  // The next ping to send to `from`, if any.
  SharedFrame checkPongLocked(NodeId from, const wire::Pong& pong_message) {
    const wire::Pong* pong = &pong_message;
    auto it = peers.find(from);
    if (it == peers.end() || !started) return nullptr;
    PerPeer& p = it->second;
    if (pong->nonce() != p.outstanding_nonce || p.outstanding_nonce == 0) {
      failLocked({ErrorCode::kProtocol, fmt::format("peer {} answered ping {} but ping {} was "
                                                    "outstanding",
                                                    from, pong->nonce(), p.outstanding_nonce)});
      return nullptr;
    }
    const auto expected =
        pingPayload(options.seed, node->id(), from, p.outstanding_nonce, options.payload_bytes);
    const auto* echoed = pong->payload();
    if (echoed == nullptr || echoed->size() != expected.size() ||
        !std::equal(expected.begin(), expected.end(), echoed->begin())) {
      failLocked({ErrorCode::kProtocol,
                  fmt::format("peer {} echoed a wrong payload for ping {}", from, pong->nonce())});
      return nullptr;
    }
    const double rtt_us =
        std::chrono::duration<double, std::micro>(Clock::now() - p.sent_at).count();
    p.rtt_sum_us += rtt_us;
    p.rtt_min_us = std::min(p.rtt_min_us, rtt_us);
    p.rtt_max_us = std::max(p.rtt_max_us, rtt_us);
    p.pongs_verified += 1;
    p.outstanding_nonce = 0;
    changed.notify_all();
    return p.pongs_verified < options.pings_per_peer ? nextPingLocked(from, p) : nullptr;
  }

  std::weak_ptr<State> self;
};

PingExchange::PingExchange(Node& node, const std::vector<NodeId>& peers, PingOptions options)
    : node_(node), state_(std::make_shared<State>()) {
  state_->node = &node;
  state_->options = options;
  state_->self = state_;
  for (NodeId peer : peers)
    state_->peers[peer];
  std::weak_ptr<State> weak = state_;
  node_.setHandler(messageType(wire::Body::Ping),
                   [weak](NodeId from, const node::InboundFrame& frame) {
                     if (auto state = weak.lock()) state->onPing(from, frame);
                   });
  node_.setHandler(messageType(wire::Body::Pong),
                   [weak](NodeId from, const node::InboundFrame& frame) {
                     if (auto state = weak.lock()) state->onPong(from, frame);
                   });
}

PingExchange::~PingExchange() {
  node_.setHandler(messageType(wire::Body::Ping), {});
  node_.setHandler(messageType(wire::Body::Pong), {});
}

void PingExchange::cancel(const Status& why) {
  std::lock_guard lock(state_->mutex);
  state_->failLocked(why);
}

PingReport PingExchange::run() {
  const auto start = Clock::now();
  PingReport report;
  std::weak_ptr<State> weak = state_;
  const bool posted = node_.post([weak] {
    auto state = weak.lock();
    if (!state) return;
    std::vector<std::pair<NodeId, SharedFrame>> first;
    {
      std::lock_guard lock(state->mutex);
      state->started = true;
      if (state->options.pings_per_peer == 0) return;
      for (auto& [peer, p] : state->peers)
        first.emplace_back(peer, state->nextPingLocked(peer, p));
    }
    for (const auto& [peer, frame] : first)
      state->sendPing(peer, frame);
  });
  std::unique_lock lock(state_->mutex);
  if (!posted) {
    state_->failLocked({ErrorCode::kShutdown, "node is not running"});
  } else {
    state_->changed.wait_for(lock, state_->options.timeout,
                             [&] { return !state_->error.ok() || state_->completeLocked(); });
  }
  report.status = state_->error;
  const uint32_t k = state_->options.pings_per_peer;
  std::string missing;
  for (const auto& [peer, p] : state_->peers) {
    PeerPingReport r;
    r.peer = peer;
    r.pongs_verified = p.pongs_verified;
    r.pings_answered = p.pings_answered;
    if (p.pongs_verified > 0) {
      r.rtt_min_us = p.rtt_min_us;
      r.rtt_mean_us = p.rtt_sum_us / p.pongs_verified;
      r.rtt_max_us = p.rtt_max_us;
    }
    report.peers.push_back(r);
    if (p.pongs_verified < k || p.pings_answered < k) {
      missing +=
          fmt::format("{}peer {}: {} of {} pongs verified, {} of {} pings received",
                      missing.empty() ? "" : "; ", peer, p.pongs_verified, k, p.pings_answered, k);
    }
  }
  if (report.status.ok() && !missing.empty()) {
    report.status = {ErrorCode::kTimeout,
                     fmt::format("ping exchange incomplete after {} ms ({}); were all nodes "
                                 "started with the same --pings?",
                                 state_->options.timeout.count(), missing)};
  }
  report.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  return report;
}

}  // namespace chorus::ping
