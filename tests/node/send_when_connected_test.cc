// node::SendWhenConnected: frames for a peer whose connection is not up yet are held and sent,
// in order, when it comes up; a dropped peer's and a destroyed sender's held frames complete
// with an error; every callback fires exactly once.
#include "node/send_when_connected.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "node/node.h"
#include "tests/node/test_util.h"

namespace chorus::node {
namespace {

using namespace testing;
using namespace std::chrono_literals;

constexpr const char* kCluster = "held";

// Node 1 of {0, 1, 2}: node 0 is a raw peer that dials it when the test says so, node 2 never
// connects.
class SendWhenConnectedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    NodeOptions o = fastOptions(kCluster, 1, {0, 1, 2});
    o.peer_timeout = 60s;  // the raw peer sends no heartbeats
    o.log_level = spdlog::level::warn;
    node_ = std::make_unique<Node>(o);
    outbox_ = std::make_unique<SendWhenConnected>(*node_);
    node_->setEventHandler([this](const PeerEvent& event) {
      if (event.kind == PeerEventKind::kUp && outbox_) outbox_->peerUpFromLoop(event.peer);
    });
    ASSERT_TRUE(node_->listen().ok());
    ASSERT_TRUE(node_->connect({{0, "127.0.0.1", 0}}).ok());
  }
  void TearDown() override {
    node_->shutdown(0ms);
    outbox_.reset();
  }

  // Runs `fn` on the loop thread and waits for it.
  template <class Fn>
  auto onLoop(Fn fn) -> decltype(fn()) {
    std::packaged_task<decltype(fn())()> task(std::move(fn));
    auto result = task.get_future();
    EXPECT_TRUE(node_->post([&task] { task(); }));
    return result.get();
  }
  SharedFrame ping(uint64_t nonce) {
    return ping::encodeMessage(*node_, ping::wire::Body::Ping,
                               [&](flatbuffers::FlatBufferBuilder& b) {
                                 return ping::wire::CreatePing(b, nonce).Union();
                               });
  }
  // Records every completion of the frame `nonce`.
  SendCallback record(uint64_t nonce) {
    return [this, nonce](NodeId, const Status& status) {
      std::lock_guard lock(mutex_);
      outcomes_[nonce].push_back(status);
      changed_.notify_all();
    };
  }
  // The completions of `nonce` once there is at least one (or none after kSoon).
  std::vector<Status> outcomesOf(uint64_t nonce) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, kSoon, [&] { return outcomes_.count(nonce) > 0; });
    return outcomes_.count(nonce) ? outcomes_[nonce] : std::vector<Status>{};
  }
  size_t completions() {
    std::lock_guard lock(mutex_);
    size_t n = 0;
    for (const auto& [nonce, statuses] : outcomes_)
      n += statuses.size();
    return n;
  }
  // Pings read from `peer` until `last`, in order.
  static std::vector<uint64_t> readPingsUntil(RawPeer& peer, uint64_t last) {
    std::vector<uint64_t> nonces;
    while (nonces.empty() || nonces.back() != last) {
      auto frame = peer.readFrame();
      if (!frame) break;
      const ping::wire::Message* message = pingMessageOf(*frame);
      if (message != nullptr && message->body_type() == ping::wire::Body::Ping) {
        nonces.push_back(message->body_as_Ping()->nonce());
      }
    }
    return nonces;
  }

  std::unique_ptr<Node> node_;
  std::unique_ptr<SendWhenConnected> outbox_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<uint64_t, std::vector<Status>> outcomes_;
};

TEST_F(SendWhenConnectedTest, HoldsFramesUntilThePeerComesUpThenSendsThemInOrder) {
  const auto held = onLoop([&] {
    for (uint64_t nonce : {1, 2, 3})
      outbox_->sendFromLoop({0}, ping(nonce), record(nonce));
    return outbox_->heldFrames(0);
  });
  EXPECT_EQ(held, 3u);
  EXPECT_EQ(completions(), 0u) << "a held frame has not completed";

  RawPeer peer(node_->port());
  ASSERT_TRUE(peer.handshake(kCluster, 0));
  EXPECT_EQ(readPingsUntil(peer, 3), (std::vector<uint64_t>{1, 2, 3}));
  for (uint64_t nonce : {1, 2, 3}) {
    const std::vector<Status> outcomes = outcomesOf(nonce);
    ASSERT_EQ(outcomes.size(), 1u) << nonce;
    EXPECT_TRUE(outcomes[0].ok()) << outcomes[0].toString();
  }
  // Connected: a new frame goes at once.
  EXPECT_EQ(onLoop([&] {
              outbox_->sendFromLoop({0}, ping(4), record(4));
              return outbox_->heldFrames(0);
            }),
            0u);
  EXPECT_EQ(readPingsUntil(peer, 4), (std::vector<uint64_t>{4}));
  EXPECT_EQ(outcomesOf(4).size(), 1u);
}

TEST_F(SendWhenConnectedTest, ADroppedPeersFramesCompleteOnceWithTheReason) {
  onLoop([&] {
    outbox_->sendFromLoop({0, 2}, ping(5), record(5));
    outbox_->sendFromLoop({2}, ping(6), record(6));
    return 0;
  });
  EXPECT_EQ(onLoop([&] { return outbox_->heldFrames(2); }), 2u);
  onLoop([&] {
    outbox_->dropFromLoop(2, "it went down in the test");
    return 0;
  });
  for (uint64_t nonce : {5, 6}) {
    const std::vector<Status> outcomes = outcomesOf(nonce);
    ASSERT_EQ(outcomes.size(), 1u) << nonce;  // node 0's copy of 5 is still held
    EXPECT_EQ(outcomes[0].code(), ErrorCode::kNotConnected);
    EXPECT_NE(outcomes[0].message().find("it went down in the test"), std::string::npos)
        << outcomes[0].toString();
  }
  EXPECT_EQ(onLoop([&] { return outbox_->heldFrames(2); }), 0u);
  EXPECT_EQ(onLoop([&] { return outbox_->heldFrames(0); }), 1u);
  // The sender ends with node 0's copy still held: it completes with kShutdown.
  onLoop([&] {
    outbox_.reset();
    return 0;
  });
  std::lock_guard lock(mutex_);
  ASSERT_EQ(outcomes_[5].size(), 2u);
  EXPECT_EQ(outcomes_[5][1].code(), ErrorCode::kShutdown);
  EXPECT_EQ(outcomes_[6].size(), 1u);
}

}  // namespace
}  // namespace chorus::node
