// Ownership properties (ps-lite lost keys when its key ranges did not divide evenly: these
// tests check every key has exactly one owner, balance, stability, and minimal movement).
#include "ps/shard_map.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <random>

namespace chorus::ps {
namespace {

TEST(ShardMap, RejectsEmptyAndDuplicateMembers) {
  EXPECT_THROW(ShardMap({}), std::invalid_argument);
  EXPECT_THROW(ShardMap({1, 2, 1}), std::invalid_argument);
}

TEST(ShardMap, EveryKeyHasExactlyOneMemberOwner) {
  ShardMap map({0, 1, 2, 3, 4});
  std::mt19937_64 rng(3);
  for (int i = 0; i < 10000; ++i) {
    Key k = rng();
    NodeId owner = map.home(k);
    EXPECT_LE(owner, 4u);
    EXPECT_EQ(owner, map.home(k));  // a function of the key alone
  }
}

TEST(ShardMap, SameOnEveryNodeWhateverTheMemberOrder) {
  ShardMap a({0, 1, 2, 3, 4, 5, 6, 7}), b({7, 3, 5, 1, 0, 2, 6, 4});
  for (Key k = 0; k < 5000; ++k)
    EXPECT_EQ(a.home(k), b.home(k));
}

// Balance bound: with K keys over N nodes each node's share is binomial(K, 1/N); we allow
// 5 standard deviations, which a correct hash passes with overwhelming probability, for both
// dense (consecutive) and sparse (random) keys.
TEST(ShardMap, LoadIsBalancedWithinFiveSigma) {
  for (size_t n : {2u, 4u, 8u, 16u}) {
    std::vector<NodeId> nodes(n);
    std::iota(nodes.begin(), nodes.end(), 0);
    ShardMap map(nodes);
    const size_t keys = 64000;
    std::map<NodeId, size_t> consecutive, random;
    std::mt19937_64 rng(n);
    for (Key k = 0; k < keys; ++k) {
      ++consecutive[map.home(k)];
      ++random[map.home(rng())];
    }
    double mean = static_cast<double>(keys) / n;
    double sigma = std::sqrt(keys * (1.0 / n) * (1 - 1.0 / n));
    for (auto* counts : {&consecutive, &random}) {
      ASSERT_EQ(counts->size(), n);
      for (auto [node, c] : *counts) {
        EXPECT_NEAR(static_cast<double>(c), mean, 5 * sigma) << "node " << node << " of " << n;
      }
    }
  }
}

TEST(ShardMap, AddingANodeMovesOnlyItsShare) {
  ShardMap before({0, 1, 2, 3, 4, 5, 6});
  ShardMap after({0, 1, 2, 3, 4, 5, 6, 7});
  const Key keys = 80000;
  size_t moved = 0;
  for (Key k = 0; k < keys; ++k) {
    if (before.home(k) != after.home(k)) {
      ++moved;
      EXPECT_EQ(after.home(k), 7u) << "key " << k << " moved between old nodes";
    }
  }
  double share = static_cast<double>(moved) / keys;
  EXPECT_NEAR(share, 1.0 / 8, 0.01);
}

TEST(ShardMap, RemovingANodeMovesOnlyItsKeys) {
  ShardMap before({0, 1, 2, 3}), after({0, 1, 3});
  for (Key k = 0; k < 20000; ++k) {
    if (before.home(k) != 2) {
      EXPECT_EQ(before.home(k), after.home(k));
    }
  }
}

TEST(ChunkLayout, CoversTheBufferExactlyOnce) {
  for (size_t total : {1u, 7u, 64u, 1000u, 1001u}) {
    for (size_t chunk : {1u, 8u, 64u, 5000u}) {
      ChunkLayout layout(total, chunk);
      size_t covered = 0;
      for (Key k = 0; k < layout.numKeys(); ++k) {
        EXPECT_EQ(layout.offset(k), covered);
        EXPECT_GT(layout.length(k), 0u);
        EXPECT_LE(layout.length(k), chunk);
        covered += layout.length(k);
      }
      EXPECT_EQ(covered, total) << total << "/" << chunk;
      EXPECT_EQ(layout.length(layout.numKeys()), 0u);
    }
  }
  EXPECT_THROW(ChunkLayout(10, 0), std::invalid_argument);
}

TEST(ChunkLayout, SliceViewsTheFlatBuffer) {
  std::vector<float> flat(10);
  std::iota(flat.begin(), flat.end(), 0.0f);
  ChunkLayout layout(10, 4);
  auto last = layout.slice(flat, 2);
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0], 8.0f);
  last[1] = -1;
  EXPECT_EQ(flat[9], -1.0f);
}

}  // namespace
}  // namespace chorus::ps
