// The handshake state machine without sockets: two Handshake objects hand each other the frames
// they answer, encoded and verified as on the wire (docs/wire-format.md, "Handshake").
#include "node/handshake.h"

#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tests/node/test_util.h"

namespace chorus::node {
namespace {

using Outcome = HandshakeStep::Outcome;
constexpr const char* kCluster = "hs";

// One end: its settings (members 0..3, self), the ids member_refusal was asked about.
struct End {
  HandshakeSettings settings;
  std::vector<NodeId> asked;  // member_refusal calls, in order
  std::set<NodeId> connected;

  End(NodeId self, std::optional<ClusterKey> key, std::string run = "", uint8_t nonce_byte = 1) {
    settings.cluster = kCluster;
    settings.self = self;
    settings.key = key;
    settings.run_fingerprint = std::move(run);
    settings.member_refusal = [this](NodeId id) -> std::string {
      asked.push_back(id);
      if (id > 3) return "not a member";
      if (id > settings.self) return "the lower id dials";
      if (connected.contains(id)) return "already connected";
      return "";
    };
    settings.new_ephemeral = [nonce_byte] {
      std::array<uint8_t, 32> secret{};
      secret.fill(nonce_byte);
      return ephemeralKeyFrom(secret);
    };
  }
};

// A frame as `from` writes `message`, verified and kept alive for envelope().
class Wire {
 public:
  const wire::Envelope& carry(const HandshakeMessage& message, const HandshakeSettings& from,
                              NodeId sender_override = UINT32_MAX) {
    const NodeId sender = sender_override == UINT32_MAX ? from.self : sender_override;
    const SharedFrame frame = encodeFrame(EnvelopeHeader{sender, from.cluster, ++sequence_, 0},
                                          message.type, handshakeBody(message, from));
    bytes_.push_back(testing::wireBytes(frame));
    const std::vector<uint8_t>& bytes = bytes_.back();
    EXPECT_TRUE(verifyFrame(bytes.data(), bytes.size(), FrameLimits{}).ok());
    return envelopeOf(bytes.data());
  }

