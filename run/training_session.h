// A training mode's run on a started node, as `chorus node` drives it, and what it achieved in
// the terms every mode shares: the loop's report plus the lines the mode adds. Each training
// mode builds one in its own folder (consensus/consensus_session.h, ps/ps_session.h,
// run/single_session.h); its registry entry (modes/registry.cc) names the builder, and the CLI
// prints the outcome and writes --save's checkpoint the same way for every mode.
#pragma once

#include <string>
#include <vector>

#include "run/training_loop.h"

namespace chorus::run {

// What a mode's run achieved, as the node prints it.
struct TrainingOutcome {
  std::string steps;  // what `loop.steps_done` counts, plural: "rounds" or "clocks"
  LoopReport loop;
  std::string waiting = "waiting";   // what the wait time was spent on (and the cache's share)
  std::vector<std::string> before;   // lines before the result (a rejoin)
  std::vector<std::string> after;    // lines after it (the average's or the owners' accuracy)
  std::vector<float> model_to_save;  // --save: node 0's final model (empty: nothing to save)
  bool saved = false;                // the run wrote --save itself
};

// A training mode's run, built on a node before it listens (its handlers in place).
class TrainingRun {
 public:
  virtual ~TrainingRun() = default;
  // Trainer thread, once every peer is connected: trains to the end. Throws for a failed run
  // (the node exits 1 with the message).
  virtual TrainingOutcome run() = 0;
  // Any thread (a signal): ends run() early.
  virtual void stop() = 0;
};

}  // namespace chorus::run
