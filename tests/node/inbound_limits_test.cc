// What a node holds for peers that have not proved anything yet, and for those that have: the
// pre-handshake frame limit, the node-wide budget of inbound bytes in flight and the cap on
// connections still in their handshake (docs/wire-format.md, "Limits").
#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "node/node.h"
#include "node/secret.h"
#include "tests/node/test_util.h"

namespace chorus::node::testing {
namespace {

// Polls `done` until it holds or `timeout` passes (for counters no event announces).
bool waitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout = kSoon) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

ClusterKey keyOf(const std::string& secret) {
  return clusterKeyFromSecret(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(secret.data()), secret.size()));
}

// The bytes of a length prefix announcing a frame of `length` bytes.
std::vector<uint8_t> prefixOf(uint32_t length) {
  return {static_cast<uint8_t>(length), static_cast<uint8_t>(length >> 8),
          static_cast<uint8_t>(length >> 16), static_cast<uint8_t>(length >> 24)};
}

// Counts the Tensor frames a node's handler saw.
class TensorCounter {
 public:
  void attach(Node& node) {
    node.setHandler(ping::messageType(ping::wire::Body::Tensor),
                    [this](NodeId from, const InboundFrame& frame) {
                      const auto& message = ping::messageOf(frame);
                      std::lock_guard lock(mutex_);
                      seen_.emplace_back(from, message.body_as_Tensor()->values()->size());
                      changed_.notify_all();
                    });
  }
  bool waitFor(NodeId from, size_t floats) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, kSoon, [&] {
      for (const auto& [who, n] : seen_) {
        if (who == from && n == floats) return true;
      }
      return false;
    });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::pair<NodeId, size_t>> seen_;
};

SharedFrame tensorFrame(Node& node, size_t floats) {
  std::vector<float> values(floats, 0.5f);
  return ping::encodeMessage(
      node, ping::wire::Body::Tensor,
      [&](flatbuffers::FlatBufferBuilder& b) {
        return ping::wire::CreateTensorDirect(b, 1, &values).Union();
      },
      floats * sizeof(float));
}

// The largest legitimate frames of a handshake, measured from real nodes' answers with the
// longest cluster names and a secret's nonce: each must fit the pre-handshake limit with room.
TEST(HandshakeLimit, TheLargestHandshakeFramesFitWithAMargin) {
  const std::string ours(kMaxClusterNameBytes, 'a');
  const std::string theirs(kMaxClusterNameBytes, 'b');
  NodeOptions o = fastOptions(ours, 1, {0, 1});
  o.cluster_key = keyOf("s3cret");
  o.log_level = spdlog::level::err;
  Node node(o);
  ASSERT_TRUE(node.listen().ok());

  const EphemeralKey ephemeral = newEphemeralKey();
  const std::vector<uint8_t> nonce_bytes(ephemeral.public_key.begin(), ephemeral.public_key.end());
  const SharedFrame hello = makeHello(ours, 0, kProtocolVersion, &nonce_bytes);
  // A Hello of another cluster: the Refuse names both clusters (only a node without a secret
  // says so before a proof; with one, the dialer is challenged first).
  NodeOptions plain_options = fastOptions(ours, 1, {0, 1});
  plain_options.log_level = spdlog::level::err;
  Node plain(plain_options);
  ASSERT_TRUE(plain.listen().ok());
  RawPeer refused(plain.port());
  refused.sendFrame(makeHello(theirs, 0, kProtocolVersion, nullptr));
  const auto refuse = refused.readFrame();
  ASSERT_TRUE(refuse.has_value());
  ASSERT_EQ(envelopeOf(refuse->data()).body_type(), wire::Body::Refuse);
  // The right cluster: the Challenge carries a nonce and a MAC.
  RawPeer challenged(node.port());
  challenged.sendFrame(hello);
  const auto challenge = challenged.readFrame();
  ASSERT_TRUE(challenge.has_value());
  ASSERT_EQ(envelopeOf(challenge->data()).body_type(), wire::Body::Challenge);
  const HandshakeMac mac{};
  const SharedFrame proof = makeFrame(0, ours, wire::Body::Proof, [&](auto& b) {
    return wire::CreateProof(b, b.CreateVector(mac.data(), mac.size())).Union();
  });
  const size_t sizes[] = {hello->size(), refuse->size(), challenge->size(), proof->size()};
  std::printf(
      "largest handshake frames (prefix included): Hello %zu, Refuse %zu, Challenge %zu, "
      "Proof %zu bytes; limit %u\n",
      sizes[0], sizes[1], sizes[2], sizes[3], kHandshakeFrameBytes);
  for (size_t size : sizes)
    EXPECT_LE(size * 2, kHandshakeFrameBytes);
  node.shutdown(0ms);
}

