#include "node/frame_cipher.h"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <sodium.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <stdexcept>

namespace chorus::node {
namespace {

static_assert(crypto_aead_chacha20poly1305_ietf_ABYTES == kSealTagBytes);
static_assert(crypto_aead_chacha20poly1305_ietf_KEYBYTES == kSessionKeyBytes);
constexpr size_t kNonceBytes = 12;
static_assert(crypto_aead_chacha20poly1305_ietf_NPUBBYTES == kNonceBytes);
// EVP takes int lengths: longer chunks are fed in steps of this (a multiple of the 64-byte
// ChaCha20 block, not that it matters: EVP carries partial blocks over).
constexpr size_t kMaxUpdateBytes = size_t{1} << 30;

void storeLittleEndian64(uint8_t* out, uint64_t value) {
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<uint8_t>(value >> (8 * i));
}

// Fetched once: an implicit fetch per record (EVP_chacha20_poly1305()) takes a lock each time.
const EVP_CIPHER* chacha20Poly1305() {
  static const EVP_CIPHER* cipher = [] {
    EVP_CIPHER* fetched = EVP_CIPHER_fetch(nullptr, "ChaCha20-Poly1305", nullptr);
    if (fetched == nullptr) {
      throw std::runtime_error(
          "OpenSSL's default provider has no ChaCha20-Poly1305 (libssl3 is broken or too old)");
    }
    return fetched;
  }();
  return cipher;
}

// OpenSSL reports failure of these calls only for programming errors (a wrong length, a call out
// of order) or allocation failure: neither is anything a peer can cause.
void check(int ok, const char* call) {
  if (ok != 1) throw std::runtime_error(fmt::format("OpenSSL {} failed", call));
}

}  // namespace

struct AeadCipher::Context {
  EVP_CIPHER_CTX* ctx = nullptr;
};

AeadCipher::AeadCipher(const SessionKey& key, Direction direction)
    : context_(std::make_unique<Context>()), direction_(direction) {
  context_->ctx = EVP_CIPHER_CTX_new();
  if (context_->ctx == nullptr) throw std::bad_alloc();
  // The key once; each record sets only its nonce (AeadStream).
  check(EVP_CipherInit_ex2(context_->ctx, chacha20Poly1305(), key.data(), nullptr,
                           direction == Direction::kSeal ? 1 : 0, nullptr),
        "EVP_CipherInit_ex2");
}

AeadCipher::~AeadCipher() {
  EVP_CIPHER_CTX_free(context_->ctx);  // cleanses the key schedule
}

AeadStream::AeadStream(AeadCipher& cipher, uint64_t nonce, std::span<const uint8_t> associated)
    : cipher_(cipher) {
  uint8_t iv[kNonceBytes] = {};
  storeLittleEndian64(iv + 4, nonce);
  // A new nonce restarts the record: fresh Poly1305 key (keystream block 0), counter 1, lengths
  // zero (RFC 8439 2.8).
  check(EVP_CipherInit_ex2(cipher_.context_->ctx, nullptr, nullptr, iv, -1, nullptr),
        "EVP_CipherInit_ex2 (nonce)");
  if (!associated.empty()) update(associated.data(), nullptr, associated.size());
}

void AeadStream::update(const uint8_t* in, uint8_t* out, size_t n) {
  while (n > 0) {
    const size_t step = std::min(n, kMaxUpdateBytes);
    int written = 0;
    check(EVP_CipherUpdate(cipher_.context_->ctx, out, &written, in, static_cast<int>(step)),
          "EVP_CipherUpdate");
    in += step;
    if (out != nullptr) out += step;
    n -= step;
  }
}

void AeadStream::seal(std::span<const uint8_t> in, uint8_t* out) {
  if (cipher_.direction_ != AeadCipher::Direction::kSeal) {
    throw std::logic_error("AeadStream::seal on an opening cipher");
  }
  update(in.data(), out, in.size());
}

void AeadStream::open(std::span<uint8_t> bytes) {
  if (cipher_.direction_ != AeadCipher::Direction::kOpen) {
    throw std::logic_error("AeadStream::open on a sealing cipher");
  }
  update(bytes.data(), bytes.data(), bytes.size());
}

SealTag AeadStream::tag() {
  if (cipher_.direction_ != AeadCipher::Direction::kSeal) {
    throw std::logic_error("AeadStream::tag on an opening cipher");
  }
  EVP_CIPHER_CTX* ctx = cipher_.context_->ctx;
  int written = 0;
  uint8_t none[1];
  check(EVP_CipherFinal_ex(ctx, none, &written), "EVP_CipherFinal_ex");
  SealTag tag{};
  check(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, static_cast<int>(tag.size()), tag.data()),
        "EVP_CTRL_AEAD_GET_TAG");
  return tag;
}

bool AeadStream::matches(std::span<const uint8_t> received) {
  if (cipher_.direction_ != AeadCipher::Direction::kOpen) {
    throw std::logic_error("AeadStream::matches on a sealing cipher");
  }
  if (received.size() != kSealTagBytes) return false;
  EVP_CIPHER_CTX* ctx = cipher_.context_->ctx;
  SealTag copy{};
  std::memcpy(copy.data(), received.data(), copy.size());
  check(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, static_cast<int>(copy.size()), copy.data()),
        "EVP_CTRL_AEAD_SET_TAG");
  int written = 0;
  uint8_t none[1];
  // 1 when the tag matches (compared in constant time by OpenSSL), 0 when it does not.
  return EVP_CipherFinal_ex(ctx, none, &written) == 1;
}

