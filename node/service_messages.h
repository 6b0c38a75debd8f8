// The typed face of a service for the code of its mode: one service is named by its schema's
// union type (`Kind`, e.g. ps::wire::Body), which the mode ties to its ServiceSpec and root
// table by specializing ServiceOf next to its service id (ps/ps_service.h). Every mode's
// schema has the same root, `table Message { body: Body; }`, so one set of helpers serves all.
#pragma once

#include <utility>

#include "node/frame.h"
#include "node/node.h"
#include "node/service.h"

namespace chorus::node {

// Specialized by each service for its union type: `static constexpr const ServiceSpec& spec`
// and `using Root = <its root table>`.
template <class Kind>
struct ServiceOf;

// What handlers and placers of one message of the service are set for.
template <class Kind>
MessageType messageType(Kind kind) {
  return {&ServiceOf<Kind>::spec, static_cast<uint8_t>(kind)};
}

// A writer of the service's whole message (for Node::encode or encodeFrame) from the writer of
// its `kind` table.
template <class Kind>
BodyWriter messageWriter(Kind kind, BodyWriter write_body) {
  return [kind, write_body = std::move(write_body)](flatbuffers::FlatBufferBuilder& b) {
    const flatbuffers::Offset<void> body = write_body(b);
    typename ServiceOf<Kind>::Root::Builder root(b);
    root.add_body(body);
    root.add_body_type(kind);
    return root.Finish().Union();
  };
}

// Encodes one of the service's messages as `node`'s frame (Node::encode).
template <class Kind>
SharedFrame encodeMessage(Node& node, Kind kind, BodyWriter write_body, size_t size_hint = 0,
                          Attachment attachment = {}) {
  return node.encode(messageType(kind), messageWriter(kind, std::move(write_body)), size_hint,
                     std::move(attachment));
}

}  // namespace chorus::node
