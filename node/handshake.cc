#include "node/handshake.h"

#include <fmt/format.h>

#include <span>

#include "node/options.h"

namespace chorus::node {
namespace {

// What a frame carries, for a handshake error: a runtime body's name, or a service's message.
std::string whatFrameCarries(const wire::Envelope& envelope) {
  if (envelope.service() != kRuntimeService) {
    return fmt::format("a message of service {}", envelope.service());
  }
  return wire::EnumNameBody(envelope.body_type());
}

}  // namespace

const char* handshakeStateName(HandshakeState state) {
  switch (state) {
    case HandshakeState::kConnecting:
      return "connecting";
    case HandshakeState::kAwaitingAnswer:
      return "awaiting-answer";
    case HandshakeState::kAwaitingWelcome:
      return "awaiting-welcome";
    case HandshakeState::kAwaitingHello:
      return "awaiting-hello";
    case HandshakeState::kAwaitingProof:
      return "awaiting-proof";
    case HandshakeState::kEstablished:
      return "established";
    case HandshakeState::kFailed:
      return "failed";
  }
  return "unknown";
}

BodyWriter handshakeBody(const HandshakeMessage& m, const HandshakeSettings& settings) {
  return [&m, &settings](flatbuffers::FlatBufferBuilder& b) -> flatbuffers::Offset<void> {
    switch (m.type) {
      case wire::Body::Hello:
        return wire::CreateHelloDirect(b, settings.cluster.c_str(), settings.self, kProtocolVersion,
                                       m.nonce.empty() ? nullptr : &m.nonce, m.text.c_str())
            .Union();
      case wire::Body::Challenge:
        return wire::CreateChallenge(b, b.CreateVector(m.nonce), b.CreateVector(m.mac)).Union();
      case wire::Body::Proof:
        return wire::CreateProof(b, b.CreateVector(m.mac)).Union();
      case wire::Body::Welcome:
        return wire::CreateWelcome(b, settings.self, kProtocolVersion).Union();
      default:
        return wire::CreateRefuseDirect(b, m.text.c_str(), m.permanent).Union();
    }
  };
}

namespace {

HandshakeMessage message(wire::Body type, std::vector<uint8_t> nonce = {},
                         std::vector<uint8_t> mac = {}, std::string text = {},
                         bool permanent = false) {
  HandshakeMessage m;
  m.type = type;
  m.nonce = std::move(nonce);
  m.mac = std::move(mac);
  m.text = std::move(text);
  m.permanent = permanent;
  return m;
}

}  // namespace

Handshake::Handshake(Role role, const HandshakeSettings& settings, NodeId peer)
    : role_(role),
      settings_(settings),
      state_(role == Role::kDialer ? HandshakeState::kConnecting : HandshakeState::kAwaitingHello),
      peer_(peer) {}

const char* Handshake::awaited() const {
  switch (state_) {
    case HandshakeState::kAwaitingHello:
      return "Hello";
    case HandshakeState::kAwaitingProof:
      return "Proof";
    default:
      return "Welcome";
  }
}

HandshakeMessage Handshake::start() {
  state_ = HandshakeState::kAwaitingAnswer;
  HandshakeMessage hello = message(wire::Body::Hello, {}, {}, settings_.run_fingerprint);
  if (settings_.key) {
    ephemeral_.emplace(settings_.new_ephemeral());
    dialer_nonce_.assign(ephemeral_->public_key.begin(), ephemeral_->public_key.end());
    hello.nonce = dialer_nonce_;
  }
  return hello;
}

HandshakeStep Handshake::onFrame(const wire::Envelope& envelope, const std::string& description) {
  const wire::Body type = envelope.body_type();
  const NodeId sender = envelope.header()->sender();
  switch (state_) {
    case HandshakeState::kAwaitingHello:
      if (type != wire::Body::Hello) {
        return protocolError(
            fmt::format("expected Hello as the first frame, got {}", whatFrameCarries(envelope)));
      }
      return onHello(envelope, description);
    case HandshakeState::kAwaitingProof:
      if (sender != peer_) {
        return protocolError(
            fmt::format("Proof claims sender {} but the Hello came from node {}", sender, peer_));
      }
      if (type == wire::Body::Refuse) return onRefuse(envelope, description);
      if (type != wire::Body::Proof) {
        return protocolError(
            fmt::format("expected Proof after our Challenge, got {}", whatFrameCarries(envelope)));
      }
      return onProof(envelope, description);
    case HandshakeState::kAwaitingAnswer:
    case HandshakeState::kAwaitingWelcome:
      if (sender != peer_) {
        return protocolError(
            fmt::format("handshake answer claims sender {} but we dialed peer {}", sender, peer_));
      }
      if (type == wire::Body::Challenge && state_ == HandshakeState::kAwaitingAnswer) {
        return onChallenge(envelope, description);
      }
      if (type == wire::Body::Welcome) return onWelcome(envelope, description);
      if (type == wire::Body::Refuse) return onRefuse(envelope, description);
      return protocolError(
          fmt::format("expected Welcome or Refuse, got {}", whatFrameCarries(envelope)));
    case HandshakeState::kConnecting:
    case HandshakeState::kEstablished:
    case HandshakeState::kFailed:
      break;
  }
  return protocolError(fmt::format("{} in handshake state {}", whatFrameCarries(envelope),
                                   handshakeStateName(state_)));
}

HandshakeStep Handshake::onHello(const wire::Envelope& envelope, const std::string& description) {
  const auto* hello = envelope.body_as_Hello();
  const NodeId id = hello->node_id();
  peer_ = id;  // claimed; proved only by a Proof (with a secret)
  const std::string cluster = hello->cluster() ? hello->cluster()->str() : "";
  const bool secret = settings_.key.has_value();
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
  } else if (secret && nonce_bytes == 0) {
    // With a secret, nothing about the cluster (its name, members, who is connected) is said
    // before the dialer has proved it: the membership checks come after the Proof.
    refusal = fmt::format(
        "this cluster has a shared secret and node {} did not offer to prove it: start it "
        "with the cluster's --secret-file",
        id);
    permanent = true;
  } else if (secret && nonce_bytes != kHandshakeNonceBytes) {
    refusal = fmt::format("the Hello's nonce has {} bytes where a chorus node sends {}",
                          nonce_bytes, kHandshakeNonceBytes);
    permanent = true;
  } else if (secret) {
    // Checked after the Proof (onProof).
  } else if (cluster != settings_.cluster) {
    refusal = fmt::format("cluster \"{}\" differs from this node's cluster \"{}\"", cluster,
                          settings_.cluster);
    permanent = true;
  } else if (refusal = settings_.member_refusal(id); !refusal.empty()) {
    // as member_refusal says
  } else if (nonce_bytes > 0) {
    refusal = fmt::format(
        "node {} offers to prove a shared secret, but node {} has none: start every node with "
        "the same --secret-file",
        id, settings_.self);
    permanent = true;
  }
  if (!refusal.empty()) {
    std::string log =
        fmt::format("refusing Hello from {} claiming node {}: {}", description, id, refusal);
    return refuse(std::move(refusal), permanent, std::move(log));
  }
  peer_run_ = hello->run() ? hello->run()->str() : "";
  if (!secret) return admit();
  // Prove the secret over the dialer's nonce and ask it to prove it over ours. Our nonce is the
  // public half of a key pair drawn for this handshake; its secret half is dropped as soon as
  // the session keys are derived.
  dialer_nonce_.assign(hello->nonce()->begin(), hello->nonce()->end());
  std::optional<KeyAgreement> agreement;
  {
    const EphemeralKey ephemeral = settings_.new_ephemeral();
    acceptor_nonce_.assign(ephemeral.public_key.begin(), ephemeral.public_key.end());
    agreement = agreeOnKey(ephemeral, dialer_nonce_);
  }
  if (!agreement) {
    std::string refusal = fmt::format(
        "the Hello's nonce is not a usable X25519 public key (a point of small order); a chorus "
        "node sends a fresh one");
    std::string log =
        fmt::format("refusing Hello from {} claiming node {}: {}", description, id, refusal);
    return refuse(std::move(refusal), /*permanent=*/true, std::move(log));
  }
  const HandshakeMac mac = handshakeMac(*settings_.key, HandshakeRole::kAcceptor, settings_.cluster,
                                        settings_.self, id, dialer_nonce_, acceptor_nonce_);
  state_ = HandshakeState::kAwaitingProof;
  keys_ = node::sessionKeys(*settings_.key, HandshakeRole::kAcceptor, settings_.cluster, id,
                            settings_.self, dialer_nonce_, acceptor_nonce_, *agreement);
  agreement->fill(0);
  HandshakeStep step;
  step.reply =
      message(wire::Body::Challenge, acceptor_nonce_, std::vector<uint8_t>(mac.begin(), mac.end()));
  // The Challenge is this end's last clear frame; the dialer's Proof is its last.
  step.seal_after_reply = true;
  return step;
}