namespace {

// The length prefix of a frame whose pieces may in principle cut it.
uint32_t prefixOf(const std::vector<std::span<const uint8_t>>& pieces) {
  uint8_t prefix[kFramePrefixBytes] = {};
  size_t got = 0;
  for (const auto& piece : pieces) {
    const size_t take = std::min(piece.size(), kFramePrefixBytes - got);
    std::memcpy(prefix + got, piece.data(), take);
    got += take;
    if (got == kFramePrefixBytes) break;
  }
  if (got < kFramePrefixBytes) throw std::invalid_argument("sealing a frame without a prefix");
  return loadLittleEndian32(prefix);
}

// The attachment's bytes of a frame of `bytes` whose Envelope has `envelope` (a programming
// error when the frame is shorter than its prefix says).
size_t attachmentOf(size_t bytes, size_t envelope) {
  if (envelope > bytes - kFramePrefixBytes) {
    throw std::invalid_argument("sealing a frame shorter than its length prefix");
  }
  return bytes - kFramePrefixBytes - envelope;
}

}  // namespace

FrameSealer::FrameSealer(const SessionKey& key) : cipher_(key, AeadCipher::Direction::kSeal) {}

FrameSealer::~FrameSealer() = default;

size_t FrameSealer::sealedSize(const OutboundFrame& frame) {
  const size_t attachment = attachmentOf(frame.size(), prefixOf(frame.pieces()));
  return frame.size() + kSealTagBytes + (attachment > 0 ? kSealTagBytes : 0);
}

void FrameSealer::start(const OutboundFrame& frame) {
  if (sealing()) throw std::logic_error("FrameSealer: a frame begun before the last one ended");
  pieces_ = frame.pieces();
  attachment_ = attachmentOf(frame.size(), prefixOf(pieces_));
  frame_ = &frame;
  piece_ = 0;
  piece_offset_ = 0;
  part_ = Part::kPrefix;
}

void FrameSealer::begin(SharedFrame frame) {
  start(*frame);
  held_ = std::move(frame);
}

SharedFrame FrameSealer::seal(const OutboundFrame& frame) {
  start(frame);
  const size_t sealed = sealedSize(frame);
  auto* out = new uint8_t[sealed];
  const size_t written = sealNext(out, sealed);
  if (written != sealed || sealing()) throw std::logic_error("frame pieces shorter than size()");
  return std::make_shared<const OutboundFrame>(
      flatbuffers::DetachedBuffer(nullptr, false, out, sealed, out, sealed), frame.sequence(),
      frame.kind());
}

void FrameSealer::takePlain(size_t n, uint8_t* out, bool seal) {
  while (n > 0) {
    if (piece_ == pieces_.size()) throw std::logic_error("frame pieces shorter than size()");
    const std::span<const uint8_t> rest = pieces_[piece_].subspan(piece_offset_);
    const size_t take = std::min(n, rest.size());
    if (seal) {
      record_->seal(rest.first(take), out);
    } else {
      std::memcpy(out, rest.data(), take);
    }
    out += take;
    n -= take;
    piece_offset_ += take;
    if (piece_offset_ == pieces_[piece_].size()) {
      ++piece_;
      piece_offset_ = 0;
    }
  }
}

size_t FrameSealer::sealNext(uint8_t* out, size_t room) {
  size_t written = 0;
  // The parts in wire order: the clear prefix (the Envelope record's associated data), the
  // Envelope's record and its tag, then the attachment's record and its tag when it has one.
  while (sealing()) {
    const size_t left = room - written;
    switch (part_) {
      case Part::kPrefix: {
        if (left < kFramePrefixBytes) return written;
        takePlain(kFramePrefixBytes, out + written, false);
        record_.emplace(cipher_, records_++,
                        std::span<const uint8_t>(out + written, kFramePrefixBytes));
        part_left_ = loadLittleEndian32(out + written);
        written += kFramePrefixBytes;
        part_ = Part::kEnvelope;
        break;
      }
      case Part::kEnvelope:
      case Part::kAttachment: {
        const size_t take = std::min(left, part_left_);
        takePlain(take, out + written, true);
        written += take;
        part_left_ -= take;
        if (part_left_ > 0) return written;
        part_ = part_ == Part::kEnvelope ? Part::kEnvelopeTag : Part::kAttachmentTag;
        break;
      }
      case Part::kEnvelopeTag:
      case Part::kAttachmentTag: {
        if (left < kSealTagBytes) return written;
        const SealTag tag = record_->tag();
        std::memcpy(out + written, tag.data(), tag.size());
        written += tag.size();
        record_.reset();
        if (part_ == Part::kEnvelopeTag && attachment_ > 0) {
          record_.emplace(cipher_, records_++, std::span<const uint8_t>());
          part_ = Part::kAttachment;
          part_left_ = attachment_;
        } else {
          frame_ = nullptr;
          held_.reset();
          pieces_.clear();
        }
        break;
      }
    }
  }
  return written;
}

FrameOpener::~FrameOpener() = default;

Status FrameOpener::failure(const char* what, uint64_t frame) const {
  return {ErrorCode::kBadFrame,
          fmt::format("{} of sealed frame {} failed authentication: it was altered, forged, "
                      "replayed or reordered on the way, or a frame before it was dropped",
                      what, frame)};
}

Status FrameOpener::openEnvelope(std::span<const uint8_t> prefix, std::span<uint8_t> envelope,
                                 std::span<const uint8_t> tag) {
  AeadStream record(cipher_, records_++, prefix);
  record.open(envelope);
  if (!record.matches(tag)) return failure("the Envelope", frames_ + 1);
  ++frames_;
  return {};
}

void FrameOpener::beginAttachment() {
  attachment_.emplace(cipher_, records_++, std::span<const uint8_t>());
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
