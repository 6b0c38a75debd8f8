// Sealed frames without sockets (node/frame_cipher.h): the streaming AEAD equals libsodium's
// one-shot ChaCha20-Poly1305, and a FrameDecoder with an opener takes sealed frames cut at any
// point, in place into a landing, and refuses an altered, replayed, reordered or dropped one.
#include "node/frame_cipher.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sodium.h>

#include <algorithm>
#include <random>

#include "node/secret.h"
#include "tests/node/test_util.h"

namespace chorus::node {
namespace {

using testing::makePing;
using testing::pingServiceOnly;

SessionKey keyOf(uint8_t seed) {
  SessionKey key{};
  for (size_t i = 0; i < key.size(); ++i)
    key[i] = static_cast<uint8_t>(seed * 31 + i);
  return key;
}

std::vector<uint8_t> randomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out)
    b = static_cast<uint8_t>(rng());
  return out;
}

// Cuts [0, n) at random points (some cuts inside a 64-byte block, some on it).
std::vector<size_t> cuts(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<size_t> out{0};
  while (out.back() < n)
    out.push_back(std::min(n, out.back() + 1 + rng() % (rng() % 2 ? 7 : 300)));
  return out;
}

// OpenSSL's streaming EVP against libsodium's one-shot call: the same ciphertext and tag, for
// any cutting, and record after record on one cipher (a FrameSealer's and FrameOpener's use).
TEST(AeadStream, EqualsLibsodiumsOneShotAeadForAnyChunking) {
  ASSERT_GE(sodium_init(), 0);
  const SessionKey key = keyOf(7);
  AeadCipher sealing(key, AeadCipher::Direction::kSeal);
  AeadCipher opening(key, AeadCipher::Direction::kOpen);
  for (const size_t n : {0, 1, 15, 16, 63, 64, 65, 1000, 4096, 70'001, 1'048'579}) {
    const std::vector<uint8_t> message = randomBytes(n, n + 1);
    const std::vector<uint8_t> associated = randomBytes(n % 21, n + 2);
    const uint64_t counter = 0x0102030405060708ULL + n;
    uint8_t nonce[12] = {};
    for (int i = 0; i < 8; ++i)
      nonce[4 + i] = static_cast<uint8_t>(counter >> (8 * i));
    std::vector<uint8_t> expected(n);
    SealTag expected_tag{};
    unsigned long long tag_bytes = 0;
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(
        expected.data(), expected_tag.data(), &tag_bytes, message.data(), n, associated.data(),
        associated.size(), nullptr, nonce, key.data());
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const std::vector<size_t> at = cuts(n, seed);
      std::vector<uint8_t> sealed(n);
      AeadStream sealer(sealing, counter, associated);
      for (size_t i = 0; i + 1 < at.size(); ++i) {
        sealer.seal({message.data() + at[i], at[i + 1] - at[i]}, sealed.data() + at[i]);
      }
      EXPECT_EQ(sealed, expected) << n << " bytes, cut by seed " << seed;
      EXPECT_EQ(sealer.tag(), expected_tag) << n << " bytes, cut by seed " << seed;
      // Opened in place, cut elsewhere.
      const std::vector<size_t> other = cuts(n, seed + 100);
      AeadStream opener(opening, counter, associated);
      for (size_t i = 0; i + 1 < other.size(); ++i)
        opener.open({sealed.data() + other[i], other[i + 1] - other[i]});
      EXPECT_TRUE(opener.matches(expected_tag));
      EXPECT_EQ(sealed, message);
    }
  }
}

