// Consensus mode's service (ModelShare, ModelRequest, TrainingDone): its wire id, its spec for
// the runtime (node/service.h) and how its code writes and reads its messages
// (consensus/consensus.fbs).
#pragma once

#include <cstdint>
#include <utility>

#include "consensus/consensus_generated.h"
#include "node/frame.h"
#include "node/service.h"
#include "node/service_messages.h"

namespace chorus::consensus {

// This service's id on the wire (fixed: peers of every build must agree on it).
inline constexpr node::ServiceId kConsensusServiceId = 2;
// Are the 64-bit vectors (a RowShare's keys) of a verified consensus message 8-byte aligned?
// They are read in place, and the Verifier checks only their length prefix's 4-byte alignment.
inline bool consensusVectorsAligned(const uint8_t* bytes) {
  const wire::Message* message = flatbuffers::GetRoot<wire::Message>(bytes);
  const wire::RowShare* share = message->body_as_RowShare();
  if (share == nullptr || share->blocks() == nullptr) return true;
  for (const wire::RowBlock* block : *share->blocks()) {
    if (block->keys() != nullptr && reinterpret_cast<uintptr_t>(block->keys()->data()) % 8 != 0) {
      return false;
    }
  }
  return true;
}

inline constexpr node::ServiceSpec kConsensusService =
    node::serviceSpec<wire::Message, wire::VerifyMessageBuffer, wire::EnumNameBody>(
        kConsensusServiceId, "consensus", consensusVectorsAligned);

// The typed helpers (node/service_messages.h) for this service's messages.
using node::encodeMessage;
using node::messageType;
using node::messageWriter;

// The message of a frame handed to one of this service's handlers or placers (verified).
inline const wire::Message& messageOf(const node::InboundFrame& frame) {
  return node::messageOf<wire::Message>(frame);
}

}  // namespace chorus::consensus

template <>
struct chorus::node::ServiceOf<chorus::consensus::wire::Body> {
  static constexpr const ServiceSpec& spec = chorus::consensus::kConsensusService;
  using Root = chorus::consensus::wire::Message;
};
