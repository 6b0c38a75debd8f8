// PS mode's service (PsPull, PsPush, PsClock, PsReply, the catch-up, TrainingDone): its wire id,
// its spec for the runtime (node/service.h) and how its code writes and reads its messages
// (ps/ps.fbs).
#pragma once

#include <cstdint>
#include <utility>

#include "node/frame.h"
#include "node/service.h"
#include "node/service_messages.h"
#include "ps/ps_generated.h"

namespace chorus::ps {

// This service's id on the wire (fixed: peers of every build must agree on it).
inline constexpr node::ServiceId kPsServiceId = 3;

// Are the 64-bit vectors (keys, clocks) of a verified PS message 8-byte aligned? They are read
// in place, and the Verifier checks only their length prefix's 4-byte alignment.
inline bool psVectorsAligned(const uint8_t* bytes) {
  const auto aligned = [](const auto* vector) {
    return vector == nullptr || reinterpret_cast<uintptr_t>(vector->data()) % 8 == 0;
  };
  const wire::Message* message = flatbuffers::GetRoot<wire::Message>(bytes);
  if (const auto* m = message->body_as_PsPull()) return aligned(m->keys());
  if (const auto* m = message->body_as_PsPush()) return aligned(m->keys());
  if (const auto* m = message->body_as_PsReply()) return aligned(m->keys());
  if (const auto* m = message->body_as_PsRowPush()) return aligned(m->keys());
  if (const auto* m = message->body_as_PsCatchupReply()) {
    return aligned(m->keys()) && aligned(m->clocks());
  }
  // Relocation (ps/relocation_codec.h).
  if (const auto* m = message->body_as_RelocLocalize()) return aligned(m->keys());
  if (const auto* m = message->body_as_RelocHandOver()) {
    return aligned(m->keys()) && aligned(m->versions()) && aligned(m->from_versions());
  }
  if (const auto* m = message->body_as_RelocTransfer()) {
    return aligned(m->keys()) && aligned(m->versions()) && aligned(m->updates());
  }
  if (const auto* m = message->body_as_RelocPush()) {
    return aligned(m->keys()) && aligned(m->ops()) && aligned(m->clocks());
  }
  if (const auto* m = message->body_as_RelocPull()) return aligned(m->keys()) && aligned(m->ops());
  if (const auto* m = message->body_as_RelocPushApplied()) {
    return aligned(m->keys()) && aligned(m->ops()) && aligned(m->versions());
  }
  if (const auto* m = message->body_as_RelocPullAnswer()) {
    return aligned(m->keys()) && aligned(m->ops()) && aligned(m->versions());
  }
  if (const auto* m = message->body_as_RelocRefusal())
    return aligned(m->keys()) && aligned(m->ops());
  if (const auto* m = message->body_as_RelocNotice()) {
    return aligned(m->keys()) && aligned(m->versions()) && aligned(m->ops());
  }
  return true;
}

inline constexpr node::ServiceSpec kPsService =
    node::serviceSpec<wire::Message, wire::VerifyMessageBuffer, wire::EnumNameBody>(
        kPsServiceId, "ps", psVectorsAligned);

// The typed helpers (node/service_messages.h) for this service's messages.
using node::encodeMessage;
using node::messageType;
using node::messageWriter;

// The message of a frame handed to one of this service's handlers or placers (verified).
inline const wire::Message& messageOf(const node::InboundFrame& frame) {
  return node::messageOf<wire::Message>(frame);
}

}  // namespace chorus::ps

template <>
struct chorus::node::ServiceOf<chorus::ps::wire::Body> {
  static constexpr const ServiceSpec& spec = chorus::ps::kPsService;
  using Root = chorus::ps::wire::Message;
};
