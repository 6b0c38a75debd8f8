// Constants every chorus peer must agree on.
#pragma once

#include <cstdint>

namespace chorus::node {

// A node's id in its cluster (the topology file's node id).
using NodeId = uint32_t;

// Bumped when the wire format changes in a way the schema evolution rule cannot absorb;
// peers with another version are refused at Hello (docs/wire-format.md).
// 2: frames may carry an attachment after the Envelope (Header.attachment).
inline constexpr uint32_t kProtocolVersion = 2;

}  // namespace chorus::node
