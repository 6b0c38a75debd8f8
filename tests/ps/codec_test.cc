// The PS codec without a network: each message is encoded as a frame, passes the frame
// verifier, and decodes to what was encoded; malformed bodies are named.
#include "ps/codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ps/key_runs.h"

namespace chorus::ps {
namespace {

// One encoded message as the receiver sees it: the verified Envelope and the attachment.
struct Received {
  node::SharedFrame frame;
  std::vector<float> attachment;  // float storage: aligned as the receiver's buffer is

  // The PS message, verified by roundTrip().
  const wire::Message& message() const {
    const auto* bytes = node::envelopeOf(frame->data()).message();
    return *flatbuffers::GetRoot<wire::Message>(bytes->data());
  }
  std::span<const uint8_t> attached() const {
    return {reinterpret_cast<const uint8_t*>(attachment.data()), frame->attachmentSize()};
  }
};

Received roundTrip(PsMessage message) {
  Received r;
  r.frame = encodeFrame(node::EnvelopeHeader{.sender = 3, .cluster = "codec"}, std::move(message));
  node::Status verified = node::verifyFrame(r.frame->data(), r.frame->envelopeSize(), {});
  EXPECT_TRUE(verified.ok()) << verified.message();
  // What the node does before any handler runs: the PS service verifies its message.
  const auto* bytes = node::envelopeOf(r.frame->data()).message();
  EXPECT_EQ(node::envelopeOf(r.frame->data()).service(), kPsServiceId);
  verified = node::verifyMessage(kPsService, {bytes->data(), bytes->size()}, {});
  EXPECT_TRUE(verified.ok()) << verified.message();
  r.attachment.resize((r.frame->attachmentSize() + sizeof(float) - 1) / sizeof(float));
  auto* out = reinterpret_cast<uint8_t*>(r.attachment.data());
  const auto pieces = r.frame->pieces();
  for (size_t i = 1; i < pieces.size(); ++i) {
    std::memcpy(out, pieces[i].data(), pieces[i].size());
    out += pieces[i].size();
  }
  return r;
}

// A pull as older builds wrote it: the keys as a plain [ulong].
PsMessage protocol3Pull(uint64_t request, std::vector<Key> keys) {
  return {wire::Body::PsPull,
          [=](flatbuffers::FlatBufferBuilder& b) {
            auto key_vector = b.CreateVector(keys.data(), keys.size());
            return wire::CreatePsPull(b, request, 5, 3, key_vector).Union();
          },
          0,
          {}};
}

constexpr size_t kAnyKeys = 1000;

TEST(Codec, APullRequestCarriesItsClocksAndKeys) {
  const std::vector<Key> keys{2, 9, 1u << 30};
  const Received r = roundTrip(pullRequest(17, 5, 3, keys));
  ASSERT_EQ(r.message().body_type(), wire::Body::PsPull);
  EXPECT_EQ(r.message().body_as_PsPull()->keys(), nullptr);  // runs only
  PullRequest pull;
  std::vector<Key> buffer;
  ASSERT_EQ(decodePull(*r.message().body_as_PsPull(), kAnyKeys, buffer, pull), std::nullopt);
  EXPECT_EQ(pull.request, 17u);
  EXPECT_EQ(pull.clock, 5);
  EXPECT_EQ(pull.min_clock, 3);
  EXPECT_EQ(std::vector<Key>(pull.keys.begin(), pull.keys.end()), keys);
}

// Issue 25, rows named by slot: a pull asking for the slots, the reply handing them out, pulls
// and pushes naming rows by slot (no keys), and the stale refusal.
TEST(Codec, RequestsBySlotCarryTheirRunsAndLayout) {
  std::vector<uint8_t> slots;
  encodeSlotRuns(std::vector<SlotRun>{{.table = 0, .slot = 3, .rows = 40}}, slots);
  PullRequest pull;
  std::vector<Key> buffer;
  const std::vector<Key> keys{4, 5};
  Received r = roundTrip(pullRequest(1, 0, 0, keys, true));
  ASSERT_EQ(decodePull(*r.message().body_as_PsPull(), kAnyKeys, buffer, pull), std::nullopt);
  EXPECT_TRUE(pull.want_slots);
  EXPECT_FALSE(pull.by_slots);
  r = roundTrip(pullBySlots(2, 4, 3, slots, 77));
  ASSERT_EQ(decodePull(*r.message().body_as_PsPull(), kAnyKeys, buffer, pull), std::nullopt);
  EXPECT_TRUE(pull.by_slots);
  EXPECT_TRUE(pull.keys.empty());
  EXPECT_EQ(std::vector<uint8_t>(pull.slot_runs.begin(), pull.slot_runs.end()), slots);
  EXPECT_EQ(pull.layout, 77u);
  const std::vector<float> grads(40, 1.0f);
  const std::vector<std::span<const float>> pieces{grads};
  r = roundTrip(pushBySlots(3, 4, slots, 78, pieces));
  PushRequest push;
  ASSERT_EQ(decodePush(*r.message().body_as_PsPush(), r.attached(), kAnyKeys, buffer, push),
            std::nullopt);
  EXPECT_TRUE(push.by_slots);
  EXPECT_EQ(push.layout, 78u);
  EXPECT_EQ(push.grads.size(), 40u);
  r = roundTrip(pullReply(5, 2, pieces, 40, slots, 79));
  ReplyView reply = decodeReply(*r.message().body_as_PsReply());
  EXPECT_EQ(std::vector<uint8_t>(reply.slot_runs.begin(), reply.slot_runs.end()), slots);
  EXPECT_EQ(reply.layout, 79u);
  EXPECT_FALSE(reply.stale);
  r = roundTrip(staleReply(6, wire::PsOp::Push, "moved"));
  reply = decodeReply(*r.message().body_as_PsReply());
  EXPECT_TRUE(reply.stale);
  EXPECT_EQ(reply.error, "moved");
}

// Issue 25: the keys cost bytes by their runs, not 8 bytes each.
TEST(Codec, KeysOnTheWireCostTheirRunsNotEightBytesEach) {
  std::vector<Key> range(10000);
  for (size_t i = 0; i < range.size(); ++i)
    range[i] = 500 + i;
  const Received r = roundTrip(pullRequest(1, 0, 0, range));
  EXPECT_LT(r.message().body_as_PsPull()->key_runs()->size(), 8u);
  EXPECT_LT(r.frame->envelopeSize(), 200u);
  std::vector<Key> every_other(10000);
  for (size_t i = 0; i < every_other.size(); ++i)
    every_other[i] = 2 * i;
  const Received spread = roundTrip(pullRequest(1, 0, 0, every_other));
  EXPECT_EQ(spread.message().body_as_PsPull()->key_runs()->size(), 2 * every_other.size());
  PullRequest pull;
  std::vector<Key> buffer;
  ASSERT_EQ(decodePull(*spread.message().body_as_PsPull(), every_other.size(), buffer, pull),
            std::nullopt);
  EXPECT_EQ(std::vector<Key>(pull.keys.begin(), pull.keys.end()), every_other);
  // One key fewer allowed than the runs hold: refused, naming the limit.
  const auto error =
      decodePull(*spread.message().body_as_PsPull(), every_other.size() - 1, buffer, pull);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("more than the 9999 keys"), std::string::npos) << *error;
}

TEST(Codec, AProtocol3PullWithPlainKeysIsStillRead) {
  const Received r = roundTrip(protocol3Pull(17, {2, 9}));
  PullRequest pull;
  std::vector<Key> buffer;
  ASSERT_EQ(decodePull(*r.message().body_as_PsPull(), kAnyKeys, buffer, pull), std::nullopt);
  EXPECT_EQ(std::vector<Key>(pull.keys.begin(), pull.keys.end()), (std::vector<Key>{2, 9}));
}

// The Verifier checks a vector's length prefix for 4-byte alignment only: a message whose keys
// sit at an address that is 4 but not 8 aligned passes it, and the PS service's own check
// refuses it (fuzz_frame found one: tests/fuzz/regressions/fuzz_frame/).
TEST(Codec, KeysNotAlignedTo8BytesAreRefused) {
  const Received r = roundTrip(protocol3Pull(17, {2, 9}));
  const auto* bytes = node::envelopeOf(r.frame->data()).message();
  EXPECT_TRUE(psVectorsAligned(bytes->data()));
  // The same message 4 bytes further on: every offset inside still verifies, the keys do not
  // sit on 8 bytes any more.
  std::vector<uint64_t> storage(bytes->size() / 8 + 2);
  auto* shifted = reinterpret_cast<uint8_t*>(storage.data()) + 4;
  std::memcpy(shifted, bytes->data(), bytes->size());
  flatbuffers::Verifier verifier(shifted, bytes->size());
  EXPECT_TRUE(wire::VerifyMessageBuffer(verifier));
  EXPECT_FALSE(psVectorsAligned(shifted));
}

TEST(Codec, APushTravelsInTheBodyOrAsTheAttachment) {
  const std::vector<Key> keys{1, 4};
  const std::vector<float> a{1, 2, 3}, b{4, 5};
  const std::vector<std::span<const float>> rows{a, b};
  for (bool attach : {false, true}) {
    const Received r = roundTrip(pushRequest(8, 2, keys, rows, 5, attach));
    EXPECT_EQ(r.frame->attachmentSize(), attach ? 5 * sizeof(float) : 0u);
    PushRequest push;
    std::vector<Key> buffer;
    ASSERT_EQ(decodePush(*r.message().body_as_PsPush(), r.attached(), kAnyKeys, buffer, push),
              std::nullopt);
    EXPECT_EQ(push.request, 8u);
    EXPECT_EQ(push.clock, 2);
    EXPECT_EQ(std::vector<Key>(push.keys.begin(), push.keys.end()), keys);
    EXPECT_EQ(std::vector<float>(push.grads.begin(), push.grads.end()),
              (std::vector<float>{1, 2, 3, 4, 5}));
  }
}

TEST(Codec, RepliesCarryValuesAcksAndErrors) {
  const std::vector<float> row{0.5f, -1};
  const std::vector<std::span<const float>> rows{row};
  Received r = roundTrip(pullReply(4, 11, rows, row.size()));
  ReplyView reply = decodeReply(*r.message().body_as_PsReply());
  EXPECT_EQ(reply.request, 4u);
  EXPECT_EQ(reply.op, wire::PsOp::Pull);
  EXPECT_EQ(reply.error, "");
  EXPECT_EQ(reply.min_clock, 11);
  EXPECT_TRUE(reply.keys.empty());  // the request id names them
  // Small rows travel in the body (one contiguous frame)...
  EXPECT_EQ(r.frame->attachmentSize(), 0u);
  const auto values = valuesOf(r.message().body_as_PsReply()->values(), r.attached());
  ASSERT_TRUE(values);
  EXPECT_EQ(std::vector<float>(values->begin(), values->end()), row);
  // ... large ones as the attachment, straight from the rows.
  const std::vector<float> big(2 * kSmallRowFloats, 2.0f);
  const std::vector<std::span<const float>> big_rows{big, row};
  r = roundTrip(pullReply(4, 11, big_rows, big.size() + row.size()));
  EXPECT_EQ(r.frame->attachmentSize(), (big.size() + row.size()) * sizeof(float));
  EXPECT_EQ(r.message().body_as_PsReply()->values(), nullptr);

  r = roundTrip(pushAck(5));
  reply = decodeReply(*r.message().body_as_PsReply());
  EXPECT_EQ(reply.request, 5u);
  EXPECT_EQ(reply.op, wire::PsOp::Push);
  EXPECT_EQ(reply.error, "");

  r = roundTrip(errorReply(0, wire::PsOp::Clock, "clock going backwards"));
  reply = decodeReply(*r.message().body_as_PsReply());
  EXPECT_EQ(reply.op, wire::PsOp::Clock);
  EXPECT_EQ(reply.error, "clock going backwards");

  r = roundTrip(clockAnnouncement(42));
  EXPECT_EQ(r.message().body_as_PsClock()->clock(), 42);
}

TEST(Codec, MalformedRequestsAreNamed) {
  PsMessage no_keys{
      .type = wire::Body::PsPull,
      .write =
          [](flatbuffers::FlatBufferBuilder& b) { return wire::CreatePsPull(b, 6, 0, 0).Union(); },
      .size_hint = 0,
      .attachment = {}};
  Received r = roundTrip(std::move(no_keys));
  PullRequest pull;
  std::vector<Key> buffer;
  EXPECT_EQ(decodePull(*r.message().body_as_PsPull(), kAnyKeys, buffer, pull), "pull without keys");
  EXPECT_EQ(pull.request, 6u);

  // Values in the body and an attachment as well.
  const std::vector<Key> keys{1};
  const std::vector<float> row{1, 2};
  const std::vector<std::span<const float>> rows{row};
  PsMessage both = pushRequest(9, 0, keys, rows, 2, false);
  both.attachment.push_back(node::bytesOf(std::span<const float>(row)));
  r = roundTrip(std::move(both));
  PushRequest push;
  const auto error =
      decodePush(*r.message().body_as_PsPush(), r.attached(), kAnyKeys, buffer, push);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("both the body and an attachment"), std::string::npos) << *error;
  EXPECT_EQ(push.request, 9u);

  // An attachment that is not whole floats.
  const uint8_t odd[3] = {1, 2, 3};
  EXPECT_FALSE(valuesOf(nullptr, std::span<const uint8_t>(odd, 3)));
}

}  // namespace
}  // namespace chorus::ps
