// Sharding properties: disjoint, covering, balanced (iid), deterministic, skew vs alpha; and
// minibatch iteration.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "ml/batches.h"
#include "ml/sharding.h"

namespace chorus::ml {
namespace {

void expectPartition(const Shards& shards, size_t n) {
  std::vector<int> seen(n, 0);
  for (const auto& shard : shards) {
    for (size_t index : shard) {
      ASSERT_LT(index, n);
      ++seen[index];
    }
  }
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(seen[i], 1) << "sample " << i;
}

std::vector<int32_t> labelsFor(size_t n, int classes, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> labels(n);
  for (auto& l : labels)
    l = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
  return labels;
}

TEST(ShardIid, DisjointCoveringBalancedDeterministic) {
  for (size_t n : {0u, 1u, 7u, 1000u, 1003u}) {
    for (int nodes : {1, 3, 8}) {
      const Shards shards = shardIid(n, nodes, 9);
      ASSERT_EQ(shards.size(), static_cast<size_t>(nodes));
      expectPartition(shards, n);
      const auto [small, large] =
          std::minmax_element(shards.begin(), shards.end(),
                              [](const auto& a, const auto& b) { return a.size() < b.size(); });
      EXPECT_LE(large->size() - small->size(), 1u);
      EXPECT_EQ(shards, shardIid(n, nodes, 9));
    }
  }
  EXPECT_NE(shardIid(1000, 4, 1), shardIid(1000, 4, 2));
}

TEST(ShardIid, IsNotJustContiguousRanges) {
  const Shards shards = shardIid(1000, 4, 3);
  const std::vector<int32_t> labels = labelsFor(1000, 10, 4);
  EXPECT_LT(labelSkew(shards, labels, 10), 0.1);
  EXPECT_GT(shards[0].back() - shards[0].front(), 900u);
}

TEST(ShardDirichlet, DisjointCoveringDeterministicNonEmpty) {
  const std::vector<int32_t> labels = labelsFor(5000, 10, 1);
  for (double alpha : {0.01, 0.1, 1.0, 100.0}) {
    const Shards shards = shardDirichlet(labels, 10, 8, alpha, 17);
    ASSERT_EQ(shards.size(), 8u);
    expectPartition(shards, labels.size());
    for (const auto& shard : shards)
      EXPECT_FALSE(shard.empty()) << "alpha " << alpha;
    EXPECT_EQ(shards, shardDirichlet(labels, 10, 8, alpha, 17));
  }
}

TEST(ShardDirichlet, SkewGrowsAsAlphaShrinks) {
  const std::vector<int32_t> labels = labelsFor(20000, 10, 2);
  double previous = -1.0;
  for (double alpha : {1000.0, 10.0, 1.0, 0.1, 0.01}) {
    // Average over a few seeds so that one lucky draw cannot flip the order.
    double skew = 0.0;
    for (uint64_t seed = 0; seed < 4; ++seed) {
      skew += labelSkew(shardDirichlet(labels, 10, 8, alpha, seed), labels, 10) / 4.0;
    }
    EXPECT_GT(skew, previous) << "alpha " << alpha;
    previous = skew;
  }
  EXPECT_GT(previous, 0.6);
  EXPECT_LT(labelSkew(shardDirichlet(labels, 10, 8, 1000.0, 0), labels, 10), 0.05);
}

// A huge alpha is iid in effect. Its Gamma draws are near alpha each, and eight of them
// summed to infinity: the cut points became NaN and one node got almost every sample.
TEST(ShardDirichlet, AHugeAlphaSplitsEvenly) {
  const std::vector<int32_t> labels = labelsFor(5000, 10, 3);
  for (double alpha : {1e6, 1e300, 1.7e308}) {
    const Shards shards = shardDirichlet(labels, 10, 8, alpha, 5);
    expectPartition(shards, labels.size());
    for (const auto& shard : shards) {
      EXPECT_GT(shard.size(), 5000u / 8 - 20) << "alpha " << alpha;
      EXPECT_LT(shard.size(), 5000u / 8 + 20) << "alpha " << alpha;
    }
    EXPECT_LT(labelSkew(shards, labels, 10), 0.05) << "alpha " << alpha;
  }
}

TEST(EpochSampler, VisitsEveryIndexOncePerEpochInSeededOrder) {
  const std::vector<size_t> shard{3, 5, 8, 13, 21, 34, 55};
  EpochSampler a(shard, 3, 77), b(shard, 3, 77);
  EXPECT_EQ(a.batchesPerEpoch(), 3u);
  std::vector<std::vector<size_t>> orders;
  for (int epoch = 0; epoch < 3; ++epoch) {
    a.startEpoch(epoch);
    b.startEpoch(epoch);
    std::vector<size_t> order;
    std::vector<size_t> sizes;
    for (auto batch = a.next(); !batch.empty(); batch = a.next()) {
      const auto other = b.next();
      EXPECT_TRUE(std::equal(batch.begin(), batch.end(), other.begin(), other.end()));
      order.insert(order.end(), batch.begin(), batch.end());
      sizes.push_back(batch.size());
    }
    EXPECT_EQ(sizes, (std::vector<size_t>{3, 3, 1}));
    std::vector<size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, shard);
    orders.push_back(order);
  }
  EXPECT_NE(orders[0], orders[1]);
  EpochSampler dropping(shard, 3, 77, true);
  dropping.startEpoch(0);
  EXPECT_EQ(dropping.batchesPerEpoch(), 2u);
  size_t batches = 0;
  while (!dropping.next().empty())
    ++batches;
  EXPECT_EQ(batches, 2u);
}

TEST(GatherBatch, CopiesColumnsAndAugmentsWithCropAndFlip) {
  Dataset data;
  data.shape = {2, 3, 4};
  data.classes = 10;
  for (int s = 0; s < 2; ++s) {
    for (int i = 0; i < 24; ++i)
      data.features.push_back(static_cast<float>(100 * s + i + 1));
    data.labels.push_back(s + 4);
  }
  Matrix batch;
  std::vector<int32_t> labels;
  Rng rng(1);
  const std::vector<size_t> indices{1, 0};
  gatherBatch(data, indices, batch, labels, {}, rng);
  EXPECT_EQ(labels, (std::vector<int32_t>{5, 4}));
  EXPECT_EQ(batch(0, 0), 101.0f);
  EXPECT_EQ(batch(23, 1), 24.0f);
  // Flip only: pixel (y, x) takes (y, W-1-x), channels kept together.
  Augmentation flipOnly{.enabled = true, .padding = 0, .flip = true};
  bool sawFlip = false, sawPlain = false;
  for (int trial = 0; trial < 20; ++trial) {
    gatherBatch(data, std::vector<size_t>{0}, batch, labels, flipOnly, rng);
    if (batch(0, 0) == 1.0f) {
      sawPlain = true;
    } else {
      sawFlip = true;
      EXPECT_EQ(batch(0, 0), 7.0f);  // (0, 3) channel 0 = (0*4+3)*2 + 0 + 1
      EXPECT_EQ(batch(1, 0), 8.0f);
    }
  }
  EXPECT_TRUE(sawFlip && sawPlain);
  // Crop only: values are either zero padding or pixels of the sample, shifted as a block.
  Augmentation cropOnly{.enabled = true, .padding = 1, .flip = false};
  for (int trial = 0; trial < 20; ++trial) {
    gatherBatch(data, std::vector<size_t>{0}, batch, labels, cropOnly, rng);
    for (Eigen::Index i = 0; i < batch.rows(); ++i) {
      const float v = batch(i, 0);
      EXPECT_TRUE(v == 0.0f || (v >= 1.0f && v <= 24.0f));
    }
  }
}

}  // namespace
}  // namespace chorus::ml
