#include "run/single_session.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <utility>

#include "ml/metrics.h"
#include "run/single_node.h"

namespace chorus::run {
namespace {

class SingleRun : public TrainingRun {
 public:
  SingleRun(NodeJob job, const RunOptions& options, spdlog::logger& log)
      : job_(std::move(job)), log_(log) {
    single_.stop = stopped_;
    single_.save_path = options.save_path;
    single_.warmup_epochs = options.warmup_epochs;
    // --resume: the checkpoint's model, and the rounds from 0, as every other node's.
    single_.continue_resumed = false;
  }

  TrainingOutcome run() override {
    // Progress lines go to the node's log, as the distributed modes' do.
    ml::ProgressReporter progress(stderr, false, std::chrono::hours(24 * 365));
    const SingleReport report = trainAlone(job_, single_, progress, log_);
    TrainingOutcome out;
    out.steps = "rounds";
    out.loop = report;
    out.saved = true;
    return out;
  }
  // A signal ends the run before its next step, as it ends a distributed node's.
  void stop() override { stopped_->store(true); }

 private:
  NodeJob job_;
  spdlog::logger& log_;
  std::shared_ptr<std::atomic<bool>> stopped_ = std::make_shared<std::atomic<bool>>(false);
  SingleOptions single_;
};

}  // namespace

std::unique_ptr<TrainingRun> makeSingleRun(NodeJob job, const RunOptions& options,
                                           spdlog::logger& log) {
  return std::make_unique<SingleRun>(std::move(job), options, log);
}

}  // namespace chorus::run
