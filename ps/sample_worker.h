// NuPS's sampling primitives on the worker side of PS mode: prepareSample(n) announces n keys to
// be drawn from a distribution pi, pullSample(id, k) returns the next k of them with their
// current values. The scheme (sampling/sample_scheme.h: naive, preloc, pool, postpone,
// onlylocal; docs/sampling.md has each one's guarantee) decides which keys and what to do ahead;
// this shell only executes what the scheme returns, through the technique's data path
// (SparseRowAccess, ps/sparse_row_access.h), whatever the technique:
// - the scheme's locality oracle is the access's isLocal (classic: the rows whose home this node
//   is; lapse: the rows held here now; a replicating technique: its replicas as well),
// - the keys it wants local ahead of use go to the access's localize (lapse: the relocation
//   shell moves them here; classic: nothing moves),
// - the values of the keys handed out are read by the access's pull, under the worker's SSP.
// A technique plugs in by implementing SparseRowAccess; nothing here changes.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "node/status.h"
#include "ps/key_space.h"
#include "sampling/negative_sampler.h"
#include "sampling/sample_scheme.h"

namespace chorus::ps {

class SparseRowAccess;

// The keys of one pullSample with their values, in sample order (a key drawn twice appears
// twice, with the same values).
struct SampleBatch {
  std::vector<Key> keys;
  std::vector<float> values;    // every key's floats, one key after the other
  std::vector<size_t> offsets;  // keys[i]'s floats start at values[offsets[i]]
  // keys[i]'s floats.
  std::span<const float> row(size_t i) const {
    const size_t end = i + 1 < offsets.size() ? offsets[i + 1] : values.size();
    return std::span<const float>(values).subspan(offsets[i], end - offsets[i]);
  }
};

// Counters since construction; any thread.
struct SampleWorkerStats {
  sampling::SampleSchemeStats scheme;  // draws, hand-outs, local ones, keys to localize
  uint64_t localize_requests = 0;      // SparseRowAccess::localize calls
  uint64_t localize_ended = 0;         // of those, ended (ok or not)
  uint64_t localize_failed = 0;        // ... with an error (harmless: read where they are)
  uint64_t remote_keys = 0;            // distinct keys per pullSample not local when handed out
};

class SampleWorker {
 public:
  // Samples from `pi` (its keys must lie in one table of `space`: std::invalid_argument
  // otherwise) through `access` (pi, access and space must outlive this). `seed` seeds the
  // scheme (pass sampling::workerSeed(run seed, node)). One SampleWorker per node: the pool is
  // the node's.
  SampleWorker(SparseRowAccess& access, const KeySpace& space, const sampling::NegativeSampler& pi,
               sampling::SampleSchemeOptions options, uint64_t seed);
  SampleWorker(const SampleWorker&) = delete;
  SampleWorker& operator=(const SampleWorker&) = delete;

  // Any thread but the loop's: announces a sample of `n` keys (n > 0) and starts localizing
  // what the scheme asks for, without waiting for it.
  sampling::SampleId prepareSample(size_t n);
  // The trainer thread (the access's pull is its; it blocks until the values are there): the
  // next `k` keys of sample `id` and their current values (as the access's pull reads them,
  // under SSP at the worker's clock) in `out`. An error when the read failed (an owner's error
  // reply, the owner is down, the access was cancelled) or onlylocal found no local key; `out`
  // then holds the keys without values. A k beyond what the sample has left or an unknown id:
  // std::invalid_argument.
  node::Status pullSample(sampling::SampleId id, size_t k, SampleBatch& out);
  // Ends a sample before all its keys were pulled.
  void finishSample(sampling::SampleId id);
  // Any thread but the loop's: blocks until every localize this sampler started has ended (ok
  // or not). Tests and the end of a run; training never waits for a localize.
  void awaitLocalizes() const;

  SampleWorkerStats stats() const;
  const sampling::SampleSchemeOptions& options() const { return options_; }

 private:
  // Shared with the access's localize callbacks, which may run after this object is gone (an
  // access completes them when it is cancelled).
  struct LocalizeCounts {
    mutable std::mutex mu;
    std::condition_variable ended_cv;
    uint64_t requests = 0;
    uint64_t ended = 0;
    uint64_t failed = 0;
  };

  SparseRowAccess& access_;
  const KeySpace& space_;
  sampling::SampleSchemeOptions options_;
  mutable std::mutex mu_;  // guards scheme_ and remote_keys_
  sampling::SampleScheme scheme_;
  uint64_t remote_keys_ = 0;
  std::shared_ptr<LocalizeCounts> localize_counts_ = std::make_shared<LocalizeCounts>();
  // pullSample's buffers (trainer thread).
  std::vector<Key> distinct_;
  std::vector<float> read_;
  std::vector<size_t> at_;
};

}  // namespace chorus::ps
