// PS mode's service (PsPull, PsPush, PsClock, PsReply, the catch-up, TrainingDone): its wire id,
// its spec for the runtime (node/service.h) and how its code writes and reads its messages
// (ps/ps.fbs).
#pragma once

#include <utility>

#include "node/frame.h"
#include "node/node.h"
#include "node/service.h"
#include "ps/ps_generated.h"

namespace chorus::ps {

// This service's id on the wire (fixed: peers of every build must agree on it).
inline constexpr node::ServiceId kPsServiceId = 3;
inline constexpr node::ServiceSpec kPsService =
    node::serviceSpec<wire::Message, wire::VerifyMessageBuffer, wire::EnumNameBody>(kPsServiceId,
                                                                                    "ps");

// What handlers and placers of one of this service's messages are set for.
inline node::MessageType messageType(wire::Body kind) {
  return {&kPsService, static_cast<uint8_t>(kind)};
}

// A writer of this service's whole message (for Node::encode or node::encodeFrame) from the
// writer of its `kind` table.
inline node::BodyWriter messageWriter(wire::Body kind, node::BodyWriter write_body) {
  return [kind, write_body = std::move(write_body)](flatbuffers::FlatBufferBuilder& b) {
    const flatbuffers::Offset<void> body = write_body(b);
    return wire::CreateMessage(b, kind, body).Union();
  };
}

// Encodes one of this service's messages as `node`'s frame (Node::encode).
inline node::SharedFrame encodeMessage(node::Node& node, wire::Body kind,
                                       node::BodyWriter write_body, size_t size_hint = 0,
                                       node::Attachment attachment = {}) {
  return node.encode(messageType(kind), messageWriter(kind, std::move(write_body)), size_hint,
                     std::move(attachment));
}

// The message of a frame handed to one of this service's handlers or placers (verified).
inline const wire::Message& messageOf(const node::InboundFrame& frame) {
  return node::messageOf<wire::Message>(frame);
}

}  // namespace chorus::ps
