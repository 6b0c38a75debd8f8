#include "run/training_loop.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "faults/straggler.h"
#include "ml/checkpoint.h"
#include "ml/optimizer.h"
#include "ml/rng.h"
#include "run/cluster_checkpoint.h"

namespace chorus::run {

using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

std::string TrainingStrategy::divergence(double loss, int64_t step) const {
  return fmt::format("training diverged (loss {}) at {} {}: lower --lr", loss, stepName(), step);
}

LoopReport runTrainingLoop(NodeJob& job, TrainingStrategy& strategy, spdlog::logger& log,
                           const LoopOptions& options) {
  LoopReport report;
  ml::Model& model = *job.model;
  const ml::DataSplit& data = *job.data;
  const std::string step_name(strategy.stepName());
  // A resumed cut (job.cuts.resumed) continues the node's earlier life: its lines stay.
  const NodeCheckpoint* resumed = job.cuts.resumed ? &*job.cuts.resumed : nullptr;
  ml::MetricsWriter metrics(job.metrics_path, options.append_metrics || resumed != nullptr);
  ShardBatcher batcher(data.train, job.shard, job.batch, ml::mixSeed(job.seed, 0xC0 + job.node_id),
                       job.augmentation);
  // Learning rate 0 is pure averaging (no optimizer: it requires a positive rate). The optimizer
  // steps once per step, so the schedule runs over steps.
  std::optional<ml::SgdOptimizer> optimizer;
  if (strategy.stepsLocally() && job.lr > 0) {
    optimizer.emplace(job.sgd, job.schedule, model.size());
    const std::span<float> state = optimizer->state();
    if (!options.optimizer_state.empty() && options.optimizer_state.size() == state.size()) {
      std::copy(options.optimizer_state.begin(), options.optimizer_state.end(), state.begin());
    }
    if (resumed != nullptr) {
      // Checked against the model's size by prepareCuts(); empty: the run had no momentum.
      auto saved = resumed->floats.find(std::string(kOptimizerSection));
      if (saved != resumed->floats.end() && saved->second.size() == state.size()) {
        std::copy(saved->second.begin(), saved->second.end(), state.begin());
      }
    }
  }
  faults::StragglerInjector stragglers(job.stragglers, job.node_id, job.seed);

  ml::MetricsEvent start("start");
  start.add("mode", strategy.mode())
      .add("node", static_cast<uint64_t>(job.node_id))
      .add("model", model.spec().toString())
      .add("parameters", static_cast<uint64_t>(model.size()))
      .add("data", data.train.name)
      .add("source", data.source)
      .add("shard_samples", static_cast<uint64_t>(job.shard.size()))
      .add("test_samples", static_cast<uint64_t>(data.test.size()))
      .add("steps", job.rounds)
      .add("batch", static_cast<uint64_t>(job.batch))
      .add("lr", job.lr)
      .add("schedule", ml::LrSchedule::kindName(job.schedule.kind))
      .addBool("augment", job.augmentation.enabled)
      .add("seed", job.seed)
      .add("stragglers", job.stragglers.text);
  strategy.describe(start);
  metrics.write(start);

  auto saveCheckpoint = [&](int64_t steps_done) {
    if (options.save_path.empty()) return;
    ml::Checkpoint checkpoint;
    checkpoint.modelSpec = model.spec().toString();
    checkpoint.step = steps_done;
    checkpoint.epoch =
        steps_done / static_cast<int64_t>(std::max<size_t>(batcher.batchesPerEpoch(), 1));
    checkpoint.seed = job.seed;
    checkpoint.params.assign(model.params().begin(), model.params().end());
    if (optimizer) {
      checkpoint.optimizerState.assign(optimizer->state().begin(), optimizer->state().end());
    }
    ml::saveCheckpoint(options.save_path, checkpoint);
  };

  Clock::time_point run_start = Clock::now();
  auto evaluateAndLog = [&](int64_t step, ml::MetricsEvent& event, bool confusion) {
    ml::Evaluation eval = ml::evaluate(model, data.test, confusion);
    event.add("test_loss", eval.loss).add("test_accuracy", eval.accuracy);
    if (job.target_acc > 0 && !report.time_to_target && eval.accuracy >= job.target_acc) {
      report.time_to_target = seconds(Clock::now() - run_start);
      log.info("{} {}: test accuracy {:.2f}% reached the target {:.2f}% after {:.1f} s", step_name,
               step, 100 * eval.accuracy, 100 * job.target_acc, *report.time_to_target);
      metrics.write(ml::MetricsEvent("target")
                        .add(kStepName, step)
                        .add("test_accuracy", eval.accuracy)
                        .add("seconds", *report.time_to_target));
    }
    return eval;
  };

  for (const std::string& line : job.cuts.skipped)
    log.warn("{}", line);
  if (resumed != nullptr) {
    log.info("resuming from cut {} ({}): every node continues at {} {}", resumed->header.cut,
             job.cuts.resumed_path, step_name, resumed->header.cut);
  }
  const int64_t first_step = strategy.firstStep(metrics);
  report.first_step = first_step;
  report.steps_done = first_step;
  if (options.continue_batches) batcher.skip(static_cast<size_t>(first_step));
  // The batches drawn so far: a resumed cut's count of them (a skipped round draws none).
  uint64_t batches_drawn = 0;
  if (resumed != nullptr) {
    batches_drawn = resumed->words.at(std::string(kProgressSection))[1];
    batcher.skip(static_cast<size_t>(batches_drawn));
  }
  run_start = Clock::now();
  Traffic traffic_before = strategy.traffic();
  ml::Matrix batch;
  std::vector<int32_t> labels;
  for (int64_t k = first_step; !strategy.finished(k); ++k) {
    const int64_t previous = report.steps_done - 1;  // the last step finished
    const StepExchange before = strategy.beforeGradient(k);
    report.wait_seconds += before.wait_s;
    if (before.stopped) {
      report.stopped = true;
      break;
    }
    // The local step: the gradient of a minibatch of this node's shard, the optimizer (where it
    // runs here), then the straggler's extra time.
    const Clock::time_point compute_start = Clock::now();
    batcher.next(batch, labels);
    ++batches_drawn;
    const double loss = model.forwardBackward(batch, labels);
    if (!std::isfinite(loss)) throw std::runtime_error(strategy.divergence(loss, k));
    strategy.afterGradient(k, model, labels);
    double lr = strategy.remoteLr(k);
    if (optimizer) {
      // The rate of step k, also after skipped rounds, a rejoin or a resume.
      optimizer->setStepCount(k);
      lr = optimizer->currentLr();
      optimizer->step(model.params(), model.grads());
    } else if (strategy.stepsLocally()) {
      lr = 0;
    }
    stragglers.waitAfterStep(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - compute_start));
    const double compute_s = seconds(Clock::now() - compute_start);

    const StepExchange after = strategy.exchange(k, compute_s);
    if (after.stopped) {
      report.stopped = true;
      break;
    }
    report.wait_seconds += after.wait_s;
    report.steps_done = k + 1;

    const Traffic traffic = strategy.traffic();
    const double wait_s = before.wait_s + after.wait_s;
    ml::MetricsEvent event(kStepName);
    event.add(kStepName, k)
        .add("loss", loss)
        .add("lr", lr)
        .add("compute_s", compute_s)
        .add("wait_s", wait_s)
        .add("bytes_sent", traffic.bytes_out - traffic_before.bytes_out)
        .add("bytes_received", traffic.bytes_in - traffic_before.bytes_in);
    traffic_before = traffic;
    strategy.describeStep(event);
    // Every eval_every steps; a skip may jump over such a step, then it is evaluated now. The
    // last step's evaluation is the final one.
    std::optional<ml::Evaluation> evaluated;
    if (job.eval_every > 0 && (k + 1) / job.eval_every > (previous + 1) / job.eval_every &&
        !strategy.finished(k + 1)) {
      evaluated = evaluateAndLog(k, event, false);
      log.info("{} {}: loss {:.4f}, test accuracy {:.2f}%, waited {:.3f} s", step_name, k, loss,
               100 * evaluated->accuracy, wait_s);
    }
    metrics.write(event);
    if (options.save_every > 0 && (k + 1) % options.save_every == 0 && !strategy.finished(k + 1)) {
      saveCheckpoint(k + 1);
    }
    if (job.cuts.cutAt(k + 1, job.rounds) && !strategy.finished(k + 1)) {
      NodeCheckpoint part;
      part.header = job.cuts.header;
      part.header.cut = k + 1;
      if (optimizer) {
        part.floats[std::string(kOptimizerSection)].assign(optimizer->state().begin(),
                                                           optimizer->state().end());
      }
      part.words[std::string(kProgressSection)] = {static_cast<uint64_t>(k + 1), batches_drawn};
      strategy.cutReached(part);
    }
    strategy.afterStep(k, loss, evaluated ? &*evaluated : nullptr);
  }
  strategy.afterLastStep();
  if (!report.stopped) saveCheckpoint(report.steps_done);

