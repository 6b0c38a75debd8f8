// One node training alone: the training loop with no peers. `chorus train` (the image models)
// and a one-node cluster of `chorus node` (the single variant of `chorus compare`) both run it,
// so the baseline and the distributed runs share one loop and one metrics format.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ml/metrics.h"
#include "run/training_loop.h"
#include "run/training_run.h"

namespace spdlog {
class logger;
}

namespace chorus::run {

// What a single-node run achieved: what every mode reports, and its epochs.
struct SingleReport : LoopReport {
  std::vector<double> epoch_losses;  // mean training loss of each epoch run here
  double epochs_done = 0;            // steps_done over the steps of one epoch, a resume's included
  int64_t steps_per_epoch = 0;
  double samples_per_second = 0;  // of the steps run here
  size_t parameters = 0;
  std::string model_spec;
};

// How a single-node run reports and checkpoints itself.
struct SingleOptions {
  // Evaluate at the end of every epoch instead of every job.eval_every steps (chorus train
  // without --eval-every).
  bool eval_every_epoch = false;
  // --save: the checkpoint written after every epoch and at the end (empty: none).
  std::string save_path;
  // --warmup-epochs as given, for the warning that a one-step warm-up has no effect.
  double warmup_epochs = 0;
  // A job resumed from a checkpoint continues the saved run at its step (chorus train); false:
  // it only starts from the checkpoint's model, at step 0, as the distributed modes do (the
  // single variant of chorus compare, which must run the same steps as the other variants).
  bool continue_resumed = true;
  // When set: the run ends before the next step once it holds true (a stopped run, as a stopped
  // distributed node's; no checkpoint is written). Any thread may set it.
  std::shared_ptr<const std::atomic<bool>> stop;
  // Tests: called on the trainer thread after each step.
  std::function<void(int64_t)> on_step_end;
};

// Trains `job` (the job of node 0 of 1) alone: progress on `progress` (a line per epoch), the
// loop's metrics, checkpoints. A job resumed from a checkpoint (job.resumed_from) continues at
// its step with its momentum (unless !options.continue_resumed); its seed must be job.seed. Throws
// std::invalid_argument for bad options, ml::CheckpointError for a checkpoint of another seed,
// std::runtime_error when training diverges or an output cannot be written.
SingleReport trainAlone(NodeJob& job, const SingleOptions& options, ml::ProgressReporter& progress,
                        spdlog::logger& log);

}  // namespace chorus::run
