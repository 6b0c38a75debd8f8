#include "node/frame_cipher.h"

#include <fmt/format.h>
#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace chorus::node {
namespace {

constexpr size_t kBlockBytes = 64;
static_assert(crypto_aead_chacha20poly1305_ietf_ABYTES == kSealTagBytes);
static_assert(crypto_aead_chacha20poly1305_ietf_KEYBYTES == kSessionKeyBytes);
static_assert(crypto_aead_chacha20poly1305_ietf_NPUBBYTES == 12);

void storeLittleEndian64(uint8_t* out, uint64_t value) {
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<uint8_t>(value >> (8 * i));
}

}  // namespace

struct AeadStream::State {
  SessionKey key;
  uint8_t nonce[12] = {};
  crypto_onetimeauth_poly1305_state mac;
  uint64_t associated_bytes = 0;
  uint64_t position = 0;            // message bytes sealed or opened so far
  uint8_t block[kBlockBytes] = {};  // keystream of the block holding `position`, if partial
};

AeadStream::AeadStream(const SessionKey& key, uint64_t nonce, std::span<const uint8_t> associated)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.key = key;
  storeLittleEndian64(s.nonce + 4, nonce);
  // RFC 8439 2.8: the Poly1305 key is the first half of keystream block 0; the message is
  // encrypted from block 1 on. The MAC covers AD, padding, ciphertext, padding, both lengths.
  uint8_t poly_key[kBlockBytes] = {};
  crypto_stream_chacha20_ietf(poly_key, sizeof(poly_key), s.nonce, s.key.data());
  crypto_onetimeauth_poly1305_init(&s.mac, poly_key);
  sodium_memzero(poly_key, sizeof(poly_key));
  static const uint8_t kZeros[16] = {};
  crypto_onetimeauth_poly1305_update(&s.mac, associated.data(), associated.size());
  crypto_onetimeauth_poly1305_update(&s.mac, kZeros, (0x10 - associated.size()) & 0xf);
  s.associated_bytes = associated.size();
}

AeadStream::~AeadStream() {
  sodium_memzero(state_.get(), sizeof(State));
}

void AeadStream::xorKeystream(const uint8_t* in, uint8_t* out, size_t n) {
  State& s = *state_;
  while (n > 0) {
    const size_t offset = s.position % kBlockBytes;
    // Block 0 was the MAC key's; the IETF counter is 32 bits (256 GiB per record).
    const uint64_t block = 1 + s.position / kBlockBytes;
    if (offset == 0 && n >= kBlockBytes) {
      const size_t whole = n - n % kBlockBytes;
      crypto_stream_chacha20_ietf_xor_ic(out, in, whole, s.nonce, static_cast<uint32_t>(block),
                                         s.key.data());
      in += whole;
      out += whole;
      n -= whole;
      s.position += whole;
      continue;
    }
    if (offset == 0) {
      std::memset(s.block, 0, sizeof(s.block));
      crypto_stream_chacha20_ietf_xor_ic(s.block, s.block, sizeof(s.block), s.nonce,
                                         static_cast<uint32_t>(block), s.key.data());
    }
    const size_t take = std::min(n, kBlockBytes - offset);
    for (size_t i = 0; i < take; ++i)
      out[i] = in[i] ^ s.block[offset + i];
    in += take;
    out += take;
    n -= take;
    s.position += take;
  }
}

void AeadStream::seal(std::span<const uint8_t> in, uint8_t* out) {
  xorKeystream(in.data(), out, in.size());
  crypto_onetimeauth_poly1305_update(&state_->mac, out, in.size());
}

void AeadStream::open(std::span<uint8_t> bytes) {
  crypto_onetimeauth_poly1305_update(&state_->mac, bytes.data(), bytes.size());
  xorKeystream(bytes.data(), bytes.data(), bytes.size());
}

SealTag AeadStream::tag() {
  State& s = *state_;
  static const uint8_t kZeros[16] = {};
  crypto_onetimeauth_poly1305_update(&s.mac, kZeros, (0x10 - s.position % 16) & 0xf);
  uint8_t lengths[16];
  storeLittleEndian64(lengths, s.associated_bytes);
  storeLittleEndian64(lengths + 8, s.position);
  crypto_onetimeauth_poly1305_update(&s.mac, lengths, sizeof(lengths));
  SealTag tag{};
  crypto_onetimeauth_poly1305_final(&s.mac, tag.data());
  return tag;
}

