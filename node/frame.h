// Framing: a little-endian uint32 length followed by one size-prefixed FlatBuffer Envelope.
// Pure code (no sockets): encoding, verification and incremental decoding of frames.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "chorus/chorus_generated.h"
#include "node/status.h"

namespace chorus::node {

// Bytes of the length prefix in front of every Envelope.
inline constexpr size_t kFramePrefixBytes = 4;
// Smallest Envelope that can hold a root offset and the file identifier.
inline constexpr size_t kMinEnvelopeBytes = 8;

// Limits applied to every inbound frame before and while it is read.
struct FrameLimits {
  uint32_t max_frame_bytes = 256u << 20;  // Envelope bytes (without the prefix)
  uint32_t max_depth = 64;                // FlatBuffers Verifier nesting limit
  uint32_t max_tables = 1'000'000;        // FlatBuffers Verifier table count limit
};

// One encoded outbound frame (prefix + Envelope). Immutable, so one frame can be shared by
// every connection it is written to (a broadcast serializes once).
class OutboundFrame {
 public:
  OutboundFrame(flatbuffers::DetachedBuffer buffer, uint64_t sequence, wire::Body body_type)
      : buffer_(std::move(buffer)), sequence_(sequence), body_type_(body_type) {}
  OutboundFrame(const OutboundFrame&) = delete;
  OutboundFrame& operator=(const OutboundFrame&) = delete;

  // First byte of the length prefix.
  const uint8_t* data() const { return buffer_.data(); }
  // Bytes on the wire, prefix included.
  size_t size() const { return buffer_.size(); }
  // The sender's sequence number written in the header.
  uint64_t sequence() const { return sequence_; }
  // The body type written in the Envelope.
  wire::Body bodyType() const { return body_type_; }

 private:
  flatbuffers::DetachedBuffer buffer_;
  uint64_t sequence_;
  wire::Body body_type_;
};
using SharedFrame = std::shared_ptr<const OutboundFrame>;

// The header fields the runtime writes into every Envelope.
struct EnvelopeHeader {
  uint32_t sender = 0;
  std::string_view cluster;
  uint64_t sequence = 0;
  int64_t send_time_ns = 0;
};

// Writes one body table into the builder and returns its offset. It must build the whole body
// (vectors first, then the table) and nothing else.
using BodyWriter = std::function<flatbuffers::Offset<void>(flatbuffers::FlatBufferBuilder&)>;

// Encodes header + body as one size-prefixed Envelope with the "CHRS" identifier.
// `size_hint` pre-sizes the builder (pass the payload size for large bodies to avoid regrowth).
SharedFrame encodeFrame(const EnvelopeHeader& header, wire::Body body_type,
                        const BodyWriter& write_body, size_t size_hint = 0);

// The Envelope of a frame that passed verifyFrame().
inline const wire::Envelope& envelopeOf(const uint8_t* frame) {
  return *flatbuffers::GetSizePrefixedRoot<wire::Envelope>(frame);
}

// A received frame that passed verifyFrame(): owns its bytes (kept at the same alignment
// as on the sender, prefix included).
class InboundFrame {
 public:
  InboundFrame(std::unique_ptr<uint8_t[]> bytes, size_t envelope_size)
      : bytes_(std::move(bytes)), envelope_size_(envelope_size) {}

  // The verified Envelope; valid as long as this frame lives.
  const wire::Envelope& envelope() const { return envelopeOf(bytes_.get()); }
  // Bytes on the wire, prefix included.
  size_t wireSize() const { return envelope_size_ + kFramePrefixBytes; }

 private:
  std::unique_ptr<uint8_t[]> bytes_;
  size_t envelope_size_;
};

// Checks one complete frame (`frame` points at its length prefix, `frame_size` counts the
// prefix too), in this order: size, file identifier, FlatBuffers Verifier under `limits` on
// exactly this frame, header present, body type known to this build. The FlatBuffers Verifier
// checks alignment relative to the buffer start, so it must see the prefix, as the sender's
// builder laid it out. Meaning checks that need connection state belong to the caller.
Status verifyFrame(const uint8_t* frame, size_t frame_size, const FrameLimits& limits);

// Reassembles frames from a byte stream cut at arbitrary points. Each frame's length is
// checked against the maximum before its buffer is allocated, and each complete frame is
// verified before it is handed out. After an error the decoder is unusable (sticky).
class FrameDecoder {
 public:
  // Called per complete verified frame; return false to stop consuming (e.g. the connection
  // is being closed).
  using FrameSink = std::function<bool(InboundFrame&&)>;

  explicit FrameDecoder(FrameLimits limits);

  // Memory the next socket read may fill: the rest of a large frame's own buffer (so bulk
  // payloads are read in place) or a small scratch buffer.
  std::span<uint8_t> readBuffer();
  // Takes `n` bytes just written into readBuffer().
  Status commitRead(size_t n, const FrameSink& sink);
  // Takes bytes from elsewhere (tests, fuzzing).
  Status consume(const uint8_t* data, size_t n, const FrameSink& sink);
  // Status at end of stream: an error when the stream stopped inside a frame.
  Status finish() const;
  // True when some bytes of a frame (or its prefix) are held.
  bool midFrame() const { return prefix_filled_ > 0 || body_ != nullptr; }

 private:
  Status completeFrame(const FrameSink& sink, bool* keep_going);

  FrameLimits limits_;
  Status error_;
  uint8_t prefix_[kFramePrefixBytes] = {};
  size_t prefix_filled_ = 0;
  std::unique_ptr<uint8_t[]> body_;  // prefix + envelope of the frame being read
  size_t body_size_ = 0;             // envelope bytes expected
  size_t body_filled_ = 0;           // envelope bytes received
  bool direct_read_ = false;         // the last readBuffer() pointed into body_
  std::unique_ptr<uint8_t[]> scratch_;
};

// Reads the little-endian uint32 at `p`.
inline uint32_t loadLittleEndian32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

}  // namespace chorus::node
