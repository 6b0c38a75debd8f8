// The sampling layer's key-access statistics (pre-scan counts, accesses added by sampling, hot
// sets and the share they cover, skew summaries) and negative samplers (chi-square against their
// distributions, independent per-worker streams).
#include "sampling/access_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "sampling/negative_sampler.h"
#include "tests/sampling/chi_square.h"

namespace chorus::sampling {
namespace {

using sampletest::chiSquare;

TEST(AccessCounts, ExactWithinBudgetSketchBeyondIt) {
  AccessCounts exact(1000);
  AccessCounts sketched(100000, 8 * 1000);  // room for 1000 exact counters only
  EXPECT_TRUE(exact.exact());
  EXPECT_FALSE(sketched.exact());
  std::mt19937_64 rng(3);
  std::vector<uint64_t> truth(100000);
  for (int i = 0; i < 50000; ++i) {
    const Key k = rng() % 1000 * 100;  // 1000 distinct keys spread over the space
    exact.add(k / 100);
    sketched.add(k);
    ++truth[k];
  }
  EXPECT_EQ(exact.total(), 50000u);
  EXPECT_EQ(sketched.total(), 50000u);
  const auto dense = sketched.dense();
  for (Key k = 0; k < truth.size(); ++k)
    ASSERT_GE(dense[k], truth[k]);  // never undercounts
  EXPECT_EQ(exact.count(5), exact.dense()[5]);
  EXPECT_THROW(exact.add(1000), std::out_of_range);
}

// NuPS's word-vector formula: output vector of w is accessed count(w) times by the data and
// negatives * count^0.75 / sum(count^0.75) times per data point by sampling.
TEST(ExpectedAccesses, AddsTheSamplersShareOfEveryDraw) {
  const std::vector<uint64_t> counts = {16, 1, 0, 81};
  const NegativeSampler unigram = NegativeSampler::byFrequency(counts, 0.75);
  const std::vector<double> pi = unigram.distribution();
  const double norm = 8.0 + 1.0 + 27.0;  // 16^.75 + 1^.75 + 81^.75
  EXPECT_NEAR(pi[0], 8.0 / norm, 1e-12);
  EXPECT_EQ(pi[2], 0.0);
  const uint64_t points = 98;  // sum of counts: one data point per access here
  const auto accesses = expectedAccesses(counts, pi, 5.0, points);
  EXPECT_NEAR(accesses[0], 16.0 + 5.0 * 98.0 * 8.0 / norm, 1e-9);
  EXPECT_NEAR(accesses[3], 81.0 + 5.0 * 98.0 * 27.0 / norm, 1e-9);
  // KGE with uniform negatives: n / #entities per draw.
  const auto uniform = NegativeSampler::uniform(0, 4).distribution();
  const auto kge = expectedAccesses(counts, uniform, 10.0, 2.0);
  EXPECT_DOUBLE_EQ(kge[2], 10.0 * 2.0 / 4.0);
  EXPECT_EQ(expectedAccesses(counts, {}, 3.0, 9.0), asAccesses(counts));
  EXPECT_THROW(expectedAccesses(counts, std::vector<double>{1.0}, 1.0, 1.0), std::invalid_argument);
}

TEST(HotSet, TakesTheMostAccessedKeysThatFitAndSaysWhatTheyCover) {
  const std::vector<double> accesses = {5, 50, 0, 10, 10, 25};  // total 100
  const HotSetChoice choice = chooseHotSet(accesses, 64, 3 * 64 + 10);
  EXPECT_EQ(choice.keys, (std::vector<Key>{1, 5, 3}));  // tie 3/4 broken by the lower key
  EXPECT_DOUBLE_EQ(choice.share, 0.85);
  EXPECT_DOUBLE_EQ(hotSetShare(accesses, std::vector<Key>{1, 1, 2}), 0.5);
  // Never-accessed keys are not worth a replica, whatever the budget.
  EXPECT_EQ(chooseHotSet(accesses, 64, 1 << 20).keys.size(), 5u);
  EXPECT_TRUE(chooseHotSet(accesses, 64, 10).keys.empty());
}

TEST(SkewSummary, SharesOfTheTopKeys) {
  std::vector<double> accesses(2000, 1.0);
  accesses[7] = 1000.0;  // the top 0.1% (2 keys): 1000 + 1
  accesses[8] = 0.0;     // never accessed
  const SkewSummary s = skewSummary(accesses);
  const double total = 1000.0 + 1998.0;
  EXPECT_EQ(s.keys, 2000u);
  EXPECT_EQ(s.accessedKeys, 1999u);
  EXPECT_DOUBLE_EQ(s.accesses, total);
  EXPECT_DOUBLE_EQ(s.top0_1, 1001.0 / total);
  EXPECT_DOUBLE_EQ(s.top1, 1019.0 / total);   // 20 keys
  EXPECT_DOUBLE_EQ(s.top10, 1199.0 / total);  // 200 keys
  const std::string line = formatSkew("rows", s);
  EXPECT_EQ(line,
            "rows: 2000 keys (1999 accessed), 2998 accesses; top 0.1% of keys take 33.4%, top 1% "
            "34.0%, top 10% 40.0%");
  EXPECT_EQ(skewSummary(std::vector<double>{}).keys, 0u);
  // A table smaller than 1000 keys still counts its top key as its top 0.1%.
  EXPECT_DOUBLE_EQ(skewSummary(std::vector<double>{3, 1}).top0_1, 0.75);
}

TEST(NegativeSampler, UniformOverARangeMatchesItsDistribution) {
  const NegativeSampler s = NegativeSampler::uniform(10, 30);
  NegativeStream stream(s, 1, 0);
  const uint64_t n = 200000;
  std::vector<uint64_t> seen(30);
  for (uint64_t i = 0; i < n; ++i) {
    const Key k = stream.next();
    ASSERT_GE(k, 10u);
    ASSERT_LT(k, 30u);
    ++seen[k];
  }
  // 19 degrees of freedom: the 0.9999 quantile is about 49.
  EXPECT_LT(chiSquare(seen, s.distribution(), n), 49.0);
  EXPECT_DOUBLE_EQ(s.probability(9), 0.0);
  EXPECT_DOUBLE_EQ(s.probability(10), 0.05);
  EXPECT_THROW(NegativeSampler::uniform(5, 5), std::invalid_argument);
}

TEST(NegativeSampler, ByFrequencyToTheAlphaMatchesItsDistribution) {
  std::vector<uint64_t> counts(50);
  for (size_t k = 0; k < counts.size(); ++k)
    counts[k] = (k * 37) % 101;  // includes a zero count at k = 0
  const NegativeSampler s = NegativeSampler::byFrequency(counts, 0.75);
  const std::vector<double> pi = s.distribution();
  double norm = 0;
  for (uint64_t c : counts)
    norm += std::pow(static_cast<double>(c), 0.75);
  EXPECT_NEAR(pi[3], std::pow(10.0, 0.75) / norm, 1e-12);  // count (3 * 37) % 101 = 10
  NegativeStream stream(s, 9, 2);
  const uint64_t n = 300000;
  std::vector<uint64_t> seen(counts.size());
  std::vector<Key> draws(1000);
  for (uint64_t i = 0; i < n / draws.size(); ++i) {
    stream.fill(draws);
    for (Key k : draws)
      ++seen[k];
  }
  EXPECT_EQ(seen[0], 0u);  // zero count: never drawn
  // 48 degrees of freedom: the 0.9999 quantile is about 91.
  EXPECT_LT(chiSquare(seen, pi, n), 91.0);
  EXPECT_THROW(NegativeSampler::byFrequency(std::vector<uint64_t>{0, 0}, 0.75),
               std::invalid_argument);
  EXPECT_THROW(NegativeSampler::byFrequency(counts, -1.0), std::invalid_argument);
}

// Workers of one run draw unrelated streams; the same (seed, worker) always the same one.
TEST(NegativeStream, SeededPerWorker) {
  const NegativeSampler s = NegativeSampler::uniform(0, 1u << 20);
  auto draw = [&](uint64_t seed, uint64_t worker) {
    NegativeStream stream(s, seed, worker);
    std::vector<Key> keys(64);
    stream.fill(keys);
    return keys;
  };
  EXPECT_EQ(draw(1, 0), draw(1, 0));
  EXPECT_NE(draw(1, 0), draw(1, 1));
  EXPECT_NE(draw(1, 0), draw(2, 0));
  std::set<uint64_t> seeds;
  for (uint64_t w = 0; w < 1000; ++w)
    seeds.insert(workerSeed(42, w));
  EXPECT_EQ(seeds.size(), 1000u);
  // Two workers' streams are not correlated: matching draws are as rare as chance says.
  const auto a = draw(5, 0), b = draw(5, 1);
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i)
    same += a[i] == b[i];
  EXPECT_LE(same, 1);
}

}  // namespace
}  // namespace chorus::sampling
