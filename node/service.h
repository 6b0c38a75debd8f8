// Services: how the runtime carries a mode's messages without knowing the mode's schema. A
// frame carries either one of the runtime's own messages (schema/chorus.fbs) or one service's
// message: the service's id and one whole FlatBuffer of the service's own schema
// (docs/wire-format.md, "Services"). A service tells the runtime how to verify its bytes and
// which of its messages a verified one is; the runtime verifies every message before any
// handler sees it, and dispatches by (service, kind).
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <utility>

namespace chorus::node {

// A service's id on the wire (Envelope.service). 0 is the runtime itself; every mode has its
// own, fixed, declared in its folder (ping/ping_service.h, ...) and listed in the mode registry.
using ServiceId = uint16_t;
inline constexpr ServiceId kRuntimeService = 0;

// What the runtime must know of a service to carry its messages: flatc's generated functions of
// the service's root table (made by serviceSpec() below).
struct ServiceSpec {
  ServiceId id = kRuntimeService;
  const char* name = "";
  // Runs the FlatBuffers Verifier over one whole message (the generated Verify<Root>Buffer).
  bool (*verify)(flatbuffers::Verifier& verifier) = nullptr;
  // Which of the service's messages a verified message is (its root's union type; 0, NONE,
  // when the union's table is absent, so that a handler of kind K always finds its table).
  uint8_t (*kind)(const uint8_t* message) = nullptr;
  // The name of a kind, for logs ("" for one this build does not know).
  const char* (*kind_name)(uint8_t kind) = nullptr;
  // What the Verifier does not check, on a verified message (null: nothing more): the
  // Verifier checks a vector's length prefix for 4-byte alignment only, so a service whose
  // messages hold 64-bit vectors, read in place, checks their elements' alignment here.
  bool (*check)(const uint8_t* message) = nullptr;
};

// The ServiceSpec of a schema whose root table `Root` holds its message in a union field `body`
// (`table Message { body: Body; }`): `Verify` is flatc's Verify<Root>Buffer, `KindName` its
// EnumName<Union>.
template <class Root, bool (*Verify)(flatbuffers::Verifier&), auto KindName>
constexpr ServiceSpec serviceSpec(ServiceId id, const char* name,
                                  bool (*check)(const uint8_t* message) = nullptr) {
  using Kind = decltype(std::declval<const Root&>().body_type());
  return {id,
          name,
          [](flatbuffers::Verifier& verifier) { return Verify(verifier); },
          [](const uint8_t* message) {
            const Root* root = flatbuffers::GetRoot<Root>(message);
            return root->body() == nullptr ? uint8_t{0} : static_cast<uint8_t>(root->body_type());
          },
          [](uint8_t kind) -> const char* { return KindName(static_cast<Kind>(kind)); },
          check};
}

// One message type of one service: what handlers and attachment placers are set for.
struct MessageType {
  const ServiceSpec* service = nullptr;
  uint8_t kind = 0;
};

// A frame's message kind as one number (what send policies compare: SendOptions::kind): the
// runtime's body type for service 0, else the service id and its kind (never below 256).
inline constexpr uint32_t messageKind(ServiceId service, uint8_t kind) {
  return (static_cast<uint32_t>(service) << 8) | kind;
}

}  // namespace chorus::node
