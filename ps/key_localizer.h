// The seam between the sampling primitives (ps/sample_worker.h) and the technique that manages
// the rows: "make these keys local to this node, I will read them soon" (Lapse's localize). The
// sampling schemes ask for it (preloc for a sample's keys, pool and postpone for the groups they
// draw ahead); SparseRowAccess::localize (ps/sparse_row_access.h) implements it per technique:
// lapse's relocation shell moves the rows here with the three-message protocol, classic
// placement moves nothing.
#pragma once

#include <functional>
#include <span>

#include "node/status.h"
#include "ps/key_space.h"
#include "ps/shard_map.h"

namespace chorus::ps {

// Moves keys to this node ahead of use.
class KeyLocalizer {
 public:
  // Runs exactly once when the localize ended (ok, or why not); on the loop thread or on the
  // calling thread when it ended at once. A failed localize is harmless: the keys are then read
  // where they are.
  using Done = std::function<void(const node::Status&)>;
  virtual ~KeyLocalizer() = default;
  // Any thread: starts making `keys` (sorted, unique, in the key space) local here and returns
  // at once.
  virtual void localize(std::span<const Key> keys, Done done) = 0;
};

}  // namespace chorus::ps
