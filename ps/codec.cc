#include "ps/codec.h"

#include <fmt/format.h>

#include <algorithm>

#include "node/node.h"

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

PsMessage pullRequest(uint64_t request, Clock clock, Clock min_clock, std::span<const Key> keys) {
  return {wire::Body::PsPull,
          [=](flatbuffers::FlatBufferBuilder& b) {
            auto key_vector = b.CreateVector(keys.data(), keys.size());
            return wire::CreatePsPull(b, request, clock, min_clock, key_vector).Union();
          },
          keys.size() * sizeof(uint64_t) + 128,
          {}};
}

PsMessage pushRequest(uint64_t request, Clock clock, std::span<const Key> keys,
                      std::span<const std::span<const float>> rows, size_t floats, bool attach) {
  if (attach) {
    node::Attachment attachment;
    for (std::span<const float> row : rows)
      node::appendPiece(attachment, node::bytesOf(row));
    return {wire::Body::PsPush,
            [=](flatbuffers::FlatBufferBuilder& b) {
              auto key_vector = b.CreateVector(keys.data(), keys.size());
              return wire::CreatePsPush(b, request, clock, key_vector).Union();
            },
            keys.size() * sizeof(uint64_t) + 128, std::move(attachment)};
  }
  return {wire::Body::PsPush,
          [=](flatbuffers::FlatBufferBuilder& b) {
            auto key_vector = b.CreateVector(keys.data(), keys.size());
            // Straight from the rows into the frame (filled at once: the memory is valid only
            // until the next builder call).
            float* out = nullptr;
            auto value_vector = b.CreateUninitializedVector(floats, &out);
            for (std::span<const float> row : rows)
              out = std::copy(row.begin(), row.end(), out);
            return wire::CreatePsPush(b, request, clock, key_vector, value_vector).Union();
          },
          floats * sizeof(float) + keys.size() * sizeof(uint64_t) + 128,
          {}};
}

PsMessage clockAnnouncement(Clock clock) {
  return {wire::Body::PsClock,
          [=](flatbuffers::FlatBufferBuilder& b) { return wire::CreatePsClock(b, clock).Union(); },
          0,
          {}};
}

PsMessage pullReply(uint64_t request, Clock min_clock, std::span<const Key> keys,
                    std::span<const std::span<const float>> rows) {
  node::Attachment attachment;
  for (std::span<const float> row : rows)
    attachment.push_back(node::bytesOf(row));
  return {
      wire::Body::PsReply,
      [=](flatbuffers::FlatBufferBuilder& b) {
        auto key_vector = b.CreateVector(keys.data(), keys.size());
        return wire::CreatePsReply(b, request, wire::PsOp::Pull, 0, min_clock, key_vector).Union();
      },
      keys.size() * sizeof(uint64_t) + 256, std::move(attachment)};
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

std::optional<std::string> decodePull(const wire::PsPull& body, PullRequest& out) {
  out.request = body.request();
  if (body.keys() == nullptr) return "pull without keys";
  out.clock = body.clock();
  out.min_clock = body.min_clock();
  out.keys = keysOf(body.keys());
  return std::nullopt;
}

std::optional<std::string> decodePush(const wire::PsPush& body, std::span<const uint8_t> attachment,
                                      PushRequest& out) {
  out.request = body.request();
  if (body.keys() == nullptr) return "push without keys";
  const std::optional<std::span<const float>> values = valuesOf(body.values(), attachment);
  if (!values) {
    return fmt::format(
        "push with values in both the body and an attachment, or an attachment of {} bytes "
        "that are not whole floats",
        attachment.size());
  }
  out.clock = body.clock();
  out.keys = keysOf(body.keys());
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
  return view;
}

}  // namespace chorus::ps
