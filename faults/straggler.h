// Straggler injection shared by both training modes: extra compute time per training step,
// drawn from a seeded distribution and spent as real waiting on the trainer thread, so that
// wall-clock results under stragglers are real; and injected crashes (crash:NODE@STEP), which
// end the process after a given step. Grammar: docs/stragglers.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "node/result.h"

namespace chorus::faults {

// One term of a profile. A profile is a '+'-separated list of terms whose delays add up.
struct StragglerTerm {
  enum class Kind {
    kFixed,       // fixed:MS                 every step waits MS
    kShiftedExp,  // shifted-exp:BASE,MEAN    BASE + Exponential(mean MEAN) ms per step
    kSlow,        // slow:N=F[,N=F...]        node N computes F times slower (F >= 1)
    kTransient,   // transient:P,LEN,F        with probability P per step a slowdown of LEN
                  //                          steps starts, during which compute is F times slower
    kCrash,       // crash:N@S[,N@S...]       node N's process dies right after its step S
  };
  Kind kind = Kind::kFixed;
  double a = 0, b = 0, c = 0;               // the numbers of the term, in the order written
  std::map<uint32_t, double> factors;       // kSlow: node id -> factor
  std::map<uint32_t, int64_t> crash_steps;  // kCrash: node id -> its last step (1-based)

  friend bool operator==(const StragglerTerm&, const StragglerTerm&) = default;
};

// A parsed straggler profile; the empty profile ("none" or "") injects nothing.
struct StragglerProfile {
  std::vector<StragglerTerm> terms;
  std::string text;  // as written

  friend bool operator==(const StragglerProfile&, const StragglerProfile&) = default;
  bool empty() const { return terms.empty(); }
  // The profile written in `text` (docs/stragglers.md), or an error naming the bad term and the
  // accepted forms, also when two crash terms name the same node. Where a flag or a file's
  // attribute enters; from there the profile travels typed.
  static node::Result<StragglerProfile> read(std::string_view text);
  // A profile of terms made elsewhere (a run spec's fields): the same range checks as read(),
  // the error naming `text`, the profile as written.
  static node::Result<StragglerProfile> fromTerms(std::vector<StragglerTerm> terms,
                                                  std::string text);
  // Adds the terms of `other` (e.g. a node's own attribute from the topology file); an error
  // when both give a crash step for the same node.
  node::Result<StragglerProfile> combinedWith(const StragglerProfile& other) const;
  // The node ids its slow and crash terms name, sorted, each once.
  std::vector<uint32_t> namedNodes() const;
  // The terms that act on node `id`: slow and crash terms keep only that node's entry (and are
  // left out when they have none), the others stay as they are. The delays it draws for `id`
  // are the same as the whole profile's (slow and crash terms draw nothing). Its text is the
  // canonical form of what is kept ("none" when nothing is).
  StragglerProfile restrictedTo(uint32_t id) const;
};

// Draws the delays of one node. Same profile, seed and node id: same delays, step by step.
class StragglerInjector {
 public:
  StragglerInjector(StragglerProfile profile, uint32_t node_id, uint64_t seed);

  // Extra time for the next step given the step's measured compute time: the sum of the
  // terms' delays (transient factors multiply the compute time), then slow factors multiply
  // the whole step (compute + that sum). Advances the random stream by one step.
  std::chrono::nanoseconds nextDelay(std::chrono::nanoseconds compute);
  // nextDelay() spent as real waiting on the calling thread; returns the time waited. When
  // the step just counted is this node's crash step, ends the process after the wait
  // (crashProcess in faults/crash.h) and does not return.
  std::chrono::nanoseconds waitAfterStep(std::chrono::nanoseconds compute);
  // Total extra time drawn so far.
  std::chrono::nanoseconds totalDelay() const { return total_; }
  // Steps counted so far: one per nextDelay() call.
  int64_t steps() const { return steps_; }
  // The step after which this node crashes (1-based), or 0 when no term crashes it.
  int64_t crashStep() const { return crash_step_; }
  // True when the step nextDelay() counted last is this node's crash step.
  bool crashDue() const { return crash_step_ > 0 && steps_ == crash_step_; }
  // True when no term can ever delay this node or end its process.
  bool inert() const;

 private:
  StragglerProfile profile_;
  uint32_t node_id_;
  std::mt19937_64 rng_;
  std::vector<int64_t> transient_left_;  // per term: steps left in its current slowdown
  std::chrono::nanoseconds total_{0};
  int64_t steps_ = 0;
  int64_t crash_step_ = 0;  // 0: never
};

}  // namespace chorus::faults
