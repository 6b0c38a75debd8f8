// The limits of the link faults a node can inject (NodeOptions::link_delay, link_jitter,
// link_loss, link_rto), written once: the runtime enforces them (validateOptions) and the
// fault-injection grammars (faults/link_delay.h) accept exactly these. No dependencies, so that
// the grammar can include it without the runtime.
#pragma once

#include <chrono>

namespace chorus::node {

// The longest link delay or jitter: beyond it the runtime's time-outs (handshake, peer
// liveness) would have to grow with it.
inline constexpr std::chrono::milliseconds kMaxLinkDelay{10'000};
// The largest NodeOptions::link_loss (a probability per frame).
inline constexpr double kMaxLinkLoss = 0.5;
// The longest NodeOptions::link_rto, and its default (Linux's smallest retransmission time-out).
inline constexpr std::chrono::milliseconds kMaxLinkRto{10'000};
inline constexpr std::chrono::milliseconds kDefaultLinkRto{200};
// The most retransmissions one frame may wait for under link_loss (1 + 2 + 4 time-outs), so
// that the longest stall is known and can be kept below the peer time-out.
inline constexpr int kMaxLinkRetransmissions = 3;

}  // namespace chorus::node
