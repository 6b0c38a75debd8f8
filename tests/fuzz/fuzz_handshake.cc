// The handshake state machine (node/handshake.h) against a peer that sends anything: the input
// is a script of handshake frames (Hello, Challenge, Proof, Welcome, Refuse, or a body that has
// no place in a handshake) whose fields the fuzzer chooses, each encoded and verified as the
// runtime would, then fed to one dialer or acceptor, with or without a cluster secret. Besides
// crashes it checks the handshake's promises:
//  - with a secret, no end is established without the other end's valid MAC (the script can
//    ask the harness to answer a challenge correctly, so the paths past the proof are reached);
//  - with a secret, nothing the acceptor says before the proof names its cluster;
//  - a failed handshake stays failed;
//  - session keys exist only with a secret and only once the handshake asks to seal or open
//    frames, and an established end's keys are the ones both ends derive (node/secret.h), so
//    the two directions switch to sealed frames with matching keys.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "node/frame.h"
#include "node/handshake.h"
#include "node/protocol.h"
#include "node/secret.h"

namespace {

using namespace chorus;
using node::Handshake;
using node::HandshakeState;
using node::HandshakeStep;

constexpr char kCluster[] = "fuzz-cluster-7c1e";
constexpr node::NodeId kSelf = 2;

// Reads the script byte by byte; zeros once it runs out.
class Script {
 public:
  Script(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  std::vector<uint8_t> bytes(size_t n) {
    std::vector<uint8_t> out;
    for (size_t i = 0; i < n; ++i)
      out.push_back(byte());
    return out;
  }
  std::string text() {
    const size_t n = byte() % 24;
    std::string out;
    for (size_t i = 0; i < n; ++i)
      out.push_back(static_cast<char>(byte()));
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

node::ClusterKey testKey() {
  node::ClusterKey key{};
  for (size_t i = 0; i < key.size(); ++i)
    key[i] = static_cast<uint8_t>(i * 13 + 1);
  return key;
}

// This end's ephemeral key pair in every handshake (its public half is this end's nonce).
node::EphemeralKey fixedEphemeral() {
  std::array<uint8_t, 32> secret{};
  for (size_t i = 0; i < secret.size(); ++i)
    secret[i] = static_cast<uint8_t>(40 + i);
  return node::ephemeralKeyFrom(secret);
}

std::vector<uint8_t> fixedNonce() {
  const node::EphemeralKey key = fixedEphemeral();
  return {key.public_key.begin(), key.public_key.end()};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Script script(data, size);
  const uint8_t setup = script.byte();
  const bool acceptor = (setup & 1) != 0;
  const bool secret = (setup & 2) != 0;
  const node::NodeId dialed = script.byte() % 5;  // the dialer's peer

  node::HandshakeSettings settings;
  settings.cluster = kCluster;
  settings.self = kSelf;
  if (secret) settings.key = testKey();
  settings.run_fingerprint = "mode=consensus\nmodel=mlp\n";
  settings.member_refusal = [](node::NodeId id) -> std::string {
    if (id == kSelf) return "that is this node's own id";
    if (id > 4) return "not a member";
    return "";
  };
  settings.new_ephemeral = fixedEphemeral;
  Handshake handshake(acceptor ? Handshake::Role::kAcceptor : Handshake::Role::kDialer, settings,
                      dialed);
  std::vector<uint8_t> own_nonce;  // the nonce this end sent (Hello or Challenge)
  std::vector<uint8_t> peer_nonce;
  std::vector<uint8_t> challenge_nonce;  // the nonce of the last valid Challenge
  node::NodeId claimed = 0;
  if (!acceptor) {
    auto hello = handshake.start();
    own_nonce = hello.nonce;
  }
  bool proved = false;  // the other end sent a valid MAC
  while (!script.done()) {
    const HandshakeState before = handshake.state();
    if (before == HandshakeState::kFailed || before == HandshakeState::kEstablished) break;
    const uint8_t op = script.byte();
    node::HandshakeMessage message;
    node::HandshakeSettings sender = settings;  // the other end's view
    sender.self = acceptor ? claimed : dialed;
    bool valid_mac = false;  // the harness wrote the right MAC
    switch (op % 6) {
      case 0: {  // Hello
        message.type = wire::Body::Hello;
        claimed = script.byte() % 6;
        sender.self = claimed;
        if ((script.byte() & 1) != 0) sender.cluster = script.text();
        const uint8_t nonce_len = script.byte();
        message.nonce = nonce_len % 3 == 0 ? script.bytes(32) : script.bytes(nonce_len % 40);
        peer_nonce = message.nonce;
        message.text = (script.byte() & 1) != 0 ? settings.run_fingerprint : script.text();
        break;
      }
      case 1: {  // Challenge, valid or not
        message.type = wire::Body::Challenge;
        message.nonce = script.bytes(script.byte() % 3 == 0 ? 20 : 32);
        if ((script.byte() & 1) != 0 && secret && !own_nonce.empty()) {
          auto mac = node::handshakeMac(*settings.key, node::HandshakeRole::kAcceptor, kCluster,
                                        dialed, kSelf, own_nonce, message.nonce);
          message.mac.assign(mac.begin(), mac.end());
          valid_mac = true;
          challenge_nonce = message.nonce;
        } else {
          message.mac = script.bytes(script.byte() % 40);
        }
        break;
      }
      case 2: {  // Proof, valid or not
        message.type = wire::Body::Proof;
        if ((script.byte() & 1) != 0 && secret && !peer_nonce.empty()) {
          const auto own = fixedNonce();
          auto mac = node::handshakeMac(*settings.key, node::HandshakeRole::kDialer, kCluster,
                                        claimed, kSelf, own, peer_nonce);
          message.mac.assign(mac.begin(), mac.end());
          valid_mac = true;
        } else {
          message.mac = script.bytes(script.byte() % 40);
        }
        break;
      }
      case 3:
        message.type = wire::Body::Welcome;
        sender.self = (script.byte() & 1) != 0 ? dialed : script.byte();
        break;
      case 4:
        message.type = wire::Body::Refuse;
        message.text = script.text();
        message.permanent = (script.byte() & 1) != 0;
        break;
      default:
        message.type = wire::Body::Heartbeat;  // no place in a handshake
        break;
    }
    node::EnvelopeHeader header{.sender = sender.self, .cluster = sender.cluster, .sequence = 1};
    node::BodyWriter writer;
    if (message.type == wire::Body::Heartbeat) {
      writer = [](flatbuffers::FlatBufferBuilder& b) {
        return wire::CreateHeartbeat(b, 1).Union();
      };
    } else {
      writer = node::handshakeBody(message, sender);
    }
    auto frame = node::encodeFrame(header, message.type, writer);
    std::vector<uint8_t> bytes;
    for (auto piece : frame->pieces())
      bytes.insert(bytes.end(), piece.begin(), piece.end());
    if (!node::verifyFrame(bytes.data(), bytes.size(), {}).ok()) __builtin_trap();
    const HandshakeStep step = handshake.onFrame(node::envelopeOf(bytes.data()), "fuzz peer");
    proved = proved || valid_mac;
    if (step.reply && secret && acceptor && !proved) {
      // Before the proof, the acceptor says nothing that names its cluster.
      if (step.reply->text.find(kCluster) != std::string::npos) __builtin_trap();
    }
    if (step.outcome == HandshakeStep::Outcome::kEstablished ||
        handshake.state() == HandshakeState::kEstablished) {
      if (secret && !proved) __builtin_trap();
    }
    if (before == HandshakeState::kFailed && handshake.state() != HandshakeState::kFailed)
      __builtin_trap();
    const node::SessionKeys* keys = handshake.sessionKeys();
    if (!secret && (keys != nullptr || step.open_inbound || step.seal_after_reply))
      __builtin_trap();
    if ((step.open_inbound || step.seal_after_reply) && keys == nullptr) __builtin_trap();
    if (secret && handshake.state() == HandshakeState::kEstablished) {
      if (keys == nullptr) __builtin_trap();
      const auto own = fixedNonce();
      // Forward secrecy: the keys mix in the X25519 agreement of this end's ephemeral key and
      // the other end's nonce; a nonce without one (a point of small order) is refused.
      const auto agreement =
          node::agreeOnKey(fixedEphemeral(), acceptor ? peer_nonce : challenge_nonce);
      if (!agreement) __builtin_trap();
      const node::SessionKeys expected =
          acceptor ? node::sessionKeys(*settings.key, node::HandshakeRole::kAcceptor, kCluster,
                                       claimed, kSelf, peer_nonce, own, *agreement)
                   : node::sessionKeys(*settings.key, node::HandshakeRole::kDialer, kCluster, kSelf,
                                       dialed, own_nonce, challenge_nonce, *agreement);
      if (keys->send != expected.send || keys->receive != expected.receive) __builtin_trap();
      // The acceptor reads sealed frames from the Proof on (the dialer from its Challenge).
      if (acceptor && !step.open_inbound) __builtin_trap();
    }
  }
  return 0;
}
