// The ping service (test and demo traffic: Ping, Pong, Tensor): its wire id, its spec for the
// runtime (node/service.h) and how its code writes and reads its messages (ping/ping.fbs).
#pragma once

#include <utility>

#include "node/frame.h"
#include "node/service.h"
#include "node/service_messages.h"
#include "ping/ping_generated.h"

namespace chorus::ping {

// This service's id on the wire (fixed: peers of every build must agree on it).
inline constexpr node::ServiceId kPingServiceId = 1;
inline constexpr node::ServiceSpec kPingService =
    node::serviceSpec<wire::Message, wire::VerifyMessageBuffer, wire::EnumNameBody>(kPingServiceId,
                                                                                    "ping");

// The typed helpers (node/service_messages.h) for this service's messages.
using node::encodeMessage;
using node::messageType;
using node::messageWriter;

// The message of a frame handed to one of this service's handlers or placers (verified).
inline const wire::Message& messageOf(const node::InboundFrame& frame) {
  return node::messageOf<wire::Message>(frame);
}

}  // namespace chorus::ping

template <>
struct chorus::node::ServiceOf<chorus::ping::wire::Body> {
  static constexpr const ServiceSpec& spec = chorus::ping::kPingService;
  using Root = chorus::ping::wire::Message;
};
