// Send-side backpressure: a peer that stops reading cannot make a node queue more than
// max_queued_bytes for it. A frame beyond the limit is refused (WhenFull::kRefuse) or pushes
// older frames of its kind out (WhenFull::kDropOlderOfKind); every callback still fires once.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "node/node.h"
#include "tests/node/test_util.h"

namespace chorus::node {
namespace {

using namespace testing;
using namespace std::chrono_literals;

constexpr const char* kCluster = "slow";
constexpr size_t kFrameBytes = 256u << 10;
constexpr size_t kLimit = 1u << 20;
// 64 MiB in all: more than loopback's socket buffers on both ends take (Linux's defaults let
// them grow to 32 MiB for reading and 4 MiB for writing), so the rest queues.
constexpr uint64_t kFrames = 256;

// Node 1 and a raw node 0 that completes the handshake and then reads nothing.
class SlowPeerTest : public ::testing::Test {
 protected:
  void SetUp() override { start({}); }
  // Starts node 1 (after SetUp's node was shut down, when called again) with `link_delay`.
  void start(std::chrono::microseconds link_delay) {
    if (node_) node_->shutdown(0ms);
    peer_.reset();
    node_.reset();
    NodeOptions o = fastOptions(kCluster, 1, {0, 1});
    o.link_delay = link_delay;
    o.peer_timeout = 60s;       // the raw peer sends no heartbeats
    o.handshake_timeout = 30s;  // the Welcome waits out the link delay too
    o.heartbeat_interval = 1s;
    o.high_watermark = 512u << 10;
    o.low_watermark = 128u << 10;
    o.max_queued_bytes = kLimit;
    o.log_level = spdlog::level::warn;
    node_ = std::make_unique<Node>(o);
    events_.attach(*node_);
    ASSERT_TRUE(node_->listen().ok());
    ASSERT_TRUE(node_->connect({{0, "127.0.0.1", 0}}).ok());
    peer_ = std::make_unique<RawPeer>(node_->port());
    ASSERT_TRUE(peer_->handshake(kCluster, 0));
    ASSERT_TRUE(node_->waitClusterReady(kSoon).ok());
  }
  void TearDown() override {
    if (node_) node_->shutdown(0ms);
  }

  SharedFrame ping(uint64_t nonce) {
    std::vector<uint8_t> payload(kFrameBytes, static_cast<uint8_t>(nonce));
    return ping::encodeMessage(*node_, ping::wire::Body::Ping,
                               [&](flatbuffers::FlatBufferBuilder& b) {
                                 return ping::wire::CreatePingDirect(b, nonce, &payload).Union();
                               });
  }
  // Waits until every closure posted before ran on the loop thread.
  void drainLoop() {
    std::promise<void> ran;
    ASSERT_TRUE(node_->post([&ran] { ran.set_value(); }));
    ran.get_future().wait();
  }
  // Reads Ping frames until one with `last` arrived; returns their nonces in order.
  std::vector<uint64_t> readPingsUntil(uint64_t last) {
    std::vector<uint64_t> nonces;
    while (nonces.empty() || nonces.back() != last) {
      auto frame = peer_->readFrame();
      if (!frame) break;
      const ping::wire::Message* message = testing::pingMessageOf(*frame);
      if (message != nullptr && message->body_type() == ping::wire::Body::Ping) {
        nonces.push_back(message->body_as_Ping()->nonce());
      }
    }
    return nonces;
  }

  struct Outcomes {
    std::mutex mutex;
    std::condition_variable changed;
    std::map<uint64_t, std::vector<Status>> by_nonce;  // every callback, per frame
  };
  SendCallback record(Outcomes& outcomes, uint64_t nonce) {
    return [&outcomes, nonce](NodeId peer, const Status& status) {
      EXPECT_EQ(peer, 0u);
      std::lock_guard lock(outcomes.mutex);
      outcomes.by_nonce[nonce].push_back(status);
      outcomes.changed.notify_all();
    };
  }

