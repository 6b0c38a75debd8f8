#include "consensus/mixing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace chorus::consensus {
namespace {

TEST(MixingWeights, UniformAndMetropolisSumToOne) {
  std::vector<size_t> degs = {2, 4, 3};
  auto u = mixingWeights(MixingKind::kUniform, 3, degs);
  EXPECT_EQ(u, std::vector<double>(4, 0.25));
  auto m = mixingWeights(MixingKind::kMetropolis, 3, degs);
  EXPECT_DOUBLE_EQ(m[1], 1.0 / 4);
  EXPECT_DOUBLE_EQ(m[2], 1.0 / 5);
  EXPECT_DOUBLE_EQ(m[3], 1.0 / 4);
  EXPECT_NEAR(std::accumulate(m.begin(), m.end(), 0.0), 1.0, 1e-12);
  // A neighbor that did not arrive leaves its weight on the node itself.
  auto partial = mixingWeights(MixingKind::kMetropolis, 3, std::span<const size_t>(degs).first(1));
  EXPECT_DOUBLE_EQ(partial[0], 1.0 - 1.0 / 4);
  EXPECT_EQ(parseMixingKind("metropolis"), MixingKind::kMetropolis);
  EXPECT_THROW(parseMixingKind("avg"), std::invalid_argument);
}

// Repeated mixing with symmetric, doubly stochastic weights drives every node to the exact
// average of the initial models (here simulated in memory; the networked test is in the
// consensus protocol's suite).
TEST(MixingWeights, RepeatedMetropolisMixingReachesTheAverageOnARing) {
  const size_t n = 6, dim = 5;
  std::mt19937 rng(1);
  std::vector<std::vector<float>> x(n, std::vector<float>(dim));
  std::vector<double> avg(dim, 0);
  for (auto& v : x) {
    for (size_t i = 0; i < dim; ++i) {
      v[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
      avg[i] += v[i] / n;
    }
  }
  for (int round = 0; round < 300; ++round) {
    auto prev = x;
    for (size_t i = 0; i < n; ++i) {
      std::vector<size_t> degs = {2, 2};
      auto w = mixingWeights(MixingKind::kMetropolis, 2, degs);
      std::vector<std::span<const float>> others = {prev[(i + 1) % n], prev[(i + n - 1) % n]};
      x[i] = prev[i];
      mixInto(x[i], w, others);
    }
  }
  for (const auto& v : x) {
    for (size_t i = 0; i < dim; ++i)
      EXPECT_NEAR(v[i], avg[i], 1e-5);
  }
}

TEST(SquaredDistance, Computes) {
  std::vector<float> a = {1, 2, 3}, b = {1, 0, 0};
  EXPECT_DOUBLE_EQ(squaredDistance(a, b), 13.0);
}

TEST(ModelAssembler, CompletesFromChunksInAnyOrder) {
  ModelAssembler asmb(10);
  std::vector<float> model(10);
  std::iota(model.begin(), model.end(), 0.0f);
  std::span<const float> m(model);
  bool done = false;
  EXPECT_FALSE(asmb.add(3, 1, 6, m.subspan(6, 4), &done).has_value());
  EXPECT_FALSE(done);
  EXPECT_EQ(asmb.latest(3), nullptr);
  EXPECT_FALSE(asmb.add(3, 1, 0, m.subspan(0, 3), &done).has_value());
  EXPECT_FALSE(done);
  EXPECT_FALSE(asmb.add(3, 1, 3, m.subspan(3, 3), &done).has_value());
  EXPECT_TRUE(done);
  ASSERT_NE(asmb.latest(3), nullptr);
  EXPECT_EQ(asmb.latest(3)->round, 1);
  EXPECT_EQ(asmb.latest(3)->values, model);
}

TEST(ModelAssembler, RejectsBadChunks) {
  ModelAssembler asmb(10);
  std::vector<float> four(4, 1.0f);
  bool done = false;
  EXPECT_NE(asmb.add(1, 0, 8, four, &done)->find("outside the 10-float model"), std::string::npos);
  EXPECT_NE(asmb.add(1, 0, 10, std::span<const float>(four).first(1), &done), std::nullopt);
  EXPECT_FALSE(asmb.add(1, 0, 2, four, &done).has_value());
  EXPECT_NE(asmb.add(1, 0, 4, four, &done)->find("overlaps"), std::string::npos);
  EXPECT_NE(asmb.add(1, 0, 0, four, &done)->find("overlaps"), std::string::npos);
  // Complete round 1, then a chunk of round 0 is too late.
  std::vector<float> whole(10, 2.0f);
  EXPECT_FALSE(asmb.add(1, 1, 0, whole, &done).has_value());
  EXPECT_TRUE(done);
  EXPECT_NE(
      asmb.add(1, 0, 0, std::span<const float>(four).first(2), &done)->find("after its round 1"),
      std::string::npos);
}

TEST(ModelAssembler, NewerCompleteModelWinsAndForgetClears) {
  ModelAssembler asmb(2);
  std::vector<float> r2 = {2, 2}, r3 = {3, 3};
  bool done = false;
  asmb.add(5, 3, 0, r3, &done);
  EXPECT_TRUE(done);
  EXPECT_EQ(asmb.latest(5)->round, 3);
  EXPECT_TRUE(asmb.add(5, 2, 0, r2, &done).has_value());  // older than the latest: refused
  asmb.forget(5);
  EXPECT_EQ(asmb.latest(5), nullptr);
  EXPECT_FALSE(asmb.add(5, 2, 0, r2, &done).has_value());  // a rejoined node starts afresh
}

// A thousand one-float chunks, each of another round: one partial model per sender is held (a
// newer round replaces it, an older one is refused), never one per round.
TEST(ModelAssembler, OnePartialModelPerSenderHoweverManyRoundsItsChunksName) {
  ModelAssembler asmb(1000);
  const std::vector<float> one = {0.5f};
  bool done = false;
  size_t peak = 0;
  for (Round round = 0; round < 1000; ++round) {
    EXPECT_FALSE(asmb.add(4, round, static_cast<size_t>(round), one, &done).has_value());
    peak = std::max(peak, asmb.heldBytes());
  }
  EXPECT_FALSE(done);
  EXPECT_EQ(peak, 1000 * sizeof(float));
  EXPECT_NE(asmb.add(4, 998, 0, one, &done)->find("older than its round 999 being assembled"),
            std::string::npos);
  asmb.forget(4);
  EXPECT_EQ(asmb.heldBytes(), 0u);
  // A complete model's values can be moved out; its round still refuses older chunks.
  std::vector<float> whole(1000, 1.0f);
  EXPECT_FALSE(asmb.add(4, 5, 0, whole, &done).has_value());
  EXPECT_TRUE(done);
  EXPECT_EQ(asmb.takeLatest(4), whole);
  EXPECT_EQ(asmb.heldBytes(), 0u);
  EXPECT_TRUE(asmb.add(4, 5, 0, one, &done).has_value());
}

}  // namespace
}  // namespace chorus::consensus
