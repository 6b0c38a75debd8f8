// Negative samplers: keys drawn from a distribution pi that is not the data's, for negative
// sampling (KGE corrupts a triple's head or tail, word vectors draw unigram^0.75 words). Either
// uniform over a key range or by frequency^alpha through the alias sampler. Every worker draws
// from its own stream, derived from (seed, worker), so that workers are independent of each
// other and a run is reproducible.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "sampling/alias_sampler.h"
#include "sampling/key_stats.h"

namespace chorus::sampling {

// The seed of worker `worker`'s stream of run seed `seed` (splitmix64 of both): distinct workers
// get unrelated streams, the same (seed, worker) always the same one.
uint64_t workerSeed(uint64_t seed, uint64_t worker);

// A distribution to draw keys from. Immutable after construction; share one between workers.
// Its draws are the same with every standard library (no std::*_distribution, whose algorithms
// the standard leaves open): the same seed gives the same negatives everywhere.
class NegativeSampler {
 public:
  // Uniform over the keys [first, end); end > first (std::invalid_argument otherwise).
  static NegativeSampler uniform(Key first, Key end);
  // Key k with probability counts[k]^alpha / sum(counts^alpha) (alpha 0.75: word2vec; alpha 0:
  // uniform over the keys with a count, since 0^0 is taken as 0 here: unseen keys are never
  // drawn). std::invalid_argument when no key has a count or alpha is negative or not finite.
  static NegativeSampler byFrequency(std::span<const uint64_t> counts, double alpha);

  // One key; `rng` is the caller's engine (see NegativeStream).
  Key operator()(std::mt19937_64& rng) const {
    if (alias_) return first_ + (*alias_)(rng);
    return first_ + uniformBelow(rng, end_ - first_);
  }
  // The probability of drawing `key`.
  double probability(Key key) const;
  // The probability of every key 0..end()-1 (keys below first() have 0), for
  // expectedAccesses().
  std::vector<double> distribution() const;
  // One past the largest key it can draw.
  Key end() const { return end_; }
  // The smallest key it can draw.
  Key first() const { return first_; }

 private:
  NegativeSampler(Key first, Key end, std::optional<AliasSampler> alias)
      : first_(first), end_(end), alias_(std::move(alias)) {}
  Key first_ = 0, end_ = 0;
  std::optional<AliasSampler> alias_;  // empty: uniform
};

// One worker's draws from a sampler: its own engine seeded with workerSeed(seed, worker).
// Not thread-safe; one per worker thread.
class NegativeStream {
 public:
  // Draws from `sampler` (which must outlive the stream) for `worker` of run `seed`.
  NegativeStream(const NegativeSampler& sampler, uint64_t seed, uint64_t worker)
      : sampler_(&sampler), rng_(workerSeed(seed, worker)) {}
  // The next key.
  Key next() { return (*sampler_)(rng_); }
  // Fills `out` with the next out.size() keys.
  void fill(std::span<Key> out) {
    for (Key& k : out)
      k = next();
  }

 private:
  const NegativeSampler* sampler_;
  std::mt19937_64 rng_;
};

}  // namespace chorus::sampling
