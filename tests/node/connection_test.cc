// One node facing a raw socket peer: malformed frames and handshake refusals close only the
// offending connection, with the reason logged, while the node keeps serving its other peer.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "node/node.h"
#include "tests/node/test_util.h"

namespace chorus::node {
namespace {

using namespace testing;
using namespace std::chrono_literals;

constexpr const char* kCluster = "gamma";

// Node B (id 1) dials node C (id 2); raw sockets play node 0 (or impostors) towards B.
class ServingNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_ = std::make_shared<LogCapture>();
    NodeOptions ob = fastOptions(kCluster, 1, {0, 1, 2, 3});
    ob.max_frame_bytes = 1 << 20;
    ob.peer_timeout = 30s;  // raw peers send no heartbeats
    ob.handshake_timeout = 500ms;
    ob.log_sinks = {log_};
    b_ = std::make_unique<Node>(ob);
    b_events_.attach(*b_);
    b_->setHandler(ping::messageType(ping::wire::Body::Ping),
                   [this](NodeId from, const InboundFrame& frame) {
                     const auto& message = ping::messageOf(frame);
                     std::lock_guard lock(mutex_);
                     pings_.emplace_back(from, message.body_as_Ping()->nonce());
                     changed_.notify_all();
                   });
    NodeOptions oc = fastOptions(kCluster, 2, {0, 1, 2, 3});
    oc.peer_timeout = 30s;
    oc.log_level = spdlog::level::warn;
    c_ = std::make_unique<Node>(oc);
    ASSERT_TRUE(b_->listen().ok());
    ASSERT_TRUE(c_->listen().ok());
    ASSERT_TRUE(b_->connect({{2, "127.0.0.1", c_->port()}}).ok());
    ASSERT_TRUE(c_->connect({{1, "127.0.0.1", b_->port()}}).ok());
    ASSERT_TRUE(b_->waitClusterReady(kSoon).ok());
    ASSERT_TRUE(c_->waitClusterReady(kSoon).ok());
  }

  void TearDown() override {
    b_->shutdown(500ms);
    c_->shutdown(500ms);
    EXPECT_EQ(b_->loopCloseResult(), 0);
    EXPECT_EQ(c_->loopCloseResult(), 0);
    if (HasFailure()) std::fprintf(stderr, "--- node 1 log ---\n%s", log_->all().c_str());
  }

  // C pings B and B's handler sees it: B still serves its healthy peer.
  void expectStillServing() {
    const uint64_t nonce = ++next_nonce_;
    c_->send(1, ping::encodeMessage(
                    *c_, ping::wire::Body::Ping, [nonce](flatbuffers::FlatBufferBuilder& b) {
                      return ping::wire::CreatePingDirect(b, nonce, nullptr).Union();
                    }));
    std::unique_lock lock(mutex_);
    EXPECT_TRUE(changed_.wait_for(lock, kSoon, [&] {
      for (const auto& [from, n] : pings_) {
        if (from == 2 && n == nonce) return true;
      }
      return false;
    })) << "node 1 stopped serving node 2";
  }

  // Handshakes a raw peer as node 0 and waits until B reports it up.
  std::unique_ptr<RawPeer> connectAsNodeZero() {
    auto raw = std::make_unique<RawPeer>(b_->port());
    EXPECT_TRUE(raw->connected());
    const size_t ups = b_events_.count(PeerEventKind::kUp, 0);
    EXPECT_TRUE(raw->handshake(kCluster, 0));
    EXPECT_TRUE(b_events_.waitFor(PeerEventKind::kUp, 0, ups + 1));
    return raw;
  }

  // Sends `bytes` after the handshake and checks the whole consequence.
  void expectBadFrameClosesOnlyThisConnection(const std::vector<uint8_t>& bytes,
                                              const std::string& reason, bool close_write = false) {
    auto raw = connectAsNodeZero();
    const size_t downs = b_events_.count(PeerEventKind::kDown, 0);
    raw->sendBytes(bytes.data(), bytes.size());
    if (close_write) raw->shutdownWrite();
    EXPECT_TRUE(raw->waitClosed()) << "node 1 kept the connection open";
    ASSERT_TRUE(b_events_.waitFor(PeerEventKind::kDown, 0, downs + 1));
    EXPECT_NE(b_events_.lastReason(PeerEventKind::kDown, 0).find(reason), std::string::npos)
        << b_events_.lastReason(PeerEventKind::kDown, 0);
    EXPECT_TRUE(log_->waitForLine({"[node 1]", "peer 0", reason}));
    expectStillServing();
    // The node still accepts node 0 afterwards.
    auto again = connectAsNodeZero();
  }