HandshakeStep Handshake::onProof(const wire::Envelope& envelope, const std::string& description) {
  const auto* proof = envelope.body_as_Proof();
  const NodeId id = peer_;
  const HandshakeMac expected =
      handshakeMac(*settings_.key, HandshakeRole::kDialer, settings_.cluster, id, settings_.self,
                   acceptor_nonce_, dialer_nonce_);
  std::string refusal;
  if (proof->mac() == nullptr ||
      !handshakeMacMatches(expected, {proof->mac()->data(), proof->mac()->size()})) {
    refusal = fmt::format(
        "node {} failed the shared-secret challenge: its --secret-file (or its cluster name) "
        "differs from this node's",
        id);
  } else {
    refusal = settings_.member_refusal(id);
  }
  if (!refusal.empty()) {
    std::string log =
        fmt::format("refusing the Proof from {} claiming node {}: {}", description, id, refusal);
    HandshakeStep step =
        refuse(std::move(refusal), /*permanent=*/proof->mac() != nullptr, std::move(log));
    step.open_inbound = true;
    return step;
  }
  HandshakeStep step = admit();
  step.open_inbound = true;
  return step;
}

HandshakeStep Handshake::admit() {
  const NodeId id = peer_;
  std::string difference = runDifference(settings_.run_fingerprint, peer_run_, id, settings_.self);
  if (difference.empty()) {
    state_ = HandshakeState::kEstablished;
    HandshakeStep step;
    step.outcome = HandshakeStep::Outcome::kEstablished;
    step.reply = message(wire::Body::Welcome);
    return step;
  }
  std::string log = fmt::format("refusing node {}: {}", id, difference);
  HandshakeStep step = refuse(difference, /*permanent=*/true, std::move(log));
  step.error_level = true;
  // Only a peer that proved the secret can end this node's wait: without a secret anyone could
  // claim a member's id with other settings.
  if (settings_.key) step.give_up = std::move(difference);
  return step;
}

