// NuPS's sampling primitives on the worker side of PS mode: prepareSample(n) announces n keys to
// be drawn from a distribution pi, pullSample(id, k) returns the next k of them with their
// current values. The scheme (sampling/sample_scheme.h: naive, preloc, pool, postpone,
// onlylocal; docs/sampling.md has each one's guarantee) decides which keys and what to do ahead;
// this shell only executes what the scheme returns: keys to localize go to a KeyLocalizer
// (ps/key_localizer.h), and the values of the keys handed out are read through the KvWorker,
// which serves this node's keys locally and sends one request per other owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "node/status.h"
#include "ps/key_directory.h"
#include "ps/key_localizer.h"
#include "ps/key_space.h"
#include "sampling/negative_sampler.h"
#include "sampling/sample_scheme.h"

namespace chorus::ps {

class KvWorker;

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
  uint64_t localize_requests = 0;      // KeyLocalizer::localize calls
  uint64_t localize_failed = 0;        // of those, ended with an error (harmless: read remotely)
  uint64_t remote_keys = 0;            // distinct keys per pullSample read from other owners
};

// The locality oracle that matches what KvWorker serves without the network today: the keys
// `self` owns in `directory` (which must outlive the oracle and change only on the thread that
// calls the sampler). Replicas count as local once the worker reads them from the replica
// (the replication core's change); until then counting them would send frames for onlylocal.
sampling::LocalityOracle ownedHere(const KeyDirectory& directory, NodeId self);

class SampleWorker {
 public:
  // Samples from `pi` (its keys must lie in one table of `space`: std::invalid_argument
  // otherwise; pi, worker, space and localizer must outlive this). `seed` seeds the scheme (pass
  // sampling::workerSeed(run seed, node)); `local` says which keys this node serves locally.
  SampleWorker(KvWorker& worker, const KeySpace& space, const sampling::NegativeSampler& pi,
               sampling::SampleSchemeOptions options, uint64_t seed, sampling::LocalityOracle local,
               KeyLocalizer& localizer);
  SampleWorker(const SampleWorker&) = delete;
  SampleWorker& operator=(const SampleWorker&) = delete;

  // Any thread but the loop's: announces a sample of `n` keys (n > 0) and starts localizing
  // what the scheme asks for, without waiting for it.
  sampling::SampleId prepareSample(size_t n);
  // Any thread but the loop's (it blocks until the values are there): the next `k` keys of
  // sample `id` and their current values (as KvWorker::pull reads them, under SSP) in `out`.
  // An error when the read failed (an owner's error reply or the owner is down) or onlylocal
  // found no local key; `out` then holds the keys without values. A k beyond what the sample
  // has left or an unknown id: std::invalid_argument.
  node::Status pullSample(sampling::SampleId id, size_t k, SampleBatch& out);
  // Ends a sample before all its keys were pulled.
  void finishSample(sampling::SampleId id);

  SampleWorkerStats stats() const;
  const sampling::SampleSchemeOptions& options() const { return options_; }

 private:
  // Shared with the localizer's callbacks, which may run after this object is gone (the
  // worker completes them when it is cancelled).
  struct LocalizeCounts {
    std::mutex mu;
    uint64_t requests = 0;
    uint64_t failed = 0;
  };

  KvWorker& worker_;
  const KeySpace& space_;
  KeyLocalizer& localizer_;
  sampling::SampleSchemeOptions options_;
  mutable std::mutex mu_;  // guards scheme_ and remote_keys_
  sampling::SampleScheme scheme_;
  uint64_t remote_keys_ = 0;
  std::shared_ptr<LocalizeCounts> localize_counts_ = std::make_shared<LocalizeCounts>();
};

}  // namespace chorus::ps
