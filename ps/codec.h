// The PS messages on the wire (ps/ps.fbs: PsPull, PsPush, PsClock, PsReply): how a
// request or an answer becomes a frame body, and how a received body becomes a typed request,
// kept apart from what the worker and the owner do with them. Values travel as a frame's
// attachment where they can (read and written in place, docs/wire-format.md) or in the body's
// `values`. Pure: no node, no socket (tests/ps/codec_test.cc round-trips every message through
// node::encodeFrame and the frame verifier).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "node/frame.h"
#include "ps/ps_service.h"
#include "ps/shard_map.h"
#include "ps/ssp.h"

namespace chorus::node {
class Node;
}

namespace chorus::ps {

// One PS message body, ready to encode: its type, the writer of its table, a size hint and the
// attachment. The writer refers to the spans it was made from: encode it before they change.
struct PsMessage {
  wire::Body type = wire::Body::NONE;
  node::BodyWriter write;
  size_t size_hint = 0;
  node::Attachment attachment;
};
// Encodes `message` as `node`'s frame (header filled by the node).
node::SharedFrame encode(node::Node& node, PsMessage message);
// Encodes `message` with the given header, without a node (tests, fuzzing seeds).
node::SharedFrame encodeFrame(const node::EnvelopeHeader& header, PsMessage message);

// Worker -> owner: read `keys` (sorted, unique) once every live worker reached `min_clock`. The
// keys travel as runs (ps/key_runs.h), encoded when the message is.
// With `want_slots`, the owner's reply also names the keys' slot runs (pullBySlots, pushBySlots).
PsMessage pullRequest(uint64_t request, Clock clock, Clock min_clock, std::span<const Key> keys,
                      bool want_slots = false);
// Worker -> owner: the pull of rows the owner named by slot (`slot_runs`, encoded SlotRuns, as its
// store had them at `layout`) in an earlier reply; no key travels (issue 25).
PsMessage pullBySlots(uint64_t request, Clock clock, Clock min_clock,
                      std::span<const uint8_t> slot_runs, uint64_t layout);
// Worker -> owner: the gradients of `keys` (sorted, unique; their floats, `floats` in all, in
// `pieces` one after the other), copied into the body, or with `attach`, sent as the attachment
// straight from the pieces (which must then stay unchanged until the frame was written). The
// pieces need not be one per key: rows next to each other in memory are one piece.
PsMessage pushRequest(uint64_t request, Clock clock, std::span<const Key> keys,
                      std::span<const std::span<const float>> pieces, size_t floats, bool attach);
// Worker -> owner: a push to rows named by slot, as pullBySlots; the gradients travel as the
// attachment straight from `pieces` (unchanged until the frame was written).
PsMessage pushBySlots(uint64_t request, Clock clock, std::span<const uint8_t> slot_runs,
                      uint64_t layout, std::span<const std::span<const float>> pieces);
// Worker -> every owner: every clock below `clock` is done.
PsMessage clockAnnouncement(Clock clock);
// Owner -> worker: the values of a pull (pieces of the store: runs of rows next to each other,
// KeyStore::rowsOf, in the order of its keys), and the owner's minimum worker clock; the
// request id names the keys. Pieces of kSmallRowFloats floats or less on average are copied
// into the body (one contiguous frame: a piece per scattered 1-float row would cost an iovec
// per key); larger ones travel as the attachment, straight from the store.
inline constexpr size_t kSmallRowFloats = 64;
// With `slot_runs` (a pull that asked want_slots): the keys' slot runs, valid at `layout`.
PsMessage pullReply(uint64_t request, Clock min_clock, std::span<const std::span<const float>> rows,
                    size_t floats, std::span<const uint8_t> slot_runs = {}, uint64_t layout = 0);
// Owner -> worker: a push was applied.
PsMessage pushAck(uint64_t request);
// Owner -> worker: the request was refused (nothing applied); request 0 for a PsClock.
PsMessage errorReply(uint64_t request, wire::PsOp op, std::string_view error);
// Owner -> worker: the request named slots of a layout this owner's store no longer has: nothing
// was applied; the worker asks again by keys.
PsMessage staleReply(uint64_t request, wire::PsOp op, std::string_view error);

// The floats of a PsPush or PsReply: its `values`, or the frame's attachment when `values` is
// absent (the attachment buffer is aligned for any scalar); nullopt when both are present or
// the attachment is not whole floats.
std::optional<std::span<const float>> valuesOf(const flatbuffers::Vector<float>* values,
                                               std::span<const uint8_t> attachment);
std::optional<std::span<const float>> valuesOf(const flatbuffers::Vector<float>* values,
                                               const node::InboundFrame& frame);

// A received PsPull; `keys` point into the frame or into the caller's key buffer. A request that
// names slots instead has no keys, and `slot_runs` (encoded, into the frame) and `layout`.
struct PullRequest {
  uint64_t request = 0;
  Clock clock = 0;
  Clock min_clock = 0;
  std::span<const Key> keys;
  std::span<const uint8_t> slot_runs;
  uint64_t layout = 0;
  bool by_slots = false;
  bool want_slots = false;
};
// A received PsPush; `grads` point into the frame, keys or slots as in PullRequest.
struct PushRequest {
  uint64_t request = 0;
  Clock clock = 0;
  std::span<const Key> keys;
  std::span<const float> grads;
  std::span<const uint8_t> slot_runs;
  uint64_t layout = 0;
  bool by_slots = false;
};
// A received PsReply; spans point into the frame. `keys` is empty unless an older owner
// sent them.
struct ReplyView {
  uint64_t request = 0;
  wire::PsOp op = wire::PsOp::Pull;
  std::string error;  // empty: no error
  Clock min_clock = 0;
  std::span<const Key> keys;
  std::span<const uint8_t> slot_runs;  // a pull that asked want_slots, valid at `layout`
  uint64_t layout = 0;
  bool stale = false;  // with `error`: ask again by keys
};

// The request of a verified PsPull body, or why it is malformed (its request id is still set):
// exactly one of `keys`, `key_runs` and `slot_runs` (left encoded, for the owner's store), runs
// that decode (ps/key_runs.h) to at most `max_keys` keys (the owner's: as many as it holds). Runs
// are decoded into `key_buffer`.
std::optional<std::string> decodePull(const wire::PsPull& body, size_t max_keys,
                                      std::vector<Key>& key_buffer, PullRequest& out);
// The request of a verified PsPush body with its frame's attachment, or why it is malformed;
// keys as decodePull's, and never more keys than floats.
std::optional<std::string> decodePush(const wire::PsPush& body, std::span<const uint8_t> attachment,
                                      size_t max_keys, std::vector<Key>& key_buffer,
                                      PushRequest& out);
// The fields of a verified PsReply body.
ReplyView decodeReply(const wire::PsReply& body);

}  // namespace chorus::ps
