#include "run/single_node.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "ml/checkpoint.h"

namespace chorus::run {
namespace {

using Clock = std::chrono::steady_clock;

std::string percent(double fraction) {
  return fmt::format("{:.2f}%", 100.0 * fraction);
}

// The loop's strategy with no peers: nothing to exchange; it reports the run per epoch.
class AloneStrategy : public TrainingStrategy {
 public:
  AloneStrategy(const NodeJob& job, const SingleOptions& options, int64_t steps_per_epoch,
                ml::ProgressReporter& progress, SingleReport& report)
      : job_(job),
        options_(options),
        per_epoch_(steps_per_epoch),
        progress_(progress),
        report_(report) {}

  std::string_view mode() const override { return "single"; }
  std::string_view stepName() const override { return "round"; }
  int64_t firstStep(ml::MetricsWriter& /*metrics*/) override {
    epoch_start_ = Clock::now();
    return job_.resumed_from.empty() ? 0 : job_.resumed_step;
  }
  bool finished(int64_t step) const override { return step >= job_.rounds; }
  StepExchange beforeGradient(int64_t /*step*/) override {
    return {.stopped = options_.stop && options_.stop->load()};
  }
  void afterGradient(int64_t /*step*/, const ml::Model& model,
                     std::span<const int32_t> labels) override {
    correct_ += ml::countCorrect(model.logits(), labels);
    samples_ += labels.size();
  }
  void afterStep(int64_t step, double loss, const ml::Evaluation* evaluated) override {
    const size_t batch = samples_ - last_samples_;
    last_samples_ = samples_;
    loss_sum_ += loss * static_cast<double>(batch);
    const double elapsed = std::chrono::duration<double>(Clock::now() - epoch_start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(samples_) / elapsed : 0.0;
    const int64_t in_epoch = step % per_epoch_ + 1;
    progress_.update(
        fmt::format("epoch {}/{} step {}/{} {:.0f} samples/s loss {:.4f} acc {}", epochOf(step),
                    epochs(), in_epoch, per_epoch_, rate, loss_sum_ / static_cast<double>(samples_),
                    percent(static_cast<double>(correct_) / static_cast<double>(samples_))));
    if (in_epoch == per_epoch_ && !finished(step + 1)) endEpoch(step, evaluated);
    if (options_.on_step_end) options_.on_step_end(step);
  }
  void ended(const LoopReport& report) override {
    // The last (maybe partial) epoch, with the final evaluation.
    if (samples_ > 0 && !report.stopped) endEpoch(report.steps_done - 1, &report.final);
    progress_.finish();
  }

 private:
  int64_t epochOf(int64_t step) const { return step / per_epoch_ + 1; }
  // Epochs of the whole run, a partial last one counted.
  int64_t epochs() const { return (job_.rounds + per_epoch_ - 1) / per_epoch_; }

  void endEpoch(int64_t step, const ml::Evaluation* evaluated) {
    const double seconds = std::chrono::duration<double>(Clock::now() - epoch_start_).count();
    const double mean_loss = loss_sum_ / static_cast<double>(std::max<size_t>(samples_, 1));
    const double accuracy =
        static_cast<double>(correct_) / static_cast<double>(std::max<size_t>(samples_, 1));
    report_.epoch_losses.push_back(mean_loss);
    train_seconds_ += seconds;
    samples_run_ += samples_;
    report_.samples_per_second =
        train_seconds_ > 0 ? static_cast<double>(samples_run_) / train_seconds_ : 0.0;
    std::string test;
    if (evaluated != nullptr) {
      test =
          fmt::format(" | test loss {:.4f} acc {}", evaluated->loss, percent(evaluated->accuracy));
    }
    progress_.line(
        fmt::format("epoch {}/{}: train loss {:.4f} acc {}{} | {:.1f} s, {:.0f} samples/s",
                    epochOf(step), epochs(), mean_loss, percent(accuracy), test, seconds,
                    seconds > 0 ? static_cast<double>(samples_) / seconds : 0.0));
    loss_sum_ = 0;
    correct_ = samples_ = last_samples_ = 0;
    epoch_start_ = Clock::now();
  }

  const NodeJob& job_;
  const SingleOptions& options_;
  const int64_t per_epoch_;
  ml::ProgressReporter& progress_;
  SingleReport& report_;
  // The epoch running: its start, loss sum, correct predictions and samples.
  Clock::time_point epoch_start_;
  double loss_sum_ = 0;
  size_t correct_ = 0, samples_ = 0, last_samples_ = 0;
  double train_seconds_ = 0;
  size_t samples_run_ = 0;
};

}  // namespace

SingleReport trainAlone(NodeJob& job, const SingleOptions& options, ml::ProgressReporter& progress,
                        spdlog::logger& log) {
  SingleReport report;
  ml::Model& model = *job.model;
  report.parameters = model.size();
  report.model_spec = model.spec().toString();
  const int64_t per_epoch =
      static_cast<int64_t>((job.shard.size() + job.batch - 1) / std::max<size_t>(job.batch, 1));
  report.steps_per_epoch = per_epoch;
  if (options.eval_every_epoch) job.eval_every = per_epoch;
  if (job.schedule.warmupSteps == 1) {
    // The ramp is base*(step+1)/warmupSteps: one step of it is the full rate.
    progress.line(fmt::format(
        "--warmup-epochs {} is one step at {} steps per epoch, and a warm-up of one step has no "
        "effect (it starts at the full rate)",
        options.warmup_epochs, per_epoch));
  }

  LoopOptions loop;
  loop.confusion = job.confusion;
  loop.continue_batches = true;
  loop.save_path = options.save_path;
  loop.save_every = per_epoch;
  if (!options.continue_resumed) job.resumed_from.clear();  // the model only
  if (!job.resumed_from.empty()) {
    // The seed picks the shuffle order, the augmentation and, with --data synthetic, the data
    // itself: another seed would not continue the saved run but silently start a different one.
    if (job.resumed_seed != job.seed) {
      throw ml::CheckpointError(
          fmt::format("{}: written with --seed {}, this run uses --seed {}: pass --seed {} to "
                      "resume",
                      job.resumed_from, job.resumed_seed, job.seed, job.resumed_seed));
    }
    const bool momentum = job.sgd.momentum > 0 && job.lr > 0;
    if (momentum) {
      if (job.resumed_optimizer_state.empty()) {
        progress.line(fmt::format("{}: no optimizer state stored; momentum restarts from zero",
                                  job.resumed_from));
      } else {
        loop.optimizer_state = job.resumed_optimizer_state;
      }
    } else if (!job.resumed_optimizer_state.empty()) {
      // Changing hyper-parameters on resume is allowed (as with --lr); it is said, not refused.
      progress.line(fmt::format(
          "{}: holds momentum velocity, but this run has --momentum 0: the velocity is dropped",
          job.resumed_from));
    }
    progress.line(fmt::format("resumed from {} at epoch {}, step {}", job.resumed_from,
                              job.resumed_step / std::max<int64_t>(per_epoch, 1),
                              job.resumed_step));
  }
  AloneStrategy alone(job, options, per_epoch, progress, report);
  static_cast<LoopReport&>(report) = runTrainingLoop(job, alone, log, loop);
  report.epochs_done =
      static_cast<double>(report.steps_done) / static_cast<double>(std::max<int64_t>(per_epoch, 1));
  return report;
}

}  // namespace chorus::run
