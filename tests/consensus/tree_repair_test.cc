// The end of a consensus run when nodes of the spanning tree die (issue 23, item 5): children
// whose parent is down re-attach to a live neighbor closer to node 0, a re-sent subtree is never
// counted twice, a node cut off from node 0 ends at once with a message, and partial sums keep
// double precision on the wire. The rules alone, then real clusters (nodes as threads, loopback,
// port 0, fixed seeds; nodes killed at a chosen round or event, never after a sleep).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "consensus/consensus_peer.h"
#include "consensus/partial_sum.h"
#include "consensus/spanning_tree.h"
#include "tests/consensus/neighbor_cluster.h"

namespace chorus::consensus {
namespace {

using namespace std::chrono_literals;
using namespace testing_neighbors;

// Seven nodes in which every node at depth 2 has two neighbors at depth 1 (edges 0-1, 0-2,
// 1-3, 1-4, 2-3, 2-4, 3-5, 3-6). Node 1 is the tree parent of 3 and 4 (lowest id), node 3 of 5
// and 6. Killing node 1 orphans the subtree {3, 4, 5, 6}; node 2 can adopt 3 and 4.
Graph ladder() {
  return {{0, {1, 2}}, {1, {0, 3, 4}}, {2, {0, 3, 4}}, {3, {1, 2, 5, 6}},
          {4, {1, 2}}, {5, {3}},       {6, {3}}};
}

// A line 0 - 1 - ... - n-1.
Graph line(NodeId n) {
  Graph g;
  for (NodeId i = 0; i < n; ++i) {
    if (i > 0) g[i].push_back(i - 1);
    if (i + 1 < n) g[i].push_back(i + 1);
  }
  return g;
}

// ---- the rules alone ----

TEST(TreeRepair, AnOrphanTakesItsLowestLiveNeighborOneHopCloser) {
  const Graph g = ladder();
  const auto depths = depthsFrom(g, 0);
  EXPECT_EQ(repairedParent(g, depths, 3, {}), 1u);
  EXPECT_EQ(repairedParent(g, depths, 3, {1}), 2u);
  EXPECT_EQ(repairedParent(g, depths, 4, {1}), 2u);
  EXPECT_EQ(repairedParent(g, depths, 3, {1, 2}), std::nullopt);
  EXPECT_EQ(repairedParent(g, depths, 5, {1}), 3u);  // knows nothing of 1: unchanged
  EXPECT_EQ(repairedParent(g, depths, 0, {}), std::nullopt);
  EXPECT_EQ(possibleChildren(g, depths, 2), (std::vector<NodeId>{3, 4}));
  EXPECT_EQ(possibleChildren(g, depths, 3), (std::vector<NodeId>{5, 6}));
  // With nothing down, the repaired tree is the spanning tree.
  for (const auto& [id, n] : g) {
    EXPECT_EQ(repairedParent(g, depths, id, {}), spanningTreeLinks(g, 0, id).parent) << id;
  }
}

TEST(TreeRepair, ParentsAlwaysMoveCloserSoNoKnowledgeOfDeathsMakesACycle) {
  // Whatever each node believes is down, following parents strictly lowers the depth.
  const Graph g = ladder();
  const auto depths = depthsFrom(g, 0);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    for (const auto& [id, n] : g) {
      std::set<NodeId> down;
      for (NodeId m : n) {
        if (rng() % 2) down.insert(m);
      }
      if (auto p = repairedParent(g, depths, id, down)) {
        EXPECT_EQ(depths.at(*p), depths.at(id) - 1);
        EXPECT_EQ(down.count(*p), 0u);
      }
    }
  }
}

TEST(TreeRepair, ANodeIsCutOffOnlyWhenEveryPathToTheRootCrossesADeadNode) {
  EXPECT_FALSE(reachesRoot(line(7), 0, 4, {3}));
  EXPECT_TRUE(reachesRoot(line(7), 0, 2, {3}));
  EXPECT_TRUE(reachesRoot(ring(6), 0, 2, {1}));  // the long way round
  EXPECT_TRUE(reachesRoot(ladder(), 0, 5, {1}));
  EXPECT_FALSE(reachesRoot(ladder(), 0, 5, {3}));
}

TEST(SumLedger, CountsEveryModelOnceAndDropsACopyOfASubtreeAlreadyCounted) {
  SumLedger ledger(2);
  const std::vector<double> big{5, 50}, copy{3, 30}, other{1, 10};
  EXPECT_EQ(ledger.add(big, std::vector<NodeId>{1, 3, 5}), SumLedger::Verdict::kAdded);
  EXPECT_EQ(ledger.add(copy, std::vector<NodeId>{3, 5}), SumLedger::Verdict::kAlreadyCounted);
  EXPECT_EQ(ledger.add(other, std::vector<NodeId>{2, 3}), SumLedger::Verdict::kOverlaps);
  EXPECT_EQ(ledger.add(std::vector<double>{1}, std::vector<NodeId>{4}),
            SumLedger::Verdict::kWrongSize);
  EXPECT_EQ(ledger.add(other, std::vector<NodeId>{2}), SumLedger::Verdict::kAdded);
  EXPECT_EQ(ledger.models(), (std::vector<NodeId>{1, 2, 3, 5}));
  EXPECT_EQ(ledger.sum(), (std::vector<double>{6, 60}));
}

// Partial sums once travelled as floats: every hop of the tree rounded the running sum to 24
// bits. Up a chain of 1000 nodes (a line's convergecast) that loses digits a double sum keeps;
// the double-float pair on the wire keeps them to ~48 bits.
TEST(SumLedger, TheDoubleFloatPairKeepsWhatAFloatSumOfManyModelsLoses) {
  constexpr size_t kNodes = 1000, kSize = 64;
  std::mt19937 rng(11);
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<std::vector<float>> models(kNodes, std::vector<float>(kSize));
  for (auto& m : models)
    for (float& v : m)
      v = value(rng) + 100.0f;  // a common offset, as trained models share
  std::vector<double> exact(kSize, 0.0);
  for (const auto& m : models)
    for (size_t i = 0; i < kSize; ++i)
      exact[i] += m[i];
  // The convergecast up the line: each hop adds its model to what came and sends it on.
  std::vector<float> as_float(kSize, 0.0f), hi, lo;
  std::vector<double> wide(kSize, 0.0);
  for (const auto& m : models) {
    for (size_t i = 0; i < kSize; ++i) {
      as_float[i] = static_cast<float>(static_cast<double>(as_float[i]) + m[i]);
      wide[i] += m[i];
    }
    splitWide(wide, hi, lo);  // what the next hop receives
    wide = joinWide(hi, lo);
  }
  double float_error = 0, wide_error = 0;
  for (size_t i = 0; i < kSize; ++i) {
    float_error = std::max(float_error, std::abs(as_float[i] - exact[i]) / std::abs(exact[i]));
    wide_error = std::max(wide_error, std::abs(wide[i] - exact[i]) / std::abs(exact[i]));
  }
  EXPECT_GT(float_error, 1e-7) << "floats on the wire lose digits";
  EXPECT_LT(wide_error, 1e-12) << "the pair keeps them";
}

// ---- real clusters ----

constexpr int64_t kRounds = 40;

// An on_round_end hook that kills `victim` at its first round end from `round` on (iteration
// skipping may jump over `round` itself).
std::function<void(Round)> killAtRound(NeighborCluster& cluster, NodeId victim, Round round) {
  return [&cluster, victim, round, killed = std::make_shared<bool>(false)](Round k) {
    if (k >= round && !*killed) {
      *killed = true;
      cluster.kill(victim);
    }
  };
}

ConsensusOptions quickOptions() {
  ConsensusOptions co;
  co.chunk_floats = 100;  // several chunks per model and per partial sum
  co.report_every = 1000ms;
  return co;
}

// Inner node 1 of the ladder is killed at round 5: its children 3 and 4 re-attach to node 2
// (3 with its own children 5 and 6), and node 0 averages the six survivors, naming 1 missing.
TEST(TreeRepair, AnInnerTreeNodeKilledMidRunLosesOnlyItsOwnModel) {
  const Graph g = ladder();
  constexpr NodeId kNodes = 7, kVictim = 1;
  auto data = syntheticData();
  NeighborCluster cluster(g, allOf(kNodes));
  for (NodeId i = 0; i < kNodes; ++i) {
    ConsensusOptions co = quickOptions();
    if (i == kVictim) {
      co.on_round_end = killAtRound(cluster, kVictim, 5);
    }
    cluster.attach(i, run::prepareNodeJob(smallRun(kRounds, 200 + i), data, i, kNodes).value(), co);
  }
  cluster.connect();
  std::map<NodeId, ConsensusReport> reports = cluster.runAll();
  EXPECT_TRUE(reports[kVictim].stopped);
  const std::vector<NodeId> survivors{0, 2, 3, 4, 5, 6};
  for (NodeId i : survivors) {
    EXPECT_EQ(reports[i].rounds_done, kRounds) << "node " << i;
    EXPECT_FALSE(reports[i].cut_off.has_value()) << "node " << i << ": " << *reports[i].cut_off;
    // The summary reached everyone, through the repaired tree.
    EXPECT_EQ(reports[i].missing_models, std::vector<NodeId>{kVictim}) << "node " << i;
    EXPECT_EQ(reports[i].departed_peers, std::vector<uint32_t>{kVictim}) << "node " << i;
  }
  expectAverageOf(reports, survivors);
  EXPECT_NE(cluster.log(0).find("the final models of node(s) 1 are missing"), std::string::npos)
      << cluster.log(0);
}

// The race: node 1 forwards its subtree's sum {1, 3, 4, 5, 6} to node 0 and is killed only once
// node 0 has it. Its children, still waiting for the summary, see it go down, re-attach to node 2
// and re-send their sums; node 2 is held until both re-sent sums reached it, so node 0 receives
// the copies before it averages. It must drop them: every model once, node 1's included (its sum
// arrived before it died).
TEST(TreeRepair, ASubtreeReSentAfterItsParentForwardedItIsCountedOnce) {
  const Graph g = ladder();
  constexpr NodeId kNodes = 7, kVictim = 1;
  auto data = syntheticData();
  NeighborCluster cluster(g, allOf(kNodes));
  std::promise<void> root_has_victims_sum;
  std::promise<void> resent_reached_two;
  std::atomic<int> resent{0};
  std::atomic<bool> root_signalled{false};
  for (NodeId i = 0; i < kNodes; ++i) {
    ConsensusOptions co = quickOptions();
    if (i == 0) {
      co.on_partial_sum = [&](NodeId from, NodeId) {
        if (from == kVictim && !root_signalled.exchange(true)) root_has_victims_sum.set_value();
      };
    }
    if (i == 2) {
      co.on_partial_sum = [&](NodeId from, NodeId) {
        if ((from == 3 || from == 4) && ++resent == 2) resent_reached_two.set_value();
      };
      co.before_partial_sum = [&] {
        EXPECT_EQ(resent_reached_two.get_future().wait_for(120s), std::future_status::ready);
      };
    }
    cluster.attach(i, run::prepareNodeJob(smallRun(kRounds, 300 + i), data, i, kNodes).value(), co);
  }
  cluster.connect();
  auto futures = cluster.start();
  ASSERT_EQ(root_has_victims_sum.get_future().wait_for(120s), std::future_status::ready);
  cluster.kill(kVictim);
  std::map<NodeId, ConsensusReport> reports;
  for (NodeId i = 0; i < kNodes; ++i)
    reports[i] = getReport(futures[i]);
  expectAverageOf(reports, allOf(kNodes));
  EXPECT_TRUE(reports[0].missing_models.empty());
  const std::string log0 = cluster.log(0);
  EXPECT_NE(log0.find("the re-sent partial sum of node(s) 3, 5, 6 (from node 2) is counted "
                      "already"),
            std::string::npos)
      << log0;
  EXPECT_NE(log0.find("the re-sent partial sum of node(s) 4 (from node 2) is counted already"),
            std::string::npos)
      << log0;
  EXPECT_NE(cluster.log(3).find("re-attaching to node 2"), std::string::npos) << cluster.log(3);
  for (NodeId i : {2u, 3u, 4u, 5u, 6u}) {
    EXPECT_FALSE(reports[i].cut_off.has_value()) << "node " << i;
    EXPECT_TRUE(reports[i].missing_models.empty()) << "node " << i;
  }
}

// A line of seven split by killing node 3: nodes 4, 5 and 6 cannot reach node 0. They end at
// once (not at the finish deadline) with a message naming what is down; node 0 averages 0..2 and
// names 3..6 missing.
TEST(TreeRepair, NodesCutOffFromTheRootEndAtOnceAndSaySo) {
  const Graph g = line(7);
  constexpr NodeId kNodes = 7, kVictim = 3;
  auto data = syntheticData();
  NeighborCluster cluster(g, allOf(kNodes));
  for (NodeId i = 0; i < kNodes; ++i) {
    ConsensusOptions co = quickOptions();
    co.finish_timeout = 100s;
    if (i == kVictim) {
      co.on_round_end = killAtRound(cluster, kVictim, 5);
    }
    cluster.attach(i, run::prepareNodeJob(smallRun(kRounds, 400 + i), data, i, kNodes).value(), co);
  }
  cluster.connect();
  const auto started = std::chrono::steady_clock::now();
  std::map<NodeId, ConsensusReport> reports = cluster.runAll(/*leave_when_done=*/true);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 60s) << "waited for the finish deadline";
  expectAverageOf(reports, {0, 1, 2});
  EXPECT_EQ(reports[0].missing_models, (std::vector<NodeId>{3, 4, 5, 6}));
  for (NodeId i : {4u, 5u, 6u}) {
    ASSERT_TRUE(reports[i].cut_off.has_value()) << "node " << i;
    EXPECT_NE(reports[i].cut_off->find("cut off from node 0"), std::string::npos)
        << *reports[i].cut_off;
  }
  EXPECT_NE(reports[4].cut_off->find("(3 known here)"), std::string::npos) << *reports[4].cut_off;
  EXPECT_NE(reports[4].cut_off->find("the final models of node(s) 4, 5, 6 are not"),
            std::string::npos)
      << *reports[4].cut_off;
  for (NodeId i : {0u, 1u, 2u}) {
    EXPECT_FALSE(reports[i].cut_off.has_value()) << "node " << i;
  }
}

}  // namespace
}  // namespace chorus::consensus
