// Straggler injection shared by both training modes: extra compute time per training step,
// drawn from a seeded distribution and spent as real waiting on the trainer thread, so that
// wall-clock results under stragglers are real. Grammar: docs/stragglers.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::faults {

// One term of a profile. A profile is a '+'-separated list of terms whose delays add up.
struct StragglerTerm {
  enum class Kind {
    kFixed,       // fixed:MS                 every step waits MS
    kShiftedExp,  // shifted-exp:BASE,MEAN    BASE + Exponential(mean MEAN) ms per step
    kSlow,        // slow:N=F[,N=F...]        node N computes F times slower (F >= 1)
    kTransient,   // transient:P,LEN,F        with probability P per step a slowdown of LEN
                  //                          steps starts, during which compute is F times slower
  };
  Kind kind = Kind::kFixed;
  double a = 0, b = 0, c = 0;          // the numbers of the term, in the order written
  std::map<uint32_t, double> factors;  // kSlow: node id -> factor
};

// A parsed straggler profile; the empty profile ("none" or "") injects nothing.
struct StragglerProfile {
  std::vector<StragglerTerm> terms;
  std::string text;  // as written

  bool empty() const { return terms.empty(); }
  // Throws std::invalid_argument naming the bad term and the accepted forms.
  static StragglerProfile parse(std::string_view text);
  // Adds the terms of `other` (e.g. a node's own attribute from the topology file).
  StragglerProfile combinedWith(const StragglerProfile& other) const;
};

// Draws the delays of one node. Same profile, seed and node id: same delays, step by step.
class StragglerInjector {
 public:
  StragglerInjector(StragglerProfile profile, uint32_t node_id, uint64_t seed);

  // Extra time for the next step given the step's measured compute time: the sum of the
  // terms' delays (transient factors multiply the compute time), then slow factors multiply
  // the whole step (compute + that sum). Advances the random stream by one step.
  std::chrono::nanoseconds nextDelay(std::chrono::nanoseconds compute);
  // nextDelay() spent as real waiting on the calling thread; returns the time waited.
  std::chrono::nanoseconds waitAfterStep(std::chrono::nanoseconds compute);
  // Total extra time drawn so far.
  std::chrono::nanoseconds totalDelay() const { return total_; }
  // True when no term can ever delay this node.
  bool inert() const;

 private:
  StragglerProfile profile_;
  uint32_t node_id_;
  std::mt19937_64 rng_;
  std::vector<int64_t> transient_left_;  // per term: steps left in its current slowdown
  std::chrono::nanoseconds total_{0};
};

}  // namespace chorus::faults