  // Everything the nodes' handlers point at is declared before the nodes, so it is
  // destroyed after them.
  std::shared_ptr<LogCapture> log_;
  EventRecorder b_events_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::pair<NodeId, uint64_t>> pings_;
  uint64_t next_nonce_ = 0;
  std::unique_ptr<Node> b_;
  std::unique_ptr<Node> c_;
};

std::vector<uint8_t> bytesOf(const SharedFrame& frame) {
  return {frame->data(), frame->data() + frame->size()};
}

TEST_F(ServingNodeTest, ZeroLengthFrameClosesConnection) {
  expectBadFrameClosesOnlyThisConnection({0, 0, 0, 0}, "zero-length frame");
}

TEST_F(ServingNodeTest, FrameOverMaximumClosesConnection) {
  expectBadFrameClosesOnlyThisConnection({0, 0, 0, 0x10}, "exceeds the maximum of 1048576");
}

TEST_F(ServingNodeTest, TruncatedFrameClosesConnection) {
  auto bytes = bytesOf(makePing(0, kCluster, 1, 64));
  bytes.resize(bytes.size() - 10);
  expectBadFrameClosesOnlyThisConnection(bytes, "truncated frame", /*close_write=*/true);
}

TEST_F(ServingNodeTest, FrameFailingVerifierClosesConnection) {
  auto bytes = bytesOf(makePing(0, kCluster, 1, 64));
  bytes[4] = 0xf0;  // root offset far outside the frame
  bytes[5] = 0xff;
  expectBadFrameClosesOnlyThisConnection(bytes, "failed the FlatBuffers Verifier");
}

TEST_F(ServingNodeTest, WrongFileIdentifierClosesConnection) {
  flatbuffers::FlatBufferBuilder b;
  auto header = wire::CreateHeaderDirect(b, 0, kCluster, 1, 0);
  auto body = wire::CreateHeartbeat(b, 1).Union();
  b.FinishSizePrefixed(wire::CreateEnvelope(b, header, wire::Body::Heartbeat, body), "XXXX");
  expectBadFrameClosesOnlyThisConnection({b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()},
                                         "wrong file identifier \"XXXX\"");
}

TEST_F(ServingNodeTest, UnknownBodyTypeClosesConnection) {
  flatbuffers::FlatBufferBuilder b;
  auto header = wire::CreateHeaderDirect(b, 0, kCluster, 1, 0);
  auto body = wire::CreateHeartbeat(b, 1).Union();
  wire::EnvelopeBuilder eb(b);
  eb.add_header(header);
  eb.add_body(body);
  b.AddElement<uint8_t>(wire::Envelope::VT_BODY_TYPE, 200, 0);
  b.FinishSizePrefixed(eb.Finish(), wire::EnvelopeIdentifier());
  expectBadFrameClosesOnlyThisConnection({b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()},
                                         "unknown body type 200");
}

TEST_F(ServingNodeTest, AServiceMessageFailingItsVerifierClosesConnection) {
  std::vector<uint8_t> message = pingMessageBytes(5);
  message[0] = 0xf0;  // the message's root offset far outside it
  message[1] = 0xff;
  expectBadFrameClosesOnlyThisConnection(
      handMadeServiceFrame(0, kCluster, ping::kPingServiceId, message),
      "bytes failed the FlatBuffers Verifier");
}

TEST_F(ServingNodeTest, AMisalignedServiceMessageClosesConnection) {
  // Valid in itself, but its 64-bit nonce would be read from a misaligned address.
  const auto frame = handMadeServiceFrame(0, kCluster, ping::kPingServiceId, pingMessageBytes(5),
                                          /*offset=*/4);
  ASSERT_FALSE(frame.empty());
  expectBadFrameClosesOnlyThisConnection(frame, "ping message not aligned to 8 bytes");
}