TEST(AeadStream, ATagDoesNotMatchAnotherKeyNonceAssociatedDataOrCiphertext) {
  const std::vector<uint8_t> message = randomBytes(100, 3);
  const std::vector<uint8_t> associated = {1, 2, 3, 4};
  std::vector<uint8_t> sealed(message.size());
  AeadCipher sealing(keyOf(1), AeadCipher::Direction::kSeal);
  AeadStream sealer(sealing, 5, associated);
  sealer.seal(message, sealed.data());
  const SealTag tag = sealer.tag();
  const auto opens = [&](const SessionKey& key, uint64_t nonce, std::vector<uint8_t> ad,
                         std::vector<uint8_t> bytes) {
    AeadCipher opening(key, AeadCipher::Direction::kOpen);
    AeadStream opener(opening, nonce, ad);
    opener.open(bytes);
    return opener.matches(tag);
  };
  EXPECT_TRUE(opens(keyOf(1), 5, associated, sealed));
  EXPECT_FALSE(opens(keyOf(2), 5, associated, sealed));
  EXPECT_FALSE(opens(keyOf(1), 6, associated, sealed));
  EXPECT_FALSE(opens(keyOf(1), 5, {1, 2, 3, 5}, sealed));
  std::vector<uint8_t> flipped = sealed;
  flipped[57] ^= 0x10;
  EXPECT_FALSE(opens(keyOf(1), 5, associated, flipped));
  flipped = sealed;
  flipped.pop_back();
  EXPECT_FALSE(opens(keyOf(1), 5, associated, flipped));
}

// A ping frame with an attachment of `bytes` (pattern from `seed`), and its plain bytes.
SharedFrame pingWithAttachment(uint64_t nonce, const std::vector<uint8_t>& attachment) {
  return testing::makeFrame(
      3, "alpha", ping::wire::Body::Ping,
      [nonce](flatbuffers::FlatBufferBuilder& b) {
        return ping::wire::CreatePingDirect(b, nonce, nullptr).Union();
      },
      nonce, attachment.empty() ? Attachment{} : Attachment{std::span(attachment)});
}

// Feeds `bytes` to `decoder` in random chunks; collects the frames.
Status feed(FrameDecoder& decoder, const std::vector<uint8_t>& bytes, uint64_t seed,
            std::vector<InboundFrame>* out) {
  std::mt19937_64 rng(seed);
  size_t offset = 0;
  while (offset < bytes.size()) {
    const size_t chunk = std::min<size_t>(bytes.size() - offset, 1 + rng() % 5000);
    Status status = decoder.consume(bytes.data() + offset, chunk, [&](InboundFrame&& f) {
      out->push_back(std::move(f));
      return true;
    });
    if (!status.ok()) return status;
    offset += chunk;
  }
  return {};
}

struct SealedStream {
  std::vector<std::vector<uint8_t>> frames;  // each sealed frame's wire bytes
  std::vector<uint8_t> all() const {
    std::vector<uint8_t> out;
    for (const auto& f : frames)
      out.insert(out.end(), f.begin(), f.end());
    return out;
  }
};

SealedStream sealFrames(const SessionKey& key, const std::vector<SharedFrame>& frames) {
  FrameSealer sealer(key);
  SealedStream out;
  for (const auto& frame : frames)
    out.frames.push_back(testing::wireBytes(sealer.seal(*frame)));
  return out;
}

TEST(SealedFrames, RoundTripWithAttachmentsCutAnywhereAndHideThePlaintext) {
  std::vector<std::vector<uint8_t>> attachments;
  std::vector<SharedFrame> frames;
  for (uint64_t i = 0; i < 6; ++i) {
    attachments.push_back(randomBytes(i % 2 == 0 ? 0 : 1000 * i + 7, i));
    frames.push_back(pingWithAttachment(i + 1, attachments.back()));
  }
  const SealedStream sealed = sealFrames(keyOf(9), frames);
  for (size_t i = 0; i < frames.size(); ++i) {
    const size_t tags = attachments[i].empty() ? 1 : 2;
    EXPECT_EQ(sealed.frames[i].size(), frames[i]->size() + tags * kSealTagBytes);
  }
  // The cluster name travels in every header: sealed, it does not appear on the wire.
  const std::vector<uint8_t> wire = sealed.all();
  const std::string name = "alpha";
  EXPECT_EQ(std::search(wire.begin(), wire.end(), name.begin(), name.end()), wire.end());
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    FrameDecoder decoder(FrameLimits{});
    decoder.setServices(pingServiceOnly);
    decoder.setOpener(std::make_unique<FrameOpener>(keyOf(9)));
    std::vector<InboundFrame> got;
    const Status status = feed(decoder, wire, seed, &got);
    ASSERT_TRUE(status.ok()) << status.message();
    ASSERT_EQ(got.size(), frames.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].envelope().header()->cluster()->str(), "alpha");
      EXPECT_EQ(ping::messageOf(got[i]).body_as_Ping()->nonce(), i + 1);
      const auto attachment = got[i].attachment();
      EXPECT_EQ(std::vector<uint8_t>(attachment.begin(), attachment.end()), attachments[i]);
    }
    EXPECT_TRUE(decoder.finish().ok());
  }
}