bool AeadStream::matches(std::span<const uint8_t> received) {
  const SealTag expected = tag();
  return received.size() == kSealTagBytes &&
         crypto_verify_16(expected.data(), received.data()) == 0;
}

FrameSealer::~FrameSealer() {
  sodium_memzero(key_.data(), key_.size());
}

SharedFrame FrameSealer::seal(const OutboundFrame& frame) {
  const size_t bytes = frame.size();
  if (bytes < kFramePrefixBytes) throw std::invalid_argument("sealing a frame without a prefix");
  const std::vector<std::span<const uint8_t>> pieces = frame.pieces();
  // The length prefix may in principle straddle pieces: read it as a byte stream.
  uint8_t prefix[kFramePrefixBytes];
  {
    size_t got = 0;
    for (const auto& piece : pieces) {
      const size_t take = std::min(piece.size(), kFramePrefixBytes - got);
      std::memcpy(prefix + got, piece.data(), take);
      got += take;
      if (got == kFramePrefixBytes) break;
    }
  }
  const size_t envelope = loadLittleEndian32(prefix);
  if (envelope > bytes - kFramePrefixBytes) {
    throw std::invalid_argument("sealing a frame shorter than its length prefix");
  }
  const size_t attachment = bytes - kFramePrefixBytes - envelope;
  const size_t sealed = bytes + kSealTagBytes + (attachment > 0 ? kSealTagBytes : 0);
  auto* out = new uint8_t[sealed];
  std::memcpy(out, prefix, kFramePrefixBytes);
  // Walks the frame's bytes after the prefix, sealing the Envelope record, then the
  // attachment's, each followed by its tag.
  uint8_t* at = out + kFramePrefixBytes;
  size_t skip = kFramePrefixBytes;
  auto record = std::make_unique<AeadStream>(key_, records_++,
                                             std::span<const uint8_t>(prefix, kFramePrefixBytes));
  size_t record_left = envelope;
  bool in_attachment = false;
  const auto closeRecord = [&] {
    const SealTag tag = record->tag();
    std::memcpy(at, tag.data(), tag.size());
    at += tag.size();
  };
  for (const auto& piece : pieces) {
    std::span<const uint8_t> rest = piece;
    if (skip >= rest.size()) {
      skip -= rest.size();
      continue;
    }
    rest = rest.subspan(skip);
    skip = 0;
    while (!rest.empty()) {
      if (record_left == 0 && !in_attachment) {
        closeRecord();
        record = std::make_unique<AeadStream>(key_, records_++, std::span<const uint8_t>());
        record_left = attachment;
        in_attachment = true;
      }
      const size_t take = std::min(rest.size(), record_left);
      record->seal(rest.first(take), at);
      at += take;
      record_left -= take;
      rest = rest.subspan(take);
    }
  }
  closeRecord();  // the Envelope's when there is no attachment, else the attachment's
  if (!in_attachment && attachment > 0) throw std::logic_error("frame pieces shorter than size()");
  return std::make_shared<const OutboundFrame>(
      flatbuffers::DetachedBuffer(nullptr, false, out, sealed, out, sealed), frame.sequence(),
      frame.kind());
}

FrameOpener::~FrameOpener() {
  sodium_memzero(key_.data(), key_.size());
}

Status FrameOpener::failure(const char* what, uint64_t frame) const {
  return {ErrorCode::kBadFrame,
          fmt::format("{} of sealed frame {} failed authentication: it was altered, forged, "
                      "replayed or reordered on the way, or a frame before it was dropped",
                      what, frame)};
}

Status FrameOpener::openEnvelope(std::span<const uint8_t> prefix, std::span<uint8_t> envelope,
                                 std::span<const uint8_t> tag) {
  AeadStream record(key_, records_++, prefix);
  record.open(envelope);
  if (!record.matches(tag)) return failure("the Envelope", frames_ + 1);
  ++frames_;
  return {};
}

void FrameOpener::beginAttachment() {
  attachment_ = std::make_unique<AeadStream>(key_, records_++, std::span<const uint8_t>());
}

void FrameOpener::openAttachment(std::span<uint8_t> chunk) {
  attachment_->open(chunk);
}

Status FrameOpener::finishAttachment(std::span<const uint8_t> tag) {
  const bool ok = attachment_->matches(tag);
  attachment_.reset();
  if (!ok) return failure("the attachment", frames_);
  return {};
}

}  // namespace chorus::node
