// The training loop every mode runs, driven by a scripted strategy: the events it writes, when it
// evaluates, how a strategy's skip, stop and end of run reach the report.
#include "run/training_loop.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "tests/ml/temp_dir.h"

namespace chorus::run {
namespace {

// A mode that records the hooks it sees; `skip_at` jumps from that step to `skip_to` (as
// consensus iteration skipping does), `stop_at` stops before that step's gradient.
class ScriptedStrategy : public TrainingStrategy {
 public:
  std::string_view mode() const override { return "scripted"; }
  std::string_view stepName() const override { return "round"; }
  void describe(ml::MetricsEvent& start) override { start.add("script", "yes"); }
  bool finished(int64_t step) const override { return step >= rounds; }
  StepExchange beforeGradient(int64_t step) override {
    if (step == stop_at) return {.stopped = true};
    return {.wait_s = 0.5};
  }
  StepExchange exchange(int64_t& step, double /*compute_s*/) override {
    if (step == skip_at) step = skip_to;
    ran.push_back(step);
    return {.wait_s = 0.25};
  }
  void describeStep(ml::MetricsEvent& event) override { event.add("scripted_step", true_step++); }
  Traffic traffic() const override {
    sent += 100;
    return {sent, 2 * sent};
  }
  void finish(int64_t steps_done, std::vector<uint32_t>& finished_peers,
              std::vector<uint32_t>& departed) override {
    finished_at = steps_done;
    finished_peers = {1, 2};
    departed = {3};
  }
  void describeEnd(ml::MetricsEvent& last) override { last.add("scripted_end", finished_at); }

  int64_t rounds = 6;
  int64_t skip_at = -1, skip_to = -1, stop_at = -1;
  std::vector<int64_t> ran;
  int64_t true_step = 0;
  mutable uint64_t sent = 0;
  int64_t finished_at = -1;
};

class TrainingLoopTest : public ::testing::Test {
 protected:
  // A one-node job on a small synthetic set, evaluated every `eval_every` steps.
  NodeJob job(int64_t rounds, int64_t eval_every) {
    RunOptions options;
    options.data.name = "synthetic";
    options.data.syntheticTrain = 200;
    options.data.syntheticTest = 50;
    options.model.name = "softmax";
    options.rounds = rounds;
    options.batch = 20;
    options.eval_every = eval_every;
    options.out_dir = dir_.path();
    return prepareNodeJob(options, loadRunData(options).value(), 0, 1).value();
  }

  // The events of the metrics file, one line each.
  std::vector<std::string> lines() const {
    std::ifstream in(dir_.file("node-0.jsonl"));
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);)
      out.push_back(line);
    return out;
  }

  static bool has(const std::string& line, const std::string& part) {
    return line.find(part) != std::string::npos;
  }

  spdlog::logger log_{"loop-test", std::make_shared<spdlog::sinks::null_sink_mt>()};
  ml::testing::TempDir dir_;
};

