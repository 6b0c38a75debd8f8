// SGD update rules on slices, and learning-rate schedules.
#include <gtest/gtest.h>

#include <vector>

#include "ml/optimizer.h"

namespace chorus::ml {
namespace {

TEST(Sgd, PlainStepWithWeightDecay) {
  std::vector<float> w{1.0f, -2.0f};
  const std::vector<float> g{0.5f, 0.5f};
  sgdUpdate({.momentum = 0.0, .weightDecay = 0.1}, 0.1, w, g, {});
  EXPECT_FLOAT_EQ(w[0], 1.0f - 0.1f * (0.5f + 0.1f * 1.0f));
  EXPECT_FLOAT_EQ(w[1], -2.0f - 0.1f * (0.5f - 0.1f * 2.0f));
}

TEST(Sgd, MomentumAccumulatesVelocity) {
  std::vector<float> w{0.0f}, v{0.0f};
  const std::vector<float> g{1.0f};
  const SgdConfig config{.momentum = 0.9};
  sgdUpdate(config, 0.1, w, g, v);
  EXPECT_FLOAT_EQ(v[0], 1.0f);
  EXPECT_FLOAT_EQ(w[0], -0.1f);
  sgdUpdate(config, 0.1, w, g, v);
  EXPECT_FLOAT_EQ(v[0], 1.9f);
  EXPECT_FLOAT_EQ(w[0], -0.1f - 0.19f);
}

TEST(Sgd, NesterovLooksAhead) {
  std::vector<float> w{0.0f}, v{0.0f};
  const std::vector<float> g{1.0f};
  const SgdConfig config{.momentum = 0.9, .nesterov = true};
  sgdUpdate(config, 0.1, w, g, v);
  // v = 1; step = g + mu*v = 1.9
  EXPECT_FLOAT_EQ(w[0], -0.19f);
  sgdUpdate(config, 0.1, w, g, v);
  // v = 1.9; step = 1 + 0.9*1.9 = 2.71
  EXPECT_FLOAT_EQ(w[0], -0.19f - 0.271f);
}

TEST(Sgd, UpdatingSlicesEqualsUpdatingTheWholeBuffer) {
  // What a PS owner does: the optimizer applied chunk by chunk with per-chunk state must give
  // exactly what one update of the whole buffer gives.
  const size_t n = 103;
  std::vector<float> whole(n), chunked(n), grads(n), vWhole(n, 0.0f), vChunked(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    whole[i] = chunked[i] = 0.01f * static_cast<float>(i) - 0.5f;
    grads[i] = 0.003f * static_cast<float>((i * 37) % 11) - 0.01f;
  }
  const SgdConfig config{.momentum = 0.9, .nesterov = true, .weightDecay = 5e-4};
  for (int step = 0; step < 3; ++step) {
    sgdUpdate(config, 0.05, whole, grads, vWhole);
    for (size_t start = 0; start < n; start += 16) {
      const size_t len = std::min<size_t>(16, n - start);
      sgdUpdate(config, 0.05, std::span(chunked).subspan(start, len),
                std::span<const float>(grads).subspan(start, len),
                std::span(vChunked).subspan(start, len));
    }
  }
  EXPECT_EQ(whole, chunked);
  EXPECT_EQ(vWhole, vChunked);
}

TEST(SgdOptimizer, CountsStepsAndFollowsTheSchedule) {
  LrSchedule schedule{.kind = LrSchedule::Kind::kStep, .baseLr = 1.0, .stepEvery = 2, .gamma = 0.5};
  SgdOptimizer optimizer({.momentum = 0.0}, schedule, 1);
  std::vector<float> w{0.0f};
  const std::vector<float> g{1.0f};
  for (int i = 0; i < 4; ++i)
    optimizer.step(w, g);
  EXPECT_EQ(optimizer.stepCount(), 4);
  EXPECT_FLOAT_EQ(w[0], -(1.0f + 1.0f + 0.5f + 0.5f));
  EXPECT_TRUE(optimizer.state().empty());
}

// A negative step has no learning rate (at step -1 the warm-up ramp divided 0 by 0).
TEST(SgdOptimizer, RefusesANegativeStepCount) {
  SgdOptimizer optimizer({.momentum = 0.0}, {.baseLr = 0.1}, 1);
  EXPECT_THROW(optimizer.setStepCount(-1), std::invalid_argument);
  optimizer.setStepCount(7);
  EXPECT_EQ(optimizer.stepCount(), 7);
  EXPECT_DOUBLE_EQ(optimizer.currentLr(), 0.1);
}

TEST(SgdOptimizer, RejectsBadHyperParameters) {
  EXPECT_THROW(SgdOptimizer({.momentum = 1.0}, {}, 1), std::invalid_argument);
  EXPECT_THROW(SgdOptimizer({.momentum = 0.0, .nesterov = true}, {}, 1), std::invalid_argument);
  EXPECT_THROW(SgdOptimizer({.weightDecay = -1.0}, {}, 1), std::invalid_argument);
  EXPECT_THROW(SgdOptimizer({}, {.baseLr = 0.0}, 1), std::invalid_argument);
}

TEST(LrSchedule, ConstantStepCosineAndWarmup) {
  EXPECT_DOUBLE_EQ((LrSchedule{.baseLr = 0.1}).at(1000), 0.1);
  const LrSchedule step{
      .kind = LrSchedule::Kind::kStep, .baseLr = 1.0, .stepEvery = 10, .gamma = 0.1};
  EXPECT_DOUBLE_EQ(step.at(9), 1.0);
  EXPECT_NEAR(step.at(10), 0.1, 1e-12);
  EXPECT_NEAR(step.at(25), 0.01, 1e-12);
  const LrSchedule cosine{.kind = LrSchedule::Kind::kCosine, .baseLr = 1.0, .totalSteps = 100};
  EXPECT_DOUBLE_EQ(cosine.at(0), 1.0);
  EXPECT_NEAR(cosine.at(50), 0.5, 1e-12);
  EXPECT_NEAR(cosine.at(100), 0.0, 1e-12);
  EXPECT_NEAR(cosine.at(1000), 0.0, 1e-12);
  const LrSchedule warm{
      .kind = LrSchedule::Kind::kCosine, .baseLr = 1.0, .warmupSteps = 10, .totalSteps = 110};
  EXPECT_DOUBLE_EQ(warm.at(0), 0.1);
  EXPECT_DOUBLE_EQ(warm.at(4), 0.5);
  EXPECT_DOUBLE_EQ(warm.at(10), 1.0);
  EXPECT_NEAR(warm.at(60), 0.5, 1e-12);
  EXPECT_EQ(LrSchedule::readKind("cosine").value(), LrSchedule::Kind::kCosine);
  EXPECT_NE(
      LrSchedule::readKind("linear").message().find("unknown learning-rate schedule 'linear'"),
      std::string::npos);
}

// Epochs of a schedule in whole steps: none for 0, at least one otherwise.
TEST(LrSchedule, StepsForEpochsAreAtLeastOneUnlessZero) {
  EXPECT_EQ(scheduleSteps(0.0, 100), 0);
  EXPECT_EQ(scheduleSteps(0.5, 10), 5);
  EXPECT_EQ(scheduleSteps(0.04, 10), 1);
  EXPECT_EQ(scheduleSteps(1e-9, 10), 1);
  EXPECT_EQ(scheduleSteps(2.0, 0), 0);
}

}  // namespace
}  // namespace chorus::ml
