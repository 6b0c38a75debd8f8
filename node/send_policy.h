// Send-side backpressure (docs/errors.md, "Slow peers"): what Node::send does with a frame for a
// peer whose queue would grow past NodeOptions::max_queued_bytes. The caller chooses per
// message class: a gossip model share that the next round supersedes may push older shares out
// of the queue; a request that must arrive is refused, and the caller decides (retry after the
// peer's kDrained event, or report the peer as slow).
#pragma once

#include <cstdint>

namespace chorus::node {

enum class WhenFull {
  // The frame is not queued: its callback fires at once with kOverloaded.
  kRefuse,
  // Older frames of the same kind that are still queued (not yet handed to the socket) are
  // dropped, oldest first, until the frame fits; their callbacks fire with kOverloaded
  // ("superseded"). When that is not enough, the frame is refused as with kRefuse.
  kDropOlderOfKind,
};

// How one send treats a full queue.
struct SendOptions {
  WhenFull when_full = WhenFull::kRefuse;
  // Which frames supersede each other under kDropOlderOfKind; 0: the frame's message kind
  // (OutboundFrame::kind(): its runtime body type, or its service and that service's kind).
  uint32_t kind = 0;
};

}  // namespace chorus::node
