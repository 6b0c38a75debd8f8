// Framing: a little-endian uint32 length followed by one size-prefixed FlatBuffer Envelope,
// then the attachment its header announces (raw bytes, usually none).
// Pure code (no sockets): encoding, verification and incremental decoding of frames.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "chorus/chorus_generated.h"
#include "node/inbound_budget.h"
#include "node/service.h"
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

// Bytes that travel after an Envelope, in pieces that are joined on the wire.
using Attachment = std::vector<std::span<const uint8_t>>;

// Appends `piece` to `pieces`, joined to the last one when it starts where that one ends (one
// iovec, or one socket read, instead of two).
template <class Byte>
void appendPiece(std::vector<std::span<Byte>>& pieces, std::span<Byte> piece) {
  if (!pieces.empty() && pieces.back().data() + pieces.back().size() == piece.data()) {
    pieces.back() = {pieces.back().data(), pieces.back().size() + piece.size()};
  } else {
    pieces.push_back(piece);
  }
}

// The bytes of `values`, as one piece of an Attachment (on the wire in host byte order, which
// every platform chorus runs on shares with FlatBuffers: little-endian).
template <class T>
std::span<const uint8_t> bytesOf(std::span<const T> values) {
  static_assert(std::is_trivially_copyable_v<T>);
  return {reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes()};
}

// One encoded outbound frame (prefix + Envelope, then its attachment). Immutable, so one frame
// can be shared by every connection it is written to (a broadcast serializes once). The
// attachment's bytes are not owned unless the frame was made by withOwnAttachment(): whoever
// encodes a frame with an attachment keeps those bytes unchanged until every send of it
// completed.
class OutboundFrame {
 public:
  // `kind`: the message's kind (messageKind(): the runtime's body type, or service and kind).
  OutboundFrame(flatbuffers::DetachedBuffer buffer, uint64_t sequence, uint32_t kind,
                Attachment attachment = {});
  OutboundFrame(const OutboundFrame&) = delete;
  OutboundFrame& operator=(const OutboundFrame&) = delete;

  // First byte of the length prefix.
  const uint8_t* data() const { return buffer_.data(); }
  // Bytes on the wire, prefix and attachment included.
  size_t size() const { return buffer_.size() + attachment_bytes_; }
  // Bytes of the prefix and the Envelope.
  size_t envelopeSize() const { return buffer_.size(); }
  // Bytes of the attachment.
  size_t attachmentSize() const { return attachment_bytes_; }
  // Every piece of the frame in wire order: the prefixed Envelope, then the attachment's.
  std::vector<std::span<const uint8_t>> pieces() const;
  // A copy of bytes [from, size()) of this frame that owns them all (what the socket has not
  // taken of a frame whose attachment is about to change).
  std::shared_ptr<const OutboundFrame> tailCopy(size_t from) const;
  // The sender's sequence number written in the header.
  uint64_t sequence() const { return sequence_; }
  // The kind of message it carries (messageKind()): what send policies compare.
  uint32_t kind() const { return kind_; }

 private:
  flatbuffers::DetachedBuffer buffer_;
  uint64_t sequence_;
  uint32_t kind_;
  Attachment attachment_;
  size_t attachment_bytes_ = 0;
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

// Encodes header + one of the runtime's messages as one size-prefixed Envelope with the "CHRS"
// identifier, announcing `attachment` (referenced, not copied: see OutboundFrame). `size_hint`
// pre-sizes the builder (pass the payload size for large bodies to avoid regrowth).
SharedFrame encodeFrame(const EnvelopeHeader& header, wire::Body body_type,
                        const BodyWriter& write_body, size_t size_hint = 0,
                        Attachment attachment = {});
// The same with a service's message: `write_message` writes the service's root table (its
// whole message, vectors first, nothing else) and returns its offset; it becomes the
// Envelope's `message` in place, as a FlatBuffer of its own aligned to 8 (no copy of its
// bytes). `type.kind` must be the kind the writer writes.
SharedFrame encodeFrame(const EnvelopeHeader& header, MessageType type,
                        const BodyWriter& write_message, size_t size_hint = 0,
                        Attachment attachment = {});

// Where one inbound frame's attachment is read to, chosen by the receiver once the Envelope
// arrived (FrameDecoder::Placer): memory the receiver owns, filled piece after piece by the
// socket reads themselves. The decoder destroys the landing exactly once: after the frame was
// handed to the sink (arrived() true), or when the stream ended or failed first (false), so
// the destructor of a subclass is where the receiver takes its memory back.
class AttachmentLanding {
 public:
  explicit AttachmentLanding(std::vector<std::span<uint8_t>> pieces) : pieces_(std::move(pieces)) {}
  virtual ~AttachmentLanding() = default;
  AttachmentLanding(const AttachmentLanding&) = delete;
  AttachmentLanding& operator=(const AttachmentLanding&) = delete;