// Sealing in pieces (what a connection does through its chunks) puts exactly the bytes of
// whole-frame sealing on the wire, for any room per call, frames with and without attachments,
// record after record on one sealer; a prefix or tag is never cut.
TEST(SealedFrames, SealingInPiecesOfAnySizeEqualsSealingWhole) {
  std::vector<std::vector<uint8_t>> attachments;
  std::vector<SharedFrame> frames;
  for (uint64_t i = 0; i < 8; ++i) {
    attachments.push_back(randomBytes(i % 3 == 0 ? 0 : 997 * i + 5, 40 + i));
    frames.push_back(pingWithAttachment(i + 1, attachments.back()));
  }
  const std::vector<uint8_t> whole = sealFrames(keyOf(4), frames).all();
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    FrameSealer sealer(keyOf(4));
    std::vector<uint8_t> wire;
    size_t expected_size = 0;
    for (const SharedFrame& frame : frames) {
      expected_size += FrameSealer::sealedSize(*frame);
      sealer.begin(frame);
      while (sealer.sealing()) {
        // Rooms from 0 (no progress) to a few KiB, some smaller than a prefix or a tag.
        const size_t room = rng() % 4 == 0 ? rng() % 20 : rng() % 4000;
        std::vector<uint8_t> piece(room);
        const size_t written = sealer.sealNext(piece.data(), room);
        ASSERT_LE(written, room);
        wire.insert(wire.end(), piece.begin(), piece.begin() + static_cast<ptrdiff_t>(written));
      }
    }
    EXPECT_EQ(wire.size(), expected_size);
    EXPECT_EQ(wire, whole) << "seed " << seed;
    EXPECT_EQ(sealer.records(), 8u + 5u);  // an Envelope per frame, an attachment for 5
  }
}

TEST(SealedFrames, AFrameIsBegunOnlyAfterTheLastOneEnded) {
  FrameSealer sealer(keyOf(2));
  const std::vector<uint8_t> attachment = randomBytes(100, 1);
  sealer.begin(pingWithAttachment(1, attachment));
  uint8_t few[10];
  EXPECT_EQ(sealer.sealNext(few, sizeof few), 10u);
  EXPECT_THROW(sealer.begin(pingWithAttachment(2, {})), std::logic_error);
  EXPECT_THROW(sealer.seal(*pingWithAttachment(2, {})), std::logic_error);
}

// A landing of several pieces is filled and opened in place, and it arrives only when the
// attachment's tag checked out; a tampered attachment ends the landing without arriving.
class PieceLanding : public AttachmentLanding {
 public:
  PieceLanding(std::vector<std::span<uint8_t>> pieces, int* arrived, int* ended)
      : AttachmentLanding(std::move(pieces)), arrived_(arrived), ended_(ended) {}
  ~PieceLanding() override { *(arrived() ? arrived_ : ended_) += 1; }

 private:
  int* arrived_;
  int* ended_;
};