  std::unique_ptr<Node> node_;
  EventRecorder events_;
  std::unique_ptr<RawPeer> peer_;
};

TEST_F(SlowPeerTest, AFullQueueRefusesFramesInsteadOfGrowing) {
  Outcomes outcomes;
  for (uint64_t i = 0; i < kFrames; ++i)
    node_->send(0, ping(i), record(outcomes, i));
  drainLoop();
  const PeerStats stats = node_->stats(0);
  EXPECT_LE(stats.queued_bytes, kLimit) << "the limit is real";
  EXPECT_GT(stats.frames_refused, 0u);
  EXPECT_TRUE(events_.waitFor(PeerEventKind::kSlow, 0));
  std::vector<uint64_t> refused;
  {
    std::lock_guard lock(outcomes.mutex);
    for (const auto& [nonce, statuses] : outcomes.by_nonce) {
      if (statuses.size() == 1 && statuses[0].code() == ErrorCode::kOverloaded) {
        EXPECT_NE(statuses[0].message().find("a frame of"), std::string::npos);
        refused.push_back(nonce);
      }
    }
  }
  EXPECT_EQ(refused.size(), stats.frames_refused);
  // The peer reads again: everything queued arrives, in order, and the queue drains.
  uint64_t last_accepted = 0;
  for (uint64_t i = 0; i < kFrames; ++i) {
    if (std::find(refused.begin(), refused.end(), i) == refused.end()) last_accepted = i;
  }
  const std::vector<uint64_t> received = readPingsUntil(last_accepted);
  EXPECT_EQ(received.size(), kFrames - refused.size());
  EXPECT_TRUE(std::is_sorted(received.begin(), received.end()));
  EXPECT_TRUE(events_.waitFor(PeerEventKind::kDrained, 0));
  std::promise<Status> later;
  node_->send(0, ping(kFrames), [&later](NodeId, const Status& s) { later.set_value(s); });
  EXPECT_TRUE(later.get_future().get().ok());
  // Every callback fired exactly once.
  std::lock_guard lock(outcomes.mutex);
  EXPECT_EQ(outcomes.by_nonce.size(), kFrames);
  for (const auto& [nonce, statuses] : outcomes.by_nonce) {
    EXPECT_EQ(statuses.size(), 1u) << "frame " << nonce;
  }
}

TEST_F(SlowPeerTest, NewerFramesOfAKindPushOlderOnesOut) {
  Outcomes outcomes;
  const SendOptions gossip{WhenFull::kDropOlderOfKind, /*kind=*/7};
  for (uint64_t i = 0; i < kFrames; ++i)
    node_->send(0, ping(i), gossip, record(outcomes, i));
  drainLoop();
  const PeerStats stats = node_->stats(0);
  EXPECT_LE(stats.queued_bytes, kLimit);
  EXPECT_GT(stats.frames_superseded, 0u);
  uint64_t superseded = 0, refused = 0;
  {
    std::lock_guard lock(outcomes.mutex);
    for (const auto& [nonce, statuses] : outcomes.by_nonce) {
      ASSERT_EQ(statuses.size(), 1u) << "frame " << nonce;
      if (statuses[0].ok()) continue;
      ASSERT_EQ(statuses[0].code(), ErrorCode::kOverloaded) << statuses[0].message();
      const bool dropped = statuses[0].message().find("superseded") != std::string::npos;
      superseded += dropped ? 1 : 0;
      refused += dropped ? 0 : 1;
    }
  }
  EXPECT_EQ(superseded, stats.frames_superseded);
  EXPECT_EQ(refused, stats.frames_refused);
  // What was neither superseded nor refused arrives, in order, once the peer reads (whether
  // the socket took it before or only now).
  std::vector<uint64_t> delivered;
  {
    std::lock_guard lock(outcomes.mutex);
    for (uint64_t i = 0; i < kFrames; ++i) {
      const auto& statuses = outcomes.by_nonce[i];
      if (statuses.empty() || statuses[0].ok()) delivered.push_back(i);
    }
  }
  ASSERT_FALSE(delivered.empty());
  EXPECT_EQ(readPingsUntil(delivered.back()), delivered);
  EXPECT_EQ(delivered.size() + superseded + refused, kFrames);
  // Frames of another kind are never pushed out by these.
  std::promise<Status> other;
  node_->send(0, ping(kFrames), [&other](NodeId, const Status& s) { other.set_value(s); });
  EXPECT_TRUE(other.get_future().get().ok());
}

// With a link delay every frame waits in the link shaper, so nothing leaves while a burst is
// sent and the outcome is exact: the queue holds kLimit / kFrameBytes frames.
TEST_F(SlowPeerTest, BehindALinkDelayTheLimitCountsHeldFramesAndDropsTheOldestHeld) {
  // Long enough that the whole burst is queued before the first frame may leave, even under
  // ThreadSanitizer on a loaded machine (400 ms was not).
  start(3s);
  constexpr uint64_t kBurst = 20;
  constexpr uint64_t kFit = kLimit / kFrameBytes - 1;  // the Envelope makes a frame a bit larger
  for (const WhenFull policy : {WhenFull::kRefuse, WhenFull::kDropOlderOfKind}) {
    SCOPED_TRACE(policy == WhenFull::kRefuse ? "refuse" : "drop older");
    const uint64_t base = policy == WhenFull::kRefuse ? 0 : 1000;
    const PeerStats before = node_->stats(0);
    Outcomes outcomes;
    for (uint64_t i = 0; i < kBurst; ++i)
      node_->send(0, ping(base + i), SendOptions{policy, 0}, record(outcomes, base + i));
    drainLoop();
    const PeerStats stats = node_->stats(0);
    EXPECT_LE(stats.queued_bytes, kLimit);
    std::vector<uint64_t> expected;  // what the peer must receive
    if (policy == WhenFull::kRefuse) {
      EXPECT_EQ(stats.frames_refused - before.frames_refused, kBurst - kFit);
      EXPECT_EQ(stats.frames_superseded - before.frames_superseded, 0u);
      for (uint64_t i = 0; i < kFit; ++i)
        expected.push_back(base + i);
    } else {
      EXPECT_EQ(stats.frames_refused - before.frames_refused, 0u);
      EXPECT_EQ(stats.frames_superseded - before.frames_superseded, kBurst - kFit);
      for (uint64_t i = kBurst - kFit; i < kBurst; ++i)
        expected.push_back(base + i);
    }
    EXPECT_EQ(readPingsUntil(expected.back()), expected);
    // Every callback fires exactly once: the held frames' once they were written.
    std::unique_lock lock(outcomes.mutex);
    EXPECT_TRUE(outcomes.changed.wait_for(lock, kSoon, [&] {
      for (uint64_t i = 0; i < kBurst; ++i) {
        if (outcomes.by_nonce[base + i].empty()) return false;
      }
      return true;
    }));
    for (const auto& [nonce, statuses] : outcomes.by_nonce) {
      ASSERT_EQ(statuses.size(), 1u) << "frame " << nonce;
      const bool delivered = std::find(expected.begin(), expected.end(), nonce) != expected.end();
      EXPECT_EQ(statuses[0].ok(), delivered) << "frame " << nonce << ": " << statuses[0].message();
    }
  }
}

TEST(SendPolicy, TheQueueLimitMayNotBeBelowTheHighWatermark) {
  NodeOptions o = fastOptions(kCluster, 0, {0, 1});
  o.max_queued_bytes = o.high_watermark - 1;
  const Status status = validateOptions(o);
  EXPECT_EQ(status.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(status.message().find("max_queued_bytes"), std::string::npos);
}

}  // namespace
}  // namespace chorus::node