HandshakeStep Handshake::onChallenge(const wire::Envelope& envelope,
                                     const std::string& description) {
  const auto* challenge = envelope.body_as_Challenge();
  const NodeId peer = peer_;
  std::string refusal;
  std::string give_up;
  std::optional<KeyAgreement> agreement;
  if (!settings_.key) {
    refusal = fmt::format(
        "node {} asks for the cluster's shared secret, but node {} has none: start every node "
        "with the same --secret-file",
        peer, settings_.self);
  } else if (challenge->nonce() == nullptr || challenge->nonce()->size() != kHandshakeNonceBytes ||
             challenge->mac() == nullptr) {
    refusal = fmt::format("node {} sent a Challenge without a {}-byte nonce or without a MAC", peer,
                          kHandshakeNonceBytes);
  } else {
    const std::span<const uint8_t> their_nonce(challenge->nonce()->data(),
                                               challenge->nonce()->size());
    const HandshakeMac expected =
        handshakeMac(*settings_.key, HandshakeRole::kAcceptor, settings_.cluster, peer,
                     settings_.self, dialer_nonce_, their_nonce);
    if (!handshakeMacMatches(expected, {challenge->mac()->data(), challenge->mac()->size()})) {
      refusal = fmt::format(
          "node {} failed the shared-secret challenge: its --secret-file (or its cluster name) "
          "differs from this node's",
          peer);
      // The node we dialed, at the topology's address, holds another secret: retrying cannot
      // help, so stop and say so.
      give_up = refusal;
    } else if (agreement = agreeOnKey(*ephemeral_, their_nonce); !agreement) {
      refusal = fmt::format(
          "node {} proved the shared secret but its Challenge's nonce is not a usable X25519 "
          "public key (a point of small order)",
          peer);
    } else {
      acceptor_nonce_.assign(their_nonce.begin(), their_nonce.end());
    }
  }
  ephemeral_.reset();  // wiped: from now on nobody can compute this handshake's keys again
  if (!refusal.empty()) {
    std::string log = fmt::format("refusing the Challenge of {}: {}", description, refusal);
    HandshakeStep step = refuse(std::move(refusal), /*permanent=*/false, std::move(log));
    step.give_up = std::move(give_up);
    return step;
  }
  const HandshakeMac proof = handshakeMac(*settings_.key, HandshakeRole::kDialer, settings_.cluster,
                                          settings_.self, peer, acceptor_nonce_, dialer_nonce_);
  state_ = HandshakeState::kAwaitingWelcome;
  keys_ = node::sessionKeys(*settings_.key, HandshakeRole::kDialer, settings_.cluster,
                            settings_.self, peer, dialer_nonce_, acceptor_nonce_, *agreement);
  agreement->fill(0);
  HandshakeStep step;
  step.reply = message(wire::Body::Proof, {}, std::vector<uint8_t>(proof.begin(), proof.end()));
  step.open_inbound = true;  // the acceptor seals everything after its Challenge
  step.seal_after_reply = true;
  return step;
}

