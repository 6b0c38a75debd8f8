// The frame reader of every connection (node/frame.h) on a stream of untrusted bytes: length
// prefixes, the Verifier on every body type and every service's message, attachments read to a
// buffer of the frame's own or to the receiver's landing, the inbound budget, a frame limit that
// changes between frames (as it does after the handshake). The first bytes of the input choose the
// limits and how the stream is cut into reads; the rest is the stream.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "consensus/consensus_service.h"
#include "node/frame.h"
#include "node/inbound_budget.h"
#include "ping/ping_service.h"
#include "ps/ps_service.h"

namespace {

using chorus::node::AttachmentLanding;
using chorus::node::FrameDecoder;
using chorus::node::FrameLimits;
using chorus::node::InboundBudget;
using chorus::node::InboundFrame;
using chorus::node::ServiceId;
using chorus::node::ServiceSpec;

// Every service a node may run: their messages are verified by their own schemas.
const ServiceSpec* everyService(ServiceId id) {
  for (const ServiceSpec* spec : {&chorus::ping::kPingService,
                                  &chorus::consensus::kConsensusService, &chorus::ps::kPsService}) {
    if (spec->id == id) return spec;
  }
  return nullptr;
}

// A landing in memory the test owns, cut into `parts` pieces.
class Landing : public AttachmentLanding {
 public:
  static std::unique_ptr<Landing> make(size_t bytes, size_t parts) {
    auto memory = std::make_unique<uint8_t[]>(bytes == 0 ? 1 : bytes);
    std::vector<std::span<uint8_t>> pieces;
    size_t step = parts == 0 ? bytes : (bytes + parts - 1) / parts;
    for (size_t at = 0; at < bytes; at += step == 0 ? 1 : step) {
      pieces.emplace_back(memory.get() + at, std::min(step == 0 ? 1 : step, bytes - at));
    }
    return std::unique_ptr<Landing>(new Landing(std::move(memory), std::move(pieces)));
  }

 private:
  Landing(std::unique_ptr<uint8_t[]> memory, std::vector<std::span<uint8_t>> pieces)
      : AttachmentLanding(std::move(pieces)), memory_(std::move(memory)) {}
  std::unique_ptr<uint8_t[]> memory_;
};

// Reads what a handler would read of a verified frame, so that a Verifier gap shows up under
// AddressSanitizer here rather than in a node.
size_t touch(const InboundFrame& frame) {
  const auto& envelope = frame.envelope();
  size_t seen = 0;
  if (const auto* header = envelope.header()) {
    seen += header->sender() + header->attachment();
    if (header->cluster() != nullptr) seen += header->cluster()->size();
  }
  seen += static_cast<size_t>(envelope.body_type());
  // A verified message is read as its service's handlers read it: its kind and its body.
  if (const ServiceSpec* service = frame.verifiedService()) {
    seen += service->kind(frame.message().data());
    if (service->id == chorus::ps::kPsServiceId) {
      const auto& message = chorus::ps::messageOf(frame);
      if (const auto* pull = message.body_as_PsPull(); pull != nullptr && pull->keys() != nullptr) {
        for (uint64_t key : *pull->keys())
          seen += key;
      }
    } else if (service->id == chorus::consensus::kConsensusServiceId) {
      const auto& message = chorus::consensus::messageOf(frame);
      if (const auto* share = message.body_as_ModelShare();
          share != nullptr && share->values() != nullptr) {
        seen += share->values()->size() + static_cast<size_t>(share->round());
      }
    } else if (const auto* ping = chorus::ping::messageOf(frame).body_as_Ping()) {
      seen += ping->nonce() + (ping->payload() != nullptr ? ping->payload()->size() : 0);
    }
  }
  for (uint8_t byte : frame.attachment())
    seen += byte;
  if (const auto* landing = frame.landing()) {
    for (auto piece : landing->pieces()) {
      for (uint8_t byte : piece)
        seen += byte;
    }
  }
  return seen;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const uint8_t mode = data[0];
  const size_t cut = 1 + data[1];  // bytes per read
  const size_t landing_parts = data[2] & 7;
  const bool use_budget = (data[3] & 1) != 0;
  data += 4;
  size -= 4;

  FrameLimits limits;
  limits.max_frame_bytes = 1u << 20;  // large enough for every seed, small enough for a fuzzer
  InboundBudget budget(2u << 20);     // must outlive the decoder and its frames
  FrameDecoder decoder(limits);
  decoder.setServices(everyService);
  if (use_budget) decoder.setBudget(&budget);
  // Before the handshake a node takes small frames only; after the first frame, large ones.
  if ((mode & 1) != 0) decoder.setMaxFrameBytes(4096, " before the handshake");
  if ((mode & 2) != 0) {
    decoder.setPlacer(
        [landing_parts](const InboundFrame&, size_t bytes) -> std::unique_ptr<AttachmentLanding> {
          return Landing::make(bytes, landing_parts);
        });
  }
  size_t frames = 0;
  volatile size_t sink = 0;
  auto on_frame = [&](InboundFrame&& frame) {
    sink = sink + touch(frame);
    if (++frames == 1) decoder.setMaxFrameBytes(limits.max_frame_bytes);
    return true;
  };
  // Half the inputs arrive through readBuffer()/commitRead() as socket reads do, the other
  // half through consume().
  const bool socket_reads = (mode & 4) != 0;
  while (size > 0) {
    size_t n = std::min(cut, size);
    chorus::node::Status status;
    if (socket_reads) {
      auto buffer = decoder.readBuffer();
      n = std::min(n, buffer.size());
      if (n == 0) break;
      std::copy(data, data + n, buffer.begin());
      status = decoder.commitRead(n, on_frame);
    } else {
      status = decoder.consume(data, n, on_frame);
    }
    if (!status.ok()) return 0;  // a clear error is the right answer to bad bytes
    data += n;
    size -= n;
  }
  (void)decoder.finish();
  return 0;
}