TEST_F(ServingNodeTest, AFrameOfAnUnknownServiceIsDroppedWithALineNamingThePeer) {
  auto raw = connectAsNodeZero();
  raw->sendFrame(makePing(0, kCluster, 1));
  const auto unknown = handMadeServiceFrame(0, kCluster, 77, pingMessageBytes(2));
  ASSERT_FALSE(unknown.empty());
  raw->sendBytes(unknown.data(), unknown.size());
  EXPECT_TRUE(log_->waitForLine({"frame of service 77 from peer 0 dropped", "no such service"}));
  // The connection stays: the next ping is dispatched.
  raw->sendFrame(makePing(0, kCluster, 3));
  std::unique_lock lock(mutex_);
  EXPECT_TRUE(changed_.wait_for(lock, kSoon, [&] { return pings_.size() == 2; }));
  EXPECT_EQ(pings_.back(), (std::pair<NodeId, uint64_t>{0, 3}));
  EXPECT_EQ(b_events_.count(PeerEventKind::kDown, 0), 0u);
}

TEST_F(ServingNodeTest, FrameClaimingAnotherSenderClosesConnection) {
  expectBadFrameClosesOnlyThisConnection(bytesOf(makePing(3, kCluster, 1)),
                                         "frame claims sender 3 but the handshake established "
                                         "peer 0");
}

TEST_F(ServingNodeTest, SecondHelloClosesConnection) {
  expectBadFrameClosesOnlyThisConnection(bytesOf(makeHello(kCluster, 0)),
                                         "unexpected Hello after the handshake");
}

TEST_F(ServingNodeTest, WellFormedFramesFromRawPeerAreDispatched) {
  auto raw = connectAsNodeZero();
  raw->sendFrame(makePing(0, kCluster, 4242));
  std::unique_lock lock(mutex_);
  EXPECT_TRUE(changed_.wait_for(lock, kSoon, [&] {
    for (const auto& [from, n] : pings_) {
      if (from == 0 && n == 4242) return true;
    }
    return false;
  }));
}

// The Refuse reason a raw peer receives after sending `hello`, then EOF.
std::string refusalFor(uint16_t port, const SharedFrame& hello) {
  RawPeer raw(port);
  EXPECT_TRUE(raw.connected());
  raw.sendFrame(hello);
  auto reply = raw.readFrame();
  if (!reply) return "<no reply>";
  EXPECT_TRUE(verifyFrame(reply->data(), reply->size(), FrameLimits{}).ok());
  const auto* envelope = &envelopeOf(reply->data());
  EXPECT_EQ(envelope->header()->sender(), 1u);
  if (envelope->body_type() != wire::Body::Refuse) return "<not a Refuse>";
  const std::string reason = envelope->body_as_Refuse()->reason()->str();
  EXPECT_TRUE(raw.waitClosed()) << "refused connection was left open";
  return reason;
}

TEST_F(ServingNodeTest, RefusesWrongCluster) {
  const auto reason = refusalFor(b_->port(), makeHello("other", 0));
  EXPECT_NE(reason.find("cluster \"other\" differs"), std::string::npos) << reason;
  EXPECT_TRUE(log_->waitForLine({"refusing Hello", "claiming node 0", "cluster \"other\""}));
  EXPECT_TRUE(b_events_.waitFor(PeerEventKind::kRefused, 0));
  expectStillServing();
}

TEST_F(ServingNodeTest, RefusesIdNotInCluster) {
  const auto reason = refusalFor(b_->port(), makeHello(kCluster, 7));
  EXPECT_NE(reason.find("node id 7 is not a member"), std::string::npos) << reason;
  EXPECT_TRUE(log_->waitForLine({"refusing Hello", "not a member"}));
  // A stranger's claimed id leaves no record: events come in order, so once a member's
  // refusal is reported, one for node 7 would have been too.
  refusalFor(b_->port(), makeHello("other", 0));
  ASSERT_TRUE(b_events_.waitFor(PeerEventKind::kRefused, 0));
  EXPECT_EQ(b_events_.count(PeerEventKind::kRefused, 7), 0u);
}

TEST_F(ServingNodeTest, RefusesIdAlreadyConnected) {
  auto first = connectAsNodeZero();
  const auto reason = refusalFor(b_->port(), makeHello(kCluster, 0));
  EXPECT_NE(reason.find("node id 0 is already connected"), std::string::npos) << reason;
  EXPECT_TRUE(log_->waitForLine({"refusing Hello", "already connected"}));
  // The established connection is untouched.
  first->sendFrame(makePing(0, kCluster, 77));
  std::unique_lock lock(mutex_);
  EXPECT_TRUE(changed_.wait_for(lock, kSoon, [&] {
    for (const auto& [from, n] : pings_) {
      if (from == 0 && n == 77) return true;
    }
    return false;
  }));
}

