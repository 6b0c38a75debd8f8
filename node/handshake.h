// The handshake of one connection as an explicit state machine (docs/wire-format.md,
// "Handshake"). No sockets, timers or threads: the node feeds it the frames that arrive before
// the connection is established and carries out each step it answers (write a frame, refuse,
// establish, give up on a peer). Unit-tested without sockets (tests/node/handshake_test.cc).
//
//   dialer:   kConnecting --start()--> kAwaitingAnswer --Challenge--> kAwaitingWelcome
//                                          |  Welcome                      | Welcome
//                                          v                               v
//                                      kEstablished <----------------------+
//   acceptor: kAwaitingHello --Hello (no secret)--> kEstablished
//                            --Hello (secret)-----> kAwaitingProof --Proof--> kEstablished
//   any state but kEstablished --refusal, Refuse or a protocol error--> kFailed
//
// Every check of the old code stays: a secret's proof before anything about the cluster is
// revealed, membership and dial direction after it, the run fingerprint last, and refusals a
// retry cannot change marked permanent.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "chorus/chorus_generated.h"
#include "node/frame.h"
#include "node/protocol.h"
#include "node/secret.h"

namespace chorus::node {

enum class HandshakeState {
  kConnecting,       // dialer: TCP connect under way; start() writes the Hello
  kAwaitingAnswer,   // dialer: Hello written; Welcome, Challenge or Refuse next
  kAwaitingWelcome,  // dialer: Proof written; Welcome or Refuse next
  kAwaitingHello,    // acceptor: nothing received yet
  kAwaitingProof,    // acceptor: Challenge written; Proof (or Refuse) next
  kEstablished,      // the peer is who it says and may send anything
  kFailed,           // refused either way or broke the protocol; the connection closes
};
const char* handshakeStateName(HandshakeState state);

// What this node brings to every handshake; shared by all connections of a node.
struct HandshakeSettings {
  std::string cluster;
  NodeId self = 0;
  std::optional<ClusterKey> key;  // the cluster's secret; empty: no proof asked or given
  std::string run_fingerprint;    // NodeOptions::run_fingerprint
  // Why a dialer claiming `id` cannot be welcomed now ("" when it can): not a member, our own
  // id, a higher id, already connected, shutting down. Asked only once the dialer proved the
  // secret (when there is one).
  std::function<std::string(NodeId id)> member_refusal;
  // A fresh ephemeral X25519 key pair per handshake (its public half is this end's nonce); tests
  // inject fixed ones.
  std::function<EphemeralKey()> new_ephemeral = newEphemeralKey;
};

// One handshake frame to write; the node encodes it with its header (handshakeBody()).
struct HandshakeMessage {
  wire::Body type = wire::Body::NONE;  // Hello, Challenge, Proof, Welcome or Refuse
  std::vector<uint8_t> nonce;          // Hello (with a secret) and Challenge
  std::vector<uint8_t> mac;            // Challenge and Proof
  std::string text;                    // Hello: the run fingerprint; Refuse: the reason
  bool permanent = false;              // Refuse: a retry would meet the same refusal
};
// Writes `message`'s body for Node::encode (the Hello carries settings' cluster and id).
BodyWriter handshakeBody(const HandshakeMessage& message, const HandshakeSettings& settings);

// What the node does after one frame (or after start()).
struct HandshakeStep {
  enum class Outcome {
    kContinue,       // write `reply` (if any) and wait for the next frame
    kEstablished,    // write `reply` (the acceptor's Welcome) and treat the peer as up
    kRefuse,         // write `reply` (our Refuse), then close after flushing
    kRefusedByPeer,  // the peer sent Refuse: report it and close
    kProtocolError,  // close at once (kProtocol)
  };
  Outcome outcome = Outcome::kContinue;
  std::optional<HandshakeMessage> reply;
  std::string reason;      // kRefuse, kRefusedByPeer, kProtocolError
  bool permanent = false;  // kRefuse, kRefusedByPeer: a retry would meet the same refusal
  // Stop dialing the peer and end waitClusterReady() at once with this ("" : no).
  std::string give_up;
  // A line for the node's log naming what was refused and why ("" : none); error_level: log it
  // as an error (the run settings differ), else as a warning.
  std::string log;
  bool error_level = false;
  // With a secret (Handshake::sessionKeys()): every frame read after this one is sealed, and
  // every frame written after `reply` is sealed.
  bool open_inbound = false;
  bool seal_after_reply = false;
};

class Handshake {
 public:
  using Role = HandshakeRole;  // kDialer or kAcceptor
  // A dialer knows whom it dials (`peer`); an acceptor learns it from the Hello. `settings`
  // must outlive this object.
  Handshake(Role role, const HandshakeSettings& settings, NodeId peer = 0);

  // Dialer, once TCP connected: the Hello to write.
  HandshakeMessage start();
  // A verified frame arrived before the connection was established. `description` names the
  // connection in log lines ("peer 1 (127.0.0.1:7001)" or "127.0.0.1:53122").
  HandshakeStep onFrame(const wire::Envelope& envelope, const std::string& description);

  HandshakeState state() const { return state_; }
  Role role() const { return role_; }
  // The dialed id, or the id the Hello claims (proved only once established).
  NodeId peer() const { return peer_; }
  // Acceptor: the run fingerprint of the dialer's Hello.
  const std::string& peerRun() const { return peer_run_; }
  // What the deadline now waits for ("Welcome", "Hello", "Proof"), for its time-out message.
  const char* awaited() const;
  // The connection's session keys once both nonces are known and the peer's MAC checked out
  // (dialer) or our Challenge went out (acceptor); null before, and always without a secret.
  const SessionKeys* sessionKeys() const { return keys_ ? &*keys_ : nullptr; }

 private:
  HandshakeStep onHello(const wire::Envelope& envelope, const std::string& description);
  HandshakeStep onProof(const wire::Envelope& envelope, const std::string& description);
  HandshakeStep onChallenge(const wire::Envelope& envelope, const std::string& description);
  HandshakeStep onWelcome(const wire::Envelope& envelope, const std::string& description);
  HandshakeStep onRefuse(const wire::Envelope& envelope, const std::string& description);
  // Acceptor, once the dialer is who it claims (or no secret is asked).
  HandshakeStep admit();
  HandshakeStep refuse(std::string reason, bool permanent, std::string log);
  HandshakeStep protocolError(std::string reason);

  Role role_;
  const HandshakeSettings& settings_;
  HandshakeState state_;
  NodeId peer_ = 0;
  // With a secret: the dialer's nonce (sent in Hello, or received in it), and the acceptor's
  // (sent in Challenge, or received in it); each is its end's ephemeral public key.
  std::vector<uint8_t> dialer_nonce_;
  std::vector<uint8_t> acceptor_nonce_;
  std::string peer_run_;
  // Dialer, from start() until the Challenge: the key pair whose public half is our nonce.
  std::optional<EphemeralKey> ephemeral_;
  std::optional<SessionKeys> keys_;
};

}  // namespace chorus::node