  const std::vector<std::span<uint8_t>>& pieces() const { return pieces_; }
  size_t size() const;
  // True once every byte is in place.
  bool arrived() const { return arrived_; }

 private:
  friend class FrameDecoder;
  std::vector<std::span<uint8_t>> pieces_;
  bool arrived_ = false;
};

// The Envelope of a frame that passed verifyFrame().
inline const wire::Envelope& envelopeOf(const uint8_t* frame) {
  return *flatbuffers::GetSizePrefixedRoot<wire::Envelope>(frame);
}

// Where a service's message starts within a frame, at least: its 64-bit scalars are aligned.
inline constexpr size_t kMessageAlignment = 8;

// Checks a service's message (the bytes of Envelope.message), in this order: alignment in
// memory, the service's FlatBuffers Verifier under `limits` on exactly these bytes. Only a
// message that passed may be read (messageOf()).
Status verifyMessage(const ServiceSpec& service, std::span<const uint8_t> message,
                     const FrameLimits& limits);

// A received frame that passed verifyFrame(): owns its bytes (kept at the same alignment
// as on the sender, prefix included) and its attachment, which is either in a buffer of its
// own (attachment()) or was read to where the receiver's placer asked (landing()).
class InboundFrame {
 public:
  InboundFrame(std::unique_ptr<uint8_t[]> bytes, size_t envelope_size)
      : bytes_(std::move(bytes)), envelope_size_(envelope_size) {}

  // The verified Envelope; valid as long as this frame lives.
  const wire::Envelope& envelope() const { return envelopeOf(bytes_.get()); }
  // The service whose message the frame carries (kRuntimeService for a runtime message).
  ServiceId service() const { return envelope().service(); }
  // The service's message bytes (empty for a runtime message).
  std::span<const uint8_t> message() const {
    const auto* bytes = envelope().message();
    return bytes == nullptr ? std::span<const uint8_t>() : std::span(bytes->data(), bytes->size());
  }
  // The service whose Verifier accepted message(), or null (a runtime message, or a service
  // this node has not registered: its message was not read).
  const ServiceSpec* verifiedService() const { return verified_service_; }
  // The kind of a verified service message.
  uint8_t kind() const { return verified_service_->kind(message().data()); }
  // Bytes on the wire, prefix and attachment included.
  size_t wireSize() const { return envelope_size_ + kFramePrefixBytes + attachment_size_; }
  // The attachment when it was read into the frame's own buffer (aligned for any scalar);
  // empty when there is none or it went to a landing.
  std::span<const uint8_t> attachment() const {
    return landing_ ? std::span<const uint8_t>()
                    : std::span<const uint8_t>(attachment_.get(), attachment_size_);
  }
  // The landing the attachment was read to, or null.
  const AttachmentLanding* landing() const { return landing_.get(); }

 private:
  friend class FrameDecoder;
  std::unique_ptr<uint8_t[]> bytes_;
  size_t envelope_size_;
  std::unique_ptr<uint8_t[]> attachment_;
  size_t attachment_size_ = 0;
  std::unique_ptr<AttachmentLanding> landing_;
  const ServiceSpec* verified_service_ = nullptr;
  // The inbound budget held by bytes_ and attachment_, given back when the frame dies.
  BudgetReservation reservation_;
  BudgetReservation attachment_reservation_;
};

// The root table of a frame's service message that passed its service's Verifier (a frame
// handed to a service's handler or placer). Never call it on a frame whose verifiedService()
// is not the service of `Root`.
template <class Root>
const Root& messageOf(const InboundFrame& frame) {
  return *flatbuffers::GetRoot<Root>(frame.message().data());
}

// Checks one complete frame (`frame` points at its length prefix, `frame_size` counts the
// prefix too), in this order: size, file identifier, FlatBuffers Verifier under `limits` on
// exactly this frame, header present, then either a runtime body of a type known to this build
// (service 0) or a service's message (body NONE). The FlatBuffers Verifier
// checks alignment relative to the buffer start, so it must see the prefix, as the sender's
// builder laid it out. Meaning checks that need connection state belong to the caller.
Status verifyFrame(const uint8_t* frame, size_t frame_size, const FrameLimits& limits);

class FrameOpener;  // node/frame_cipher.h

// Reassembles frames from a byte stream cut at arbitrary points. Each frame's length is
// checked against the maximum before its buffer is allocated, and each complete frame is
// verified before it is handed out. After an error the decoder is unusable (sticky).
class FrameDecoder {
 public:
  // Called per complete verified frame; return false to stop consuming (e.g. the connection
  // is being closed).
  using FrameSink = std::function<bool(InboundFrame&&)>;

