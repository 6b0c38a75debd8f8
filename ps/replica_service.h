// The replica sync's service (NuPS replication of hot keys: ReplicaSync, ReplicaDrain): its wire
// id, its spec for the runtime (node/service.h) and how its code writes and reads its messages
// (ps/replica.fbs). A service of its own beside PS mode's (ps/ps_service.h): the replica shell
// registers it on the node it runs on (ps/replica_shell.h), a node that replicates nothing never
// does, and a frame of it is then dropped by the runtime with a warning naming the peer.
#pragma once

#include <cstdint>

#include "node/frame.h"
#include "node/service.h"
#include "node/service_messages.h"
#include "ps/replica_generated.h"

namespace chorus::ps {

// This service's id on the wire (fixed: peers of every build must agree on it). It belongs to PS
// mode, whose own messages are service 3; no mode of the registry may take it
// (tests/ps/replica_shell_test.cc checks).
inline constexpr node::ServiceId kReplicaServiceId = 4;

// Are the 64-bit vectors (keys) of a verified replica message 8-byte aligned? They are read in
// place, and the Verifier checks only their length prefix's 4-byte alignment.
inline bool replicaVectorsAligned(const uint8_t* bytes) {
  const replica_wire::Message* message = flatbuffers::GetRoot<replica_wire::Message>(bytes);
  const replica_wire::ReplicaSync* sync = message->body_as_ReplicaSync();
  if (sync == nullptr || sync->keys() == nullptr) return true;
  return reinterpret_cast<uintptr_t>(sync->keys()->data()) % 8 == 0;
}

inline constexpr node::ServiceSpec kReplicaService =
    node::serviceSpec<replica_wire::Message, replica_wire::VerifyMessageBuffer,
                      replica_wire::EnumNameBody>(kReplicaServiceId, "ps-replica",
                                                  replicaVectorsAligned);

// The message of a frame handed to one of this service's handlers (verified).
inline const replica_wire::Message& replicaMessageOf(const node::InboundFrame& frame) {
  return node::messageOf<replica_wire::Message>(frame);
}

}  // namespace chorus::ps

template <>
struct chorus::node::ServiceOf<chorus::ps::replica_wire::Body> {
  static constexpr const ServiceSpec& spec = chorus::ps::kReplicaService;
  using Root = chorus::ps::replica_wire::Message;
};