TEST_F(TrainingLoopTest, WritesStartOneEventPerStepAndFinalWithTheStrategysFields) {
  NodeJob j = job(6, 3);
  ScriptedStrategy strategy;
  const LoopReport report = runTrainingLoop(j, strategy, log_);
  EXPECT_EQ(report.steps_done, 6);
  EXPECT_FALSE(report.stopped);
  EXPECT_DOUBLE_EQ(report.wait_seconds, 6 * 0.75);
  EXPECT_EQ(report.finished_peers, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(report.departed_peers, (std::vector<uint32_t>{3}));
  EXPECT_EQ(strategy.finished_at, 6);
  const std::vector<std::string> events = lines();
  ASSERT_EQ(events.size(), 8u);  // start, 6 rounds, final
  EXPECT_TRUE(has(events[0], "\"event\":\"start\"") && has(events[0], "\"mode\":\"scripted\"") &&
              has(events[0], "\"script\":\"yes\""))
      << events[0];
  for (int k = 0; k < 6; ++k) {
    const std::string& e = events[static_cast<size_t>(k + 1)];
    EXPECT_TRUE(has(e, "\"event\":\"step\",") && has(e, "\"step\":" + std::to_string(k) + ","))
        << e;
    EXPECT_TRUE(has(e, "\"wait_s\":0.75") && has(e, "\"bytes_sent\":100,") &&
                has(e, "\"bytes_received\":200,") && has(e, "\"scripted_step\":"))
        << e;
    // Every 3 steps, but not at the last: the final event evaluates that one.
    EXPECT_EQ(has(e, "\"test_accuracy\":"), k == 2) << e;
  }
  EXPECT_TRUE(has(events[7], "\"event\":\"final\"") && has(events[7], "\"steps\":6,") &&
              has(events[7], "\"first_step\":0,") && has(events[7], "\"test_accuracy\":") &&
              has(events[7], "\"finished_peers\":[1,2]") &&
              has(events[7], "\"departed_peers\":[3]") && has(events[7], "\"scripted_end\":6"))
      << events[7];
}

// A strategy that jumps over steps (consensus iteration skipping) moves the loop on, and an
// evaluation step jumped over is evaluated at the step the jump lands on.
TEST_F(TrainingLoopTest, AJumpOverAnEvaluationStepEvaluatesWhereItLands) {
  NodeJob j = job(10, 4);
  ScriptedStrategy strategy;
  strategy.rounds = 10;
  strategy.skip_at = 2;
  strategy.skip_to = 5;  // over step 3, whose end (4 steps done) was due for evaluation
  const LoopReport report = runTrainingLoop(j, strategy, log_);
  EXPECT_EQ(strategy.ran, (std::vector<int64_t>{0, 1, 5, 6, 7, 8, 9}));
  EXPECT_EQ(report.steps_done, 10);
  std::set<int64_t> evaluated;
  for (const std::string& e : lines()) {
    if (!has(e, "\"event\":\"step\"") || !has(e, "\"test_accuracy\":")) continue;
    const size_t at = e.find("\"step\":") + 7;
    evaluated.insert(std::stoll(e.substr(at)));
  }
  EXPECT_EQ(evaluated, (std::set<int64_t>{5, 7}));
}

// A stop ends the run at once: the final event is still written, the end-of-run exchange is not
// run.
TEST_F(TrainingLoopTest, AStopEndsTheRunWithoutTheEndOfRunExchange) {
  NodeJob j = job(6, 0);
  ScriptedStrategy strategy;
  strategy.stop_at = 2;
  const LoopReport report = runTrainingLoop(j, strategy, log_);
  EXPECT_TRUE(report.stopped);
  EXPECT_EQ(report.steps_done, 2);
  EXPECT_EQ(strategy.finished_at, -1);
  EXPECT_TRUE(report.finished_peers.empty());
  const std::vector<std::string> events = lines();
  ASSERT_EQ(events.size(), 4u);  // start, 2 rounds, final
  EXPECT_TRUE(has(events[3], "\"event\":\"final\"") && has(events[3], "\"steps\":2,")) << events[3];
}

// The target: a "target" event at the first evaluation that reaches it, and its time in the
// report.
TEST_F(TrainingLoopTest, TheFirstEvaluationAtTheTargetIsRecordedOnce) {
  NodeJob j = job(6, 1);
  j.target_acc = 0.01;  // any trained softmax beats it at the first evaluation
  ScriptedStrategy strategy;
  const LoopReport report = runTrainingLoop(j, strategy, log_);
  ASSERT_TRUE(report.time_to_target.has_value());
  int targets = 0;
  for (const std::string& e : lines()) {
    if (has(e, "\"event\":\"target\"")) {
      ++targets;
      EXPECT_TRUE(has(e, "\"step\":0,")) << e;
    }
  }
  EXPECT_EQ(targets, 1);
}

}  // namespace
}  // namespace chorus::run
