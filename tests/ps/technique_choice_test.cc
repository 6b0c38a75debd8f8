// --technique auto's rule as a pure function (ps/technique_choice.h): keys several nodes use in
// one window are replicated, keys one node uses most are relocated, the rest stay at home; no
// tuning input beyond the window, which follows from the sync rate.
#include "ps/technique_choice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace chorus::ps {
namespace {

// One table of `rows` rows of 4 floats.
KeySpace oneTable(size_t rows) {
  KeySpace space;
  space.addTable("t", rows, 4);
  return space;
}

TechniqueChoiceOptions perClock(int64_t clocks_per_epoch) {
  TechniqueChoiceOptions options;
  options.clocks_per_epoch = clocks_per_epoch;
  options.window_clocks = 1;
  options.bytes_per_float = 24;
  return options;
}

TEST(TechniqueChoice, ExpectedUsersIsTheSumOfEachNodesChanceToTouchTheKey) {
  EXPECT_DOUBLE_EQ(expectedUsers(std::vector<double>{0, 0, 0}), 0.0);
  const std::vector<double> lambdas = {1.0, 2.0, 0.0};
  EXPECT_NEAR(expectedUsers(lambdas), (1 - std::exp(-1.0)) + (1 - std::exp(-2.0)), 1e-12);
  // Many accesses each: every node touches it, so the count of nodes.
  EXPECT_NEAR(expectedUsers(std::vector<double>{50, 50, 50, 50}), 4.0, 1e-9);
}

// Four nodes, ten clocks per epoch, eight keys:
// 0: every node, 40 times an epoch (4 per clock each)    -> replicated
// 1: nodes 0 and 1, 30 times an epoch each                -> replicated (two nodes per clock)
// 2: node 2 only, 50 times an epoch                       -> relocated
// 3: node 3 most (20), nodes 0-2 once each                -> relocated (20 of 23)
// 4: nodes 0-3 once an epoch each                         -> home (0.38 users per clock)
// 5: nodes 0 and 1 three times an epoch each              -> home (neither makes most)
// 6: never accessed                                       -> home
// 7: node 1 once an epoch                                 -> relocated (all of its accesses)
TEST(TechniqueChoice, SharedKeysAreReplicatedSingleUserKeysRelocatedColdKeysLeftHome) {
  const KeySpace space = oneTable(8);
  std::vector<NodeAccesses> nodes(4, NodeAccesses{TableAccesses(8, 0.0)});
  for (size_t n = 0; n < 4; ++n) {
    nodes[n][0][0] = 40;
    nodes[n][0][4] = 1;
  }
  nodes[0][0][1] = nodes[1][0][1] = 30;
  nodes[2][0][2] = 50;
  nodes[3][0][3] = 20;
  nodes[0][0][3] = nodes[1][0][3] = nodes[2][0][3] = 1;
  nodes[0][0][5] = nodes[1][0][5] = 3;
  nodes[1][0][7] = 1;
  const TechniqueChoice choice = chooseTechniques(space, nodes, perClock(10));
  EXPECT_EQ(choice.replicated, (std::vector<Key>{0, 1}));
  EXPECT_EQ(choice.relocated, (std::vector<Key>{2, 3, 7}));
  EXPECT_EQ(choice.home, 3u);
  EXPECT_EQ(choice.replica_bytes, 2u * 4 * 24);
  EXPECT_EQ(choice.over_budget, 0u);
  const double all = 160 + 60 + 50 + 23 + 4 + 6 + 1;
  EXPECT_NEAR(choice.replicated_share, 220 / all, 1e-12);
  EXPECT_NEAR(choice.relocated_share, 74 / all, 1e-12);
  EXPECT_NEAR(choice.home_share, 10 / all, 1e-12);
  EXPECT_DOUBLE_EQ(choice.window_clocks, 1.0);
}

// The same counts over a longer epoch are rarer per clock: a key two nodes use 30 times in 1000
// clocks is no longer shared within a window, and with neither making most it stays home; a
// longer window (a slower sync) makes it shared again.
TEST(TechniqueChoice, TheWindowDecidesWhatSharedMeans) {
  const KeySpace space = oneTable(1);
  std::vector<NodeAccesses> nodes(2, NodeAccesses{TableAccesses{30}});
  TechniqueChoice choice = chooseTechniques(space, nodes, perClock(1000));
  EXPECT_TRUE(choice.replicated.empty());
  EXPECT_TRUE(choice.relocated.empty());
  EXPECT_EQ(choice.home, 1u);
  TechniqueChoiceOptions slow = perClock(1000);
  slow.window_clocks = 500;  // 15 accesses per node and window
  choice = chooseTechniques(space, nodes, slow);
  EXPECT_EQ(choice.replicated, (std::vector<Key>{0}));
}

TEST(TechniqueChoice, TheWindowIsOneSyncIntervalAndAtLeastAClock) {
  EXPECT_DOUBLE_EQ(autoWindowClocks(25, 25, 1000), 1.0);
  EXPECT_DOUBLE_EQ(autoWindowClocks(50, 25, 1000), 1.0);  // never below a clock
  EXPECT_DOUBLE_EQ(autoWindowClocks(5, 25, 1000), 5.0);
  EXPECT_DOUBLE_EQ(autoWindowClocks(0, 25, 1000), 1000.0);  // synced only at the end
}

// Over the memory cap the most shared keys win; the rest stay home (no single main user) or are
// relocated (one).
TEST(TechniqueChoice, TheMemoryCapKeepsTheMostSharedKeys) {
  const KeySpace space = oneTable(3);
  std::vector<NodeAccesses> nodes(3, NodeAccesses{TableAccesses{10, 50, 10}});
  nodes[2][0][2] = 0;  // key 2: two nodes only
  TechniqueChoiceOptions options = perClock(10);
  options.budget_bytes = 2 * 4 * 24;  // two rows
  TechniqueChoice choice = chooseTechniques(space, nodes, options);
  // Keys 0 and 1 are used by all three nodes (1 resp. 5 accesses per clock each): 1 is the most
  // shared, then 0; key 2 by two.
  EXPECT_EQ(choice.replicated, (std::vector<Key>{0, 1}));
  EXPECT_EQ(choice.over_budget, 1u);
  EXPECT_EQ(choice.home, 1u);
  EXPECT_TRUE(choice.relocated.empty());
  // Node 0 makes most of key 2's accesses now: past the cap it is relocated.
  nodes[0][0][2] = 100;
  choice = chooseTechniques(space, nodes, options);
  EXPECT_EQ(choice.relocated, (std::vector<Key>{2}));
  EXPECT_EQ(choice.home, 0u);
}

// Every table takes part; the keys are the key space's (table.first + row), and a table without
// counts is never accessed (home).
TEST(TechniqueChoice, KeysOfEveryTableAreChosenByTheirOwnCounts) {
  KeySpace space;
  space.addTable("entities", 3, 4);
  space.addTable("relations", 2, 4);
  std::vector<NodeAccesses> nodes(2, NodeAccesses{TableAccesses{0, 5, 0}, TableAccesses{40, 0}});
  nodes[0][0][2] = 7;
  const TechniqueChoice choice = chooseTechniques(space, nodes, perClock(4));
  EXPECT_EQ(choice.replicated, (std::vector<Key>{1, 3}));  // entity 1, relation 0
  EXPECT_EQ(choice.relocated, (std::vector<Key>{2}));      // entity 2: node 0 alone
  EXPECT_EQ(choice.home, 2u);                              // entity 0, relation 1
  std::vector<NodeAccesses> no_relations(2, NodeAccesses{TableAccesses{0, 5, 0}, TableAccesses{}});
  EXPECT_EQ(chooseTechniques(space, no_relations, perClock(4)).replicated, (std::vector<Key>{1}));
}

TEST(TechniqueChoice, BadShapesAreRefused) {
  const KeySpace space = oneTable(3);
  EXPECT_THROW(chooseTechniques(space, {}, perClock(4)), std::invalid_argument);
  const std::vector<NodeAccesses> wrong_rows(2, NodeAccesses{TableAccesses{1, 2}});
  EXPECT_THROW(chooseTechniques(space, wrong_rows, perClock(4)), std::invalid_argument);
  const std::vector<NodeAccesses> wrong_tables(2, NodeAccesses{});
  EXPECT_THROW(chooseTechniques(space, wrong_tables, perClock(4)), std::invalid_argument);
  const std::vector<NodeAccesses> fine(2, NodeAccesses{TableAccesses{1, 2, 3}});
  EXPECT_THROW(chooseTechniques(space, fine, perClock(0)), std::invalid_argument);
  TechniqueChoiceOptions no_window = perClock(4);
  no_window.window_clocks = 0;
  EXPECT_THROW(chooseTechniques(space, fine, no_window), std::invalid_argument);
}

TEST(TechniqueChoice, TheLogLineSaysWhatWasChosen) {
  const KeySpace space = oneTable(2);
  const std::vector<NodeAccesses> nodes(2, NodeAccesses{TableAccesses{100, 0}});
  const std::string line = formatTechniqueChoice(chooseTechniques(space, nodes, perClock(1)));
  EXPECT_NE(line.find("auto: 1 keys replicated"), std::string::npos) << line;
  EXPECT_NE(line.find("0 relocated"), std::string::npos) << line;
  EXPECT_NE(line.find("1 at their homes"), std::string::npos) << line;
}

}  // namespace
}  // namespace chorus::ps
