// Constants every chorus peer must agree on.
#pragma once

#include <cstddef>
#include <cstdint>

namespace chorus::node {

// A node's id in its cluster (the topology file's node id).
using NodeId = uint32_t;

// Bumped when the wire format changes in a way the schema evolution rule cannot absorb;
// peers with another version are refused at Hello (docs/wire-format.md).
// 2: frames may carry an attachment after the Envelope (Header.attachment).
// 3: mode messages travel as a service's message (Envelope.service, Envelope.message), each mode
//    with its own schema; the runtime's union Body holds its own messages only.
// 4: with a cluster secret, every frame after the handshake is sealed (node/frame_cipher.h).
// 5: with a cluster secret, the handshake's nonces are ephemeral X25519 public keys and the
//    session keys mix in their agreement (forward secrecy; node/secret.h).
inline constexpr uint32_t kProtocolVersion = 5;

// The longest cluster name (bytes): it travels in every header, and the handshake frames must
// fit kHandshakeFrameBytes with it.
inline constexpr size_t kMaxClusterNameBytes = 256;
// The largest frame accepted on a connection before its handshake completed. The largest
// legitimate one, a Refuse naming two clusters of kMaxClusterNameBytes, is about 1.1 KiB (a
// Hello with a secret's nonce about 0.7 KiB; measured in HandshakeLimit.*), so this leaves
// about four times that.
inline constexpr uint32_t kHandshakeFrameBytes = 4096;

}  // namespace chorus::node
