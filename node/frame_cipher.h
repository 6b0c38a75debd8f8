// Sealed frames: every frame of a connection whose handshake proved the cluster's secret is
// encrypted and authenticated with ChaCha20-Poly1305 (RFC 8439) under a key of that connection
// and direction (docs/security.md says why this AEAD and what it protects). Pure code: no
// sockets; the Connection seals what it writes and its FrameDecoder opens what it reads.
//
// On the wire a sealed frame is
//
//   length (4, clear) | Envelope (length bytes, sealed) | tag (16)
//     [ | attachment (the bytes the Envelope announces, sealed) | tag (16) ]
//
// The length stays in clear so that the receiver knows where the Envelope ends; it is
// authenticated (associated data of the Envelope's record). The Envelope and the attachment are
// two records, so the receiver can check the Envelope before it chooses where the attachment
// lands. Each record's nonce is the number of records sent before it in its direction (never
// sent): a frame that is altered, forged, replayed, reordered, or that follows a dropped one
// does not open, and the connection closes.
//
// The records are computed chunk by chunk over the frame's pieces with OpenSSL's EVP
// ChaCha20-Poly1305 (its vectorized code: several times libsodium 1.0.18's speed on this
// hardware, bench/README.md), exactly as libsodium's one-shot
// crypto_aead_chacha20poly1305_ietf_*_detached computes them over one buffer (tests check it),
// so an attachment is opened in place, piece by piece, where it lands.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "node/frame.h"
#include "node/status.h"

namespace chorus::node {

inline constexpr size_t kSealTagBytes = 16;
inline constexpr size_t kSessionKeyBytes = 32;
using SessionKey = std::array<uint8_t, kSessionKeyBytes>;
using SealTag = std::array<uint8_t, kSealTagBytes>;

// The two keys of one connection, as one end sees them.
struct SessionKeys {
  SessionKey send{};     // seals what this end writes
  SessionKey receive{};  // opens what the other end writes
};

// One direction's cipher: the OpenSSL context and key that every record of that direction is
// computed with, set up once so that a record costs no allocation and no key schedule. One record
// at a time (an AeadStream borrows it from construction to tag()/matches()).
class AeadCipher {
 public:
  enum class Direction { kSeal, kOpen };
  AeadCipher(const SessionKey& key, Direction direction);
  ~AeadCipher();
  AeadCipher(const AeadCipher&) = delete;
  AeadCipher& operator=(const AeadCipher&) = delete;

 private:
  friend class AeadStream;
  struct Context;  // OpenSSL's EVP_CIPHER_CTX, kept out of this header
  std::unique_ptr<Context> context_;
  Direction direction_;
};

// ChaCha20-Poly1305 (RFC 8439, libsodium's "ietf" variant) over a message given in chunks of any
// size: the same ciphertext and tag as the one-shot call. One object per record.
class AeadStream {
 public:
  // `nonce` is the record's number (the 12-byte nonce is its 8 little-endian bytes after four
  // zeros); `associated` is authenticated, not encrypted. `cipher` (which says whether this
  // record seals or opens) must outlive this object and run no other record meanwhile.
  AeadStream(AeadCipher& cipher, uint64_t nonce, std::span<const uint8_t> associated);
  AeadStream(const AeadStream&) = delete;
  AeadStream& operator=(const AeadStream&) = delete;

  // Sealing: encrypts the next `in.size()` bytes of the message into `out` (which may be
  // `in.data()`, not otherwise overlapping it).
  void seal(std::span<const uint8_t> in, uint8_t* out);
  // Opening: decrypts the next bytes of the message in place. The plaintext must not be trusted
  // before matches() said yes.
  void open(std::span<uint8_t> bytes);
  // Sealing: the tag over everything sealed (call once, at the end).
  SealTag tag();
  // Opening: constant-time, does `received` equal the tag of what was opened? (call once, at
  // the end).
  bool matches(std::span<const uint8_t> received);

