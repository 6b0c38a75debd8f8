// Pure framing: encode, verify and incremental decode, without sockets.
#include "node/frame.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "tests/node/test_util.h"

namespace chorus::node {
namespace {

using testing::makeFrame;
using testing::makePing;
using testing::pingServiceOnly;

std::vector<uint8_t> bytesOf(const SharedFrame& frame) {
  return testing::wireBytes(frame);
}

// Feeds `bytes` in chunks whose sizes come from a seeded generator; collects frames.
Status feedInChunks(FrameDecoder& decoder, const std::vector<uint8_t>& bytes, uint64_t seed,
                    std::vector<InboundFrame>* out) {
  std::mt19937_64 rng(seed);
  size_t offset = 0;
  while (offset < bytes.size()) {
    const size_t chunk = std::min<size_t>(bytes.size() - offset, 1 + rng() % 97);
    Status status = decoder.consume(bytes.data() + offset, chunk, [&](InboundFrame&& f) {
      out->push_back(std::move(f));
      return true;
    });
    if (!status.ok()) return status;
    offset += chunk;
  }
  return {};
}

TEST(Frame, RoundTripAcrossArbitraryReadBoundaries) {
  std::vector<uint8_t> stream;
  for (uint64_t nonce = 1; nonce <= 20; ++nonce) {
    auto frame = makePing(3, "alpha", nonce, nonce * 13);
    auto bytes = bytesOf(frame);
    stream.insert(stream.end(), bytes.begin(), bytes.end());
  }
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    FrameDecoder decoder(FrameLimits{});
    decoder.setServices(pingServiceOnly);
    std::vector<InboundFrame> frames;
    ASSERT_TRUE(feedInChunks(decoder, stream, seed, &frames).ok());
    ASSERT_EQ(frames.size(), 20u);
    for (uint64_t i = 0; i < frames.size(); ++i) {
      const auto& envelope = frames[i].envelope();
      EXPECT_EQ(envelope.header()->sender(), 3u);
      EXPECT_EQ(envelope.header()->cluster()->str(), "alpha");
      ASSERT_EQ(envelope.service(), ping::kPingServiceId);
      ASSERT_EQ(frames[i].verifiedService(), &ping::kPingService);
      // The message is a FlatBuffer of its own, aligned for its 64-bit fields.
      EXPECT_EQ(reinterpret_cast<uintptr_t>(frames[i].message().data()) % kMessageAlignment, 0u);
      const auto& message = ping::messageOf(frames[i]);
      ASSERT_EQ(message.body_type(), ping::wire::Body::Ping);
      EXPECT_EQ(message.body_as_Ping()->nonce(), i + 1);
      EXPECT_EQ(message.body_as_Ping()->payload()->size(), (i + 1) * 13);
    }
    EXPECT_FALSE(decoder.midFrame());
    EXPECT_TRUE(decoder.finish().ok());
  }
}

TEST(Frame, LargeTensorIsReadInPlaceThroughReadBuffer) {
  std::vector<float> values(1 << 18);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(i) * 0.5f;
  auto frame =
      makeFrame(1, "alpha", ping::wire::Body::Tensor, [&](flatbuffers::FlatBufferBuilder& b) {
        return ping::wire::CreateTensorDirect(b, 42, &values).Union();
      });
  const auto bytes = bytesOf(frame);
  FrameDecoder decoder(FrameLimits{});
  decoder.setServices(pingServiceOnly);
  size_t offset = 0;
  int frames = 0;
  size_t direct_reads = 0;
  while (offset < bytes.size()) {
    std::span<uint8_t> target = decoder.readBuffer();
    if (target.size() > 70 * 1024) ++direct_reads;  // larger than the scratch buffer
    const size_t n = std::min<size_t>({target.size(), bytes.size() - offset, 100'000});
    std::memcpy(target.data(), bytes.data() + offset, n);
    offset += n;
    Status status = decoder.commitRead(n, [&](InboundFrame&& f) {
      const auto* tensor = ping::messageOf(f).body_as_Tensor();
      EXPECT_EQ(tensor->tag(), 42u);
      EXPECT_EQ(tensor->values()->size(), values.size());
      EXPECT_EQ(tensor->values()->Get(1000), 500.0f);
      ++frames;
      return true;
    });
    ASSERT_TRUE(status.ok()) << status.toString();
  }
  EXPECT_EQ(frames, 1);
  EXPECT_GT(direct_reads, 0u);
}

TEST(Frame, EncodeUsesOneSequenceAndTheGivenHeader) {
  auto frame = makeFrame(
      9, "beta", wire::Body::Heartbeat,
      [](flatbuffers::FlatBufferBuilder& b) { return wire::CreateHeartbeat(b, 77).Union(); }, 1234);
  EXPECT_EQ(frame->sequence(), 1234u);
  EXPECT_EQ(frame->kind(), static_cast<uint32_t>(wire::Body::Heartbeat));
  EXPECT_EQ(loadLittleEndian32(frame->data()), frame->size() - kFramePrefixBytes);
  ASSERT_TRUE(verifyFrame(frame->data(), frame->size(), FrameLimits{}).ok());
  const auto* envelope = &envelopeOf(frame->data());
  EXPECT_EQ(envelope->header()->sequence(), 1234u);
  EXPECT_EQ(envelope->body_as_Heartbeat()->echo_time_ns(), 77);
}

Status decodeAll(const std::vector<uint8_t>& bytes, FrameLimits limits = {}) {
  FrameDecoder decoder(limits);
  Status status = decoder.consume(bytes.data(), bytes.size(), [](InboundFrame&&) { return true; });
  if (!status.ok()) return status;
  return decoder.finish();
}

TEST(Frame, ZeroLengthIsRejected) {
  const Status status = decodeAll({0, 0, 0, 0});
  EXPECT_EQ(status.code(), ErrorCode::kBadFrame);
  EXPECT_NE(status.message().find("zero-length"), std::string::npos);
}

TEST(Frame, LengthOverMaximumIsRejectedBeforeAllocation) {
  // 0xfffffff0 bytes would be a 4 GiB allocation if the check came after it.
  const Status status = decodeAll({0xf0, 0xff, 0xff, 0xff});
  EXPECT_EQ(status.code(), ErrorCode::kBadFrame);
  EXPECT_NE(status.message().find("exceeds the maximum"), std::string::npos);
  FrameLimits small;
  small.max_frame_bytes = 64;
  auto frame = makePing(1, "alpha", 1, 200);
  EXPECT_NE(decodeAll(bytesOf(frame), small).message().find("exceeds the maximum of 64"),
            std::string::npos);
}

// Another program on the port answers with text: the error says so and shows what it sent.
TEST(Frame, TextInsteadOfAFrameIsNamedAsAnotherProtocol) {
  const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  const Status status = decodeAll(std::vector<uint8_t>(http.begin(), http.end()));
  EXPECT_EQ(status.code(), ErrorCode::kBadFrame);
  EXPECT_NE(status.message().find("the peer does not speak chorus: it sent \"GET / "
                                  "HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n\"..."),
            std::string::npos)
      << status.message();
  // A binary length that is merely too large is not called another protocol.
  EXPECT_EQ(decodeAll({0xf0, 0xff, 0xff, 0xff}).message().find("does not speak chorus"),
            std::string::npos);
}

TEST(Frame, TruncatedFrameIsReportedAtEndOfStream) {
  auto bytes = bytesOf(makePing(1, "alpha", 1, 100));
  bytes.resize(bytes.size() / 2);
  const Status status = decodeAll(bytes);
  EXPECT_EQ(status.code(), ErrorCode::kBadFrame);
  EXPECT_NE(status.message().find("truncated frame"), std::string::npos);
  EXPECT_NE(decodeAll({5, 0}).message().find("length-prefix"), std::string::npos);
}

TEST(Frame, BytesFailingTheVerifierAreRejected) {
  auto bytes = bytesOf(makePing(1, "alpha", 1, 100));
  // Point the root offset far outside the buffer; the identifier stays intact.
  bytes[4] = 0xf0;
  bytes[5] = 0xff;
  const Status status = decodeAll(bytes);
  EXPECT_EQ(status.code(), ErrorCode::kBadFrame);
  EXPECT_NE(status.message().find("Verifier"), std::string::npos);
}

TEST(Frame, VerifierDepthLimitApplies) {
  auto bytes = bytesOf(makePing(1, "alpha", 1, 100));
  FrameLimits shallow;
  shallow.max_depth = 1;  // Envelope -> Header is already depth 2
  EXPECT_NE(decodeAll(bytes, shallow).message().find("Verifier"), std::string::npos);
}

TEST(Frame, WrongFileIdentifierIsRejected) {
  flatbuffers::FlatBufferBuilder b;
  auto header = wire::CreateHeaderDirect(b, 1, "alpha", 1, 0);
  auto body = wire::CreateHeartbeat(b, 1).Union();
  b.FinishSizePrefixed(wire::CreateEnvelope(b, header, wire::Body::Heartbeat, body), "NOPE");
  std::vector<uint8_t> bytes(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  const Status status = decodeAll(bytes);
  EXPECT_EQ(status.code(), ErrorCode::kBadFrame);
  EXPECT_NE(status.message().find("wrong file identifier \"NOPE\""), std::string::npos);
}

// An Envelope whose union type byte is `type` (possibly unknown to this build).
std::vector<uint8_t> envelopeWithBodyType(uint8_t type) {
  flatbuffers::FlatBufferBuilder b;
  auto header = wire::CreateHeaderDirect(b, 1, "alpha", 1, 0);
  auto body = wire::CreateHeartbeat(b, 1).Union();
  wire::EnvelopeBuilder eb(b);
  eb.add_header(header);
  eb.add_body(body);
  b.AddElement<uint8_t>(wire::Envelope::VT_BODY_TYPE, type, 0);
  b.FinishSizePrefixed(eb.Finish(), wire::EnvelopeIdentifier());
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

TEST(Frame, UnknownBodyTypeIsRejected) {
  const Status status = decodeAll(envelopeWithBodyType(200));
  EXPECT_EQ(status.code(), ErrorCode::kBadFrame);
  EXPECT_NE(status.message().find("unknown body type 200"), std::string::npos);
  EXPECT_TRUE(decodeAll(envelopeWithBodyType(static_cast<uint8_t>(wire::Body::Heartbeat))).ok());
}

TEST(Frame, AServiceFrameAndARuntimeFrameCarryOnlyTheirOwnPart) {
  // A service's frame with a runtime body as well.
  flatbuffers::FlatBufferBuilder b;
  const auto message = b.CreateVector(testing::pingMessageBytes(1));
  const auto body = wire::CreateHeartbeat(b, 1).Union();
  auto header = wire::CreateHeaderDirect(b, 1, "alpha", 1, 0);
  b.FinishSizePrefixed(
      wire::CreateEnvelope(b, header, wire::Body::Heartbeat, body, ping::kPingServiceId, message),
      wire::EnvelopeIdentifier());
  Status status = decodeAll({b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()});
  EXPECT_NE(status.message().find("Envelope of service 1 with a runtime body"), std::string::npos)
      << status.toString();
  // A runtime frame with a service's message.
  flatbuffers::FlatBufferBuilder r;
  const auto stray = r.CreateVector(testing::pingMessageBytes(1));
  const auto beat = wire::CreateHeartbeat(r, 1).Union();
  header = wire::CreateHeaderDirect(r, 1, "alpha", 1, 0);
  r.FinishSizePrefixed(
      wire::CreateEnvelope(r, header, wire::Body::Heartbeat, beat, kRuntimeService, stray),
      wire::EnvelopeIdentifier());
  status = decodeAll({r.GetBufferPointer(), r.GetBufferPointer() + r.GetSize()});
  EXPECT_NE(status.message().find("runtime Heartbeat with a service message"), std::string::npos)
      << status.toString();
  // A service's frame without its message.
  flatbuffers::FlatBufferBuilder e;
  header = wire::CreateHeaderDirect(e, 1, "alpha", 1, 0);
  e.FinishSizePrefixed(wire::CreateEnvelope(e, header, wire::Body::NONE, 0, 9),
                       wire::EnvelopeIdentifier());
  status = decodeAll({e.GetBufferPointer(), e.GetBufferPointer() + e.GetSize()});
  EXPECT_NE(status.message().find("Envelope of service 9 without a message"), std::string::npos)
      << status.toString();
}

TEST(Frame, AServiceMessageIsVerifiedBeforeThePlacerOrTheSinkSeesIt) {
  std::vector<uint8_t> message = testing::pingMessageBytes(1);
  message[0] = 0xf0;  // root offset outside the message
  const auto frame = testing::handMadeServiceFrame(1, "alpha", ping::kPingServiceId, message);
  FrameDecoder decoder(FrameLimits{});
  decoder.setServices(pingServiceOnly);
  bool delivered = false;
  const Status status = decoder.consume(frame.data(), frame.size(), [&](InboundFrame&&) {
    delivered = true;
    return true;
  });
  EXPECT_FALSE(delivered);
  EXPECT_EQ(status.code(), ErrorCode::kBadFrame);
  EXPECT_NE(status.message().find("bytes failed the FlatBuffers Verifier"), std::string::npos)
      << status.toString();
  // A service the receiver does not know is not read: its frame is handed on unverified.
  FrameDecoder other(FrameLimits{});
  other.setServices([](ServiceId) -> const ServiceSpec* { return nullptr; });
  const InboundFrame* seen = nullptr;
  std::vector<InboundFrame> kept;
  ASSERT_TRUE(other
                  .consume(frame.data(), frame.size(),
                           [&](InboundFrame&& f) {
                             kept.push_back(std::move(f));
                             return true;
                           })
                  .ok());
  ASSERT_EQ(kept.size(), 1u);
  seen = &kept.front();
  EXPECT_EQ(seen->verifiedService(), nullptr);
  EXPECT_EQ(seen->service(), ping::kPingServiceId);
}

TEST(Frame, EnvelopeWithoutHeaderIsRejected) {
  flatbuffers::FlatBufferBuilder b;
  auto body = wire::CreateHeartbeat(b, 1).Union();
  b.FinishSizePrefixed(wire::CreateEnvelope(b, 0, wire::Body::Heartbeat, body),
                       wire::EnvelopeIdentifier());
  std::vector<uint8_t> bytes(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  EXPECT_NE(decodeAll(bytes).message().find("without a header"), std::string::npos);
}

TEST(Frame, ErrorsAreSticky) {
  FrameDecoder decoder(FrameLimits{});
  const uint8_t zero[4] = {0, 0, 0, 0};
  auto sink = [](InboundFrame&&) { return true; };
  EXPECT_FALSE(decoder.consume(zero, 4, sink).ok());
  auto good = bytesOf(makePing(1, "alpha", 1));
  const Status again = decoder.consume(good.data(), good.size(), sink);
  EXPECT_NE(again.message().find("zero-length"), std::string::npos);
}

// A Heartbeat frame carrying `attachment` (in pieces of the given sizes, cut from it).
SharedFrame frameWithAttachment(const std::vector<uint8_t>& attachment,
                                const std::vector<size_t>& piece_sizes, uint64_t sequence = 1) {
  Attachment pieces;
  size_t at = 0;
  for (size_t size : piece_sizes) {
    pieces.emplace_back(attachment.data() + at, size);
    at += size;
  }
  EXPECT_EQ(at, attachment.size());
  return encodeFrame(
      EnvelopeHeader{3, "alpha", sequence, 0}, wire::Body::Heartbeat,
      [](flatbuffers::FlatBufferBuilder& b) { return wire::CreateHeartbeat(b, 77).Union(); }, 0,
      std::move(pieces));
}

std::vector<uint8_t> patternOf(size_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i)
    bytes[i] = static_cast<uint8_t>(i * 31 + seed);
  return bytes;
}

TEST(Frame, AttachmentsRoundTripAcrossArbitraryReadBoundaries) {
  const auto big = patternOf(10'000, 1);
  const auto small = patternOf(100, 2);
  std::vector<SharedFrame> frames{makePing(3, "alpha", 1),
                                  frameWithAttachment(big, {1, 9'000, 999}),
                                  makePing(3, "alpha", 2), frameWithAttachment(small, {100})};
  EXPECT_EQ(frames[1]->size(), frames[1]->envelopeSize() + big.size());
  EXPECT_EQ(frames[1]->attachmentSize(), big.size());
  std::vector<uint8_t> stream;
  for (const auto& frame : frames) {
    const auto bytes = bytesOf(frame);
    stream.insert(stream.end(), bytes.begin(), bytes.end());
  }
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    FrameDecoder decoder(FrameLimits{});
    decoder.setServices(pingServiceOnly);
    std::vector<InboundFrame> out;
    ASSERT_TRUE(feedInChunks(decoder, stream, seed, &out).ok());
    ASSERT_TRUE(decoder.finish().ok());
    ASSERT_EQ(out.size(), 4u);
    EXPECT_TRUE(out[0].attachment().empty());
    EXPECT_EQ(ping::messageOf(out[0]).body_as_Ping()->nonce(), 1u);
    const auto got = out[1].attachment();
    EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.end()), big);
    EXPECT_EQ(out[1].wireSize(), frames[1]->size());
    EXPECT_EQ(out[1].envelope().body_as_Heartbeat()->echo_time_ns(), 77);
    EXPECT_EQ(ping::messageOf(out[2]).body_as_Ping()->nonce(), 2u);
    const auto got_small = out[3].attachment();
    EXPECT_EQ(std::vector<uint8_t>(got_small.begin(), got_small.end()), small);
    EXPECT_EQ(out[3].landing(), nullptr);
  }
}

// Records how its landing ended.
class RecordingLanding : public AttachmentLanding {
 public:
  RecordingLanding(std::vector<std::span<uint8_t>> pieces, std::vector<int>* endings)
      : AttachmentLanding(std::move(pieces)), endings_(endings) {}
  RecordingLanding(const RecordingLanding&) = delete;
  RecordingLanding& operator=(const RecordingLanding&) = delete;
  ~RecordingLanding() override { endings_->push_back(arrived() ? 1 : 0); }

 private:
  std::vector<int>* endings_;
};

// A placer that reads every attachment into `target`, recording into `endings`.
FrameDecoder::Placer landIn(std::span<uint8_t> target, std::vector<int>* endings) {
  return [target, endings](const InboundFrame&, size_t) {
    return std::make_unique<RecordingLanding>(std::vector<std::span<uint8_t>>{target}, endings);
  };
}

TEST(Frame, AttachmentLandsWhereThePlacerSaysThroughReadBuffer) {
  const auto attachment = patternOf(300'000, 5);
  const auto bytes = bytesOf(frameWithAttachment(attachment, {300'000}));
  // Three pieces, apart from each other, in a buffer of the receiver's.
  std::vector<uint8_t> target(400'000, 0);
  std::vector<int> endings;
  FrameDecoder decoder(FrameLimits{});
  decoder.setPlacer([&](const InboundFrame& frame, size_t size) {
    EXPECT_EQ(frame.envelope().body_type(), wire::Body::Heartbeat);
    EXPECT_EQ(size, attachment.size());
    return std::make_unique<RecordingLanding>(
        std::vector<std::span<uint8_t>>{{target.data(), 100'000},
                                        {target.data() + 150'000, 3},
                                        {target.data() + 200'000, 199'997}},
        &endings);
  });
  size_t offset = 0;
  int frames = 0;
  size_t reads_into_target = 0;
  while (offset < bytes.size()) {
    std::span<uint8_t> into = decoder.readBuffer();
    if (into.data() >= target.data() && into.data() < target.data() + target.size())
      ++reads_into_target;
    const size_t n = std::min<size_t>({into.size(), bytes.size() - offset, 70'000});
    std::memcpy(into.data(), bytes.data() + offset, n);
    offset += n;
    ASSERT_TRUE(decoder
                    .commitRead(n,
                                [&](InboundFrame&& f) {
                                  EXPECT_TRUE(f.attachment().empty());
                                  EXPECT_NE(f.landing(), nullptr);
                                  EXPECT_TRUE(f.landing()->arrived());
                                  ++frames;
                                  return true;
                                })
                    .ok());
  }
  EXPECT_EQ(frames, 1);
  EXPECT_GE(reads_into_target, 2u);         // only what came with the Envelope, or after the 3-byte
                                            // piece, went through the scratch buffer
  EXPECT_EQ(endings, std::vector<int>{1});  // released once the frame was handled
  std::vector<uint8_t> landed(target.begin(), target.begin() + 100'000);
  landed.insert(landed.end(), target.begin() + 150'000, target.begin() + 150'003);
  landed.insert(landed.end(), target.begin() + 200'000, target.begin() + 399'997);
  EXPECT_EQ(landed, attachment);
  EXPECT_EQ(target[100'000], 0);  // nothing between the pieces was touched
  EXPECT_EQ(target[399'997], 0);
}

TEST(Frame, ALandingCutOffByTheEndOfTheStreamIsReleasedUnarrived) {
  const auto attachment = patternOf(50'000, 9);
  const auto bytes = bytesOf(frameWithAttachment(attachment, {50'000}));
  std::vector<uint8_t> target(50'000);
  std::vector<int> endings;
  {
    FrameDecoder decoder(FrameLimits{});
    decoder.setPlacer(landIn(target, &endings));
    int frames = 0;
    ASSERT_TRUE(decoder
                    .consume(bytes.data(), bytes.size() - 10,
                             [&](InboundFrame&&) {
                               ++frames;
                               return true;
                             })
                    .ok());
    EXPECT_EQ(frames, 0);
    EXPECT_TRUE(decoder.midFrame());
    const Status end = decoder.finish();
    EXPECT_NE(end.message().find("ended after 49990 of 50000 attachment bytes"), std::string::npos)
        << end.toString();
    EXPECT_TRUE(endings.empty());
  }
  EXPECT_EQ(endings, std::vector<int>{0});
}

TEST(Frame, ALandingOfTheWrongSizeIsReleasedAndTheFrameKeepsItsOwnCopy) {
  const auto attachment = patternOf(5'000, 4);
  const auto bytes = bytesOf(frameWithAttachment(attachment, {2'000, 3'000}));
  std::vector<uint8_t> target(4'000);
  std::vector<int> endings;
  FrameDecoder decoder(FrameLimits{});
  decoder.setPlacer(landIn(target, &endings));
  std::vector<InboundFrame> out;
  ASSERT_TRUE(feedInChunks(decoder, bytes, 3, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].landing(), nullptr);
  const auto got = out[0].attachment();
  EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.end()), attachment);
  EXPECT_EQ(endings, std::vector<int>{0});
}

TEST(Frame, AnAttachmentBeyondTheFrameLimitIsRejected) {
  const auto bytes = bytesOf(frameWithAttachment(patternOf(8'192, 1), {8'192}));
  FrameLimits limits;
  limits.max_frame_bytes = 4'096;
  const Status status = decodeAll(bytes, limits);
  EXPECT_EQ(status.code(), ErrorCode::kBadFrame);
  EXPECT_NE(status.message().find("attachment of 8192 bytes"), std::string::npos)
      << status.toString();
}

TEST(Frame, TailCopyHoldsTheRestOfEveryPiece) {
  const auto attachment = patternOf(1'000, 8);
  const SharedFrame frame = frameWithAttachment(attachment, {10, 0, 990});
  const auto all = bytesOf(frame);
  for (size_t from : {size_t{0}, size_t{3}, frame->envelopeSize(), frame->envelopeSize() + 10,
                      frame->envelopeSize() + 500, all.size() - 1, all.size()}) {
    const SharedFrame tail = frame->tailCopy(from);
    EXPECT_EQ(tail->attachmentSize(), 0u);
    EXPECT_EQ(bytesOf(tail),
              std::vector<uint8_t>(all.begin() + static_cast<ptrdiff_t>(from), all.end()))
        << "from " << from;
  }
}

// Seeded mutation fuzzing: corrupted frames yield an error value or a verified frame, never a
// crash (run under the sanitizer build to catch out-of-bounds reads).
TEST(Frame, MutatedFramesNeverCrashTheDecoder) {
  const auto original = bytesOf(makePing(4, "alpha", 9, 64));
  std::mt19937_64 rng(20261121);
  int rejected = 0;
  for (int round = 0; round < 3000; ++round) {
    auto bytes = original;
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < flips; ++i) {
      // Keep the length prefix mostly intact so the Verifier, not the length check, is hit.
      const size_t at = 4 + rng() % (bytes.size() - 4);
      bytes[at] = static_cast<uint8_t>(rng());
    }
    FrameDecoder decoder(FrameLimits{});
    Status status = decoder.consume(bytes.data(), bytes.size(), [](InboundFrame&& f) {
      // Anything handed out must be safe to read.
      const auto& envelope = f.envelope();
      (void)envelope.header()->sender();
      return true;
    });
    if (!status.ok()) ++rejected;
  }
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace chorus::node
