// The sealed frame path (node/frame_cipher.h) as a connection with a cluster secret reads it: the
// fuzzer writes plain frames (seeded with real ones of every service), the harness seals them with
// the sending end's FrameSealer and plays a man on the wire (a flipped bit, a replayed, dropped or
// forged frame), then a FrameDecoder with the receiving end's FrameOpener reads the stream cut
// into reads of any size, its attachments to a buffer or to a landing of several pieces, under an
// inbound budget or not. Checked on every input:
// - what reaches the sink is exactly the plain frames, in order, up to the first one the man on
//   the wire touched (its size, its header, every byte of its attachment): nothing tampered,
//   replayed, reordered or forged is ever delivered;
// - a stream with a frame that was not delivered ends in an error (of the read, or finish()'s
//   "stopped inside a frame"), never in silence.
//
// Input: 3 bytes of options (bits of byte 0: socket reads, a placer, a budget; byte 1: bytes per
// read - 1; byte 2: landing pieces), then records: control byte (bits 0-2: what the wire does
// with this frame: 0-3 deliver it, 4 flip a bit, 5 replay the previous frame instead, 6 drop it,
// 7 a frame sealed under another key), 2 bytes little-endian length, then that many bytes of one
// plain frame (its length prefix is clamped to the bytes given; the rest is its attachment), and
// for a flipped bit 2 more bytes: where.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "consensus/consensus_service.h"
#include "node/frame.h"
#include "node/frame_cipher.h"
#include "node/inbound_budget.h"
#include "ping/ping_service.h"
#include "ps/ps_service.h"
#include "ps/replica_service.h"

namespace {

using namespace chorus;
using node::AttachmentLanding;
using node::FrameDecoder;
using node::InboundFrame;

const node::ServiceSpec* everyService(node::ServiceId id) {
  for (const node::ServiceSpec* spec : {&ping::kPingService, &consensus::kConsensusService,
                                        &ps::kPsService, &ps::kReplicaService}) {
    if (spec->id == id) return spec;
  }
  return nullptr;
}

[[noreturn]] void fail(const char* what, size_t a, size_t b) {
  std::fprintf(stderr, "fuzz_sealed_frame: %s (%zu, %zu)\n", what, a, b);
  std::abort();
}

class Landing : public AttachmentLanding {
 public:
  static std::unique_ptr<Landing> make(size_t bytes, size_t parts) {
    auto memory = std::make_unique<uint8_t[]>(bytes == 0 ? 1 : bytes);
    std::vector<std::span<uint8_t>> pieces;
    const size_t step = std::max<size_t>(1, parts == 0 ? bytes : (bytes + parts - 1) / parts);
    for (size_t at = 0; at < bytes; at += step)
      pieces.emplace_back(memory.get() + at, std::min(step, bytes - at));
    return std::unique_ptr<Landing>(new Landing(std::move(memory), std::move(pieces)));
  }

