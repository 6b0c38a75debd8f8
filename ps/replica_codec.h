// The replica sync's messages on the wire (ps/replica.fbs): how a ReplicaSyncMessage of the core
// (ps/replica_sync.h) or a drain announcement becomes a frame body, and how a received body
// becomes one again. The decoder checks the shape only (a known kind, whole floats in the
// attachment, finite values); ReplicaSync::receive checks the meaning (members, parts, keys,
// widths, rounds). Pure: no node, no socket (tests/ps/replica_shell_test.cc round-trips every
// message through node::encodeFrame and the frame verifier).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "node/frame.h"
#include "ps/replica_service.h"
#include "ps/replica_sync.h"

namespace chorus::ps {

// One replica message, ready to encode: its type, the writer of its table, a size hint and the
// attachment (the rows' floats, referenced, not copied: they must stay alive and unchanged until
// every send of the frame completed, so hold `rows` until then, e.g. in the send callback).
struct ReplicaFrameParts {
  replica_wire::Body type = replica_wire::Body::NONE;
  node::BodyWriter write;
  size_t size_hint = 0;
  node::Attachment attachment;
  std::shared_ptr<const SparseRows> rows;  // what `attachment` points into (sync messages)
};

// A sync message of the core (its rows must not be null).
ReplicaFrameParts replicaSyncFrame(const ReplicaSyncMessage& message);
// The end-of-run announcement: every push of the sender is in its rounds up to `final_round`.
ReplicaFrameParts replicaDrainFrame(uint64_t final_round);
// Encodes `parts` with the given header, without a node (tests, fuzzing seeds).
node::SharedFrame encodeReplicaFrame(const node::EnvelopeHeader& header, ReplicaFrameParts parts);

// The core's message of a verified ReplicaSync with its frame's attachment, into `out`; or why
// the body is malformed (an unknown kind, an attachment that is not whole floats) or is a sum
// that carries a value that is NaN or infinite. A contribution with such values is no error:
// its rows are dropped (out.rows empty, out.dropped_non_finite their count), so that a member
// whose deltas are not finite contributes nothing to that round instead of stalling it until
// the member is declared down (a NaN summed into a replica would reach every node's model).
std::optional<std::string> decodeReplicaSync(const replica_wire::ReplicaSync& body,
                                             std::span<const uint8_t> attachment,
                                             ReplicaSyncMessage& out);

}  // namespace chorus::ps
