// The training loop every mode runs (single node, consensus, PS): batching, the local step and
// its learning-rate schedule, the straggler wait, the divergence check, evaluation every N steps,
// the time to the target accuracy, traffic counters and the start / step / target / final
// events of the node's JSON-lines metrics file. A mode adds only what it exchanges with its
// peers, through a TrainingStrategy: consensus sends and mixes models after the local step, PS
// reads the model before it and pushes the gradient after it, a single node does nothing.
// Trainer thread; no networking here.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ml/metrics.h"
#include "ml/train.h"
#include "run/node_id.h"
#include "run/training_run.h"

namespace spdlog {
class logger;
}

namespace chorus::run {

// Bytes this node sent and received so far (all peers).
struct Traffic {
  uint64_t bytes_out = 0;
  uint64_t bytes_in = 0;
};

// What one step of a mode did besides the local gradient.
struct StepExchange {
  bool stopped = false;  // stop() ended the step: the run ends without it
  double wait_s = 0;     // time spent waiting for peers in this step
};

struct LoopReport;

// What the metrics files call a training step, in every mode: the step events
// (`{"event":"step","step":K,...}`, K from 0), the step field of `target` events, and the final
// event's `steps` (the last step finished + 1) and `first_step`; the start event's `steps` is the
// number of steps planned. Files written before this name was shared say `round` (consensus,
// single) or `clock` (PS) in the same places, and `chorus report` still reads them.
inline constexpr std::string_view kStepName = "step";

// What a mode adds to the loop. Every hook runs on the trainer thread.
class TrainingStrategy {
 public:
  virtual ~TrainingStrategy() = default;
  // The mode as the start event names it: "single", "consensus" or "ps".
  virtual std::string_view mode() const = 0;
  // What a step is called in logs and messages: "round" or "clock" (the metrics say kStepName).
  virtual std::string_view stepName() const = 0;
  // Whether the loop applies the optimizer locally (consensus, single); PS owners apply it.
  virtual bool stepsLocally() const { return true; }
  // The rate of `step` when the loop does not step locally.
  virtual double remoteLr(int64_t /*step*/) const { return 0; }
  // The mode's fields of the start event and its start-up log line.
  virtual void describe(ml::MetricsEvent& /*start*/) {}
  // The step to begin at (a rejoin's catch-up may write events), before the run's clock starts.
  virtual int64_t firstStep(ml::MetricsWriter& /*metrics*/) { return 0; }
  // Whether the run ends before `step` (one past the last step run).
  virtual bool finished(int64_t step) const = 0;
  // Before the gradient of `step` (PS: read the model).
  virtual StepExchange beforeGradient(int64_t /*step*/) { return {}; }
  // Right after the gradient of `step` (the model's logits and grads of the batch with
  // `labels`), before the optimizer (consensus: gradient statistics; one node: accuracy).
  virtual void afterGradient(int64_t /*step*/, const ml::Model& /*model*/,
                             std::span<const int32_t> /*labels*/) {}
  // What to say when the loss of `step` is not finite (the loop throws it).
  virtual std::string divergence(double loss, int64_t step) const;
  // After the local step and the straggler wait of `step`, which took `compute_s`: the exchange
  // with the peers. May move `step` forward (consensus iteration skipping).
  virtual StepExchange exchange(int64_t& /*step*/, double /*compute_s*/) { return {}; }
  // The mode's fields of the step event (after the common ones).
  virtual void describeStep(ml::MetricsEvent& /*event*/) {}
  // Whole-cluster checkpoints (docs/checkpoints.md): after the step event of step cut-1, when
  // job.cuts.cutAt(cut, rounds): this node's part of cut `cut`, holding what the loop owns (the
  // header, the local optimizer's state, the progress record); the mode adds its own state
  // and writes it (run::writeNodeCheckpoint), now or, when its state is complete only later
  // (PS: at the cut's barrier), before its next step.
  virtual void cutReached(NodeCheckpoint& /*part*/) {}
  // After the step event of `step` was written (answer requests, progress, tests' hooks), with
  // the test evaluation of this step when there was one.
  virtual void afterStep(int64_t /*step*/, double /*loss*/, const ml::Evaluation* /*evaluated*/) {}
  // After the last step, before the final evaluation (PS: the last push).
  virtual void afterLastStep() {}
  // Bytes sent and received so far.
  virtual Traffic traffic() const { return {}; }
  // After the final evaluation, before finish().
  virtual void ended(const LoopReport& /*report*/) {}
  // The end of the run with the peers (not after a stop): final models, TrainingDone, the wait
  // for the others. Fills `finished` and `departed` with the members that said TrainingDone and
  // those that left first.
  virtual void finish(int64_t /*steps_done*/, std::vector<NodeId>& /*finished*/,
                      std::vector<NodeId>& /*departed*/) {}
  // The mode's fields of the final event (after finish()).
  virtual void describeEnd(ml::MetricsEvent& /*final_event*/) {}
};

// What a run achieved, in every mode.
struct LoopReport {
  int64_t first_step = 0;  // 0, or where a rejoin or a resume took up the run
  int64_t steps_done = 0;  // the last step finished + 1
  bool stopped = false;    // stop() ended it early
  double seconds = 0;      // of the steps, from the first to the final evaluation
  double wait_seconds = 0;
  ml::Evaluation final;  // the final test evaluation (with its confusion matrix when asked)
  std::optional<double> time_to_target;  // seconds until the test accuracy reached the target
  std::vector<NodeId> finished_peers;    // members that said TrainingDone
  std::vector<NodeId> departed_peers;    // members that went down or left before that
};

struct LoopOptions {
  bool append_metrics = false;  // a rejoining node keeps its earlier life's lines
  bool confusion = false;       // the final evaluation computes the confusion matrix
  // The batches continue where a run of firstStep() steps left them (a resumed run); otherwise
  // they start at the shard's first epoch (a rejoining node).
  bool continue_batches = false;
  // The optimizer's velocity to start from (a resumed checkpoint's); empty: zero.
  std::vector<float> optimizer_state;
  // A checkpoint of the model (and the optimizer's velocity) every save_every steps (0: only at
  // the end) and after the last step, unless stopped; empty: none.
  std::string save_path;
  int64_t save_every = 0;
};

// Runs `job` with `strategy`: the start event, the steps from strategy.firstStep() until
// strategy.finished(), evaluation every job.eval_every steps, the final evaluation,
// strategy.finish() and the final event. Throws std::runtime_error when training diverges.
LoopReport runTrainingLoop(NodeJob& job, TrainingStrategy& strategy, spdlog::logger& log,
                           const LoopOptions& options = {});

}  // namespace chorus::run
