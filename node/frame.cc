#include "node/frame.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace chorus::node {
namespace {

// Reads below this many remaining bytes go through the scratch buffer, so several small frames
// are taken per read; larger remainders are read straight into the frame's own buffer.
constexpr size_t kScratchBytes = 64 * 1024;

std::string printableIdentifier(const uint8_t* p) {
  std::string out;
  for (size_t i = 0; i < flatbuffers::kFileIdentifierLength; ++i) {
    const auto c = static_cast<unsigned char>(p[flatbuffers::kFileIdentifierLength + i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

}  // namespace

SharedFrame encodeFrame(const EnvelopeHeader& header, wire::Body body_type,
                        const BodyWriter& write_body, size_t size_hint) {
  flatbuffers::FlatBufferBuilder builder(std::max<size_t>(size_hint + 256, 1024));
  const flatbuffers::Offset<void> body = write_body ? write_body(builder) : 0;
  const auto cluster = builder.CreateString(header.cluster.data(), header.cluster.size());
  const auto head =
      wire::CreateHeader(builder, header.sender, cluster, header.sequence, header.send_time_ns);
  const auto envelope = wire::CreateEnvelope(builder, head, body_type, body);
  builder.FinishSizePrefixed(envelope, wire::EnvelopeIdentifier());
  return std::make_shared<const OutboundFrame>(builder.Release(), header.sequence, body_type);
}

Status verifyFrame(const uint8_t* frame, size_t frame_size, const FrameLimits& limits) {
  const uint8_t* envelope = frame + kFramePrefixBytes;
  const size_t size = frame_size < kFramePrefixBytes ? 0 : frame_size - kFramePrefixBytes;
  if (size < kMinEnvelopeBytes) {
    return {ErrorCode::kBadFrame,
            fmt::format("frame of {} bytes is too short to hold an Envelope", size)};
  }
  if (!flatbuffers::BufferHasIdentifier(envelope, wire::EnvelopeIdentifier())) {
    return {ErrorCode::kBadFrame,
            fmt::format("wrong file identifier \"{}\" (expected \"{}\")",
                        printableIdentifier(envelope), wire::EnvelopeIdentifier())};
  }
  flatbuffers::Verifier verifier(frame, frame_size, limits.max_depth, limits.max_tables);
  if (!wire::VerifySizePrefixedEnvelopeBuffer(verifier)) {
    return {ErrorCode::kBadFrame,
            fmt::format("Envelope of {} bytes failed the FlatBuffers Verifier", size)};
  }
  const auto* root = &envelopeOf(frame);
  const auto type = static_cast<unsigned>(root->body_type());
  if (type == static_cast<unsigned>(wire::Body::NONE) ||
      type > static_cast<unsigned>(wire::Body::MAX)) {
    return {ErrorCode::kBadFrame, fmt::format("unknown body type {}", type)};
  }
  if (root->header() == nullptr) {
    return {ErrorCode::kBadFrame, "Envelope without a header"};
  }
  if (root->body() == nullptr) {
    return {ErrorCode::kBadFrame, fmt::format("Envelope with body type {} but no body",
                                              wire::EnumNameBody(root->body_type()))};
  }
  return {};
}

FrameDecoder::FrameDecoder(FrameLimits limits)
    : limits_(limits), scratch_(std::make_unique_for_overwrite<uint8_t[]>(kScratchBytes)) {}

std::span<uint8_t> FrameDecoder::readBuffer() {
  if (body_ != nullptr && body_size_ - body_filled_ >= kScratchBytes) {
    direct_read_ = true;
    return {body_.get() + kFramePrefixBytes + body_filled_, body_size_ - body_filled_};
  }
  direct_read_ = false;
  return {scratch_.get(), kScratchBytes};
}

Status FrameDecoder::commitRead(size_t n, const FrameSink& sink) {
  if (!error_.ok()) return error_;
  if (!direct_read_) return consume(scratch_.get(), n, sink);
  direct_read_ = false;
  body_filled_ += n;
  if (body_filled_ < body_size_) return {};
  bool keep_going = true;
  return completeFrame(sink, &keep_going);
}

Status FrameDecoder::consume(const uint8_t* data, size_t n, const FrameSink& sink) {
  if (!error_.ok()) return error_;
  bool keep_going = true;
  while (n > 0 && keep_going) {
    if (body_ == nullptr) {
      const size_t take = std::min(n, kFramePrefixBytes - prefix_filled_);
      std::memcpy(prefix_ + prefix_filled_, data, take);
      prefix_filled_ += take;
      data += take;
      n -= take;
      if (prefix_filled_ < kFramePrefixBytes) break;
      const uint32_t length = loadLittleEndian32(prefix_);
      if (length == 0) {
        error_ = {ErrorCode::kBadFrame, "zero-length frame"};
        return error_;
      }
      if (length > limits_.max_frame_bytes) {
        error_ = {ErrorCode::kBadFrame,
                  fmt::format("frame length {} bytes exceeds the maximum of {} bytes", length,
                              limits_.max_frame_bytes)};
        return error_;
      }
      // Allocated only now that the length is known to be within the limit.
      body_ = std::make_unique_for_overwrite<uint8_t[]>(kFramePrefixBytes + length);
      std::memcpy(body_.get(), prefix_, kFramePrefixBytes);
      body_size_ = length;
      body_filled_ = 0;
      prefix_filled_ = 0;
    }
    const size_t take = std::min(n, body_size_ - body_filled_);
    std::memcpy(body_.get() + kFramePrefixBytes + body_filled_, data, take);
    body_filled_ += take;
    data += take;
    n -= take;
    if (body_filled_ == body_size_) {
      Status status = completeFrame(sink, &keep_going);
      if (!status.ok()) return status;
    }
  }
  return {};
}

Status FrameDecoder::completeFrame(const FrameSink& sink, bool* keep_going) {
  Status status = verifyFrame(body_.get(), kFramePrefixBytes + body_size_, limits_);
  if (!status.ok()) {
    error_ = status;
    return error_;
  }
  InboundFrame frame(std::move(body_), body_size_);
  body_ = nullptr;
  body_size_ = 0;
  body_filled_ = 0;
  *keep_going = sink(std::move(frame));
  return {};
}

Status FrameDecoder::finish() const {
  if (!error_.ok()) return error_;
  if (body_ != nullptr) {
    return {ErrorCode::kBadFrame, fmt::format("truncated frame: stream ended after {} of {} bytes",
                                              body_filled_, body_size_)};
  }
  if (prefix_filled_ > 0) {
    return {ErrorCode::kBadFrame, fmt::format("truncated frame: stream ended after {} of {} "
                                              "length-prefix bytes",
                                              prefix_filled_, kFramePrefixBytes)};
  }
  return {};
}

}  // namespace chorus::node
