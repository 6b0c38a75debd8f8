// The cluster's shared secret and the handshake's challenge-response (docs/wire-format.md,
// "Handshake"). With a secret, each end of a new connection proves that it knows it by a MAC
// over the other end's fresh nonce, so a process that only knows the cluster's name and an id
// cannot join, and a recorded handshake cannot be replayed. Each nonce is the public half of an
// ephemeral X25519 key pair drawn for that handshake alone; both ends derive the connection's
// session keys from the secret, both nonces and the X25519 agreement of the two ephemeral keys
// (sessionKeys()), and every frame after the handshake is sealed with them (node/frame_cipher.h,
// docs/security.md). The agreement gives forward secrecy: whoever recorded a handshake, even
// with the secret, cannot compute its keys once both ends dropped their ephemeral halves.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "node/frame_cipher.h"
#include "node/status.h"

namespace chorus::node {

constexpr size_t kClusterKeyBytes = 32;
constexpr size_t kHandshakeNonceBytes = 32;
constexpr size_t kHandshakeMacBytes = 32;
constexpr size_t kKeyAgreementBytes = 32;

using ClusterKey = std::array<uint8_t, kClusterKeyBytes>;
using HandshakeNonce = std::array<uint8_t, kHandshakeNonceBytes>;
using HandshakeMac = std::array<uint8_t, kHandshakeMacBytes>;
// What X25519 of one end's ephemeral secret and the other end's public half gives both ends.
using KeyAgreement = std::array<uint8_t, kKeyAgreementBytes>;

// Reads a secret file and derives the cluster key from its bytes (trailing line breaks and
// spaces are not part of the secret, so `echo` and an editor give the same key). Errors name
// the file: missing, unreadable, a directory, empty, or larger than 64 KiB. `warning` is set
// when other users may read the file.
Status loadClusterKey(const std::string& path, ClusterKey* key, std::string* warning);

// The key of a secret given as bytes (what loadClusterKey derives from the file's contents).
ClusterKey clusterKeyFromSecret(std::span<const uint8_t> secret);

// One end's ephemeral X25519 key pair for one handshake; its public half travels as that end's
// nonce (Hello's or Challenge's). The secret half never leaves the process and is wiped when the
// object goes (each copy wipes its own).
struct EphemeralKey {
  HandshakeNonce public_key{};
  std::array<uint8_t, 32> secret_key{};
  ~EphemeralKey();
};

// A fresh random key pair (libsodium's X25519).
EphemeralKey newEphemeralKey();
// The key pair whose secret half is `secret_key` (tests inject fixed ones).
EphemeralKey ephemeralKeyFrom(const std::array<uint8_t, 32>& secret_key);
// X25519 of `own`'s secret half and the other end's public half (its nonce): the same on both
// ends. Empty when `their_public` has the wrong length or is a point of small order (the result
// would be all zeros whatever `own` is, so an end sending one would fix the session keys).
std::optional<KeyAgreement> agreeOnKey(const EphemeralKey& own,
                                       std::span<const uint8_t> their_public);

// Which end proves: the acceptor answers the dialer's Hello, the dialer answers the acceptor's
// Challenge. The role is part of the MAC, so one end's proof never serves as the other's.
enum class HandshakeRole { kAcceptor, kDialer };

// The MAC with which `prover` (node `from`, talking to node `to` in `cluster`) answers the other
// end's `their_nonce`; `own_nonce` is the prover's nonce of the same handshake.
HandshakeMac handshakeMac(const ClusterKey& key, HandshakeRole prover, const std::string& cluster,
                          uint32_t from, uint32_t to, std::span<const uint8_t> their_nonce,
                          std::span<const uint8_t> own_nonce);

// The session keys of the connection whose handshake (in `cluster`, node `dialer` dialing node
// `acceptor`) exchanged these nonces (the ephemeral public halves) and agreed on `agreement`
// (agreeOnKey()), as the end `self` sees them: what one end sends with is what the other
// receives with, each direction has its own key, and only a holder of `key` who also knows the
// agreement (one end of this handshake) can compute them. Fresh per connection.
SessionKeys sessionKeys(const ClusterKey& key, HandshakeRole self, const std::string& cluster,
                        uint32_t dialer, uint32_t acceptor, std::span<const uint8_t> dialer_nonce,
                        std::span<const uint8_t> acceptor_nonce, const KeyAgreement& agreement);

// Constant-time check of a received MAC against the expected one (false on a wrong length).
bool handshakeMacMatches(const HandshakeMac& expected, std::span<const uint8_t> received);

}  // namespace chorus::node