 private:
  void update(const uint8_t* in, uint8_t* out, size_t n);
  AeadCipher& cipher_;
};

// Seals the frames one end writes on one connection, in the order they reach the socket. A
// frame is sealed either whole (seal()) or in pieces into buffers of any size (begin(), then
// sealNext() until sealing() is false), so that a connection can write a large frame sealed
// through a small reused buffer instead of a fresh one the size of the frame (node/chunk_pool.h;
// docs/security.md, "Cost").
class FrameSealer {
 public:
  explicit FrameSealer(const SessionKey& key);
  ~FrameSealer();
  FrameSealer(const FrameSealer&) = delete;
  FrameSealer& operator=(const FrameSealer&) = delete;

  // Bytes `frame` takes on the wire sealed: its own, plus a tag per record.
  static size_t sealedSize(const OutboundFrame& frame);
  // `frame` sealed as one buffer the result owns. `frame`'s bytes are read as a byte stream
  // (its length prefix says where the Envelope ends and the attachment starts), so a frame
  // made by tailCopy(0) seals as the original. Must be called in wire order: each call takes
  // the next one or two record numbers. Not while sealing().
  SharedFrame seal(const OutboundFrame& frame);
  // Starts sealing `frame` in pieces (held until its last byte is sealed). Wire order, as
  // seal(); not while sealing().
  void begin(SharedFrame frame);
  // Seals the next bytes of the frame begun into `out`, at most `room` of them, and returns how
  // many. A length prefix or a tag is never cut: fewer than `room` bytes come back when the
  // next of those does not fit (so `room` must be at least kSealTagBytes to make progress).
  size_t sealNext(uint8_t* out, size_t room);
  // A frame was begun and some of it is still to be sealed.
  bool sealing() const { return frame_ != nullptr; }
  // Records sealed so far (begun, for the frame being sealed).
  uint64_t records() const { return records_; }

 private:
  enum class Part { kPrefix, kEnvelope, kEnvelopeTag, kAttachment, kAttachmentTag };
  void start(const OutboundFrame& frame);
  // Copies (`seal` false) or seals the next `n` bytes of the frame's plaintext into `out`.
  void takePlain(size_t n, uint8_t* out, bool seal);

  AeadCipher cipher_;
  uint64_t records_ = 0;
  // The frame being sealed: where its plaintext is read next, and which part is written next.
  const OutboundFrame* frame_ = nullptr;
  SharedFrame held_;
  std::vector<std::span<const uint8_t>> pieces_;
  size_t piece_ = 0;
  size_t piece_offset_ = 0;
  Part part_ = Part::kPrefix;
  size_t part_left_ = 0;  // plaintext bytes of the current record still to seal
  size_t attachment_ = 0;
  std::optional<AeadStream> record_;
};

// Opens the frames one end reads on one connection, in wire order (FrameDecoder::setOpener).
class FrameOpener {
 public:
  explicit FrameOpener(const SessionKey& key) : cipher_(key, AeadCipher::Direction::kOpen) {}
  ~FrameOpener();
  // Opens an Envelope in place: `prefix` is its clear length prefix, `tag` the 16 bytes after
  // it. An error (kBadFrame) when the record does not open.
  Status openEnvelope(std::span<const uint8_t> prefix, std::span<uint8_t> envelope,
                      std::span<const uint8_t> tag);
  // The attachment announced by the Envelope just opened: begin, then every chunk in order,
  // then its tag.
  void beginAttachment();
  void openAttachment(std::span<uint8_t> chunk);
  Status finishAttachment(std::span<const uint8_t> tag);
  // Envelopes opened so far (frames are numbered from 1 in failures).
  uint64_t frames() const { return frames_; }

 private:
  Status failure(const char* what, uint64_t frame) const;
  AeadCipher cipher_;
  uint64_t records_ = 0;
  uint64_t frames_ = 0;
  std::optional<AeadStream> attachment_;
};

}  // namespace chorus::node
