#include "node/frame.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "node/frame_cipher.h"

namespace chorus::node {
namespace {

// Another program on a chorus port (a web server, ssh) answers with text, whose first four bytes
// read as a huge frame length: say so and show what it sent, instead of a bare length.
std::string notChorusNote(const uint8_t (&prefix)[kFramePrefixBytes],
                          std::span<const uint8_t> more) {
  const auto printable = [](uint8_t c) { return c >= 0x20 && c < 0x7f; };
  if (!std::all_of(std::begin(prefix), std::end(prefix), printable)) return {};
  std::string shown;
  const auto show = [&](uint8_t c) {
    if (c == '\r') {
      shown += "\\r";
    } else if (c == '\n') {
      shown += "\\n";
    } else if (printable(c) && c != '"') {
      shown += static_cast<char>(c);
    } else {
      shown += fmt::format("\\x{:02x}", c);
    }
  };
  for (uint8_t c : prefix)
    show(c);
  for (uint8_t c : more)
    show(c);
  return fmt::format(
      "; the peer does not speak chorus: it sent \"{}\"... (is another program listening at "
      "this address, or is it not a chorus node?)",
      shown);
}

// Reads below this many remaining bytes go through the scratch buffer, so several small frames
// are taken per read; larger remainders are read straight into the frame's own buffer.
constexpr size_t kScratchBytes = 64 * 1024;
// Attachment pieces with at least this much left are read in place, even when that takes a
// read per piece: each such read saves a copy of the piece out of the scratch buffer.
constexpr size_t kDirectAttachmentBytes = 4 * 1024;

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

OutboundFrame::OutboundFrame(flatbuffers::DetachedBuffer buffer, uint64_t sequence, uint32_t kind,
                             Attachment attachment)
    : buffer_(std::move(buffer)),
      sequence_(sequence),
      kind_(kind),
      attachment_(std::move(attachment)) {
  std::erase_if(attachment_, [](std::span<const uint8_t> piece) { return piece.empty(); });
  for (const auto& piece : attachment_)
    attachment_bytes_ += piece.size();
}

std::vector<std::span<const uint8_t>> OutboundFrame::pieces() const {
  std::vector<std::span<const uint8_t>> all;
  all.reserve(1 + attachment_.size());
  all.emplace_back(buffer_.data(), buffer_.size());
  all.insert(all.end(), attachment_.begin(), attachment_.end());
  return all;
}

std::shared_ptr<const OutboundFrame> OutboundFrame::tailCopy(size_t from) const {
  const size_t bytes = size() - std::min(from, size());
  // A DetachedBuffer without an allocator frees its bytes with delete[].
  auto* copy = new uint8_t[std::max<size_t>(bytes, 1)];
  uint8_t* out = copy;
  size_t skip = from;
  for (const auto& piece : pieces()) {
    if (skip >= piece.size()) {
      skip -= piece.size();
      continue;
    }
    out = std::copy(piece.begin() + static_cast<ptrdiff_t>(skip), piece.end(), out);
    skip = 0;
  }
  return std::make_shared<const OutboundFrame>(
      flatbuffers::DetachedBuffer(nullptr, false, copy, std::max<size_t>(bytes, 1), copy, bytes),
      sequence_, kind_);
}

namespace {

size_t attachmentBytes(const Attachment& attachment) {
  size_t bytes = 0;
  for (const auto& piece : attachment)
    bytes += piece.size();
  if (bytes > std::numeric_limits<uint32_t>::max()) {
    throw std::invalid_argument(
        fmt::format("an attachment of {} bytes does not fit a frame", bytes));
  }
  return bytes;
}

// Writes the header and the Envelope around what the builder holds and finishes the frame.
SharedFrame finishFrame(flatbuffers::FlatBufferBuilder& builder, const EnvelopeHeader& header,
                        wire::Body body_type, flatbuffers::Offset<void> body, ServiceId service,
                        flatbuffers::Offset<flatbuffers::Vector<uint8_t>> message, uint32_t kind,
                        Attachment attachment) {
  const size_t attachment_bytes = attachmentBytes(attachment);
  const auto cluster = builder.CreateString(header.cluster.data(), header.cluster.size());
  const auto head =
      wire::CreateHeader(builder, header.sender, cluster, header.sequence, header.send_time_ns,
                         static_cast<uint32_t>(attachment_bytes));
  const auto envelope = wire::CreateEnvelope(builder, head, body_type, body, service, message);
  builder.FinishSizePrefixed(envelope, wire::EnvelopeIdentifier());
  return std::make_shared<const OutboundFrame>(builder.Release(), header.sequence, kind,
                                               std::move(attachment));
}

}  // namespace

SharedFrame encodeFrame(const EnvelopeHeader& header, wire::Body body_type,
                        const BodyWriter& write_body, size_t size_hint, Attachment attachment) {
  (void)attachmentBytes(attachment);  // refused before anything is built
  flatbuffers::FlatBufferBuilder builder(std::max<size_t>(size_hint + 256, 1024));
  const flatbuffers::Offset<void> body = write_body ? write_body(builder) : 0;
  return finishFrame(builder, header, body_type, body, kRuntimeService, 0,
                     messageKind(kRuntimeService, static_cast<uint8_t>(body_type)),
                     std::move(attachment));
}

SharedFrame encodeFrame(const EnvelopeHeader& header, MessageType type,
                        const BodyWriter& write_message, size_t size_hint, Attachment attachment) {
  (void)attachmentBytes(attachment);
  flatbuffers::FlatBufferBuilder builder(std::max<size_t>(size_hint + 256, 1024));
  // The message is written first, so it ends where the buffer ends: FlatBuffers aligns every
  // scalar relative to the end, and the finished frame's size is a multiple of its largest
  // alignment, so what is aligned relative to the message's end is aligned in the frame too.
  const flatbuffers::Offset<void> root = write_message(builder);
  // Finished as FlatBuffers finishes a buffer (root offset in front, no identifier: the
  // service id says whose it is), padded so that it starts at a multiple of 8 from the end ...
  builder.PreAlign(sizeof(flatbuffers::uoffset_t), kMessageAlignment);
  builder.PushElement(builder.ReferTo(root.o));
  const flatbuffers::uoffset_t message_bytes = builder.GetSize();
  // ... and wrapped in place as the [ubyte] vector `message`: its length in front of it.
  const auto message =
      flatbuffers::Offset<flatbuffers::Vector<uint8_t>>(builder.PushElement(message_bytes));
  return finishFrame(builder, header, wire::Body::NONE, 0, type.service->id, message,
                     messageKind(type.service->id, type.kind), std::move(attachment));
}

size_t AttachmentLanding::size() const {
  size_t bytes = 0;
  for (const auto& piece : pieces_)
    bytes += piece.size();
  return bytes;
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
  if (root->header() == nullptr) {
    return {ErrorCode::kBadFrame, "Envelope without a header"};
  }
  const auto type = static_cast<unsigned>(root->body_type());
  if (root->service() != kRuntimeService) {
    if (type != static_cast<unsigned>(wire::Body::NONE)) {
      return {ErrorCode::kBadFrame, fmt::format("Envelope of service {} with a runtime body ({})",
                                                root->service(), type)};
    }
    if (root->message() == nullptr) {
      return {ErrorCode::kBadFrame,
              fmt::format("Envelope of service {} without a message", root->service())};
    }
    return {};
  }
  if (type == static_cast<unsigned>(wire::Body::NONE) ||
      type > static_cast<unsigned>(wire::Body::MAX)) {
    return {ErrorCode::kBadFrame, fmt::format("unknown body type {}", type)};
  }
  if (root->body() == nullptr) {
    return {ErrorCode::kBadFrame, fmt::format("Envelope with body type {} but no body",
                                              wire::EnumNameBody(root->body_type()))};
  }
  if (root->message() != nullptr) {
    return {ErrorCode::kBadFrame, fmt::format("runtime {} with a service message",
                                              wire::EnumNameBody(root->body_type()))};
  }
  return {};
}

Status verifyMessage(const ServiceSpec& service, std::span<const uint8_t> message,
                     const FrameLimits& limits) {
  // The Verifier checks alignment relative to the message's start only; its 64-bit fields are
  // read in place, so the start itself must be aligned (a sender lays it out so).
  if (reinterpret_cast<uintptr_t>(message.data()) % kMessageAlignment != 0) {
    return {ErrorCode::kBadFrame, fmt::format("{} message not aligned to {} bytes within the frame",
                                              service.name, kMessageAlignment)};
  }
  flatbuffers::Verifier verifier(message.data(), message.size(), limits.max_depth,
                                 limits.max_tables);
  if (!service.verify(verifier)) {
    return {ErrorCode::kBadFrame,
            fmt::format("{} message of {} bytes failed the FlatBuffers Verifier", service.name,
                        message.size())};
  }
  if (service.check != nullptr && !service.check(message.data())) {
    return {ErrorCode::kBadFrame,
            fmt::format("{} message with a 64-bit vector not aligned to 8 bytes", service.name)};
  }
  return {};
}

FrameDecoder::FrameDecoder(FrameLimits limits)
    : limits_(limits),
      max_frame_bytes_(limits.max_frame_bytes),
      scratch_(std::make_unique_for_overwrite<uint8_t[]>(kScratchBytes)) {}

FrameDecoder::~FrameDecoder() = default;

void FrameDecoder::setOpener(std::unique_ptr<FrameOpener> opener) {
  opener_ = std::move(opener);
}

void FrameDecoder::setMaxFrameBytes(uint32_t bytes, std::string note) {
  max_frame_bytes_ = std::min(bytes, limits_.max_frame_bytes);
  limit_note_ = std::move(note);
}

bool FrameDecoder::reserve(size_t bytes, const char* what, BudgetReservation* into) {
  if (budget_ == nullptr) return true;
  if (!budget_->tryReserve(bytes)) {
    error_ = {ErrorCode::kOverloaded,
              fmt::format("{} of {} bytes would take the node's inbound bytes in flight from {} "
                          "above its budget of {} bytes",
                          what, bytes, budget_->reserved(), budget_->budget())};
    return false;
  }
  *into = BudgetReservation(budget_, bytes);
  return true;
}

std::span<uint8_t> FrameDecoder::readBuffer() {
  if (frame_ != nullptr) {
    const std::span<uint8_t> piece = nextAttachmentSpan();
    if (piece.size() >= kDirectAttachmentBytes) {
      direct_read_ = true;
      return piece;
    }
  } else if (body_ != nullptr && body_size_ - body_filled_ >= kScratchBytes) {
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
  bool keep_going = true;
  if (frame_ != nullptr) {
    advanceAttachment(n);
    if (attachment_left_ == 0) return finishAttachment(sink, &keep_going);
    return {};
  }
  body_filled_ += n;
  if (body_filled_ < body_size_) return {};
  return completeEnvelope(sink, &keep_going);
}

std::span<uint8_t> FrameDecoder::nextAttachmentSpan() {
  while (piece_ < pieces_.size() && piece_filled_ == pieces_[piece_].size()) {
    ++piece_;
    piece_filled_ = 0;
  }
  if (piece_ == pieces_.size()) return {};
  return pieces_[piece_].subspan(piece_filled_);
}

void FrameDecoder::advanceAttachment(size_t n) {
  // Sealed: the bytes just read are opened in place while they are in cache (the last piece
  // is the tag's, which is not part of the record).
  if (attachment_sealed_ && piece_ + 1 < pieces_.size()) {
    opener_->openAttachment(pieces_[piece_].subspan(piece_filled_, n));
  }
  piece_filled_ += n;
  attachment_left_ -= n;
}

Status FrameDecoder::finishAttachment(const FrameSink& sink, bool* keep_going) {
  if (attachment_sealed_) {
    attachment_sealed_ = false;
    Status status = opener_->finishAttachment(attachment_tag_);
    if (!status.ok()) {
      error_ = std::move(status);
      frame_.reset();  // its landing ends without arriving
      pieces_.clear();
      return error_;
    }
  }
  deliver(sink, keep_going);
  return {};
}

void FrameDecoder::deliver(const FrameSink& sink, bool* keep_going) {
  if (frame_->landing_) frame_->landing_->arrived_ = true;
  InboundFrame frame = std::move(*frame_);
  frame_.reset();
  pieces_.clear();
  *keep_going = sink(std::move(frame));
}

Status FrameDecoder::consume(const uint8_t* data, size_t n, const FrameSink& sink) {
  if (!error_.ok()) return error_;
  bool keep_going = true;
  while (n > 0 && keep_going) {
    if (frame_ != nullptr) {
      const std::span<uint8_t> piece = nextAttachmentSpan();
      const size_t take = std::min(n, piece.size());
      std::memcpy(piece.data(), data, take);
      advanceAttachment(take);
      data += take;
      n -= take;
      if (attachment_left_ == 0) {
        Status status = finishAttachment(sink, &keep_going);
        if (!status.ok()) return status;
      }
      continue;
    }
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
      if (length > max_frame_bytes_) {
        error_ = {ErrorCode::kBadFrame,
                  fmt::format("frame length {} bytes exceeds the maximum of {} bytes{}{}", length,
                              max_frame_bytes_, limit_note_,
                              notChorusNote(prefix_, {data, std::min<size_t>(n, 40)}))};
        return error_;
      }
      // Allocated only now that the length is known to be within the limit and the budget. A
      // sealed Envelope is followed by its tag, read into the same buffer.
      body_sealed_ = opener_ != nullptr;
      const size_t bytes = size_t{length} + (body_sealed_ ? kSealTagBytes : 0);
      if (!reserve(kFramePrefixBytes + bytes, "a frame", &body_reservation_)) return error_;
      body_ = std::make_unique_for_overwrite<uint8_t[]>(kFramePrefixBytes + bytes);
      std::memcpy(body_.get(), prefix_, kFramePrefixBytes);
      body_size_ = bytes;
      body_filled_ = 0;
      prefix_filled_ = 0;
    }
    const size_t take = std::min(n, body_size_ - body_filled_);
    std::memcpy(body_.get() + kFramePrefixBytes + body_filled_, data, take);
    body_filled_ += take;
    data += take;
    n -= take;
    if (body_filled_ == body_size_) {
      Status status = completeEnvelope(sink, &keep_going);
      if (!status.ok()) return status;
    }
  }
  return {};
}

Status FrameDecoder::completeEnvelope(const FrameSink& sink, bool* keep_going) {
  const size_t envelope_size = body_size_ - (body_sealed_ ? kSealTagBytes : 0);
  if (body_sealed_) {
    uint8_t* envelope = body_.get() + kFramePrefixBytes;
    Status opened =
        opener_->openEnvelope({body_.get(), kFramePrefixBytes}, {envelope, envelope_size},
                              {envelope + envelope_size, kSealTagBytes});
    if (!opened.ok()) {
      error_ = std::move(opened);
      return error_;
    }
  }
  Status status = verifyFrame(body_.get(), kFramePrefixBytes + envelope_size, limits_);
  if (!status.ok()) {
    error_ = status;
    return error_;
  }
  const bool sealed = body_sealed_;
  auto frame = std::make_unique<InboundFrame>(std::move(body_), envelope_size);
  frame->reservation_ = std::move(body_reservation_);
  const ServiceId service = frame->service();
  if (service != kRuntimeService && services_) {
    if (const ServiceSpec* spec = services_(service)) {
      status = verifyMessage(*spec, frame->message(), limits_);
      if (!status.ok()) {
        error_ = status;
        return error_;
      }
      frame->verified_service_ = spec;
    }
  }
  body_ = nullptr;
  body_size_ = 0;
  body_filled_ = 0;
  const uint32_t bytes = frame->envelope().header()->attachment();
  if (bytes == 0) {
    *keep_going = sink(std::move(*frame));
    return {};
  }
  if (bytes > max_frame_bytes_ - envelope_size) {
    error_ = {ErrorCode::kBadFrame,
              fmt::format("attachment of {} bytes after an Envelope of {} bytes exceeds the "
                          "maximum frame of {} bytes{}",
                          bytes, envelope_size, max_frame_bytes_, limit_note_)};
    return error_;
  }
  std::unique_ptr<AttachmentLanding> landing = placer_ ? placer_(*frame, bytes) : nullptr;
  // A landing of the wrong size is the receiver's mistake: read into a buffer instead (the
  // landing is destroyed without arriving, so its memory is released at once).
  if (landing != nullptr && landing->size() != bytes) landing.reset();
  if (landing != nullptr) {
    pieces_ = landing->pieces();
    frame->landing_ = std::move(landing);
  } else {
    if (!reserve(bytes, "an attachment", &frame->attachment_reservation_)) return error_;
    frame->attachment_ = std::make_unique_for_overwrite<uint8_t[]>(bytes);
    pieces_ = {std::span<uint8_t>(frame->attachment_.get(), bytes)};
  }
  frame->attachment_size_ = bytes;
  piece_ = 0;
  piece_filled_ = 0;
  attachment_left_ = bytes;
  if (sealed) {
    opener_->beginAttachment();
    attachment_sealed_ = true;
    pieces_.push_back({attachment_tag_, kSealTagBytes});
    attachment_left_ += kSealTagBytes;
  }
  frame_ = std::move(frame);
  return {};
}

Status FrameDecoder::finish() const {
  if (!error_.ok()) return error_;
  if (frame_ != nullptr) {
    const size_t expected = frame_->attachment_size_ + (attachment_sealed_ ? kSealTagBytes : 0);
    return {ErrorCode::kBadFrame,
            fmt::format("truncated frame: stream ended after {} of {} attachment bytes",
                        expected - attachment_left_, expected)};
  }
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
