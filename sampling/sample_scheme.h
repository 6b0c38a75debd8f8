// NuPS's sampling primitives as a pure core: prepare(n) announces that n keys will be drawn from
// a distribution pi, pull(id, k) hands out the next k of them. Five schemes decide when the keys
// are drawn and how they are made local (docs/sampling.md, "Sampling schemes", has each one's
// guarantee). The core does no networking and knows no PS type: it asks a locality oracle whether
// a key is local now, and returns what the network shell must do as plain key lists ("localize
// these", "these are remote"), so that the shell (ps/sample_worker.h) stays a thin loop over
// KvWorker and the relocation seam. Deterministic: the same seed, options, oracle answers and
// calls give the same keys with every standard library (std::mt19937_64 and the sampler's own
// arithmetic, no std::*_distribution or std::shuffle).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sampling/negative_sampler.h"

namespace chorus::sampling {

// Strongest guarantee first. The names are the flag values (--sample-scheme) and NuPS's.
enum class SampleSchemeKind {
  kNaive,      // i.i.d. draws at pull time, read wherever they live: exact, independent
  kPreloc,     // i.i.d. draws at prepare, localized at once: exact, independent
  kPool,       // groups drawn ahead and localized, each handed out `reuse` times: marginally pi
  kPostpone,   // pool, and a key not local at its turn goes to the end of its sample: multiset
  kOnlyLocal,  // draws until the key is local, never the network: pi restricted to local keys
};

// The flag value of `kind` ("naive", "preloc", "pool", "postpone", "onlylocal").
const char* sampleSchemeName(SampleSchemeKind kind);
// The scheme a flag value names, or nullopt.
std::optional<SampleSchemeKind> parseSampleScheme(std::string_view name);

struct SampleSchemeOptions {
  SampleSchemeKind kind = SampleSchemeKind::kNaive;
  // pool, postpone: how many times each drawn group is handed out (--sample-reuse; NuPS's
  // untuned setting is 16). 1 hands every draw out once.
  uint32_t reuse = 1;
  // pool, postpone: keys drawn (and localized) together (NuPS: 250).
  size_t group_size = 256;
  // pool, postpone: groups kept drawn beyond what prepared samples took, so that they are
  // being localized while the current samples are used.
  size_t groups_ahead = 2;
  // onlylocal: draws per key before giving up (the node holds too little of pi's mass).
  uint64_t max_draws_per_key = uint64_t{1} << 20;
};

// Why `options` cannot be used (reuse, group_size or max_draws_per_key of 0), or nullopt.
std::optional<std::string> checkSampleOptions(const SampleSchemeOptions& options);

// The options of the flags --sample-scheme `scheme` and --sample-reuse `reuse` (nullopt: not
// given; 16 for pool and postpone then, NuPS's untuned setting), parsed once where the flags
// enter: an error naming the flag when the scheme is unknown, the reuse is not in [1, 1000000],
// or a reuse is given for a scheme that does not reuse (naive, preloc, onlylocal).
std::optional<std::string> sampleOptionsFromFlags(std::string_view scheme,
                                                  std::optional<int64_t> reuse,
                                                  SampleSchemeOptions& out);

// Largest group poolGroupSize() chooses (keys drawn and localized together).
inline constexpr size_t kMaxPoolGroup = size_t{1} << 16;

// The group size for pool and postpone when each sample has `sample_keys` keys: at least
// options.reuse samples' worth (at most kMaxPoolGroup, never below options.group_size), so that
// one pass through a group spans `reuse` samples. A group no larger than a sample would be one
// sample handed out `reuse` times in a row: `reuse` consecutive samples of the same keys, which
// a step that shares its negatives sees as the same negatives `reuse` times (docs/sampling.md,
// "Pool in detail"). options.group_size for the other schemes.
size_t poolGroupSize(size_t sample_keys, const SampleSchemeOptions& options);

// "Is key k local to this node now?": owned or replicated here, so that reading it sends no
// frame. Called on the thread that calls the scheme; may change its answers between calls.
using LocalityOracle = std::function<bool(Key)>;

// Identifies one prepared sample.
using SampleId = uint64_t;

struct PreparedSample {
  SampleId id = 0;
  // Keys to make local ahead of use (sorted, unique, none local when the scheme asked): the
  // shell hands them to its localizer and does not wait.
  std::vector<Key> localize;
};

struct SampleKeys {
  // The keys handed out, in sample order (a key may repeat).
  std::vector<Key> keys;
  // Those among them that were not local at pull time (sorted, unique): their values come over
  // the network. Always empty for onlylocal.
  std::vector<Key> remote;
  // onlylocal found no local key within max_draws_per_key draws: `keys` holds what it found
  // before (the sample is used up either way). Nullopt otherwise.
  std::optional<std::string> error;
};

// Counters since construction.
struct SampleSchemeStats {
  uint64_t prepared = 0;    // samples prepared
  uint64_t drawn = 0;       // draws from pi (onlylocal: rejected draws included)
  uint64_t handed_out = 0;  // keys pull() returned
  uint64_t local = 0;       // of those, local at pull time
  uint64_t localize = 0;    // keys asked to be localized
  uint64_t postponed = 0;   // postpone: keys moved to the end of their sample
};

// One node's sampling state (the pool is per node: use one scheme for every worker of a node).
// Not thread-safe: one thread calls it (the shell serializes its callers).
class SampleScheme {
 public:
  // Draws from `pi` (which must outlive this) with an engine seeded by `seed` (the shell passes
  // workerSeed(run seed, node)). std::invalid_argument when checkSampleOptions fails or `local`
  // is empty.
  SampleScheme(const NegativeSampler& pi, SampleSchemeOptions options, uint64_t seed,
               LocalityOracle local);