  report.seconds = seconds(Clock::now() - run_start);
  ml::MetricsEvent last("final");
  report.final = evaluateAndLog(report.steps_done, last, options.confusion);
  // The commands print the result on stdout; the log repeats it only for debugging.
  log.debug(
      "final test accuracy {:.2f}% (loss {:.4f}) after {} {}s in {:.1f} s, {:.1f} s of it "
      "waiting",
      100 * report.final.accuracy, report.final.loss, report.steps_done, step_name, report.seconds,
      report.wait_seconds);
  strategy.ended(report);
  if (!report.stopped) {
    strategy.finish(report.steps_done, report.finished_peers, report.departed_peers);
  }
  last.add("steps", report.steps_done)
      .add("first_step", report.first_step)
      .add("seconds", report.seconds)
      .add("wait_s", report.wait_seconds)
      .add("time_to_target", report.time_to_target ? *report.time_to_target : -1.0)
      .addRaw("finished_peers", fmt::format("[{}]", fmt::join(report.finished_peers, ",")))
      .addRaw("departed_peers", fmt::format("[{}]", fmt::join(report.departed_peers, ",")));
  if (options.confusion) {
    last.addRaw("confusion", fmt::format("[{}]", fmt::join(report.final.confusion, ",")));
  }
  strategy.describeEnd(last);
  metrics.write(last);
  return report;
}

}  // namespace chorus::run