// Two nodes of a cluster with the longest name and a secret still complete the handshake, and
// after it frames far above the pre-handshake limit arrive.
TEST(HandshakeLimit, ARealHandshakeWithTheLongestNameAndASecretPassesAndLiftsTheLimit) {
  const std::string cluster(kMaxClusterNameBytes, 'x');
  NodeOptions too_long = fastOptions(cluster + "x", 0, {0});
  EXPECT_EQ(validateOptions(too_long).code(), ErrorCode::kInvalidArgument);
  TensorCounter tensors;
  std::vector<std::unique_ptr<Node>> nodes;
  for (NodeId i = 0; i < 2; ++i) {
    NodeOptions o = fastOptions(cluster, i, {0, 1});
    o.cluster_key = keyOf("s3cret");
    o.log_level = spdlog::level::warn;
    nodes.push_back(std::make_unique<Node>(o));
  }
  tensors.attach(*nodes[1]);
  for (auto& n : nodes)
    ASSERT_TRUE(n->listen().ok());
  ASSERT_TRUE(nodes[0]->connect({{1, "127.0.0.1", nodes[1]->port()}}).ok());
  ASSERT_TRUE(nodes[1]->connect({{0, "127.0.0.1", nodes[0]->port()}}).ok());
  for (auto& n : nodes) {
    const Status ready = n->waitClusterReady(kSoon);
    ASSERT_TRUE(ready.ok()) << ready.message();
  }
  nodes[0]->send(1, tensorFrame(*nodes[0], 256 * 1024));  // 1 MiB
  EXPECT_TRUE(tensors.waitFor(0, 256 * 1024));
  for (auto& n : nodes) {
    n->shutdown(200ms);
    EXPECT_EQ(n->loopCloseResult(), 0);
  }
}

// Node 1 (with a secret) and its peer node 2; raw sockets that never said Hello.
class LimitedNodeTest : public ::testing::Test {
 protected:
  static constexpr const char* kCluster = "limits";

  void start(const std::function<void(NodeOptions&)>& adjust = {}) {
    log_ = std::make_shared<LogCapture>();
    for (NodeId i = 1; i <= 2; ++i) {
      NodeOptions o = fastOptions(kCluster, i, {0, 1, 2, 3});
      o.cluster_key = keyOf("s3cret");
      o.peer_timeout = 30s;
      if (i == 1) {
        o.log_sinks = {log_};
        if (adjust) adjust(o);
      } else {
        o.log_level = spdlog::level::warn;
      }
      nodes_.push_back(std::make_unique<Node>(o));
    }
    tensors_.attach(server());
    for (auto& n : nodes_)
      ASSERT_TRUE(n->listen().ok());
  }

  // Connects node 1 and node 2 and sends a Tensor of `floats` from 2 to 1.
  void expectClusterWorks(size_t floats = 1024) {
    ASSERT_TRUE(server().connect({{2, "127.0.0.1", peer().port()}}).ok());
    ASSERT_TRUE(peer().connect({{1, "127.0.0.1", server().port()}}).ok());
    for (auto& n : nodes_) {
      const Status ready = n->waitClusterReady(kSoon);
      ASSERT_TRUE(ready.ok()) << ready.message();
    }
    peer().send(1, tensorFrame(peer(), floats));
    EXPECT_TRUE(tensors_.waitFor(2, floats));
  }

