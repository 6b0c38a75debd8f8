// The staleness bound of a distributed run, one value with one grammar for every place it
// enters or leaves: the --staleness flag (both modes), compare's variant names (ps:bsp,
// ps:ssp:N, ps:async), the metrics files and the run fingerprint. PS mode reads it as SSP's
// bound s (a worker at clock c sees every update from clocks <= c-s-1); consensus mode as tau
// (a neighbor's model may be used up to tau rounds late). No networking, no I/O.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "node/result.h"

namespace CLI {
class App;
}

namespace chorus::run {

struct StalenessBound {
  // The bound of a fully asynchronous run (PS mode only).
  static constexpr int64_t kInfinite = std::numeric_limits<int64_t>::max();
  int64_t bound = 0;

  bool infinite() const { return bound == kInfinite; }
  // "N" (a whole number >= 0), "bsp" (= 0), "ssp:N" (= N), "async" or "inf" (= infinite), or
  // the error "bad staleness '<text>': ..." naming the accepted forms.
  static node::Result<StalenessBound> read(std::string_view text);
  // "N" or "inf": what the metrics files and the run fingerprint hold (read() reads it back).
  std::string toString() const;
  // "bsp", "ssp:N" or "async": the tail of a PS variant's name in `chorus compare` ("ps:" +
  // this); read() reads it back.
  std::string variantName() const;
  // The lowest step every peer must have reached before a reader at `reader_step` may go on
  // (reader_step - bound); the lowest possible step when the bound is infinite.
  int64_t requiredMinStep(int64_t reader_step) const;

  friend bool operator==(const StalenessBound&, const StalenessBound&) = default;
};

// Both modes' default bound.
inline constexpr StalenessBound kDefaultStaleness{2};

// Registers --staleness on `cmd`, parsed once into `target` (a bad value is refused by CLI11
// naming the flag), and --staleness-bound, its old spelling in consensus mode, hidden, accepted
// for one release with a deprecation line on stderr.
void addStalenessOption(CLI::App& cmd, StalenessBound& target);

}  // namespace chorus::run
