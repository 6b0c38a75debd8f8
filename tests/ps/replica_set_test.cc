// The replicas of hot keys on one node (layout, local pushes, delta, applying a round's sum) and
// the choice of which keys are hot. The sync protocol across nodes is replica_sync_test.cc.
#include "ps/replica_set.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "ps/replica_choice.h"
#include "ps/replica_layout.h"

namespace chorus::ps {
namespace {

// Two tables: "entities" keys 0..9 of 2 floats, "relations" keys 100..103 of 3 floats.
KeySpace twoTables() {
  KeySpace space;
  space.addTable("entities", 0, 10, 2);
  space.addTable("relations", 100, 4, 3);
  return space;
}

std::shared_ptr<const UpdatePolicy> plainSgd(double lr = 1.0) {
  OwnerOptimizer optimizer;
  optimizer.sgd.momentum = 0.0;
  optimizer.schedule.baseLr = lr;
  return std::make_shared<SgdPolicy>(optimizer);
}

std::shared_ptr<const UpdatePolicy> adagrad() {
  AdagradConfig config;
  config.schedule.baseLr = 0.5;
  return std::make_shared<AdagradPolicy>(config);
}

TEST(ReplicaLayout, PlacesRowsAndPartsAndRefusesBadRows) {
  const KeySpace space = twoTables();
  const ShardMap members({4, 7, 9});
  const ReplicaLayout layout(space, {101, 3, 0, 3}, members);
  ASSERT_EQ(layout.keys(), (std::vector<Key>{0, 3, 101}));
  EXPECT_EQ(layout.width(0), 2u);
  EXPECT_EQ(layout.width(2), 3u);
  EXPECT_EQ(layout.offset(2), 4u);
  EXPECT_EQ(layout.totalWidth(), 7u);
  EXPECT_EQ(layout.totalLength(), 7u);
  for (size_t i = 0; i < layout.size(); ++i)
    EXPECT_EQ(layout.members()[layout.part(i)], members.home(layout.keys()[i]));
  EXPECT_FALSE(layout.indexOf(5).has_value());
  EXPECT_EQ(layout.indexFrom(101, 0), 2u);
  EXPECT_EQ(layout.indexFrom(101, 2), 2u);
  EXPECT_EQ(layout.indexFrom(3, 1), 1u);
  EXPECT_FALSE(layout.indexFrom(3, 2).has_value());  // searched from position 2 on
  EXPECT_FALSE(layout.indexFrom(200, 1).has_value());
  EXPECT_FALSE(layout.indexFrom(0, 9).has_value());
  EXPECT_THROW(ReplicaLayout(space, {50}, members), std::invalid_argument);

  EXPECT_EQ(layout.check(SparseRows{{0, 101}, std::vector<float>(5)}), std::nullopt);
  EXPECT_NE(layout.check(SparseRows{{101, 0}, std::vector<float>(5)})->find("sorted"),
            std::string::npos);
  EXPECT_NE(layout.check(SparseRows{{1}, std::vector<float>(2)})->find("not a replicated key"),
            std::string::npos);
  EXPECT_NE(layout.check(SparseRows{{0}, std::vector<float>(3)})->find("wrong length"),
            std::string::npos);
  const size_t part0 = layout.part(0);
  const std::optional<std::string> other =
      layout.check(SparseRows{{0}, std::vector<float>(2)}, (part0 + 1) % 3);
  ASSERT_TRUE(other.has_value());
  EXPECT_NE(other->find("belongs to the part of node"), std::string::npos);

  // AdaGrad's accumulators add up: its rows carry them.
  const ReplicaLayout withState(space, {0, 101}, members, adagrad().get());
  EXPECT_TRUE(withState.syncsState());
  EXPECT_EQ(withState.width(0), 4u);
  EXPECT_EQ(withState.width(1), 6u);
  EXPECT_EQ(withState.totalLength(), 5u);
}

TEST(ReplicaLayout, AddRowsMergesByKey) {
  const ReplicaLayout layout(twoTables(), {0, 1, 2, 100}, ShardMap({0}));
  SparseRows acc{{1, 100}, {1, 2, 3, 4, 5}};
  addRows(layout, acc, SparseRows{{0, 1}, {10, 20, 30, 40}});
  EXPECT_EQ(acc.keys, (std::vector<Key>{0, 1, 100}));
  EXPECT_EQ(acc.values, (std::vector<float>{10, 20, 31, 42, 3, 4, 5}));
  SparseRows empty;
  addRows(layout, empty, acc);
  EXPECT_EQ(empty.values, acc.values);
}

TEST(ReplicaSet, PushesApplyAtOnceAndAccumulateTheChange) {
  auto layout = std::make_shared<const ReplicaLayout>(twoTables(), std::vector<Key>{0, 3, 101},
                                                      ShardMap({0, 1}));
  std::vector<float> initial(7);
  std::iota(initial.begin(), initial.end(), 1.0f);  // key 0: 1 2, key 3: 3 4, key 101: 5 6 7
  ReplicaSet set(layout, initial, plainSgd(0.5));

  EXPECT_EQ(set.check(std::vector<Key>{0, 101}, 5), std::nullopt);
  EXPECT_NE(set.check(std::vector<Key>{0, 1}, std::nullopt)->find("not replicated"),
            std::string::npos);
  EXPECT_NE(set.check(std::vector<Key>{0}, 3)->find("wrong length"), std::string::npos);

  const std::vector<Key> keys{0, 101};
  set.push(keys, std::vector<float>{2, 4, 2, 2, 2}, 0);
  set.push(std::vector<Key>{0}, std::vector<float>{2, 0}, 1);
  std::vector<float> read;
  set.read(keys, read);
  EXPECT_EQ(read, (std::vector<float>{-1, 0, 4, 5, 6}));  // w -= 0.5 g, twice for key 0
  EXPECT_EQ(set.pendingRows(), 2u);

  const SparseRows delta = set.takeDelta();
  EXPECT_EQ(delta.keys, keys);
  EXPECT_EQ(delta.values, (std::vector<float>{-2, -2, -1, -1, -1}));
  EXPECT_EQ(set.pendingRows(), 0u);
  EXPECT_TRUE(set.takeDelta().empty());

  // Pushed after the take, then the round's sum arrives (this node's delta plus another's):
  // the row is the agreed value plus what is pending.
  set.push(std::vector<Key>{0}, std::vector<float>{0, 2}, 2);
  SparseRows sum = delta;
  sum.values[0] += 10;  // another node changed key 0 by +10, +0
  set.applySum(sum);
  EXPECT_EQ(std::vector<float>(set.values(0).begin(), set.values(0).end()),
            (std::vector<float>{1 - 2 + 10, 2 - 2 - 1}));
  EXPECT_EQ(std::vector<float>(set.values(101).begin(), set.values(101).end()),
            (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(std::vector<float>(set.values(3).begin(), set.values(3).end()),
            (std::vector<float>{3, 4}));
  const SparseRows next = set.takeDelta();
  EXPECT_EQ(next.keys, std::vector<Key>{0});
  EXPECT_EQ(next.values, (std::vector<float>{0, -1}));
}

TEST(ReplicaSet, AdagradAccumulatorsAreSummedLikeOneOwners) {
  // Two nodes push to one key; after exchanging their deltas both accumulators hold the sum of
  // every squared gradient, as an owner that applied both pushes would.
  auto policy = adagrad();
  auto layout = std::make_shared<const ReplicaLayout>(twoTables(), std::vector<Key>{0},
                                                      ShardMap({0, 1}), policy.get());
  const std::vector<float> initial{1, 1};
  ReplicaSet a(layout, initial, policy), b(layout, initial, policy);
  a.push(std::vector<Key>{0}, std::vector<float>{1, 2}, 0);
  b.push(std::vector<Key>{0}, std::vector<float>{3, 0}, 0);
  EXPECT_EQ(std::vector<float>(a.state(0).begin(), a.state(0).end()), (std::vector<float>{1, 4}));
  SparseRows sum = a.takeDelta();
  addRows(*layout, sum, b.takeDelta());
  a.applySum(sum);
  b.applySum(sum);
  for (const ReplicaSet* set : {&a, &b}) {
    EXPECT_EQ(std::vector<float>(set->state(0).begin(), set->state(0).end()),
              (std::vector<float>{10, 4}));
  }
  EXPECT_EQ(std::vector<float>(a.values(0).begin(), a.values(0).end()),
            std::vector<float>(b.values(0).begin(), b.values(0).end()));
  // The values moved by both steps: 1 - 0.5 * 1/1 - 0.5 * 3/3 in the first float.
  EXPECT_FLOAT_EQ(a.values(0)[0], 0.0f);
}

TEST(ReplicaSet, MomentumStaysLocal) {
  OwnerOptimizer optimizer;
  optimizer.sgd.momentum = 0.9;
  optimizer.schedule.baseLr = 0.1;
  auto policy = std::make_shared<SgdPolicy>(optimizer);
  auto layout = std::make_shared<const ReplicaLayout>(twoTables(), std::vector<Key>{0},
                                                      ShardMap({0, 1}), policy.get());
  EXPECT_FALSE(layout->syncsState());
  ReplicaSet set(layout, std::vector<float>{0, 0}, policy);
  set.push(std::vector<Key>{0}, std::vector<float>{1, 1}, 0);
  EXPECT_EQ(set.state(0).size(), 2u);
  EXPECT_EQ(set.takeDelta().values.size(), 2u);  // values only
  EXPECT_EQ(ReplicaSet::bytesPerRow(2, *policy), 4u * (2 + 2 + 2 * 2));
  EXPECT_THROW(ReplicaSet(layout, std::vector<float>{0}, policy), std::invalid_argument);
}

TEST(ReplicaChoice, TakesTheMostAccessedKeysOfEveryTableWithinTheBudget) {
  const KeySpace space = twoTables();
  std::vector<TableAccesses> accesses{std::vector<double>(10, 0.0), {50, 0, 7, 30}};
  accesses[0][4] = 40;
  accesses[0][9] = 7;
  accesses[0][1] = 1;
  // 4 bytes per float: an entity row takes 8 bytes, a relation row 12.
  ReplicaChoice choice = chooseReplicas(space, accesses, 4, 12 + 8 + 12);
  EXPECT_EQ(choice.keys, (std::vector<Key>{4, 100, 103}));
  EXPECT_EQ(choice.bytes, 32u);
  EXPECT_NEAR(choice.share, 120.0 / 135.0, 1e-12);
  // Ties (7 and 7) by the lower key; never-accessed keys are never hot.
  choice = chooseTopReplicas(space, accesses, 4, 5);
  EXPECT_EQ(choice.keys, (std::vector<Key>{4, 9, 100, 102, 103}));
  choice = chooseTopReplicas(space, accesses, 4, 100);
  EXPECT_EQ(choice.keys.size(), 6u);
  EXPECT_NEAR(choice.share, 1.0, 1e-12);
  EXPECT_TRUE(chooseReplicas(space, accesses, 4, 7).keys.empty());
  // A table left out takes no part.
  choice = chooseTopReplicas(space, std::vector<TableAccesses>{accesses[0], {}}, 4, 2);
  EXPECT_EQ(choice.keys, (std::vector<Key>{4, 9}));
  EXPECT_NE(formatReplicaChoice(choice).find("replicating 2 hot keys"), std::string::npos);

  EXPECT_THROW(chooseReplicas(space, std::vector<TableAccesses>{accesses[0]}, 4, 100),
               std::invalid_argument);
  EXPECT_THROW(chooseReplicas(space, std::vector<TableAccesses>{{1, 2}, {}}, 4, 100),
               std::invalid_argument);
}

}  // namespace
}  // namespace chorus::ps