  void TearDown() override {
    for (auto& n : nodes_) {
      n->shutdown(200ms);
      EXPECT_EQ(n->loopCloseResult(), 0);
    }
    if (HasFailure() && log_) std::fprintf(stderr, "--- node 1 log ---\n%s", log_->all().c_str());
  }

  Node& server() { return *nodes_[0]; }
  Node& peer() { return *nodes_[1]; }

  std::shared_ptr<LogCapture> log_;
  TensorCounter tensors_;  // outlives the nodes
  std::vector<std::unique_ptr<Node>> nodes_;
};

// The probe of the hardening issue: connections that announce frames of hundreds of MiB before
// their Hello. The node allocates nothing for them, closes each one saying why, and a real
// cluster still forms and works (frames of 4 MiB after the handshake).
TEST_F(LimitedNodeTest, HugeFramesAnnouncedBeforeTheHelloAllocateNothingAndAreClosed) {
  start();
  constexpr size_t kProbes = 8;
  constexpr uint32_t kAnnounced = 200u << 20;
  std::vector<std::unique_ptr<RawPeer>> probes;
  const std::vector<uint8_t> filler(64 * 1024, 0x5a);
  for (size_t i = 0; i < kProbes; ++i) {
    probes.push_back(std::make_unique<RawPeer>(server().port()));
    ASSERT_TRUE(probes.back()->connected());
    const auto prefix = prefixOf(kAnnounced);
    probes.back()->sendBytes(prefix.data(), prefix.size());
    probes.back()->sendBytes(filler.data(), filler.size());
  }
  for (auto& probe : probes)
    EXPECT_TRUE(probe->waitClosed()) << "the node kept a connection that announced 200 MiB";
  EXPECT_TRUE(log_->waitForLine({"closing connection from 127.0.0.1:", "before its handshake",
                                 "frame length 209715200 bytes exceeds the maximum of 4096 bytes "
                                 "before the handshake"}));
  ASSERT_TRUE(waitUntil([&] { return server().inboundStats().oversized_handshakes == kProbes; }));
  const InboundStats stats = server().inboundStats();
  // Nothing was reserved for them: not one buffer of a frame they announced.
  EXPECT_EQ(stats.peak_reserved_bytes, 0u);
  EXPECT_EQ(stats.reserved_bytes, 0u);
  expectClusterWorks(1024 * 1024);  // 4 MiB
  EXPECT_LE(server().inboundStats().peak_reserved_bytes, 2 * (4u << 20));
}

// A frame of one byte over the limit before the handshake is refused; one at the limit is read.
TEST_F(LimitedNodeTest, TheLimitBeforeTheHandshakeIsExact) {
  start();
  RawPeer over(server().port());
  const auto prefix = prefixOf(kHandshakeFrameBytes + 1);
  over.sendBytes(prefix.data(), prefix.size());
  EXPECT_TRUE(over.waitClosed());
  EXPECT_TRUE(log_->waitForLine({"frame length 4097 bytes exceeds the maximum of 4096 bytes"}));
  // A frame of exactly the limit is read whole, then refused for what it is (not CHRS).
  RawPeer exact(server().port());
  std::vector<uint8_t> at = prefixOf(kHandshakeFrameBytes);
  at.resize(kFramePrefixBytes + kHandshakeFrameBytes, 0x5a);
  exact.sendBytes(at.data(), at.size());
  EXPECT_TRUE(exact.waitClosed());
  EXPECT_TRUE(log_->waitForLine({"before its handshake", "wrong file identifier"}));
  expectClusterWorks();
}

