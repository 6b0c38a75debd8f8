// The relocation core's messages (ps/relocation_message.h) as PS-service FlatBuffers (ps/ps.fbs,
// Reloc* tables): a run of messages of one kind to one destination travels as one table, one
// entry per message. Pure functions, no networking: the relocation shell (ps/relocation_shell.h)
// writes what the core sends and reads what peers send, and tests/ps/relocation_codec_test.cc
// checks the round trip and the refusals of malformed tables.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ps/key_space.h"
#include "ps/ps_generated.h"
#include "ps/relocation_message.h"

namespace chorus::ps {

// The refused kind of a RelocRefusal entry that refuses a whole frame (it could not be read):
// the shell logs it and does not hand it to the core.
inline constexpr uint8_t kRefusedFrame = 255;

// Messages that travel together in one table: the same wire table, and for notices the same
// notice kind. Equal batch kinds may share a frame.
int relocationBatchKind(const RelocationBody& body);

// The wire body type `messages` (non-empty, all of one batch kind) travel as.
wire::Body relocationWireBody(const RelocationBody& first);

// Writes `messages` (non-empty, one batch kind) as their table. Rows and gradients must have
// their keys' lengths in `space` (the core makes them so).
flatbuffers::Offset<void> writeRelocation(flatbuffers::FlatBufferBuilder& b,
                                          std::span<const RelocationBody> messages);

// A RelocRefusal of a whole frame: `reason` says why it could not be read.
flatbuffers::Offset<void> writeFrameRefusal(flatbuffers::FlatBufferBuilder& b,
                                            const std::string& reason);

// Is `body` one of the relocation tables?
bool isRelocationWireBody(wire::Body body);

// What a frame held: the messages for the core, and the whole-frame refusals a peer sent back
// (their reasons).
struct RelocationFrame {
  std::vector<RelocationBody> messages;
  std::vector<std::string> frame_refusals;
};

// Reads a verified PS message of a relocation table into `out` (appended). An error (nothing
// appended) when the table is malformed: vectors of different lengths, a key outside `space`
// where a row or gradient must be sized by it, floats that do not add up, an unknown notice or
// refused kind. Meaning checks (is the key held here, did I ask for it) are the core's.
std::optional<std::string> readRelocation(const wire::Message& message, const KeySpace& space,
                                          RelocationFrame& out);

}  // namespace chorus::ps
