// PS mode's service (PsPull, PsPush, PsClock, PsReply, the catch-up, TrainingDone): its wire id,
// its spec for the runtime (node/service.h) and how its code writes and reads its messages
// (ps/ps.fbs).
#pragma once

#include <utility>

#include "node/frame.h"
#include "node/service.h"
#include "node/service_messages.h"
#include "ps/ps_generated.h"

namespace chorus::ps {

// This service's id on the wire (fixed: peers of every build must agree on it).
inline constexpr node::ServiceId kPsServiceId = 3;
inline constexpr node::ServiceSpec kPsService =
    node::serviceSpec<wire::Message, wire::VerifyMessageBuffer, wire::EnumNameBody>(kPsServiceId,
                                                                                    "ps");

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