// Members that are authenticated share one budget of inbound bytes in flight: a frame that
// would exceed it closes its connection with a line naming the peer, the frame being read
// arrives whole, and the budget is given back.
TEST(InboundBudget, AFrameOverTheBudgetClosesItsConnectionNamingThePeer) {
  auto log = std::make_shared<LogCapture>();
  TensorCounter tensors;
  EventRecorder events;
  NodeOptions o = fastOptions("budget", 3, {0, 1, 2, 3});
  o.max_frame_bytes = 1 << 20;
  o.inbound_budget_bytes = 3 << 19;  // 1.5 MiB: one frame of 0.95 MiB fits, two do not
  o.peer_timeout = 30s;
  o.log_sinks = {log};
  Node node(o);
  tensors.attach(node);
  events.attach(node);
  ASSERT_TRUE(node.listen().ok());
  constexpr size_t kFloats = 250'000;
  auto frameFrom = [&](NodeId sender) {
    std::vector<float> values(kFloats, 1.0f);
    return wireBytes(makeFrame(sender, "budget", ping::wire::Body::Tensor, [&](auto& b) {
      return ping::wire::CreateTensorDirect(b, 1, &values).Union();
    }));
  };
  RawPeer first(node.port());
  ASSERT_TRUE(first.handshake("budget", 0));
  RawPeer second(node.port());
  ASSERT_TRUE(second.handshake("budget", 1));
  const std::vector<uint8_t> a = frameFrom(0);
  const std::vector<uint8_t> b = frameFrom(1);
  first.sendBytes(a.data(), a.size() / 2);
  ASSERT_TRUE(waitUntil([&] { return node.inboundStats().reserved_bytes >= a.size(); }));
  second.sendBytes(b.data(), b.size() / 2);
  EXPECT_TRUE(second.waitClosed());
  ASSERT_TRUE(events.waitFor(PeerEventKind::kDown, 1));
  EXPECT_NE(events.lastReason(PeerEventKind::kDown, 1).find("above its budget of 1572864 bytes"),
            std::string::npos)
      << events.lastReason(PeerEventKind::kDown, 1);
  EXPECT_TRUE(log->waitForLine({"peer 1", "down", "overloaded", "inbound bytes in flight"}));
  EXPECT_EQ(node.inboundStats().refused_frames, 1u);
  first.sendBytes(a.data() + a.size() / 2, a.size() - a.size() / 2);
  EXPECT_TRUE(tensors.waitFor(0, kFloats));
  EXPECT_TRUE(waitUntil([&] { return node.inboundStats().reserved_bytes == 0; }));
  EXPECT_LE(node.inboundStats().peak_reserved_bytes, o.inbound_budget_bytes);
  node.shutdown(0ms);
  EXPECT_EQ(node.loopCloseResult(), 0);
}

// Connections that never say anything are bounded: beyond the cap the node closes new ones at
// once with a line saying why; once the silent ones are gone, a real peer connects.
TEST_F(LimitedNodeTest, ConnectionsBeyondTheHandshakeCapAreClosedAtOnce) {
  start([](NodeOptions& o) {
    o.max_handshaking_connections = 3;
    o.handshake_timeout = 30s;  // only the cap can close the fourth one in time
  });
  std::vector<std::unique_ptr<RawPeer>> silent;
  for (int i = 0; i < 3; ++i) {
    silent.push_back(std::make_unique<RawPeer>(server().port()));
    ASSERT_TRUE(silent.back()->connected());
  }
  ASSERT_TRUE(waitUntil([&] { return server().inboundStats().handshaking == 3; }));
  RawPeer fourth(server().port());
  EXPECT_TRUE(fourth.waitClosed(5s));
  EXPECT_TRUE(log_->waitForLine({"closing connection from 127.0.0.1:", "overloaded",
                                 "3 connections are still in their handshake (at most 3)"}));
  EXPECT_EQ(server().inboundStats().refused_connections, 1u);
  silent.clear();
  ASSERT_TRUE(waitUntil([&] { return server().inboundStats().handshaking == 0; }));
  expectClusterWorks();
}

}  // namespace
}  // namespace chorus::node::testing