HandshakeStep Handshake::onWelcome(const wire::Envelope& envelope, const std::string& description) {
  if (settings_.key && acceptor_nonce_.empty()) {
    std::string refusal = fmt::format(
        "node {} accepted this node without proving the cluster's shared secret: it has no "
        "--secret-file; start every node with the same one",
        peer_);
    std::string log = fmt::format("refusing the Welcome of {}: {}", description, refusal);
    return refuse(std::move(refusal), /*permanent=*/false, std::move(log));
  }
  const auto* welcome = envelope.body_as_Welcome();
  if (welcome->node_id() != peer_ || welcome->protocol_version() != kProtocolVersion) {
    return protocolError(
        fmt::format("Welcome from node {} with protocol version {} (expected node {}, version {})",
                    welcome->node_id(), welcome->protocol_version(), peer_, kProtocolVersion));
  }
  state_ = HandshakeState::kEstablished;
  HandshakeStep step;
  step.outcome = HandshakeStep::Outcome::kEstablished;
  return step;
}

HandshakeStep Handshake::onRefuse(const wire::Envelope& envelope, const std::string& description) {
  const auto* refuse = envelope.body_as_Refuse();
  const char* ours = role_ == Role::kAcceptor                     ? "Challenge"
                     : state_ == HandshakeState::kAwaitingWelcome ? "Proof"
                                                                  : "Hello";
  state_ = HandshakeState::kFailed;
  HandshakeStep step;
  step.outcome = HandshakeStep::Outcome::kRefusedByPeer;
  step.reason = refuse->reason() ? refuse->reason()->str() : "(no reason)";
  step.permanent = refuse->permanent();
  step.log = fmt::format("{} (node {}) refused our {}: {}", description, peer_, ours, step.reason);
  // A dialer trusts the node at the topology's address to say when a retry is pointless; an
  // acceptor never ends its wait on the word of a connection that has not proved anything.
  if (step.permanent && role_ == Role::kDialer) {
    step.give_up = fmt::format("node {} refused this node: {}", peer_, step.reason);
  }
  return step;
}

HandshakeStep Handshake::refuse(std::string reason, bool permanent, std::string log) {
  state_ = HandshakeState::kFailed;
  HandshakeStep step;
  step.outcome = HandshakeStep::Outcome::kRefuse;
  step.reply = message(wire::Body::Refuse, {}, {}, reason, permanent);
  step.reason = std::move(reason);
  step.permanent = permanent;
  step.log = std::move(log);
  return step;
}

HandshakeStep Handshake::protocolError(std::string reason) {
  state_ = HandshakeState::kFailed;
  HandshakeStep step;
  step.outcome = HandshakeStep::Outcome::kProtocolError;
  step.reason = std::move(reason);
  return step;
}

}  // namespace chorus::node
