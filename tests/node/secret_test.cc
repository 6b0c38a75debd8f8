// The cluster's shared secret: reading the secret file, the handshake MAC, and the
// challenge-response between real nodes and against a raw peer that forges or replays a proof.
#include "node/secret.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "tests/node/test_util.h"

namespace chorus::node::testing {
namespace {

constexpr char kCluster[] = "secret-test";

ClusterKey keyOf(const std::string& secret) {
  return clusterKeyFromSecret(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(secret.data()), secret.size()));
}

// A fresh directory under the system's temporary one, removed at the end of the test.
class TempDir {
 public:
  TempDir()
      : path_(std::filesystem::temp_directory_path() /
              ("chorus-secret-" + std::to_string(::getpid()) + "-" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  // Writes `content` to `name` with permissions `mode`; returns its path.
  std::string write(const std::string& name, const std::string& content, mode_t mode = 0600) {
    const std::filesystem::path file = path_ / name;
    std::ofstream(file, std::ios::binary) << content;
    ::chmod(file.c_str(), mode);
    return file.string();
  }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

TEST(ClusterKey, ReadsTheSecretFileWithoutItsTrailingLineBreaks) {
  TempDir dir;
  ClusterKey plain{}, with_newline{}, other{};
  std::string warning;
  ASSERT_TRUE(loadClusterKey(dir.write("a", "s3cret"), &plain, &warning).ok());
  EXPECT_EQ(warning, "");
  ASSERT_TRUE(loadClusterKey(dir.write("b", "s3cret\r\n\n"), &with_newline, &warning).ok());
  ASSERT_TRUE(loadClusterKey(dir.write("c", "s3cret2\n"), &other, &warning).ok());
  EXPECT_EQ(plain, with_newline);
  EXPECT_EQ(plain, keyOf("s3cret"));
  EXPECT_NE(plain, other);
  // The key is derived from the secret, not the secret itself.
  ClusterKey padded{};
  const std::string raw = "s3cret";
  std::copy(raw.begin(), raw.end(), padded.begin());
  EXPECT_NE(plain, padded);
}

TEST(ClusterKey, RefusesMissingEmptyAndOtherFilesNamingThem) {
  TempDir dir;
  ClusterKey key{};
  std::string warning;
  const std::string missing = dir.path() + "/missing";
  Status status = loadClusterKey(missing, &key, &warning);
  EXPECT_EQ(status.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(status.message().find("secret file " + missing), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("No such file"), std::string::npos) << status.message();

  const std::string empty = dir.write("empty", "\n\n");
  status = loadClusterKey(empty, &key, &warning);
  EXPECT_NE(status.message().find("secret file " + empty + " is empty"), std::string::npos)
      << status.message();

  status = loadClusterKey(dir.path(), &key, &warning);
  EXPECT_NE(status.message().find("not a regular file"), std::string::npos) << status.message();

  const std::string huge = dir.write("huge", std::string(64 * 1024 + 1, 'x'));
  status = loadClusterKey(huge, &key, &warning);
  EXPECT_NE(status.message().find("more than the 65536"), std::string::npos) << status.message();
}

TEST(ClusterKey, WarnsWhenOtherUsersMayReadTheFile) {
  TempDir dir;
  ClusterKey key{};
  std::string warning;
  const std::string open = dir.write("open", "s3cret", 0644);
  ASSERT_TRUE(loadClusterKey(open, &key, &warning).ok());
  EXPECT_NE(warning.find("may be read by other users (mode 644)"), std::string::npos) << warning;
  EXPECT_NE(warning.find("chmod 600 " + open), std::string::npos) << warning;
  ASSERT_TRUE(loadClusterKey(dir.write("closed", "s3cret", 0600), &key, &warning).ok());
  EXPECT_EQ(warning, "");
}

// Each input of the MAC matters, so that no proof serves another role, cluster, pair of nodes or
// handshake.
TEST(HandshakeMac, BindsTheRoleTheClusterBothIdsAndBothNonces) {
  const ClusterKey key = keyOf("s3cret");
  const HandshakeNonce a = newEphemeralKey().public_key;
  const HandshakeNonce b = newEphemeralKey().public_key;
  EXPECT_NE(a, b);
  const HandshakeMac mac = handshakeMac(key, HandshakeRole::kAcceptor, "c", 1, 0, a, b);
  EXPECT_TRUE(handshakeMacMatches(mac, mac));
  EXPECT_EQ(mac, handshakeMac(key, HandshakeRole::kAcceptor, "c", 1, 0, a, b));
  const std::vector<HandshakeMac> others{
      handshakeMac(keyOf("other"), HandshakeRole::kAcceptor, "c", 1, 0, a, b),
      handshakeMac(key, HandshakeRole::kDialer, "c", 1, 0, a, b),
      handshakeMac(key, HandshakeRole::kAcceptor, "d", 1, 0, a, b),
      handshakeMac(key, HandshakeRole::kAcceptor, "c", 0, 1, a, b),
      handshakeMac(key, HandshakeRole::kAcceptor, "c", 1, 2, a, b),
      handshakeMac(key, HandshakeRole::kAcceptor, "c", 1, 0, b, a),
      handshakeMac(key, HandshakeRole::kAcceptor, "c", 1, 0, a, a),
  };
  for (size_t i = 0; i < others.size(); ++i)
    EXPECT_FALSE(handshakeMacMatches(mac, others[i])) << "variant " << i;
  EXPECT_FALSE(handshakeMacMatches(mac, std::span<const uint8_t>(mac.data(), mac.size() - 1)));
}

// Nodes 0..n-1 on loopback, each with its own key (or none), dialing each other.
class SecretCluster {
 public:
  explicit SecretCluster(const std::vector<std::optional<ClusterKey>>& keys) {
    std::vector<NodeId> members;
    for (size_t i = 0; i < keys.size(); ++i)
      members.push_back(static_cast<NodeId>(i));
    events_.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      NodeOptions o = fastOptions(kCluster, static_cast<NodeId>(i), members);
      o.cluster_key = keys[i];
      o.log_level = spdlog::level::warn;
      nodes_.push_back(std::make_unique<Node>(o));
      events_[i] = std::make_unique<EventRecorder>();
      events_[i]->attach(*nodes_[i]);
      EXPECT_TRUE(nodes_[i]->listen().ok());
    }
    for (size_t i = 0; i < nodes_.size(); ++i) {
      std::vector<PeerAddress> peers;
      for (size_t j = 0; j < nodes_.size(); ++j) {
        if (j != i) peers.push_back({static_cast<NodeId>(j), "127.0.0.1", nodes_[j]->port()});
      }
      EXPECT_TRUE(nodes_[i]->connect(peers).ok());
    }
  }
  ~SecretCluster() {
    for (auto& n : nodes_)
      n->shutdown(100ms);
  }
  Node& node(size_t i) { return *nodes_[i]; }
  EventRecorder& events(size_t i) { return *events_[i]; }

 private:
  std::vector<std::unique_ptr<EventRecorder>> events_;  // outlive the nodes
  std::vector<std::unique_ptr<Node>> nodes_;
};

TEST(SharedSecret, NodesWithTheSameSecretConnectAndExchangeFrames) {
  const ClusterKey key = keyOf("s3cret");
  SecretCluster cluster({key, key, key});
  for (size_t i = 0; i < 3; ++i) {
    const Status ready = cluster.node(i).waitClusterReady(kSoon);
    EXPECT_TRUE(ready.ok()) << ready.message();
  }
  std::mutex mu;
  std::condition_variable changed;
  std::vector<uint64_t> nonces;
  cluster.node(2).setHandler(ping::messageType(ping::wire::Body::Ping),
                             [&](NodeId, const InboundFrame& frame) {
                               const auto& message = ping::messageOf(frame);
                               std::lock_guard lock(mu);
                               nonces.push_back(message.body_as_Ping()->nonce());
                               changed.notify_all();
                             });
  cluster.node(0).send(2, ping::encodeMessage(cluster.node(0), ping::wire::Body::Ping, [](auto& b) {
                         return ping::wire::CreatePingDirect(b, 42, nullptr).Union();
                       }));
  std::unique_lock lock(mu);
  EXPECT_TRUE(changed.wait_for(lock, kSoon, [&] { return !nonces.empty(); }));
  EXPECT_EQ(nonces, std::vector<uint64_t>{42});
}

// Sealed frames larger than a seal chunk (Connection writes them through 512 KiB chunks, cut
// anywhere), with and without attachments, between bursts of small ones that share a buffer:
// every frame arrives intact and in order, also those still queued when the sender shuts down
// (the Leave behind them makes the connection seal everything at once).
TEST(SealedTraffic, LargeAndSmallFramesArriveIntactAndInOrderThroughTheSealChunks) {
  const ClusterKey key = keyOf("s3cret");
  SecretCluster cluster({key, key});
  ASSERT_TRUE(cluster.node(0).waitClusterReady(kSoon).ok());
  ASSERT_TRUE(cluster.node(1).waitClusterReady(kSoon).ok());
  const auto pattern = [](uint64_t nonce, size_t n) {
    std::vector<uint8_t> bytes(n);
    for (size_t i = 0; i < n; ++i)
      bytes[i] = static_cast<uint8_t>(nonce * 131 + i * 7 + (i >> 9));
    return bytes;
  };
  // nonce -> (payload bytes, attachment bytes); the attachments live until the end.
  std::map<uint64_t, std::pair<size_t, size_t>> sizes;
  std::vector<std::unique_ptr<std::vector<uint8_t>>> attachments;
  std::vector<SharedFrame> frames;
  uint64_t nonce = 0;
  for (int burst = 0; burst < 3; ++burst) {
    for (const auto& [payload, attached] : std::vector<std::pair<size_t, size_t>>{
             {1'300'000, 0}, {100, 2'100'007}, {0, 0}, {600'000, 700'001}, {64, 0}}) {
      for (int copies = payload < 1000 && attached == 0 ? 300 : 1; copies > 0; --copies) {
        ++nonce;
        sizes[nonce] = {payload, attached};
        const std::vector<uint8_t> bytes = pattern(nonce, payload);
        Attachment attachment;
        if (attached > 0) {
          attachments.push_back(std::make_unique<std::vector<uint8_t>>(pattern(~nonce, attached)));
          attachment.push_back(*attachments.back());
        }
        frames.push_back(ping::encodeMessage(
            cluster.node(0), ping::wire::Body::Ping,
            [&](flatbuffers::FlatBufferBuilder& b) {
              return ping::wire::CreatePingDirect(b, nonce, &bytes).Union();
            },
            payload + 64, std::move(attachment)));
      }
    }
  }
  std::mutex mu;
  std::condition_variable changed;
  std::vector<uint64_t> order;
  std::vector<std::string> problems;
  cluster.node(1).setHandler(
      ping::messageType(ping::wire::Body::Ping), [&](NodeId, const InboundFrame& frame) {
        const auto* ping = ping::messageOf(frame).body_as_Ping();
        const uint64_t n = ping->nonce();
        const auto [payload, attached] = sizes.at(n);
        const std::vector<uint8_t> got_payload =
            ping->payload() == nullptr
                ? std::vector<uint8_t>()
                : std::vector<uint8_t>(ping->payload()->begin(), ping->payload()->end());
        const std::span<const uint8_t> got_attachment = frame.attachment();
        std::lock_guard lock(mu);
        if (got_payload != pattern(n, payload)) problems.push_back(fmt::format("payload of {}", n));
        if (std::vector<uint8_t>(got_attachment.begin(), got_attachment.end()) !=
            pattern(~n, attached)) {
          problems.push_back(fmt::format("attachment of {}", n));
        }
        order.push_back(n);
        changed.notify_all();
      });
  const size_t half = frames.size() / 2;
  for (size_t i = 0; i < half; ++i)
    cluster.node(0).send(1, frames[i]);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(changed.wait_for(lock, kSoon * 4, [&] { return order.size() == half; }))
        << order.size() << " of " << half;
  }
  for (size_t i = half; i < frames.size(); ++i)
    cluster.node(0).send(1, frames[i]);
  cluster.node(0).shutdown(kSoon);
  std::unique_lock lock(mu);
  ASSERT_TRUE(changed.wait_for(lock, kSoon * 4, [&] { return order.size() == frames.size(); }))
      << order.size() << " of " << frames.size();
  EXPECT_TRUE(problems.empty()) << fmt::format("{}", fmt::join(problems, ", "));
  std::vector<uint64_t> expected(frames.size());
  std::iota(expected.begin(), expected.end(), uint64_t{1});
  EXPECT_EQ(order, expected);
}

TEST(SharedSecret, ANodeWithAnotherSecretIsRefusedAndBothSidesSayWhy) {
  SecretCluster cluster({keyOf("s3cret"), keyOf("another")});
  // Node 0 dials: node 1's Challenge does not check out with node 0's key.
  ASSERT_TRUE(cluster.events(0).waitFor(PeerEventKind::kRefused, 1));
  EXPECT_NE(
      cluster.events(0)
          .lastReason(PeerEventKind::kRefused, 1)
          .find("node 1 failed the shared-secret challenge: its --secret-file (or its cluster "
                "name) differs"),
      std::string::npos)
      << cluster.events(0).lastReason(PeerEventKind::kRefused, 1);
  ASSERT_TRUE(cluster.events(1).waitFor(PeerEventKind::kRefused, 0));
  EXPECT_NE(cluster.events(1)
                .lastReason(PeerEventKind::kRefused, 0)
                .find("--secret-file (or its cluster name) differs"),
            std::string::npos);
  // A retry would meet the same secret: the dialer stops at once instead of timing out.
  const Status ready = cluster.node(0).waitClusterReady(kSoon);
  EXPECT_EQ(ready.code(), ErrorCode::kRefused);
  EXPECT_NE(ready.message().find("failed the shared-secret challenge"), std::string::npos)
      << ready.message();
  EXPECT_EQ(cluster.events(0).count(PeerEventKind::kUp, 1), 0u);
  EXPECT_EQ(cluster.events(1).count(PeerEventKind::kUp, 0), 0u);
}

TEST(SharedSecret, ANodeWithoutTheSecretIsRefusedAndSoIsOneThatHasOneAlone) {
  {
    SecretCluster cluster({std::nullopt, keyOf("s3cret")});
    ASSERT_TRUE(cluster.events(0).waitFor(PeerEventKind::kRefused, 1));
    const std::string reason = cluster.events(0).lastReason(PeerEventKind::kRefused, 1);
    EXPECT_NE(reason.find("this cluster has a shared secret and node 0 did not offer to prove it: "
                          "start it with the cluster's --secret-file"),
              std::string::npos)
        << reason;
  }
  {
    SecretCluster cluster({keyOf("s3cret"), std::nullopt});
    ASSERT_TRUE(cluster.events(0).waitFor(PeerEventKind::kRefused, 1));
    const std::string reason = cluster.events(0).lastReason(PeerEventKind::kRefused, 1);
    EXPECT_NE(reason.find("node 0 offers to prove a shared secret, but node 1 has none"),
              std::string::npos)
        << reason;
  }
}

// Before a dialer has proved the secret, the node says nothing about the cluster: not its name,
// not which ids are members or connected. Every such Hello gets a Challenge (or, without a
// nonce or with a malformed one, a refusal that names only what the Hello lacked).
TEST(SharedSecret, NothingAboutTheClusterIsSaidBeforeTheProof) {
  NodeOptions o = fastOptions(kCluster, 1, {0, 1});
  o.cluster_key = keyOf("s3cret");
  o.log_level = spdlog::level::off;
  Node node(o);
  ASSERT_TRUE(node.listen().ok());
  const HandshakeNonce fresh = newEphemeralKey().public_key;
  const std::vector<uint8_t> nonce(fresh.begin(), fresh.end());
  const std::vector<uint8_t> short_nonce(7, 1);
  auto firstAnswer = [&](const SharedFrame& hello) -> std::string {
    RawPeer raw(node.port());
    raw.sendFrame(hello);
    auto reply = raw.readFrame();
    if (!reply || !verifyFrame(reply->data(), reply->size(), FrameLimits{}).ok()) return "<none>";
    const wire::Envelope& envelope = envelopeOf(reply->data());
    if (envelope.body_type() == wire::Body::Challenge) return "Challenge";
    if (envelope.body_type() == wire::Body::Refuse) {
      return envelope.body_as_Refuse()->reason()->str();
    }
    return "<other>";
  };
  // Another cluster's name, a non-member id, this node's own id: all challenged alike.
  EXPECT_EQ(firstAnswer(makeHello("guess", 0, kProtocolVersion, &nonce)), "Challenge");
  EXPECT_EQ(firstAnswer(makeHello(kCluster, 77, kProtocolVersion, &nonce)), "Challenge");
  EXPECT_EQ(firstAnswer(makeHello(kCluster, 1, kProtocolVersion, &nonce)), "Challenge");
  const std::string unproved = firstAnswer(makeHello(kCluster, 0, kProtocolVersion, nullptr));
  EXPECT_NE(unproved.find("did not offer to prove it"), std::string::npos) << unproved;
  EXPECT_EQ(unproved.find(kCluster), std::string::npos) << unproved;
  const std::string malformed = firstAnswer(makeHello(kCluster, 0, kProtocolVersion, &short_nonce));
  EXPECT_NE(malformed.find("the Hello's nonce has 7 bytes where a chorus node sends 32"),
            std::string::npos)
      << malformed;
  node.shutdown(0ms);
}

// A raw peer that plays node 0 against node 1 with the secret: the documented exchange works
// with the right key, while a forged Proof, or a Proof recorded from an earlier handshake, is
// refused and the node goes on accepting.
TEST(SharedSecret, AForgedOrReplayedProofIsRefusedAndTheNodeKeepsServing) {
  const ClusterKey key = keyOf("s3cret");
  NodeOptions o = fastOptions(kCluster, 1, {0, 1});
  o.cluster_key = key;
  o.log_level = spdlog::level::warn;
  auto log = std::make_shared<LogCapture>();
  o.log_sinks = {log};
  EventRecorder events;
  Node node(o);
  events.attach(node);
  ASSERT_TRUE(node.listen().ok());

  // The raw dialer's ephemeral key pair: its public half is the Hello's nonce.
  const EphemeralKey dialer_key = newEphemeralKey();
  const std::vector<uint8_t> nonce(dialer_key.public_key.begin(), dialer_key.public_key.end());
  const SharedFrame hello = makeHello(kCluster, 0, kProtocolVersion, &nonce);
  // Sends Hello and reads the Challenge; returns the acceptor's nonce (empty on failure).
  auto challenge = [&](RawPeer& raw) -> std::vector<uint8_t> {
    raw.sendFrame(hello);
    auto reply = raw.readFrame();
    if (!reply || !verifyFrame(reply->data(), reply->size(), FrameLimits{}).ok()) return {};
    const wire::Envelope& envelope = envelopeOf(reply->data());
    if (envelope.body_type() != wire::Body::Challenge) return {};
    const auto* c = envelope.body_as_Challenge();
    std::vector<uint8_t> acceptor_nonce(c->nonce()->begin(), c->nonce()->end());
    const HandshakeMac expected =
        handshakeMac(key, HandshakeRole::kAcceptor, kCluster, 1, 0, nonce, acceptor_nonce);
    EXPECT_TRUE(handshakeMacMatches(expected, {c->mac()->data(), c->mac()->size()}))
        << "the node's Challenge does not prove the secret";
    return acceptor_nonce;
  };
  auto proof = [&](const HandshakeMac& mac) {
    return makeFrame(0, kCluster, wire::Body::Proof, [&](flatbuffers::FlatBufferBuilder& b) {
      return wire::CreateProof(b, b.CreateVector(mac.data(), mac.size())).Union();
    });
  };
  // The node's answer to the Proof is sealed (with keys the test derives: it holds the secret).
  auto answer = [&](RawPeer& raw, const std::vector<uint8_t>& acceptor_nonce) -> std::string {
    const auto agreement = agreeOnKey(dialer_key, acceptor_nonce);
    if (!agreement) return "<no key agreement>";
    FrameOpener opener(
        sessionKeys(key, HandshakeRole::kDialer, kCluster, 0, 1, nonce, acceptor_nonce, *agreement)
            .receive);
    auto reply = raw.readSealedFrame(opener);
    if (!reply || !verifyFrame(reply->data(), reply->size(), FrameLimits{}).ok()) return "<none>";
    const wire::Envelope& envelope = envelopeOf(reply->data());
    if (envelope.body_type() == wire::Body::Welcome) return "Welcome";
    if (envelope.body_type() == wire::Body::Refuse)
      return envelope.body_as_Refuse()->reason()->str();
    return "<other>";
  };

  // The right proof: welcomed.
  HandshakeMac recorded{};
  {
    RawPeer raw(node.port());
    const std::vector<uint8_t> acceptor_nonce = challenge(raw);
    ASSERT_EQ(acceptor_nonce.size(), kHandshakeNonceBytes);
    recorded = handshakeMac(key, HandshakeRole::kDialer, kCluster, 0, 1, acceptor_nonce, nonce);
    raw.sendFrame(proof(recorded));
    EXPECT_EQ(answer(raw, acceptor_nonce), "Welcome");
    EXPECT_TRUE(events.waitFor(PeerEventKind::kUp, 0));
  }
  ASSERT_TRUE(events.waitFor(PeerEventKind::kDown, 0));

  // The same Hello and the recorded Proof: the node's nonce is fresh, so the Proof is stale.
  {
    RawPeer raw(node.port());
    const std::vector<uint8_t> acceptor_nonce = challenge(raw);
    ASSERT_EQ(acceptor_nonce.size(), kHandshakeNonceBytes);
    raw.sendFrame(proof(recorded));
    EXPECT_NE(answer(raw, acceptor_nonce).find("node 0 failed the shared-secret challenge"),
              std::string::npos);
    EXPECT_TRUE(raw.waitClosed());
  }
  // A forged Proof.
  {
    RawPeer raw(node.port());
    const std::vector<uint8_t> acceptor_nonce = challenge(raw);
    ASSERT_EQ(acceptor_nonce.size(), kHandshakeNonceBytes);
    HandshakeMac forged{};
    forged.fill(0x5a);
    raw.sendFrame(proof(forged));
    EXPECT_NE(answer(raw, acceptor_nonce).find("failed the shared-secret challenge"),
              std::string::npos);
    EXPECT_TRUE(raw.waitClosed());
  }
  EXPECT_TRUE(log->waitForLine({"refusing the Proof from 127.0.0.1:", "claiming node 0",
                                "failed the shared-secret challenge"}));
  EXPECT_EQ(events.count(PeerEventKind::kUp, 0), 1u);

  // Still accepting: the right proof again.
  {
    RawPeer raw(node.port());
    const std::vector<uint8_t> acceptor_nonce = challenge(raw);
    ASSERT_EQ(acceptor_nonce.size(), kHandshakeNonceBytes);
    raw.sendFrame(
        proof(handshakeMac(key, HandshakeRole::kDialer, kCluster, 0, 1, acceptor_nonce, nonce)));
    EXPECT_EQ(answer(raw, acceptor_nonce), "Welcome");
    EXPECT_TRUE(events.waitFor(PeerEventKind::kUp, 0, 2));
  }
  node.shutdown(100ms);
  EXPECT_EQ(node.loopCloseResult(), 0);
}

// A dialer that gets the Challenge and never answers is cut off after the handshake time-out,
// with a log line saying what was missing.
TEST(SharedSecret, ADialerThatNeverProvesIsClosedAfterTheHandshakeTimeout) {
  NodeOptions o = fastOptions(kCluster, 1, {0, 1});
  o.cluster_key = keyOf("s3cret");
  o.handshake_timeout = 300ms;
  o.log_level = spdlog::level::warn;
  auto log = std::make_shared<LogCapture>();
  o.log_sinks = {log};
  Node node(o);
  ASSERT_TRUE(node.listen().ok());
  const HandshakeNonce nonce = newEphemeralKey().public_key;
  const std::vector<uint8_t> bytes(nonce.begin(), nonce.end());
  RawPeer raw(node.port());
  raw.sendFrame(makeHello(kCluster, 0, kProtocolVersion, &bytes));
  auto reply = raw.readFrame();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(envelopeOf(reply->data()).body_type(), wire::Body::Challenge);
  EXPECT_TRUE(raw.waitClosed());
  EXPECT_TRUE(log->waitForLine({"before its handshake", "no Proof within the handshake timeout"}));
  node.shutdown(100ms);
  EXPECT_EQ(node.loopCloseResult(), 0);
}

// A man on the wire between two members: the test plays node 0, holding the secret so that it
// can seal frames, and does to its own sealed frames what an attacker on the path could (flip a
// bit, replay one, swap two). Node 1 takes the good frames and closes the connection at the
// first bad one with a log line naming the peer and the frame; it never hands the bad frame to
// a handler. And what node 1 writes is sealed: its cluster name and payload do not travel in
// clear.
TEST(SealedTraffic, AFrameAlteredReplayedOrReorderedOnTheWayClosesTheConnectionNamingThePeer) {
  const ClusterKey key = keyOf("s3cret");
  NodeOptions o = fastOptions(kCluster, 1, {0, 1});
  o.cluster_key = key;
  o.log_level = spdlog::level::warn;
  auto log = std::make_shared<LogCapture>();
  o.log_sinks = {log};
  EventRecorder events;
  Node node(o);
  events.attach(node);
  std::mutex mu;
  std::vector<uint64_t> pings;
  node.setHandler(ping::messageType(ping::wire::Body::Ping), [&](NodeId, const InboundFrame& f) {
    std::lock_guard lock(mu);
    pings.push_back(ping::messageOf(f).body_as_Ping()->nonce());
  });
  ASSERT_TRUE(node.listen().ok());

  // Hello, Challenge, Proof, sealed Welcome: the session keys of one connection.
  std::unique_ptr<FrameOpener> opener;  // reads what node 1 writes on the latest connection
  const auto establish = [&](RawPeer& raw) -> std::optional<SessionKeys> {
    const EphemeralKey fresh = newEphemeralKey();
    const std::vector<uint8_t> nonce(fresh.public_key.begin(), fresh.public_key.end());
    raw.sendFrame(makeHello(kCluster, 0, kProtocolVersion, &nonce));
    auto reply = raw.readFrame();
    if (!reply || !verifyFrame(reply->data(), reply->size(), FrameLimits{}).ok()) return {};
    const auto* challenge = envelopeOf(reply->data()).body_as_Challenge();
    if (challenge == nullptr || challenge->nonce() == nullptr) return {};
    const std::vector<uint8_t> theirs(challenge->nonce()->begin(), challenge->nonce()->end());
    const HandshakeMac mac =
        handshakeMac(key, HandshakeRole::kDialer, kCluster, 0, 1, theirs, nonce);
    raw.sendFrame(makeFrame(0, kCluster, wire::Body::Proof, [&](flatbuffers::FlatBufferBuilder& b) {
      return wire::CreateProof(b, b.CreateVector(mac.data(), mac.size())).Union();
    }));
    const auto agreement = agreeOnKey(fresh, theirs);
    if (!agreement) return {};
    const SessionKeys keys =
        sessionKeys(key, HandshakeRole::kDialer, kCluster, 0, 1, nonce, theirs, *agreement);
    opener = std::make_unique<FrameOpener>(keys.receive);
    auto welcome = raw.readSealedFrame(*opener);
    if (!welcome || !verifyFrame(welcome->data(), welcome->size(), FrameLimits{}).ok() ||
        envelopeOf(welcome->data()).body_type() != wire::Body::Welcome) {
      return {};
    }
    return keys;
  };

  // Node 1's own frames are sealed.
  {
    RawPeer raw(node.port());
    const auto keys = establish(raw);
    ASSERT_TRUE(keys.has_value());
    ASSERT_TRUE(events.waitFor(PeerEventKind::kUp, 0));
    node.send(0, ping::encodeMessage(node, ping::wire::Body::Ping, [](auto& b) {
                const std::string text = "payload-in-clear?";
                const std::vector<uint8_t> payload(text.begin(), text.end());
                return ping::wire::CreatePingDirect(b, 0xC0FFEE, &payload).Union();
              }));
    std::vector<uint8_t> wire;
    auto frame = raw.readSealedFrame(*opener, &wire);
    ASSERT_TRUE(frame.has_value());
    for (const std::string& clear : {std::string(kCluster), std::string("payload-in-clear?")}) {
      EXPECT_EQ(std::search(wire.begin(), wire.end(), clear.begin(), clear.end()), wire.end())
          << clear << " travelled in clear";
    }
    const auto* message = pingMessageOf(*frame);
    ASSERT_NE(message, nullptr);
    EXPECT_EQ(message->body_as_Ping()->nonce(), 0xC0FFEEu);
  }
  ASSERT_TRUE(events.waitFor(PeerEventKind::kDown, 0));

  struct Attack {
    const char* what;
    std::vector<int> order;  // indices of the sealed frames sent, -1: frame 2 with a bit flipped
    size_t bad_frame;        // the number of the first frame that cannot open
    std::vector<uint64_t> handled;
  };
  const std::vector<Attack> attacks = {
      {"a flipped bit", {0, -1, 2}, 2, {1}},
      {"a replay", {0, 1, 1}, 3, {1, 2}},
      {"a reorder", {1, 0}, 1, {}},
  };
  size_t downs = 1;
  for (const Attack& attack : attacks) {
    {
      std::lock_guard lock(mu);
      pings.clear();
    }
    RawPeer raw(node.port());
    const auto keys = establish(raw);
    ASSERT_TRUE(keys.has_value()) << attack.what;
    ASSERT_TRUE(events.waitFor(PeerEventKind::kUp, 0, downs + 1)) << attack.what;
    FrameSealer sealer(keys->send);
    std::vector<std::vector<uint8_t>> sealed;
    for (uint64_t nonce = 1; nonce <= 3; ++nonce)
      sealed.push_back(wireBytes(sealer.seal(*makePing(0, kCluster, nonce))));
    for (const int index : attack.order) {
      std::vector<uint8_t> bytes = sealed[index < 0 ? 1 : index];
      if (index < 0) bytes[bytes.size() / 2] ^= 0x04;
      raw.sendBytes(bytes.data(), bytes.size());
    }
    EXPECT_TRUE(raw.waitClosed()) << attack.what;
    ASSERT_TRUE(events.waitFor(PeerEventKind::kDown, 0, ++downs)) << attack.what;
    EXPECT_TRUE(log->waitForLine(
        {"peer 0 (127.0.0.1:", "down: closing its connection",
         fmt::format("the Envelope of sealed frame {} failed authentication", attack.bad_frame),
         "replayed or reordered"}))
        << attack.what << "\n"
        << log->all();
    std::lock_guard lock(mu);
    EXPECT_EQ(pings, attack.handled) << attack.what;
  }
  node.shutdown(100ms);
  EXPECT_EQ(node.loopCloseResult(), 0);
}

}  // namespace
}  // namespace chorus::node::testing