 private:
  Landing(std::unique_ptr<uint8_t[]> memory, std::vector<std::span<uint8_t>> pieces)
      : AttachmentLanding(std::move(pieces)), memory_(std::move(memory)) {}
  std::unique_ptr<uint8_t[]> memory_;
};

node::SessionKey keyOf(uint8_t seed) {
  node::SessionKey key{};
  for (size_t i = 0; i < key.size(); ++i)
    key[i] = static_cast<uint8_t>(seed + 7 * i);
  return key;
}

// One plain frame as the sender hands it to the sealer: one buffer, prefix first.
node::SharedFrame plainFrame(const std::vector<uint8_t>& bytes) {
  auto* out = new uint8_t[bytes.size()];
  std::memcpy(out, bytes.data(), bytes.size());
  return std::make_shared<const node::OutboundFrame>(
      flatbuffers::DetachedBuffer(nullptr, false, out, bytes.size(), out, bytes.size()), 0, 0);
}

std::vector<uint8_t> wireOf(const node::SharedFrame& frame) {
  std::vector<uint8_t> out;
  for (auto piece : frame->pieces())
    out.insert(out.end(), piece.begin(), piece.end());
  return out;
}

struct Plain {
  std::vector<uint8_t> bytes;  // prefix, Envelope, attachment
  size_t envelope = 0;
  // The attachment its Envelope announces, when the plain Envelope verifies (else the receiver
  // refuses it once opened). The sealer seals whatever follows the Envelope as the attachment's
  // record, so an Envelope announcing none before bytes that follow opens and is delivered
  // alone, and the stream breaks after it; one announcing another size never opens.
  std::optional<uint64_t> announced;
  size_t rest() const { return bytes.size() - node::kFramePrefixBytes - envelope; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t mode = data[0];
  const size_t cut = 1 + data[1];
  const size_t landing_parts = data[2] & 7;
  data += 3;
  size -= 3;
  node::FrameLimits limits;
  limits.max_frame_bytes = 1u << 20;

  node::FrameSealer sealer(keyOf(1));
  node::FrameSealer forger(keyOf(2));  // a sender without this connection's key
  std::vector<Plain> plain;            // every frame the sender sealed, in record order
  std::vector<uint8_t> stream;
  // The frames on the wire: the index into `plain` of the frame whose intact sealed bytes they
  // are, or nullopt (altered, or sealed under another key). Position j opens iff it holds j.
  std::vector<std::optional<size_t>> sent;
  std::vector<uint8_t> last_sealed;
  size_t last_index = 0;  // the plain frame last_sealed holds
  while (size >= 3) {
    const uint8_t control = data[0];
    size_t length = data[1] | (size_t{data[2]} << 8);
    data += 3;
    size -= 3;
    length = std::min(length, size);
    Plain p;
    p.bytes.assign(data, data + length);
    data += length;
    size -= length;
    if (p.bytes.size() < node::kFramePrefixBytes) p.bytes.resize(node::kFramePrefixBytes, 0);
    const size_t claimed = node::loadLittleEndian32(p.bytes.data());
    p.envelope = std::min(claimed, p.bytes.size() - node::kFramePrefixBytes);
    for (size_t i = 0; i < node::kFramePrefixBytes; ++i)
      p.bytes[i] = static_cast<uint8_t>(p.envelope >> (8 * i));
    if (node::verifyFrame(p.bytes.data(), node::kFramePrefixBytes + p.envelope, limits).ok())
      p.announced = node::envelopeOf(p.bytes.data()).header()->attachment();
    const int op = control & 7;
    if (op == 7) {  // forged: sealed under another key, in place of this frame
      const std::vector<uint8_t> forged = wireOf(forger.seal(*plainFrame(p.bytes)));
      stream.insert(stream.end(), forged.begin(), forged.end());
      sent.push_back(std::nullopt);
      continue;
    }
    std::vector<uint8_t> sealed = wireOf(sealer.seal(*plainFrame(p.bytes)));
    plain.push_back(std::move(p));
    if (op == 6) {  // dropped on the way (its record numbers are spent)
      last_sealed = std::move(sealed);
      last_index = plain.size() - 1;
      continue;
    }
    if (op == 5 && !last_sealed.empty()) {  // the previous frame again, instead of this one
      // Intact bytes of an earlier frame: they open only where that frame is due (after a drop
      // of it, the "replay" is its first arrival).
      stream.insert(stream.end(), last_sealed.begin(), last_sealed.end());
      sent.push_back(last_index);
      last_sealed = std::move(sealed);
      last_index = plain.size() - 1;
      continue;
    }
    std::optional<size_t> index = plain.size() - 1;
    if (op == 4 && size >= 2) {  // one bit flipped, anywhere in the sealed frame
      const size_t at = (data[0] | (size_t{data[1]} << 8)) % (sealed.size() * 8);
      data += 2;
      size -= 2;
      sealed[at / 8] ^= static_cast<uint8_t>(1u << (at % 8));
      // A frame whose Envelope announces no attachment is delivered without the bytes sealed
      // after it (the stream breaks there): a bit flipped in those leaves the frame intact.
      const Plain& q = plain.back();
      const size_t received = q.announced == 0 && q.rest() > 0
                                  ? node::kFramePrefixBytes + q.envelope + node::kSealTagBytes
                                  : sealed.size();
      if (at / 8 < received) index = std::nullopt;
    }
    stream.insert(stream.end(), sealed.begin(), sealed.end());
    sent.push_back(index);
    last_sealed = std::move(sealed);
    last_index = plain.size() - 1;
  }
  // Frames that can be delivered: the intact ones at their own place, up to the first that is
  // not, or that cannot open as sealed, or that breaks the stream after it.
  size_t openable = 0;
  while (openable < sent.size() && sent[openable] == openable) {
    const Plain& p = plain[openable];
    if (!p.announced) break;
    if (*p.announced == p.rest()) {
      ++openable;
      continue;
    }
    if (*p.announced == 0) ++openable;  // delivered without what follows, which cannot open
    break;
  }

  node::InboundBudget budget(2u << 20);  // outlives the decoder and its frames
  FrameDecoder decoder(limits);
  decoder.setServices(everyService);
  decoder.setOpener(std::make_unique<node::FrameOpener>(keyOf(1)));
  if ((mode & 4) != 0) decoder.setBudget(&budget);
  if ((mode & 2) != 0) {
    decoder.setPlacer([landing_parts](const InboundFrame&, size_t bytes) {
      return std::unique_ptr<AttachmentLanding>(Landing::make(bytes, landing_parts));
    });
  }
  size_t delivered = 0;
  auto on_frame = [&](InboundFrame&& frame) {
    if (delivered >= openable) fail("a frame the wire touched was delivered", delivered, openable);
    const Plain& p = plain[*sent[delivered]];
    const size_t expected_size = node::kFramePrefixBytes + p.envelope + *p.announced;
    if (frame.wireSize() != expected_size) {
      fail("a delivered frame's size differs from what was sealed", frame.wireSize(),
           expected_size);
    }
    // Its header as sealed (the plain Envelope passed the same Verifier).
    const auto* sealed_header = node::envelopeOf(p.bytes.data()).header();
    const auto* header = frame.envelope().header();
    if (header->sequence() != sealed_header->sequence() ||
        header->sender() != sealed_header->sender() ||
        header->attachment() != sealed_header->attachment()) {
      fail("a delivered frame's header differs from what was sealed", delivered, 0);
    }
    // Every attachment byte as sealed, wherever it landed.
    std::vector<uint8_t> attachment(frame.attachment().begin(), frame.attachment().end());
    if (const AttachmentLanding* landing = frame.landing()) {
      for (auto piece : landing->pieces())
        attachment.insert(attachment.end(), piece.begin(), piece.end());
    }
    const auto sealed_attachment = p.bytes.begin() + node::kFramePrefixBytes + p.envelope;
    if (attachment.size() != *p.announced ||
        !std::equal(attachment.begin(), attachment.end(), sealed_attachment)) {
      fail("a delivered frame's attachment differs from what was sealed", delivered,
           attachment.size());
    }
    ++delivered;
    return true;
  };
  const bool socket_reads = (mode & 1) != 0;
  const uint8_t* at = stream.data();
  size_t left = stream.size();
  node::Status status;
  while (left > 0 && status.ok()) {
    size_t n = std::min(cut, left);
    if (socket_reads) {
      auto buffer = decoder.readBuffer();
      n = std::min(n, buffer.size());
      if (n == 0) fail("readBuffer() offered no room", left, 0);
      std::copy(at, at + n, buffer.begin());
      status = decoder.commitRead(n, on_frame);
    } else {
      status = decoder.consume(at, n, on_frame);
    }
    at += n;
    left -= n;
  }
  const bool ended_in_error = !status.ok() || !decoder.finish().ok();
  if (delivered < sent.size() && !ended_in_error)
    fail("frames were not delivered, yet the stream ended without an error", delivered,
         sent.size());
  return 0;
}