TEST_F(ServingNodeTest, RefusesOtherProtocolVersion) {
  const auto reason = refusalFor(b_->port(), makeHello(kCluster, 0, kProtocolVersion + 98));
  EXPECT_NE(reason.find(fmt::format("protocol version {} differs", kProtocolVersion + 98)),
            std::string::npos)
      << reason;
  EXPECT_TRUE(log_->waitForLine({"refusing Hello", "protocol version"}));
}

// Version 1 peers know nothing of attachments: they would read an attachment as the next
// frame's length, so they are refused at Hello.
TEST_F(ServingNodeTest, RefusesPeersOfTheProtocolWithoutAttachments) {
  static_assert(kProtocolVersion >= 2);
  const auto reason = refusalFor(b_->port(), makeHello(kCluster, 0, 1));
  EXPECT_NE(reason.find("protocol version 1 differs from this node's version"), std::string::npos)
      << reason;
}

TEST_F(ServingNodeTest, RefusesHigherIdThatDials) {
  const auto reason = refusalFor(b_->port(), makeHello(kCluster, 3));
  EXPECT_NE(reason.find("the lower id dials"), std::string::npos) << reason;
}

TEST_F(ServingNodeTest, RefusesHelloWhoseHeaderNamesAnotherSender) {
  const auto hello =
      makeFrame(2, kCluster, wire::Body::Hello, [](flatbuffers::FlatBufferBuilder& b) {
        return wire::CreateHelloDirect(b, kCluster, 0, kProtocolVersion).Union();
      });
  const auto reason = refusalFor(b_->port(), hello);
  EXPECT_NE(reason.find("header says sender 2"), std::string::npos) << reason;
}

TEST_F(ServingNodeTest, FirstFrameMustBeHello) {
  RawPeer raw(b_->port());
  raw.sendFrame(makePing(0, kCluster, 1));
  EXPECT_TRUE(raw.waitClosed());
  EXPECT_TRUE(log_->waitForLine({"before its handshake", "expected Hello as the first frame"}));
  expectStillServing();
}

TEST_F(ServingNodeTest, SilentConnectionIsClosedAfterHandshakeTimeout) {
  RawPeer raw(b_->port());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(raw.waitClosed());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 400ms);
  EXPECT_TRUE(log_->waitForLine({"no Hello within the handshake timeout of 500 ms"}));
  expectStillServing();
}

TEST_F(ServingNodeTest, BadFrameBeforeHandshakeIsLoggedWithAddress) {
  RawPeer raw(b_->port());
  const uint8_t zero[4] = {0, 0, 0, 0};
  raw.sendBytes(zero, 4);
  EXPECT_TRUE(raw.waitClosed());
  EXPECT_TRUE(log_->waitForLine({"closing connection from 127.0.0.1:", "zero-length frame"}));
}

// A real dialer that is refused surfaces the reason as an event and in the ready error.
TEST_F(ServingNodeTest, DialerSurfacesRefusal) {
  NodeOptions o = fastOptions("other-cluster", 0, {0, 1});
  o.log_level = spdlog::level::err;
  EventRecorder events;  // outlives the node
  Node dialer(o);
  events.attach(dialer);
  ASSERT_TRUE(dialer.listen().ok());
  ASSERT_TRUE(dialer.connect({{1, "127.0.0.1", b_->port()}}).ok());
  ASSERT_TRUE(events.waitFor(PeerEventKind::kRefused, 1));
  EXPECT_NE(events.lastReason(PeerEventKind::kRefused, 1).find("cluster \"other-cluster\""),
            std::string::npos);
  // Another cluster's name does not change on a retry: the dialer stops at once.
  const Status ready = dialer.waitClusterReady(kSoon);
  EXPECT_EQ(ready.code(), ErrorCode::kRefused);
  EXPECT_NE(ready.message().find("node 1 refused this node: cluster \"other-cluster\""),
            std::string::npos)
      << ready.message();
  dialer.shutdown(100ms);
  EXPECT_EQ(dialer.loopCloseResult(), 0);
}

}  // namespace
}  // namespace chorus::node
