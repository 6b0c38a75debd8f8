#include "ps/replica_codec.h"

#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <utility>

#include "node/finite.h"

namespace chorus::ps {

ReplicaFrameParts replicaSyncFrame(const ReplicaSyncMessage& message) {
  const SparseRows& rows = *message.rows;  // not null (the core never sends null rows)
  ReplicaFrameParts parts;
  parts.type = replica_wire::Body::ReplicaSync;
  parts.rows = message.rows;
  parts.size_hint = 64 + 8 * rows.keys.size() + 4 * message.contributors.size();
  if (!rows.values.empty()) {
    parts.attachment.push_back(node::bytesOf(std::span<const float>(rows.values)));
  }
  const auto kind = message.kind == ReplicaSyncKind::kSum
                        ? replica_wire::ReplicaSyncKind::Sum
                        : replica_wire::ReplicaSyncKind::Contribution;
  // The writer holds the rows (and with them the attachment's floats) and a copy of the rest.
  parts.write = [rows_held = message.rows, contributors = message.contributors,
                 round = message.round, part = message.part,
                 kind](flatbuffers::FlatBufferBuilder& b) {
    // 64-bit elements first: the keys are read in place, so they must sit on 8 bytes.
    const auto keys = b.CreateVector(rows_held->keys);
    const auto contributor_list = contributors.empty()
                                      ? flatbuffers::Offset<flatbuffers::Vector<uint32_t>>()
                                      : b.CreateVector(contributors);
    return replica_wire::CreateReplicaSync(b, kind, round, part, contributor_list, keys).Union();
  };
  return parts;
}

ReplicaFrameParts replicaDrainFrame(uint64_t final_round) {
  ReplicaFrameParts parts;
  parts.type = replica_wire::Body::ReplicaDrain;
  parts.size_hint = 64;
  parts.write = [final_round](flatbuffers::FlatBufferBuilder& b) {
    return replica_wire::CreateReplicaDrain(b, final_round).Union();
  };
  return parts;
}

node::SharedFrame encodeReplicaFrame(const node::EnvelopeHeader& header, ReplicaFrameParts parts) {
  return node::encodeFrame(header, node::messageType(parts.type),
                           node::messageWriter(parts.type, std::move(parts.write)), parts.size_hint,
                           std::move(parts.attachment));
}

std::optional<std::string> decodeReplicaSync(const replica_wire::ReplicaSync& body,
                                             std::span<const uint8_t> attachment,
                                             ReplicaSyncMessage& out) {
  switch (body.kind()) {
    case replica_wire::ReplicaSyncKind::Contribution:
      out.kind = ReplicaSyncKind::kContribution;
      break;
    case replica_wire::ReplicaSyncKind::Sum:
      out.kind = ReplicaSyncKind::kSum;
      break;
    default:
      return fmt::format("replica sync message of unknown kind {}",
                         static_cast<unsigned>(body.kind()));
  }
  if (attachment.size() % sizeof(float) != 0) {
    return fmt::format("replica sync message with an attachment of {} bytes: not whole floats",
                       attachment.size());
  }
  out.round = body.round();
  out.part = body.part();
  out.contributors.clear();
  if (const auto* contributors = body.contributors()) {
    out.contributors.assign(contributors->begin(), contributors->end());
  }
  auto rows = std::make_shared<SparseRows>();
  if (const auto* keys = body.keys()) {
    // Aligned (replicaVectorsAligned ran before any handler): one copy.
    rows->keys.resize(keys->size());
    if (keys->size() > 0) {
      std::memcpy(rows->keys.data(), keys->data(), keys->size() * sizeof(uint64_t));
    }
  }
  rows->values.resize(attachment.size() / sizeof(float));
  if (!attachment.empty()) std::memcpy(rows->values.data(), attachment.data(), attachment.size());
  // A NaN or infinity summed into a replica would reach every node's model within a round
  // (issue 27, hole 3): refused here, like a PS push or a consensus model chunk.
  if (const std::optional<size_t> first = node::firstNonFinite(rows->values)) {
    if (out.kind == ReplicaSyncKind::kContribution) {
      // The member's delta of the part is dropped for this round; the reducer gets an empty
      // contribution from it and the round goes on (the shell logs it, naming the member).
      out.dropped_non_finite = node::countNonFinite(rows->values);
      out.rows = std::make_shared<SparseRows>();
      return std::nullopt;
    }
    return fmt::format(
        "round-{} part-{} replica sync message holds {} non-finite value(s) (the first, {}, is "
        "float {} of its {}): refused",
        out.round, out.part, node::countNonFinite(rows->values), rows->values[*first], *first,
        rows->values.size());
  }
  out.rows = std::move(rows);
  return std::nullopt;
}

}  // namespace chorus::ps
