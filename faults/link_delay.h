// Link latency injection: every frame a node sends is held back for a fixed delay plus a
// seeded uniform jitter before it reaches the socket, in order (node::NodeOptions::link_delay).
// Loopback has almost no latency; real clusters do, and it changes how the training modes
// compare (a PS read is a round trip per clock). Grammar: docs/stragglers.md.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "node/link_limits.h"
#include "node/result.h"

namespace chorus::faults {

// The limits the grammars accept, in milliseconds: the runtime's (node/link_limits.h), which
// validateOptions enforces.
inline constexpr double kMaxLinkDelayMs = static_cast<double>(node::kMaxLinkDelay.count());

struct LinkDelay {
  std::chrono::microseconds delay{0};   // every frame waits at least this long
  std::chrono::microseconds jitter{0};  // plus a uniform draw from [0, jitter)
  std::string text;                     // as written

  friend bool operator==(const LinkDelay&, const LinkDelay&) = default;
  bool empty() const { return delay.count() == 0 && jitter.count() == 0; }
  // "none", "0", "MS" or "MS,JITTER_MS" (decimals allowed), or an error naming the text and
  // the accepted forms.
  static node::Result<LinkDelay> read(std::string_view text);
  // A delay made elsewhere (a run spec's fields), checked against the same limits; `text` is
  // how it was written.
  static node::Result<LinkDelay> fromValues(std::chrono::microseconds delay,
                                            std::chrono::microseconds jitter, std::string text);
};

// Packet loss as TCP lives it: nothing is lost for good, but a lost segment is sent again after
// a retransmission time-out, and the link delivers nothing behind it until then
// (node::NodeOptions::link_loss). Grammar: docs/stragglers.md.
inline constexpr double kMaxLinkLoss = node::kMaxLinkLoss;  // the largest probability accepted
inline constexpr double kMaxLinkRtoMs = static_cast<double>(node::kMaxLinkRto.count());

struct LinkLoss {
  double probability = 0;  // per frame sent
  std::chrono::microseconds rto{node::kDefaultLinkRto};
  std::string text;  // as written

  friend bool operator==(const LinkLoss&, const LinkLoss&) = default;
  bool empty() const { return probability == 0; }
  // "none", "P" or "P,RTO_MS", with P from 0 to kMaxLinkLoss and RTO_MS above 0 and at most
  // kMaxLinkRtoMs, or an error naming the text and the accepted forms.
  static node::Result<LinkLoss> read(std::string_view text);
  // A loss made elsewhere (a run spec's fields), checked against the same limits.
  static node::Result<LinkLoss> fromValues(double probability, std::chrono::microseconds rto,
                                           std::string text);
};

}  // namespace chorus::faults