TEST(SealedFrames, AttachmentsAreOpenedInPlaceInALandingOfSeveralPieces) {
  const std::vector<uint8_t> attachment = randomBytes(50'000, 11);
  const SealedStream sealed = sealFrames(keyOf(4), {pingWithAttachment(1, attachment)});
  for (const bool tamper : {false, true}) {
    std::vector<uint8_t> wire = sealed.all();
    if (tamper) wire[wire.size() - 20'000] ^= 1;
    std::vector<uint8_t> memory(attachment.size() + 64);
    int arrived = 0;
    int ended = 0;
    FrameDecoder decoder(FrameLimits{});
    decoder.setServices(pingServiceOnly);
    decoder.setOpener(std::make_unique<FrameOpener>(keyOf(4)));
    decoder.setPlacer([&](const InboundFrame&, size_t bytes) {
      EXPECT_EQ(bytes, attachment.size());
      // Three pieces with gaps between them, cut at odd places.
      std::vector<std::span<uint8_t>> pieces = {{memory.data(), 777},
                                                {memory.data() + 800, 30'001},
                                                {memory.data() + 30'832, bytes - 30'778}};
      return std::make_unique<PieceLanding>(std::move(pieces), &arrived, &ended);
    });
    std::vector<InboundFrame> got;
    const Status status = feed(decoder, wire, 5, &got);
    if (!tamper) {
      ASSERT_TRUE(status.ok()) << status.message();
      ASSERT_EQ(got.size(), 1u);
      got.clear();
      EXPECT_EQ(arrived, 1);
      std::vector<uint8_t> joined(memory.begin(), memory.begin() + 777);
      joined.insert(joined.end(), memory.begin() + 800, memory.begin() + 800 + 30'001);
      joined.insert(joined.end(), memory.begin() + 30'832,
                    memory.begin() + 30'832 + (attachment.size() - 30'778));
      EXPECT_EQ(joined, attachment);
    } else {
      EXPECT_EQ(status.code(), ErrorCode::kBadFrame);
      EXPECT_NE(status.message().find("the attachment of sealed frame 1 failed authentication"),
                std::string::npos)
          << status.message();
      EXPECT_TRUE(got.empty());
      EXPECT_EQ(ended, 1);
      EXPECT_EQ(arrived, 0);
    }
  }
}

// What an attacker on the path can do to sealed frames, each refused with the frame named.
TEST(SealedFrames, AlteredReplayedReorderedDroppedOrForgedFramesAreRefused) {
  std::vector<SharedFrame> frames;
  for (uint64_t i = 1; i <= 4; ++i)
    frames.push_back(makePing(3, "alpha", i, 40));
  const SealedStream sealed = sealFrames(keyOf(2), frames);
  const auto decode = [&](const std::vector<std::vector<uint8_t>>& order, size_t* delivered) {
    FrameDecoder decoder(FrameLimits{});
    decoder.setServices(pingServiceOnly);
    decoder.setOpener(std::make_unique<FrameOpener>(keyOf(2)));
    std::vector<uint8_t> wire;
    for (const auto& f : order)
      wire.insert(wire.end(), f.begin(), f.end());
    std::vector<InboundFrame> got;
    const Status status = feed(decoder, wire, 1, &got);
    *delivered = got.size();
    return status;
  };
  const auto& f = sealed.frames;
  size_t delivered = 0;
  ASSERT_TRUE(decode(f, &delivered).ok());
  EXPECT_EQ(delivered, 4u);

  std::vector<uint8_t> flipped = f[1];
  flipped[flipped.size() / 2] ^= 0x80;
  struct Case {
    const char* what;
    std::vector<std::vector<uint8_t>> order;
    size_t delivered;
  };
  std::vector<uint8_t> prefix_changed = f[0];
  prefix_changed.insert(prefix_changed.begin() + 4 + 8, 0);  // a longer Envelope...
  prefix_changed[0] += 1;                                    // ...that the prefix announces
  FrameSealer stranger(keyOf(3));
  const std::vector<uint8_t> forged = testing::wireBytes(stranger.seal(*frames[0]));
  const std::vector<Case> cases = {
      {"a flipped bit", {f[0], flipped, f[2]}, 1},
      {"a replay", {f[0], f[1], f[1]}, 2},
      {"a reorder", {f[0], f[2], f[1]}, 1},
      {"a drop", {f[0], f[2]}, 1},
      {"a frame sealed with another key", {forged}, 0},
      {"a changed length prefix", {prefix_changed}, 0},
      {"clear frames", {testing::wireBytes(frames[0]), testing::wireBytes(frames[1])}, 0},
  };
  for (const auto& c : cases) {
    const Status status = decode(c.order, &delivered);
    EXPECT_EQ(status.code(), ErrorCode::kBadFrame) << c.what;
    EXPECT_NE(status.message().find(fmt::format("sealed frame {} failed authentication: it was "
                                                "altered, forged, replayed or reordered",
                                                c.delivered + 1)),
              std::string::npos)
        << c.what << ": " << status.message();
    EXPECT_EQ(delivered, c.delivered) << c.what;
  }
}

TEST(SessionKeys, EachEndSendsWithWhatTheOtherReceivesWithAndEveryInputMatters) {
  const ClusterKey cluster = clusterKeyFromSecret(std::vector<uint8_t>{'s'});
  const std::vector<uint8_t> a(32, 1);
  const std::vector<uint8_t> b(32, 2);
  KeyAgreement agreed{};
  agreed.fill(9);
  const SessionKeys dialer = sessionKeys(cluster, HandshakeRole::kDialer, "c", 0, 1, a, b, agreed);
  const SessionKeys acceptor =
      sessionKeys(cluster, HandshakeRole::kAcceptor, "c", 0, 1, a, b, agreed);
  EXPECT_EQ(dialer.send, acceptor.receive);
  EXPECT_EQ(dialer.receive, acceptor.send);
  EXPECT_NE(dialer.send, dialer.receive);
  const ClusterKey other = clusterKeyFromSecret(std::vector<uint8_t>{'t'});
  KeyAgreement other_agreement = agreed;
  other_agreement[31] ^= 1;
  for (const SessionKeys& variant :
       {sessionKeys(other, HandshakeRole::kDialer, "c", 0, 1, a, b, agreed),
        sessionKeys(cluster, HandshakeRole::kDialer, "d", 0, 1, a, b, agreed),
        sessionKeys(cluster, HandshakeRole::kDialer, "c", 0, 2, a, b, agreed),
        sessionKeys(cluster, HandshakeRole::kDialer, "c", 0, 1, b, a, agreed),
        sessionKeys(cluster, HandshakeRole::kDialer, "c", 0, 1, a, a, agreed),
        sessionKeys(cluster, HandshakeRole::kDialer, "c", 0, 1, a, b, other_agreement)}) {
    EXPECT_NE(variant.send, dialer.send);
    EXPECT_NE(variant.receive, dialer.receive);
  }
}

// X25519 as the handshake uses it: both ends agree from their own secret half and the other's
// public half (the nonces on the wire); nobody else does, and points of small order are refused.
TEST(KeyAgreement, BothEndsAgreeAThirdPartyDoesNotAndSmallOrderPointsAreRefused) {
  const EphemeralKey dialer = newEphemeralKey();
  const EphemeralKey acceptor = newEphemeralKey();
  const EphemeralKey eavesdropper = newEphemeralKey();
  EXPECT_NE(dialer.public_key, acceptor.public_key);
  const auto at_dialer = agreeOnKey(dialer, acceptor.public_key);
  const auto at_acceptor = agreeOnKey(acceptor, dialer.public_key);
  ASSERT_TRUE(at_dialer && at_acceptor);
  EXPECT_EQ(*at_dialer, *at_acceptor);
  // Whoever recorded both public halves holds neither secret half: its own key pair against
  // either nonce gives something else.
  EXPECT_NE(*agreeOnKey(eavesdropper, dialer.public_key), *at_dialer);
  EXPECT_NE(*agreeOnKey(eavesdropper, acceptor.public_key), *at_dialer);
  // The same secret half gives the same public half (tests inject fixed ones).
  EXPECT_EQ(ephemeralKeyFrom(dialer.secret_key).public_key, dialer.public_key);
  // Points of small order (zero, one) and a wrong length are refused.
  HandshakeNonce zero{};
  HandshakeNonce one{};
  one[0] = 1;
  EXPECT_FALSE(agreeOnKey(dialer, zero));
  EXPECT_FALSE(agreeOnKey(dialer, one));
  EXPECT_FALSE(agreeOnKey(dialer, std::span<const uint8_t>(acceptor.public_key.data(), 31)));
}

}  // namespace
}  // namespace chorus::node
