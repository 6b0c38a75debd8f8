#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "sampling/alias_sampler.h"
#include "sampling/key_stats.h"

namespace chorus::sampling {
namespace {

// Pearson's chi-square of observed counts against the sampler's probabilities.
double chiSquare(const std::vector<uint64_t>& observed, const AliasSampler& s, uint64_t n) {
  double chi = 0;
  for (size_t i = 0; i < observed.size(); ++i) {
    double expected = s.probability(i) * static_cast<double>(n);
    if (expected > 0) chi += std::pow(static_cast<double>(observed[i]) - expected, 2) / expected;
  }
  return chi;
}

TEST(AliasSampler, MatchesItsDistribution) {
  std::vector<double> w = {5, 0, 1, 3, 1, 10, 0.5};
  AliasSampler s(w);
  std::mt19937_64 rng(9);
  const uint64_t n = 200000;
  std::vector<uint64_t> seen(w.size());
  for (uint64_t i = 0; i < n; ++i)
    ++seen[s(rng)];
  EXPECT_EQ(seen[1], 0u);  // zero weight: never drawn
  // 5 non-zero degrees of freedom; 30 is far beyond the 0.9999 quantile (about 25.7).
  EXPECT_LT(chiSquare(seen, s, n), 30.0);
}

TEST(AliasSampler, ZipfAndUnigramShapes) {
  auto z = zipfWeights(1000, 1.1);
  AliasSampler s(z);
  std::mt19937_64 rng(2);
  const uint64_t n = 300000;
  std::vector<uint64_t> seen(z.size());
  for (uint64_t i = 0; i < n; ++i)
    ++seen[s(rng)];
  EXPECT_NEAR(static_cast<double>(seen[0]) / n, s.probability(0), 0.005);
  EXPECT_GT(seen[0], seen[1]);
  EXPECT_GT(seen[1], seen[10]);
  auto u = unigramWeights(std::vector<uint64_t>{16, 1, 0});
  EXPECT_DOUBLE_EQ(u[0], 8.0);  // 16^0.75
  EXPECT_DOUBLE_EQ(u[1], 1.0);
  EXPECT_DOUBLE_EQ(u[2], 0.0);
}

// {1e308, 1e308, 0} sums to infinity in doubles; the zero-weight item must still never be drawn.
TEST(AliasSampler, HugeWeightsKeepTheirProportions) {
  AliasSampler s(std::vector<double>{1e308, 1e308, 0});
  EXPECT_DOUBLE_EQ(s.probability(0), 0.5);
  EXPECT_DOUBLE_EQ(s.probability(1), 0.5);
  EXPECT_EQ(s.probability(2), 0.0);
  std::mt19937_64 rng(4);
  std::vector<uint64_t> seen(3);
  for (int i = 0; i < 10000; ++i)
    ++seen[s(rng)];
  EXPECT_EQ(seen[2], 0u);
  EXPECT_GT(seen[0], 4500u);
  EXPECT_GT(seen[1], 4500u);
  // Tiny weights too (their sum is subnormal, their ratio exact).
  AliasSampler tiny(std::vector<double>{1e-320, 3e-320});
  EXPECT_NEAR(tiny.probability(0), 0.25, 1e-3);
}

TEST(AliasSampler, RejectsBadWeights) {
  EXPECT_THROW(AliasSampler(std::vector<double>{}), std::invalid_argument);
  EXPECT_THROW(AliasSampler(std::vector<double>{0, 0}), std::invalid_argument);
  EXPECT_THROW(AliasSampler(std::vector<double>{1, -1}), std::invalid_argument);
  EXPECT_THROW(AliasSampler(std::vector<double>{1, NAN}), std::invalid_argument);
}

TEST(CountMinSketch, NeverUndercountsAndStaysWithinItsBound) {
  CountMinSketch sketch(2048, 4);
  ExactCounts exact;
  std::mt19937_64 rng(4);
  AliasSampler zipf(zipfWeights(50000, 1.0));
  for (int i = 0; i < 200000; ++i) {
    Key k = zipf(rng);
    sketch.add(k);
    exact.add(k);
  }
  EXPECT_EQ(sketch.total(), exact.total());
  const double bound = std::exp(1.0) * static_cast<double>(sketch.total()) / sketch.width();
  int over_bound = 0;
  for (Key k = 0; k < 50000; ++k) {
    uint64_t est = sketch.estimate(k), truth = exact.count(k);
    ASSERT_GE(est, truth);
    over_bound += static_cast<double>(est - truth) > bound;
  }
  // The bound holds per key with probability 1 - e^-4 (about 98%).
  EXPECT_LT(over_bound, 50000 * 0.05);
  EXPECT_THROW(CountMinSketch(0, 1), std::invalid_argument);
}

TEST(HotSet, RanksFitsBudgetAndBreaksTiesAlike) {
  std::vector<HotKey> c = {{7, 10}, {3, 50}, {9, 10}, {1, 2}, {4, 99}};
  auto hot = selectHotSet(c, 100, 350);  // room for 3 keys
  ASSERT_EQ(hot.size(), 3u);
  EXPECT_EQ(hot[0].key, 4u);
  EXPECT_EQ(hot[1].key, 3u);
  EXPECT_EQ(hot[2].key, 7u);                              // tie with 9 at count 10: the lower key
  EXPECT_EQ(selectHotSet(c, 100, 10000, 10).size(), 4u);  // min_count drops key 1
  EXPECT_TRUE(selectHotSet(c, 100, 50).empty());
}

}  // namespace
}  // namespace chorus::sampling
