// The key directory: owners and replicas that change, with a version per change. The property
// that matters most (dmlc/ps-lite #185 lost keys in its range split): after any sequence of
// changes, every key has exactly one owner, a member, which is not also its replica.
#include "ps/key_directory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace chorus::ps {
namespace {

KeySpace unevenSpace() {
  // Ranges that divide by no node count evenly, with a gap.
  KeySpace space;
  space.addTable("entity", 1013, 8);
  space.addTable("relation", 5000, 11, 4);
  space.addTable("dense", ChunkLayout(1001, 7).numKeys(), 7);
  return space;
}

// Every key exactly once across ownedBy() of all nodes, and owner() agrees.
void expectOneOwnerPerKey(const KeyDirectory& directory) {
  const KeySpace& space = directory.space();
  std::vector<Key> seen;
  for (NodeId n : directory.shardMap().nodes()) {
    for (Key k : directory.ownedBy(n)) {
      EXPECT_EQ(directory.owner(k), n) << "key " << k;
      seen.push_back(k);
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, space.allKeys());
  for (Key k : space.allKeys()) {
    const std::vector<NodeId> replicas = directory.replicas(k);
    EXPECT_TRUE(std::is_sorted(replicas.begin(), replicas.end()));
    EXPECT_EQ(std::adjacent_find(replicas.begin(), replicas.end()), replicas.end());
    EXPECT_EQ(std::count(replicas.begin(), replicas.end(), directory.owner(k)), 0) << "key " << k;
    EXPECT_TRUE(directory.holds(directory.owner(k), k));
  }
}

TEST(KeyDirectory, StartsWithEveryKeyAtItsHome) {
  const ShardMap map({0, 1, 2});
  const KeyDirectory directory(map, unevenSpace());
  for (Key k : directory.space().allKeys()) {
    EXPECT_EQ(directory.owner(k), map.home(k));
    EXPECT_EQ(directory.home(k), map.home(k));
    EXPECT_TRUE(directory.replicas(k).empty());
    EXPECT_EQ(directory.keyVersion(k), 0u);
  }
  EXPECT_EQ(directory.version(), 0u);
  EXPECT_EQ(directory.changedKeys(), 0u);
  expectOneOwnerPerKey(directory);
}

TEST(KeyDirectory, EveryKeyHasExactlyOneOwnerAfterAnySequenceOfChanges) {
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u}) {
    std::mt19937_64 rng(seed);
    const std::vector<NodeId> nodes =
        seed % 2 ? std::vector<NodeId>{0, 1, 2} : std::vector<NodeId>{2, 5, 7, 8};
    KeyDirectory directory(ShardMap(nodes), unevenSpace());
    const std::vector<Key> keys = directory.space().allKeys();
    uint64_t changes = 0;
    for (int step = 0; step < 3000; ++step) {
      // A few hot keys see most of the changes, so keys move back and forth.
      const Key key = rng() % 4 == 0 ? keys[rng() % keys.size()] : keys[rng() % 8];
      const NodeId node = nodes[rng() % nodes.size()];
      const uint64_t before = directory.version();
      const NodeId owner_before = directory.owner(key);
      const std::vector<NodeId> replicas_before = directory.replicas(key);
      bool changed = false;
      switch (rng() % 3) {
        case 0:
          ASSERT_EQ(directory.setOwner(key, node), std::nullopt);
          changed = owner_before != node;
          EXPECT_EQ(directory.owner(key), node);
          break;
        case 1: {
          const auto error = directory.addReplica(key, node);
          if (owner_before == node) {
            ASSERT_TRUE(error);
          } else {
            ASSERT_EQ(error, std::nullopt);
            changed = std::count(replicas_before.begin(), replicas_before.end(), node) == 0;
            EXPECT_TRUE(directory.holds(node, key));
          }
          break;
        }
        case 2:
          ASSERT_EQ(directory.removeReplica(key, node), std::nullopt);
          changed = std::count(replicas_before.begin(), replicas_before.end(), node) > 0;
          if (owner_before != node) {
            EXPECT_FALSE(directory.holds(node, key));
          }
          break;
      }
      // The version moves by one exactly when something changed, and stamps the key.
      EXPECT_EQ(directory.version(), before + (changed ? 1 : 0));
      if (changed) {
        ++changes;
        EXPECT_EQ(directory.keyVersion(key), directory.version());
      }
      if (step % 500 == 0) expectOneOwnerPerKey(directory);
    }
    EXPECT_EQ(directory.version(), changes);
    expectOneOwnerPerKey(directory);
  }
}

TEST(KeyDirectory, AReplicaThatBecomesOwnerIsNoLongerAReplica) {
  KeyDirectory directory(ShardMap({0, 1, 2}), KeySpace(ChunkLayout(40, 4)));
  const Key key = 3;
  const NodeId home = directory.home(key);
  const NodeId other = (home + 1) % 3;
  const NodeId third = (home + 2) % 3;
  ASSERT_EQ(directory.addReplica(key, other), std::nullopt);
  ASSERT_EQ(directory.addReplica(key, third), std::nullopt);
  EXPECT_EQ(directory.replicas(key).size(), 2u);
  ASSERT_EQ(directory.setOwner(key, other), std::nullopt);
  EXPECT_EQ(directory.owner(key), other);
  EXPECT_EQ(directory.replicas(key), std::vector<NodeId>{third});
  EXPECT_FALSE(directory.holds(home, key));
  // Back home with no replica: the directory forgets the key but not its version.
  ASSERT_EQ(directory.removeReplica(key, third), std::nullopt);
  ASSERT_EQ(directory.setOwner(key, home), std::nullopt);
  EXPECT_EQ(directory.changedKeys(), 0u);
  EXPECT_EQ(directory.keyVersion(key), 5u);
  EXPECT_EQ(directory.version(), 5u);
}

TEST(KeyDirectory, RefusesUnknownKeysAndNodes) {
  KeyDirectory directory(ShardMap({0, 1}), KeySpace(ChunkLayout(40, 4)));
  EXPECT_NE(directory.setOwner(10, 0)->find("key 10 is not in the key space"), std::string::npos);
  EXPECT_NE(directory.setOwner(1, 9)->find("node 9 is not a member"), std::string::npos);
  EXPECT_NE(directory.addReplica(1, directory.owner(1))->find("primary copy"), std::string::npos);
  EXPECT_NE(directory.removeReplica(1, 9)->find("not a member"), std::string::npos);
  EXPECT_EQ(directory.version(), 0u);
}

TEST(KeyDirectory, ALargeSpaceNeedsNoTableOfHomes) {
  // Beyond kHomeCacheKeys the homes are hashed per lookup: nothing is kept per key.
  KeySpace space;
  space.addTable("entity", KeyDirectory::kHomeCacheKeys * 4, 16);
  const ShardMap map({0, 1, 2, 3});
  KeyDirectory directory(map, space);
  for (Key k : {Key{0}, Key{12345}, Key{KeyDirectory::kHomeCacheKeys * 4 - 1}})
    EXPECT_EQ(directory.owner(k), map.home(k));
  ASSERT_EQ(directory.setOwner(12345, (map.home(12345) + 1) % 4), std::nullopt);
  EXPECT_EQ(directory.owner(12345), (map.home(12345) + 1) % 4);
  EXPECT_EQ(directory.changedKeys(), 1u);
}

}  // namespace
}  // namespace chorus::ps
