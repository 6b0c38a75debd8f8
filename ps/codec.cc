#include "ps/codec.h"

#include <fmt/format.h>

#include <algorithm>

#include "node/node.h"
#include "ps/key_runs.h"

namespace chorus::ps {

node::SharedFrame encode(node::Node& node, PsMessage message) {
  return encodeMessage(node, message.type, std::move(message.write), message.size_hint,
                       std::move(message.attachment));
}

node::SharedFrame encodeFrame(const node::EnvelopeHeader& header, PsMessage message) {
  return node::encodeFrame(header, messageType(message.type),
                           messageWriter(message.type, std::move(message.write)), message.size_hint,
                           std::move(message.attachment));
}

namespace {

// The runs of `keys` as a vector of `b`, through a per-thread buffer (no allocation and no
// clearing per message once it has grown: its size is its room).
flatbuffers::Offset<flatbuffers::Vector<uint8_t>> keyRunsVector(flatbuffers::FlatBufferBuilder& b,
                                                                std::span<const Key> keys) {
  thread_local std::vector<uint8_t> runs;
  if (runs.size() < keyRunsBound(keys.size())) runs.resize(keyRunsBound(keys.size()));
  return b.CreateVector(runs.data(), encodeKeyRuns(keys, runs.data()));
}

// A size hint for the runs of `keys`: about 2 bytes a key spread by hashing, most keys fewer.
size_t keyRunsHint(size_t keys) {
  return 2 * keys + 16;
}

}  // namespace

PsMessage pullRequest(uint64_t request, Clock clock, Clock min_clock, std::span<const Key> keys,
                      bool want_slots) {
  return {
      wire::Body::PsPull,
      [=](flatbuffers::FlatBufferBuilder& b) {
        auto runs = keyRunsVector(b, keys);
        return wire::CreatePsPull(b, request, clock, min_clock, 0, runs, 0, 0, want_slots).Union();
      },
      keyRunsHint(keys.size()) + 128,
      {}};
}

PsMessage pullBySlots(uint64_t request, Clock clock, Clock min_clock,
                      std::span<const uint8_t> slot_runs, uint64_t layout) {
  return {wire::Body::PsPull,
          [=](flatbuffers::FlatBufferBuilder& b) {
            auto slots = b.CreateVector(slot_runs.data(), slot_runs.size());
            return wire::CreatePsPull(b, request, clock, min_clock, 0, 0, slots, layout).Union();
          },
          slot_runs.size() + 128,
          {}};
}

PsMessage pushBySlots(uint64_t request, Clock clock, std::span<const uint8_t> slot_runs,
                      uint64_t layout, std::span<const std::span<const float>> pieces) {
  node::Attachment attachment;
  attachment.reserve(pieces.size());
  for (std::span<const float> piece : pieces)
    node::appendPiece(attachment, node::bytesOf(piece));
  return {wire::Body::PsPush,
          [=](flatbuffers::FlatBufferBuilder& b) {
            auto slots = b.CreateVector(slot_runs.data(), slot_runs.size());
            return wire::CreatePsPush(b, request, clock, 0, 0, 0, slots, layout).Union();
          },
          slot_runs.size() + 128, std::move(attachment)};
}

PsMessage pushRequest(uint64_t request, Clock clock, std::span<const Key> keys,
                      std::span<const std::span<const float>> pieces, size_t floats, bool attach) {
  if (attach) {
    node::Attachment attachment;
    for (std::span<const float> piece : pieces)
      node::appendPiece(attachment, node::bytesOf(piece));
    return {wire::Body::PsPush,
            [=](flatbuffers::FlatBufferBuilder& b) {
              auto runs = keyRunsVector(b, keys);
              return wire::CreatePsPush(b, request, clock, 0, 0, runs).Union();
            },
            keyRunsHint(keys.size()) + 128, std::move(attachment)};
  }
  return {wire::Body::PsPush,
          [=](flatbuffers::FlatBufferBuilder& b) {
            auto runs = keyRunsVector(b, keys);
            // Straight from the rows into the frame (filled at once: the memory is valid only
            // until the next builder call).
            float* out = nullptr;
            auto value_vector = b.CreateUninitializedVector(floats, &out);
            for (std::span<const float> piece : pieces)
              out = std::copy(piece.begin(), piece.end(), out);
            return wire::CreatePsPush(b, request, clock, 0, value_vector, runs).Union();
          },
          floats * sizeof(float) + keyRunsHint(keys.size()) + 128,
          {}};
}

PsMessage clockAnnouncement(Clock clock) {
  return {wire::Body::PsClock,
          [=](flatbuffers::FlatBufferBuilder& b) { return wire::CreatePsClock(b, clock).Union(); },
          0,
          {}};
}

PsMessage pullReply(uint64_t request, Clock min_clock, std::span<const std::span<const float>> rows,
                    size_t floats, std::span<const uint8_t> slot_runs, uint64_t layout) {
  auto slotVector = [=](flatbuffers::FlatBufferBuilder& b) {
    return slot_runs.empty() ? flatbuffers::Offset<flatbuffers::Vector<uint8_t>>()
                             : b.CreateVector(slot_runs.data(), slot_runs.size());
  };
  if (floats <= kSmallRowFloats * rows.size()) {
    return {wire::Body::PsReply,
            [=](flatbuffers::FlatBufferBuilder& b) {
              auto slots = slotVector(b);
              float* out = nullptr;
              auto value_vector = b.CreateUninitializedVector(floats, &out);
              for (std::span<const float> row : rows)
                out = std::copy(row.begin(), row.end(), out);
              return wire::CreatePsReply(b, request, wire::PsOp::Pull, 0, min_clock, 0,
                                         value_vector, slots, layout)
                  .Union();
            },
            floats * sizeof(float) + slot_runs.size() + 256,
            {}};
  }
  node::Attachment attachment;
  attachment.reserve(rows.size());
  for (std::span<const float> row : rows)
    node::appendPiece(attachment, node::bytesOf(row));
  return {wire::Body::PsReply,
          [=](flatbuffers::FlatBufferBuilder& b) {
            auto slots = slotVector(b);
            return wire::CreatePsReply(b, request, wire::PsOp::Pull, 0, min_clock, 0, 0, slots,
                                       layout)
                .Union();
          },
          slot_runs.size() + 256, std::move(attachment)};
}

PsMessage pushAck(uint64_t request) {
  return {wire::Body::PsReply,
          [=](flatbuffers::FlatBufferBuilder& b) {
            return wire::CreatePsReply(b, request, wire::PsOp::Push).Union();
          },
          0,
          {}};
}

PsMessage errorReply(uint64_t request, wire::PsOp op, std::string_view error) {
  return {wire::Body::PsReply,
          [=](flatbuffers::FlatBufferBuilder& b) {
            return wire::CreatePsReply(b, request, op, b.CreateString(error)).Union();
          },
          0,
          {}};
}

PsMessage staleReply(uint64_t request, wire::PsOp op, std::string_view error) {
  return {wire::Body::PsReply,
          [=](flatbuffers::FlatBufferBuilder& b) {
            auto text = b.CreateString(error);
            return wire::CreatePsReply(b, request, op, text, 0, 0, 0, 0, 0, true).Union();
          },
          0,
          {}};
}

std::optional<std::span<const float>> valuesOf(const flatbuffers::Vector<float>* values,
                                               std::span<const uint8_t> attached) {
  if (values != nullptr) {
    if (!attached.empty()) return std::nullopt;
    return std::span<const float>(values->data(), values->size());
  }
  if (attached.size() % sizeof(float) != 0) return std::nullopt;
  return std::span<const float>(reinterpret_cast<const float*>(attached.data()),
                                attached.size() / sizeof(float));
}

std::optional<std::span<const float>> valuesOf(const flatbuffers::Vector<float>* values,
                                               const node::InboundFrame& frame) {
  return valuesOf(values, frame.attachment());
}

namespace {

std::span<const Key> keysOf(const flatbuffers::Vector<uint64_t>* keys) {
  if (keys == nullptr) return {};
  return {keys->data(), keys->size()};
}

}  // namespace

namespace {

// The keys of a request: its `keys` (older builds) or its decoded `key_runs`, exactly one of them,
// or neither with `slot_runs` instead (then `by_slots` is set and `slot_bytes` names them).
std::optional<std::string> requestKeys(const char* what, const flatbuffers::Vector<uint64_t>* keys,
                                       const flatbuffers::Vector<uint8_t>* runs,
                                       const flatbuffers::Vector<uint8_t>* slots, size_t max_keys,
                                       std::vector<Key>& key_buffer, std::span<const Key>& out,
                                       std::span<const uint8_t>& slot_bytes, bool& by_slots) {
  out = {};  // a request reused for the next message keeps nothing of the last
  slot_bytes = {};
  by_slots = false;
  if ((keys != nullptr) + (runs != nullptr) + (slots != nullptr) > 1)
    return fmt::format("{} with more than one of keys, key runs and slot runs", what);
  if (slots != nullptr) {
    slot_bytes = {slots->data(), slots->size()};
    by_slots = true;
    return std::nullopt;
  }
  if (keys != nullptr) {
    out = keysOf(keys);
    return std::nullopt;
  }
  if (runs == nullptr) return fmt::format("{} without keys", what);
  if (auto error = decodeKeyRuns({runs->data(), runs->size()}, max_keys, key_buffer)) {
    return fmt::format("{}: {}", what, *error);
  }
  out = key_buffer;
  return std::nullopt;
}

}  // namespace

std::optional<std::string> decodePull(const wire::PsPull& body, size_t max_keys,
                                      std::vector<Key>& key_buffer, PullRequest& out) {
  out.request = body.request();
  if (auto error = requestKeys("pull", body.keys(), body.key_runs(), body.slot_runs(), max_keys,
                               key_buffer, out.keys, out.slot_runs, out.by_slots)) {
    return error;
  }
  out.clock = body.clock();
  out.min_clock = body.min_clock();
  out.layout = body.layout();
  out.want_slots = body.want_slots() && !out.by_slots;
  return std::nullopt;
}

std::optional<std::string> decodePush(const wire::PsPush& body, std::span<const uint8_t> attachment,
                                      size_t max_keys, std::vector<Key>& key_buffer,
                                      PushRequest& out) {
  out.request = body.request();
  const std::optional<std::span<const float>> values = valuesOf(body.values(), attachment);
  if (!values) {
    return fmt::format(
        "push with values in both the body and an attachment, or an attachment of {} bytes "
        "that are not whole floats",
        attachment.size());
  }
  // Every key holds at least one float: more keys than floats is a wrong request whatever
  // the store holds, and bounds what the runs may expand to by the frame's own size.
  if (auto error = requestKeys("push", body.keys(), body.key_runs(), body.slot_runs(),
                               std::min(max_keys, values->size()), key_buffer, out.keys,
                               out.slot_runs, out.by_slots)) {
    return error;
  }
  out.clock = body.clock();
  out.layout = body.layout();
  out.grads = *values;
  return std::nullopt;
}

ReplyView decodeReply(const wire::PsReply& body) {
  ReplyView view;
  view.request = body.request();
  view.op = body.op();
  if (body.error() != nullptr) view.error = body.error()->str();
  view.min_clock = body.min_clock();
  view.keys = keysOf(body.keys());
  if (body.slot_runs() != nullptr)
    view.slot_runs = {body.slot_runs()->data(), body.slot_runs()->size()};
  view.layout = body.layout();
  view.stale = body.stale();
  return view;
}

}  // namespace chorus::ps