  // Called with a verified frame (Envelope, and its service message when the service is
  // known) that announces an attachment of `bytes` (at most the frame limit): where to read it
  // (every piece's sizes adding up to `bytes`), or null for a buffer of the frame's own.
  using Placer =
      std::function<std::unique_ptr<AttachmentLanding>(const InboundFrame&, size_t bytes)>;
  // The spec of a service this receiver knows, or null: its messages are verified with it
  // before the placer or the sink sees the frame (a message that fails ends the stream).
  using ServiceLookup = std::function<const ServiceSpec*(ServiceId)>;

  explicit FrameDecoder(FrameLimits limits);
  ~FrameDecoder();
  void setPlacer(Placer placer) { placer_ = std::move(placer); }
  void setServices(ServiceLookup services) { services_ = std::move(services); }
  // Every buffer the decoder allocates (Envelope, attachment not placed elsewhere) is first
  // reserved from `budget` (null: none); a frame that does not fit is an error (kOverloaded).
  // The budget must outlive the decoder and every frame it hands out.
  void setBudget(InboundBudget* budget) { budget_ = budget; }
  // Changes the largest frame accepted from the next length prefix on (at most the limits'
  // max_frame_bytes); `note` ends the error message of a frame above it (" before the
  // handshake"). Safe to call from the sink, between two frames of one read.
  void setMaxFrameBytes(uint32_t bytes, std::string note = {});
  uint32_t maxFrameBytes() const { return max_frame_bytes_; }
  // Every frame from the next length prefix on is sealed (node/frame_cipher.h) and opened with
  // `opener` before it is verified; one that does not open is an error (kBadFrame). Call
  // between two frames (from the sink, or before the first byte).
  void setOpener(std::unique_ptr<FrameOpener> opener);
  bool sealed() const { return opener_ != nullptr; }

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
  bool midFrame() const { return prefix_filled_ > 0 || body_ != nullptr || frame_ != nullptr; }

 private:
  // The Envelope is in: verifies it, then delivers the frame or starts its attachment.
  Status completeEnvelope(const FrameSink& sink, bool* keep_going);
  // Takes `n` bytes of the attachment that were written where nextAttachmentSpan() pointed.
  void advanceAttachment(size_t n);
  // The rest of the attachment piece being filled.
  std::span<uint8_t> nextAttachmentSpan();
  // Hands the frame whose attachment is complete to the sink.
  void deliver(const FrameSink& sink, bool* keep_going);
  // The attachment (and its tag, when sealed) is in: checks the tag, then delivers.
  Status finishAttachment(const FrameSink& sink, bool* keep_going);
  // Reserves `bytes` from the budget for the frame being read (into `into`), or sets error_.
  bool reserve(size_t bytes, const char* what, BudgetReservation* into);

  FrameLimits limits_;
  uint32_t max_frame_bytes_;
  std::string limit_note_;
  InboundBudget* budget_ = nullptr;
  BudgetReservation body_reservation_;  // held by body_ until the Envelope becomes a frame
  Status error_;
  uint8_t prefix_[kFramePrefixBytes] = {};
  size_t prefix_filled_ = 0;
  std::unique_ptr<uint8_t[]> body_;  // prefix + envelope of the frame being read
  size_t body_size_ = 0;             // envelope bytes expected
  size_t body_filled_ = 0;           // envelope bytes received
  bool direct_read_ = false;         // the last readBuffer() pointed into body_ or a piece
  std::unique_ptr<uint8_t[]> scratch_;
  Placer placer_;
  ServiceLookup services_;
  // A verified frame whose attachment is being read: into pieces_[piece_] at piece_filled_.
  std::unique_ptr<InboundFrame> frame_;
  std::vector<std::span<uint8_t>> pieces_;
  size_t piece_ = 0;
  size_t piece_filled_ = 0;
  size_t attachment_left_ = 0;
  // Sealed frames: the opener, whether the frame being read is sealed (set at its prefix), and
  // where an attachment's tag is read to (the last of pieces_).
  std::unique_ptr<FrameOpener> opener_;
  bool body_sealed_ = false;
  bool attachment_sealed_ = false;
  uint8_t attachment_tag_[16] = {};
};

// Reads the little-endian uint32 at `p`.
inline uint32_t loadLittleEndian32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

}  // namespace chorus::node
