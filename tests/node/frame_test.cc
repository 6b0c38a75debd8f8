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

std::vector<uint8_t> bytesOf(const SharedFrame& frame) {
  return {frame->data(), frame->data() + frame->size()};
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
    std::vector<InboundFrame> frames;
    ASSERT_TRUE(feedInChunks(decoder, stream, seed, &frames).ok());
    ASSERT_EQ(frames.size(), 20u);
    for (uint64_t i = 0; i < frames.size(); ++i) {
      const auto& envelope = frames[i].envelope();
      EXPECT_EQ(envelope.header()->sender(), 3u);
      EXPECT_EQ(envelope.header()->cluster()->str(), "alpha");
      ASSERT_EQ(envelope.body_type(), wire::Body::Ping);
      EXPECT_EQ(envelope.body_as_Ping()->nonce(), i + 1);
      EXPECT_EQ(envelope.body_as_Ping()->payload()->size(), (i + 1) * 13);
    }
    EXPECT_FALSE(decoder.midFrame());
    EXPECT_TRUE(decoder.finish().ok());
  }
}

TEST(Frame, LargeTensorIsReadInPlaceThroughReadBuffer) {
  std::vector<float> values(1 << 18);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(i) * 0.5f;
  auto frame = makeFrame(1, "alpha", wire::Body::Tensor, [&](flatbuffers::FlatBufferBuilder& b) {
    return wire::CreateTensorDirect(b, 42, &values).Union();
  });
  const auto bytes = bytesOf(frame);
  FrameDecoder decoder(FrameLimits{});
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
      const auto* tensor = f.envelope().body_as_Tensor();
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
  EXPECT_EQ(frame->bodyType(), wire::Body::Heartbeat);
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