  // Announces a sample of `n` keys (n > 0, std::invalid_argument otherwise). naive and
  // onlylocal draw nothing yet; preloc draws the n keys; pool and postpone take the next n keys
  // of the pool, drawing groups so that groups_ahead remain. `localize` lists the drawn keys
  // that are not local (preloc: the sample's; pool: new groups' and the sample's own).
  PreparedSample prepare(size_t n);
  // Hands out the next `k` keys of sample `id` (k at most what is left of it; an unknown id or
  // a larger k: std::invalid_argument). The sample ends once all its keys are handed out.
  SampleKeys pull(SampleId id, size_t k);
  // Ends sample `id` before all its keys were handed out (no-op for an ended or unknown id).
  void finish(SampleId id);

  // Keys a sample has left (0 for an ended or unknown id).
  size_t remaining(SampleId id) const;
  // Samples prepared and not yet ended.
  size_t openSamples() const { return samples_.size(); }
  // Keys drawn for the pool and not yet taken by a sample (pool, postpone).
  size_t poolSize() const { return pool_.size(); }
  const SampleSchemeOptions& options() const { return options_; }
  const SampleSchemeStats& stats() const { return stats_; }

 private:
  struct Sample {
    size_t left = 0;          // keys still to hand out
    std::vector<Key> keys;    // preloc, pool, postpone: the sample's keys, in order
    size_t next = 0;          // the next of `keys` to consider
    std::deque<Key> delayed;  // postpone: keys moved to the end, in the order they were moved
  };

  // Draws groups until the pool holds `n` keys beyond groups_ahead groups' hand-outs; appends
  // every new group's keys to `drawn`.
  void fillPool(size_t n, std::vector<Key>& drawn);
  // One key from pi.
  Key draw();
  // Fisher-Yates with uniformBelow (std::shuffle's algorithm is the library's choice).
  void shuffle(std::vector<Key>& keys);
  // The keys of `keys` not local now, sorted and unique.
  std::vector<Key> notLocal(const std::vector<Key>& keys) const;
  // The next key of a postpone sample: a local one first, else the oldest moved one.
  Key nextPostponed(Sample& sample);

  const NegativeSampler* pi_;
  SampleSchemeOptions options_;
  std::mt19937_64 rng_;
  LocalityOracle local_;
  SampleId next_id_ = 1;
  std::unordered_map<SampleId, Sample> samples_;
  std::deque<Key> pool_;  // pool, postpone: keys in hand-out order
  SampleSchemeStats stats_;
};

}  // namespace chorus::sampling
