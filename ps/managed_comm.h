// Managed communication (Bösen: Wei et al., "Managed Communication and Consistency for Fast
// Data-Parallel Iterative Analytics", SoCC 2015), the cores without networking: the per-node
// bandwidth budget (a token bucket over the bytes the node actually sent), the priority of a
// key (the relative magnitude of how much it changed, as Bösen's code computes it) and the
// choice of the next message's keys. The network shell is ps/managed_comm_shell.h; the design
// and the measurements are in docs/managed-comm.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "ps/key_space.h"
#include "ps/ssp.h"

namespace chorus::ps {

// The bandwidth budget of one node: `rate` bytes per second accumulate up to `burst` bytes.
// Everything the node sends is charged (nothing but managed traffic is ever held back for it:
// pulls, pushes and clocks go at once and may drive the balance below zero, a debt that managed
// sends wait out). Bytes are measured, not guessed: managed frames are charged when queued
// (their encoded size), and the node's byte counter, observed now and then, charges whatever
// else went out. Pure: time is passed in.
class TokenBucket {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  // `bytes_per_s` > 0 and `burst_bytes` > 0 (std::invalid_argument otherwise); starts full.
  TokenBucket(double bytes_per_s, double burst_bytes, TimePoint start);

  // Adds what accumulated since the last refill (never past the burst).
  void refill(TimePoint now);
  // A managed frame of `bytes` was queued: charged now, before the socket counts it.
  void chargeQueued(uint64_t bytes);
  // The node's counter of bytes sent now reads `bytes_out_total`: what it counts beyond every
  // byte charged so far (queued managed frames included) is charged as other traffic. A counter
  // that has not caught up with the queued frames yet charges nothing.
  void observeSent(uint64_t bytes_out_total);
  // May a managed frame go now (the balance is positive)?
  bool canSend() const { return tokens_ > 0; }
  double tokens() const { return tokens_; }
  // How long until the balance is positive again (zero when it is).
  std::chrono::nanoseconds untilPositive() const;
  double rate() const { return rate_; }
  double burst() const { return burst_; }
  // Bytes charged so far: managed frames queued, and other traffic observed.
  uint64_t managedBytes() const { return managed_; }
  uint64_t otherBytes() const { return other_; }

 private:
  double rate_;
  double burst_;
  double tokens_;
  TimePoint last_;
  uint64_t charged_ = 0;  // every byte charged, managed or observed
  uint64_t managed_ = 0;
  uint64_t other_ = 0;
};

// The budget of an owner that sends messages of up to `message_bytes` to `receivers` other
// nodes: `mbps` Mbit/s (> 0), holding at most `burst_s` seconds of the rate but at least one
// message to every receiver and itself. Full at `now`. The dense and the sparse shells' bucket.
TokenBucket ownerBudget(double mbps, double burst_s, size_t message_bytes, size_t receivers,
                        TokenBucket::TimePoint now);

// When an owner's sender must read its rows again (a pass reads every row it owns): not while
// no update was applied and no clock passed since a pass that found nothing to send with
// budget left. Pure.
class ScanPacer {
 public:
  // Is a pass due, with `updates` applied so far and the owner's minimum clock `min_clock`?
  bool due(uint64_t updates, Clock min_clock) const {
    return updates != updates_ || min_clock != min_clock_;
  }
  // A pass found nothing to send while the budget allowed: skip until an update or a clock.
  void settled(uint64_t updates, Clock min_clock) {
    updates_ = updates;
    min_clock_ = min_clock;
  }

 private:
  uint64_t updates_ = 0;
  Clock min_clock_ = -1;
};

// Bösen's priority of an update: sum over its floats of |delta / value|, with `before` the
// value the delta was made to (|delta| alone where that value is 0). `now` and `before` have
// the same length.
double relativeChange(std::span<const float> now, std::span<const float> before);

// An owner's record of the values it last sent of each key (server push), and the choice of
// the next keys to send: those that changed most since, by relativeChange, packed up to a
// message size. Pure; the caller reads the values (its store) and sends.
class ChangeTracker {
 public:
  using Rows = std::function<std::span<const float>(Key)>;

  // Tracks `keys` (sorted, unique) with `now(key)` as what was sent last (the initial model,
  // which every worker starts from).
  ChangeTracker(std::vector<Key> keys, const Rows& now);

  // The keys whose values moved since they were last sent, most changed first (ties to the
  // lower key), as many as fit in `max_bytes` of floats (at least one when any moved). Reads
  // every tracked row once.
  std::vector<Key> pick(const Rows& now, size_t max_bytes) const;
  // Every key whose values moved since it was last sent, most changed first (ties to the lower
  // key). Reads every tracked row once.
  std::vector<Key> ranked(const Rows& now) const;
  // How many of `ranked`'s leading keys fit in `max_bytes` of floats (at least one when it is
  // not empty): the next message's keys.
  size_t fits(std::span<const Key> ranked, size_t max_bytes) const;
  // `key` was sent with `values` (its length must be the tracked one).
  void sent(Key key, std::span<const float> values);
  const std::vector<Key>& keys() const { return keys_; }

 private:
  std::vector<Key> keys_;
  std::unordered_map<Key, std::vector<float>> last_sent_;
};

}  // namespace chorus::ps
