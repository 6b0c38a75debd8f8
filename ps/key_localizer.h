// The seam between the sampling primitives (ps/sample_worker.h) and relocation: "make these keys
// local to this node, I will read them soon" (Lapse's localize). The sampling schemes ask for it
// (preloc for a sample's keys, pool and postpone for the groups they draw ahead); what it does is
// the relocation core's business. Until that core lands, PrefetchLocalizer stands in: it reads
// the keys ahead instead of moving them.
#pragma once

#include <functional>
#include <span>

#include "node/status.h"
#include "ps/key_space.h"
#include "ps/shard_map.h"

namespace chorus::ps {

class KvWorker;

// Moves keys to this node ahead of use. The relocation core implements this with the
// three-message protocol (requester -> home -> old owner -> requester) and updates the locality
// oracle the sampling schemes ask, so that the keys count as local once moved.
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

// Stands in for relocation until the relocation core implements KeyLocalizer: a localize is a
// read of the keys through the worker, executed at once and not waited for. Ownership does not
// move, so the keys stay remote to the locality oracle; what the read buys is the worker's row
// cache: a pullSample of the keys while that read is fresh enough under SSP (docs/ps.md) is
// served from the cache and sends no frame. With the cache off (asynchronous workers) it only
// costs traffic, and the sampling docs say so (docs/sampling.md).
class PrefetchLocalizer final : public KeyLocalizer {
 public:
  // Reads through `worker` (which must outlive this, and every localize it started) keys of
  // `space`.
  PrefetchLocalizer(KvWorker& worker, const KeySpace& space) : worker_(worker), space_(space) {}
  void localize(std::span<const Key> keys, Done done) override;

 private:
  KvWorker& worker_;
  const KeySpace& space_;
};

}  // namespace chorus::ps