 private:
  uint64_t sequence_ = 0;
  std::vector<std::vector<uint8_t>> bytes_;
};

HandshakeMessage bare(wire::Body type) {
  HandshakeMessage m;
  m.type = type;
  return m;
}

ClusterKey keyOf(const std::string& secret) {
  return clusterKeyFromSecret({reinterpret_cast<const uint8_t*>(secret.data()), secret.size()});
}

TEST(Handshake, WithoutASecretHelloThenWelcome) {
  End low(0, std::nullopt), high(2, std::nullopt);
  Handshake dialer(Handshake::Role::kDialer, low.settings, 2);
  Handshake acceptor(Handshake::Role::kAcceptor, high.settings);
  EXPECT_EQ(dialer.state(), HandshakeState::kConnecting);
  EXPECT_EQ(acceptor.state(), HandshakeState::kAwaitingHello);
  Wire wire;

  const HandshakeMessage hello = dialer.start();
  EXPECT_EQ(hello.type, wire::Body::Hello);
  EXPECT_TRUE(hello.nonce.empty());
  EXPECT_EQ(dialer.state(), HandshakeState::kAwaitingAnswer);

  const HandshakeStep welcomed = acceptor.onFrame(wire.carry(hello, low.settings), "a");
  EXPECT_EQ(welcomed.outcome, Outcome::kEstablished);
  ASSERT_TRUE(welcomed.reply);
  EXPECT_EQ(welcomed.reply->type, wire::Body::Welcome);
  EXPECT_EQ(acceptor.state(), HandshakeState::kEstablished);
  EXPECT_EQ(acceptor.peer(), 0u);
  EXPECT_EQ(high.asked, std::vector<NodeId>{0});

  const HandshakeStep up = dialer.onFrame(wire.carry(*welcomed.reply, high.settings), "d");
  EXPECT_EQ(up.outcome, Outcome::kEstablished);
  EXPECT_EQ(dialer.state(), HandshakeState::kEstablished);
}

TEST(Handshake, WithASecretHelloChallengeProofWelcomeAndNothingRevealedBeforeTheProof) {
  const ClusterKey key = keyOf("s3cret");
  End low(1, key, "", 1), high(3, key, "", 2);
  Handshake dialer(Handshake::Role::kDialer, low.settings, 3);
  Handshake acceptor(Handshake::Role::kAcceptor, high.settings);
  Wire wire;

  const HandshakeMessage hello = dialer.start();
  EXPECT_EQ(hello.nonce.size(), kHandshakeNonceBytes);
  const HandshakeStep challenge = acceptor.onFrame(wire.carry(hello, low.settings), "a");
  EXPECT_EQ(challenge.outcome, Outcome::kContinue);
  ASSERT_TRUE(challenge.reply);
  EXPECT_EQ(challenge.reply->type, wire::Body::Challenge);
  EXPECT_EQ(acceptor.state(), HandshakeState::kAwaitingProof);
  EXPECT_STREQ(acceptor.awaited(), "Proof");
  EXPECT_TRUE(high.asked.empty()) << "membership must not be judged before the Proof";

  const HandshakeStep proof = dialer.onFrame(wire.carry(*challenge.reply, high.settings), "d");
  EXPECT_EQ(proof.outcome, Outcome::kContinue);
  ASSERT_TRUE(proof.reply);
  EXPECT_EQ(proof.reply->type, wire::Body::Proof);
  EXPECT_EQ(dialer.state(), HandshakeState::kAwaitingWelcome);

  const HandshakeStep welcome = acceptor.onFrame(wire.carry(*proof.reply, low.settings), "a");
  EXPECT_EQ(welcome.outcome, Outcome::kEstablished);
  EXPECT_EQ(high.asked, std::vector<NodeId>{1});
  EXPECT_EQ(dialer.onFrame(wire.carry(*welcome.reply, high.settings), "d").outcome,
            Outcome::kEstablished);
}

// Runs a whole handshake with a secret between `low` (dialing) and `high`, recording every frame
// as an eavesdropper would; returns both ends' keys and the nonces on the wire.
struct Recorded {
  SessionKeys dialer, acceptor;
  std::vector<uint8_t> hello_nonce, challenge_nonce;
};
Recorded recordHandshake(End& low, End& high, NodeId acceptor_id) {
  Handshake dialer(Handshake::Role::kDialer, low.settings, acceptor_id);
  Handshake acceptor(Handshake::Role::kAcceptor, high.settings);
  Wire wire;
  Recorded r;
  const HandshakeMessage hello = dialer.start();
  r.hello_nonce = hello.nonce;
  const HandshakeStep challenge = acceptor.onFrame(wire.carry(hello, low.settings), "a");
  EXPECT_TRUE(challenge.reply);
  if (!challenge.reply) return r;
  r.challenge_nonce = challenge.reply->nonce;
  const HandshakeStep proof = dialer.onFrame(wire.carry(*challenge.reply, high.settings), "d");
  EXPECT_TRUE(proof.reply);
  if (!proof.reply) return r;
  const HandshakeStep welcome = acceptor.onFrame(wire.carry(*proof.reply, low.settings), "a");
  EXPECT_EQ(welcome.outcome, Outcome::kEstablished);
  EXPECT_EQ(dialer.onFrame(wire.carry(*welcome.reply, high.settings), "d").outcome,
            Outcome::kEstablished);
  EXPECT_TRUE(dialer.sessionKeys() != nullptr && acceptor.sessionKeys() != nullptr);
  if (dialer.sessionKeys() == nullptr || acceptor.sessionKeys() == nullptr) return r;
  r.dialer = *dialer.sessionKeys();
  r.acceptor = *acceptor.sessionKeys();
  return r;
}

// Forward secrecy (docs/security.md): each connection's keys come from fresh ephemeral X25519
// key pairs, so two handshakes of the same two nodes get different keys, and a member who
// recorded a handshake (it holds the secret and sees both nonces) cannot compute them.
TEST(Handshake, KeysDifferPerConnectionAndARecordedHandshakeDoesNotGiveThemAway) {
  const ClusterKey key = keyOf("s3cret");
  End low(1, key), high(3, key);
  low.settings.new_ephemeral = newEphemeralKey;  // as a node draws them
  high.settings.new_ephemeral = newEphemeralKey;
  const Recorded first = recordHandshake(low, high, 3);
  const Recorded second = recordHandshake(low, high, 3);
  EXPECT_EQ(first.dialer.send, first.acceptor.receive);
  EXPECT_EQ(first.dialer.receive, first.acceptor.send);
  EXPECT_EQ(second.dialer.send, second.acceptor.receive);
  EXPECT_NE(first.dialer.send, second.dialer.send);
  EXPECT_NE(first.dialer.receive, second.dialer.receive);
  EXPECT_NE(first.hello_nonce, second.hello_nonce);
  EXPECT_NE(first.challenge_nonce, second.challenge_nonce);

  // The recorder knows K and both nonces; its best guesses at the agreement (its own key pair
  // against either nonce, or nothing) give other keys.
  const EphemeralKey recorder = newEphemeralKey();
  std::vector<KeyAgreement> guesses = {KeyAgreement{}};
  for (const auto* nonce : {&first.hello_nonce, &first.challenge_nonce}) {
    const auto guess = agreeOnKey(recorder, *nonce);
    ASSERT_TRUE(guess);
    guesses.push_back(*guess);
  }
  for (const KeyAgreement& guess : guesses) {
    const SessionKeys keys = sessionKeys(key, HandshakeRole::kDialer, kCluster, 1, 3,
                                         first.hello_nonce, first.challenge_nonce, guess);
    EXPECT_NE(keys.send, first.dialer.send);
    EXPECT_NE(keys.receive, first.dialer.receive);
  }
}

// What the keys are made of: with injected key pairs, both ends' keys are sessionKeys() of K,
// the two public halves (the nonces on the wire) and their X25519 agreement.
TEST(Handshake, TheKeysMixTheSecretWithTheEphemeralAgreement) {
  const ClusterKey key = keyOf("s3cret");
  End low(1, key, "", 5), high(3, key, "", 6);
  const Recorded r = recordHandshake(low, high, 3);
  const EphemeralKey dialer_key = low.settings.new_ephemeral();
  const EphemeralKey acceptor_key = high.settings.new_ephemeral();
  ASSERT_EQ(r.hello_nonce,
            std::vector<uint8_t>(dialer_key.public_key.begin(), dialer_key.public_key.end()));
  ASSERT_EQ(r.challenge_nonce,
            std::vector<uint8_t>(acceptor_key.public_key.begin(), acceptor_key.public_key.end()));
  const auto agreement = agreeOnKey(dialer_key, acceptor_key.public_key);
  ASSERT_TRUE(agreement);
  const SessionKeys expected = sessionKeys(key, HandshakeRole::kDialer, kCluster, 1, 3,
                                           r.hello_nonce, r.challenge_nonce, *agreement);
  EXPECT_EQ(r.dialer.send, expected.send);
  EXPECT_EQ(r.dialer.receive, expected.receive);
  // Another secret with the same agreement: other keys (a non-member who broke X25519 still
  // needs K).
  const SessionKeys other = sessionKeys(keyOf("other"), HandshakeRole::kDialer, kCluster, 1, 3,
                                        r.hello_nonce, r.challenge_nonce, *agreement);
  EXPECT_NE(other.send, expected.send);
}

// A Hello whose nonce is a point of small order (the agreement would be all zeros, whatever the
// acceptor's half) is refused before anything about the cluster is said.
TEST(Handshake, AHelloNonceOfSmallOrderIsRefused) {
  const ClusterKey key = keyOf("s3cret");
  End low(1, key), high(3, key);
  low.settings.new_ephemeral = [] {
    EphemeralKey zero;  // public half all zeros: the identity
    return zero;
  };
  Handshake dialer(Handshake::Role::kDialer, low.settings, 3);
  Handshake acceptor(Handshake::Role::kAcceptor, high.settings);
  Wire wire;
  const HandshakeStep step = acceptor.onFrame(wire.carry(dialer.start(), low.settings), "a");
  EXPECT_EQ(step.outcome, Outcome::kRefuse);
  EXPECT_TRUE(step.permanent);
  EXPECT_NE(step.reason.find("not a usable X25519 public key"), std::string::npos) << step.reason;
  EXPECT_EQ(step.reason.find(kCluster), std::string::npos);
  EXPECT_TRUE(high.asked.empty());
}

TEST(Handshake, AHelloOfAnotherClusterGetsAChallengeWhenThereIsASecret) {
  const ClusterKey key = keyOf("s3cret");
  End stranger(1, key), high(3, key);
  stranger.settings.cluster = "elsewhere";
  Handshake acceptor(Handshake::Role::kAcceptor, high.settings);
  Handshake dialer(Handshake::Role::kDialer, stranger.settings, 3);
  Wire wire;
  const HandshakeStep step = acceptor.onFrame(wire.carry(dialer.start(), stranger.settings), "a");
  EXPECT_EQ(step.outcome, Outcome::kContinue);
  ASSERT_TRUE(step.reply);
  EXPECT_EQ(step.reply->type, wire::Body::Challenge);
  // The stranger cannot check the acceptor's MAC (it covers the cluster name): it refuses and
  // stops, as with another secret.
  const HandshakeStep answer = dialer.onFrame(wire.carry(*step.reply, high.settings), "d");
  EXPECT_EQ(answer.outcome, Outcome::kRefuse);
  EXPECT_NE(answer.reason.find("failed the shared-secret challenge"), std::string::npos);
  EXPECT_FALSE(answer.give_up.empty());
  EXPECT_FALSE(answer.permanent);
}

TEST(Handshake, AWrongProofIsRefusedPermanentlyWithoutAskingAboutMembership) {
  End low(1, keyOf("one"), "", 1), high(3, keyOf("two"), "", 2);
  // The dialer holds another secret; make it answer anyway by faking its proof.
  Handshake acceptor(Handshake::Role::kAcceptor, high.settings);
  Handshake dialer(Handshake::Role::kDialer, low.settings, 3);
  Wire wire;
  ASSERT_EQ(acceptor.onFrame(wire.carry(dialer.start(), low.settings), "a").outcome,
            Outcome::kContinue);
  HandshakeMessage forged = bare(wire::Body::Proof);
  forged.mac.assign(32, 7);
  const HandshakeStep step = acceptor.onFrame(wire.carry(forged, low.settings), "127.0.0.1:9");
  EXPECT_EQ(step.outcome, Outcome::kRefuse);
  EXPECT_TRUE(step.permanent);
  EXPECT_TRUE(step.give_up.empty()) << "an unproved peer never ends the acceptor's wait";
  EXPECT_NE(step.log.find("refusing the Proof from 127.0.0.1:9 claiming node 1"),
            std::string::npos);
  EXPECT_TRUE(high.asked.empty());
  EXPECT_EQ(acceptor.state(), HandshakeState::kFailed);
}

TEST(Handshake, OtherRunSettingsAreRefusedPermanentlyAndEndTheWaitOnlyWithASecret) {
  for (const bool secret : {false, true}) {
    SCOPED_TRACE(secret ? "with a secret" : "without");
    std::optional<ClusterKey> key;
    if (secret) key = keyOf("k");
    End low(0, key, "lr=0.1\nseed=1", 1), high(1, key, "lr=0.05\nseed=1", 2);
    Handshake dialer(Handshake::Role::kDialer, low.settings, 1);
    Handshake acceptor(Handshake::Role::kAcceptor, high.settings);
    Wire wire;
    HandshakeStep step = acceptor.onFrame(wire.carry(dialer.start(), low.settings), "a");
    if (secret) {
      step = dialer.onFrame(wire.carry(*step.reply, high.settings), "d");
      step = acceptor.onFrame(wire.carry(*step.reply, low.settings), "a");
    }
    EXPECT_EQ(step.outcome, Outcome::kRefuse);
    EXPECT_TRUE(step.permanent);
    EXPECT_TRUE(step.error_level);
    EXPECT_NE(step.reason.find("node 0 runs with lr=0.1, node 1 with lr=0.05"), std::string::npos)
        << step.reason;
    EXPECT_EQ(step.give_up.empty(), !secret);
    // The dialer stops at once on the permanent Refuse.
    const HandshakeStep refused = dialer.onFrame(wire.carry(*step.reply, high.settings), "d");
    EXPECT_EQ(refused.outcome, Outcome::kRefusedByPeer);
    EXPECT_TRUE(refused.permanent);
    EXPECT_NE(refused.give_up.find("node 1 refused this node"), std::string::npos);
    EXPECT_NE(refused.log.find(secret ? "refused our Proof" : "refused our Hello"),
              std::string::npos)
        << refused.log;
  }
}

TEST(Handshake, MembershipRefusalsComeFromTheNodeAndAreNotPermanent) {
  End low(0, std::nullopt), high(2, std::nullopt);
  high.connected.insert(0);
  Handshake dialer(Handshake::Role::kDialer, low.settings, 2);
  Handshake acceptor(Handshake::Role::kAcceptor, high.settings);
  Wire wire;
  const HandshakeStep step = acceptor.onFrame(wire.carry(dialer.start(), low.settings), "a");
  EXPECT_EQ(step.outcome, Outcome::kRefuse);
  EXPECT_EQ(step.reason, "already connected");
  EXPECT_FALSE(step.permanent);
  const HandshakeStep refused = dialer.onFrame(wire.carry(*step.reply, high.settings), "d");
  EXPECT_EQ(refused.outcome, Outcome::kRefusedByPeer);
  EXPECT_TRUE(refused.give_up.empty()) << "a passing refusal is retried";
}

TEST(Handshake, FramesOutOfOrderAreProtocolErrors) {
  End low(0, std::nullopt), high(2, std::nullopt);
  Wire wire;
  {
    Handshake acceptor(Handshake::Role::kAcceptor, high.settings);
    const HandshakeStep step =
        acceptor.onFrame(wire.carry(bare(wire::Body::Welcome), low.settings), "a");
    EXPECT_EQ(step.outcome, Outcome::kProtocolError);
    EXPECT_EQ(step.reason, "expected Hello as the first frame, got Welcome");
  }
  {
    Handshake dialer(Handshake::Role::kDialer, low.settings, 2);
    (void)dialer.start();
    const HandshakeStep step =
        dialer.onFrame(wire.carry(bare(wire::Body::Welcome), high.settings, 3), "d");
    EXPECT_EQ(step.outcome, Outcome::kProtocolError);
    EXPECT_EQ(step.reason, "handshake answer claims sender 3 but we dialed peer 2");
  }
  {
    // After its Proof a dialer takes Welcome or Refuse only: a second Challenge is refused.
    const ClusterKey key = keyOf("k");
    End a(0, key, "", 1), b(2, key, "", 2);
    Handshake dialer(Handshake::Role::kDialer, a.settings, 2);
    Handshake acceptor(Handshake::Role::kAcceptor, b.settings);
    const HandshakeStep challenge = acceptor.onFrame(wire.carry(dialer.start(), a.settings), "a");
    ASSERT_EQ(dialer.onFrame(wire.carry(*challenge.reply, b.settings), "d").outcome,
              Outcome::kContinue);
    const HandshakeStep again = dialer.onFrame(wire.carry(*challenge.reply, b.settings), "d");
    EXPECT_EQ(again.outcome, Outcome::kProtocolError);
    EXPECT_EQ(again.reason, "expected Welcome or Refuse, got Challenge");
  }
}

TEST(Handshake, AWelcomeWithoutTheAcceptorsProofIsRefusedWhenWeHaveASecret) {
  End low(0, keyOf("k")), high(2, std::nullopt);
  Handshake dialer(Handshake::Role::kDialer, low.settings, 2);
  Wire wire;
  (void)dialer.start();
  const HandshakeStep step =
      dialer.onFrame(wire.carry(bare(wire::Body::Welcome), high.settings), "peer 2");
  EXPECT_EQ(step.outcome, Outcome::kRefuse);
  EXPECT_FALSE(step.permanent);
  EXPECT_NE(step.log.find("refusing the Welcome of peer 2"), std::string::npos);
}

}  // namespace
}  // namespace chorus::node
