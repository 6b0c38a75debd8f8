// The pure core of sparse gossip: which rows go where, row-wise mixing, and what it costs.
#include "consensus/sparse_gossip.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

namespace chorus::consensus {
namespace {

// A graph as adjacency lists.
using Graph = std::map<NodeId, std::vector<NodeId>>;

Graph ring(size_t n) {
  Graph g;
  for (size_t i = 0; i < n; ++i) {
    const auto a = static_cast<NodeId>(i);
    g[a] = {static_cast<NodeId>((i + n - 1) % n), static_cast<NodeId>((i + 1) % n)};
    std::sort(g[a].begin(), g[a].end());
  }
  return g;
}

// A simulated cluster of nodes, each with its own copy of the tables and its SparseGossip,
// running synchronous rounds (wait-all, tau 0): local step, send, mix every neighbor's share.
struct Cluster {
  Graph graph;
  std::vector<GossipTableShape> shapes;
  std::map<NodeId, std::vector<std::vector<float>>> tables;
  std::map<NodeId, SparseGossip> gossip;
  MixingKind kind = MixingKind::kUniform;
  uint64_t bytes_last_round = 0;  // every share of the last round, over every node
  size_t rows_last_round = 0;

  Cluster(Graph g, std::vector<GossipTableShape> s, SparseGossipOptions base, uint64_t seed)
      : graph(std::move(g)), shapes(std::move(s)) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<std::vector<float>> initial;
    for (const GossipTableShape& shape : shapes) {
      initial.emplace_back(shape.rows * shape.dim);
      for (float& v : initial.back())
        v = normal(rng);
    }
    for (const auto& [id, neighbors] : graph) {
      tables[id] = initial;  // the same seed's model on every node
      SparseGossipOptions o = base;
      o.tables = shapes;
      o.neighbors = neighbors;
      gossip.emplace(id, SparseGossip(o));
    }
  }

  std::vector<std::span<const float>> view(NodeId id) {
    std::vector<std::span<const float>> v;
    for (auto& t : tables[id])
      v.emplace_back(t);
    return v;
  }
  std::vector<std::span<float>> mutableView(NodeId id) {
    std::vector<std::span<float>> v;
    for (auto& t : tables[id])
      v.emplace_back(t);
    return v;
  }

  // One round: `step` changes rows of each node (and reports them), then every node sends
  // every neighbor its share, then every node mixes what its neighbors sent (neighbor order).
  template <typename Step>
  void round(Round r, Step step, bool flush = false) {
    for (auto& [id, g] : gossip)
      step(id, r, tables[id], g);
    std::map<NodeId, std::map<NodeId, RowShare>> inbox;  // to -> from -> share
    bytes_last_round = 0;
    rows_last_round = 0;
    for (auto& [id, g] : gossip) {
      for (NodeId to : graph[id]) {
        RowShare share = g.select(to, r, view(id), flush);
        bytes_last_round += share.payloadBytes();
        rows_last_round += share.rows();
        EXPECT_EQ(checkRowShare(share, shapes, id), std::nullopt);
        inbox[to][id] = std::move(share);
      }
    }
    for (auto& [id, g] : gossip) {
      std::vector<CarriedShare> used;
      for (NodeId from : graph[id])
        used.push_back({from, graph[from].size(), &inbox[id][from]});
      g.mix(r, mutableView(id), kind, graph[id].size(), used);
    }
  }
};

// A local step that touches a few random rows of each table (seeded per node and round).
void randomStep(NodeId id, Round r, std::vector<std::vector<float>>& tables, SparseGossip& g,
                const std::vector<GossipTableShape>& shapes, size_t rows_per_table) {
  std::mt19937_64 rng(1000 * r + id);
  for (size_t t = 0; t < tables.size(); ++t) {
    std::vector<RowKey> keys;
    std::uniform_int_distribution<RowKey> pick(0, shapes[t].rows - 1);
    for (size_t i = 0; i < rows_per_table; ++i) {
      const RowKey key = pick(rng);
      keys.push_back(key);
      for (size_t d = 0; d < shapes[t].dim; ++d)
        tables[t][key * shapes[t].dim + d] -= 0.01f * static_cast<float>(d + 1 + id);
    }
    g.markLocal(t, keys, r);
  }
}

TEST(SparseGossip, EveryRowEveryRoundIsDenseConsensusBitForBit) {
  for (MixingKind kind : {MixingKind::kUniform, MixingKind::kMetropolis}) {
    // A ring of 5 plus a chord, so that Metropolis weights differ between nodes.
    Graph g = ring(5);
    g[0].push_back(2);
    g[2].push_back(0);
    for (auto& [id, n] : g)
      std::sort(n.begin(), n.end());
    const std::vector<GossipTableShape> shapes = {{50, 8}, {7, 3}};
    SparseGossipOptions o;
    o.dense = true;
    Cluster sparse(g, shapes, o, 42);
    sparse.kind = kind;
    // Dense consensus of the same model: one flat vector per node, mixInto over the neighbors.
    std::map<NodeId, std::vector<float>> dense;
    for (auto& [id, t] : sparse.tables) {
      for (auto& table : t)
        dense[id].insert(dense[id].end(), table.begin(), table.end());
    }
    for (Round r = 0; r < 20; ++r) {
      // The same local step on both: applied to the sparse tables, then copied into the flat
      // vector at the same offsets.
      sparse.round(r, [&](NodeId id, Round rr, auto& tables, SparseGossip& gossip) {
        randomStep(id, rr, tables, gossip, shapes, 4);
        size_t offset = 0;
        for (auto& table : tables) {
          std::copy(table.begin(), table.end(), dense[id].begin() + offset);
          offset += table.size();
        }
      });
      std::map<NodeId, std::vector<float>> y = dense;  // the models sent this round
      for (auto& [id, x] : dense) {
        std::vector<size_t> degrees;
        std::vector<std::span<const float>> others;
        for (NodeId j : g[id]) {
          degrees.push_back(g[j].size());
          others.emplace_back(y[j]);
        }
        mixInto(x, mixingWeights(kind, g[id].size(), degrees), others);
      }
      for (auto& [id, x] : dense) {
        std::vector<float> flat;
        for (auto& table : sparse.tables[id])
          flat.insert(flat.end(), table.begin(), table.end());
        ASSERT_EQ(flat.size(), x.size());
        ASSERT_EQ(std::memcmp(flat.data(), x.data(), x.size() * sizeof(float)), 0)
            << "node " << id << " round " << r;
      }
    }
  }
}

// docs/sparse-consensus.md's bound: in synchronous rounds, a row changed at round r reaches a
// node d hops away by the end of round r + d K - 1 (each hop waits at most K - 1 rounds for a
// cold round, and a relayed row waits from the round after it was mixed).
TEST(SparseGossip, ARowChangedOnceReachesEveryNodeWithinTheBound) {
  for (int64_t K : {1, 3, 4}) {
    for (Round change : {Round{0}, Round{2}}) {
      const std::vector<GossipTableShape> shapes = {{20, 4}};
      SparseGossipOptions o;
      o.cold_every = K;
      o.relay_hops = 2;  // the diameter of a ring of 5
      Cluster c(ring(5), shapes, o, 7);
      const std::vector<float> initial = c.tables[0][0];
      const RowKey row = 11;
      std::map<NodeId, Round> reached;
      for (Round r = 0; r < 3 * K + change + 2; ++r) {
        c.round(r, [&](NodeId id, Round rr, auto& tables, SparseGossip& g) {
          if (id != 0 || rr != change) return;
          tables[0][row * 4] += 1.0f;
          const RowKey k = row;
          g.markLocal(0, std::span<const RowKey>(&k, 1), rr);
        });
        for (auto& [id, t] : c.tables) {
          if (!reached.count(id) && t[0][row * 4] != initial[row * 4]) reached[id] = r;
        }
      }
      const std::map<NodeId, Round> hops = {{0, 0}, {1, 1}, {4, 1}, {2, 2}, {3, 2}};
      for (const auto& [id, d] : hops) {
        ASSERT_TRUE(reached.count(id)) << "node " << id << " K " << K;
        EXPECT_LE(reached[id], change + std::max<Round>(d * K - 1, 0))
            << "node " << id << " K " << K << " change " << change;
      }
      // Nothing else ever changed: once the change has travelled its hops, no row is due.
      for (auto& [id, g] : c.gossip) {
        for (NodeId to : c.graph[id])
          EXPECT_EQ(g.pendingRows(to), 0u) << id << " -> " << to;
      }
    }
  }
}

TEST(SparseGossip, BytesPerRoundScaleWithRowsTouchedNotTableSize) {
  const auto bytesPerRound = [](size_t rows) {
    const std::vector<GossipTableShape> shapes = {{rows, 16}, {10, 16}};
    SparseGossipOptions o;
    o.cold_every = 1;
    Cluster c(ring(4), shapes, o, 3);
    uint64_t total = 0;
    for (Round r = 0; r < 10; ++r) {
      c.round(r, [&](NodeId id, Round rr, auto& tables, SparseGossip& g) {
        randomStep(id, rr, tables, g, shapes, 20);
      });
      if (r >= 5) total += c.bytes_last_round;
    }
    return total / 5;
  };
  const uint64_t small = bytesPerRound(2000);
  const uint64_t large = bytesPerRound(20000);
  // The dense exchange of the small table alone: 4 nodes x 2 neighbors x its rows.
  const uint64_t dense_small = 4 * 2 * 2010 * rowWireBytes(16);
  EXPECT_LT(small * 5, dense_small);
  // A 10x larger table sends about as many bytes (within 25%), not 10x more.
  EXPECT_LT(static_cast<double>(large), 1.25 * static_cast<double>(small));
  EXPECT_GT(static_cast<double>(large), 0.75 * static_cast<double>(small));
}

TEST(SparseGossip, HotRowsGoEveryRoundColdRowsEveryKthRound) {
  SparseGossipOptions o;
  o.tables = {{10, 2}};
  o.neighbors = {1};
  o.hot = {{3}};
  o.cold_every = 4;
  SparseGossip g(o);
  std::vector<float> table(20, 1.0f);
  const std::vector<std::span<const float>> view = {table};
  const std::vector<RowKey> keys = {3, 5, 7};
  g.markLocal(0, keys, 0);
  RowShare s0 = g.select(1, 0, view);
  ASSERT_EQ(s0.blocks.size(), 1u);
  EXPECT_EQ(s0.blocks[0].keys, std::vector<RowKey>({3}));
  EXPECT_EQ(g.pendingRows(1), 2u);
  EXPECT_EQ(g.select(1, 1, view).rows(), 0u);
  EXPECT_EQ(g.select(1, 2, view).rows(), 0u);
  RowShare s3 = g.select(1, 3, view);  // (3 + 1) % 4 == 0: the cold round
  ASSERT_EQ(s3.blocks.size(), 1u);
  EXPECT_EQ(s3.blocks[0].keys, std::vector<RowKey>({5, 7}));
  EXPECT_EQ(g.pendingRows(1), 0u);
  // flush sends cold rows in any round.
  g.markLocal(0, std::vector<RowKey>{8}, 4);
  EXPECT_EQ(g.select(1, 4, view, /*flush=*/true).rows(), 1u);
}

TEST(SparseGossip, ARoundBudgetSendsColdRowsOldestFirst) {
  SparseGossipOptions o;
  o.tables = {{10, 2}};
  o.neighbors = {1};
  o.cold_every = 100;
  o.round_bytes = 2 * rowWireBytes(2);
  SparseGossip g(o);
  std::vector<float> table(20, 1.0f);
  const std::vector<std::span<const float>> view = {table};
  g.markLocal(0, std::vector<RowKey>{9, 8}, 0);
  g.markLocal(0, std::vector<RowKey>{1, 2}, 1);
  EXPECT_EQ(g.select(1, 1, view).blocks[0].keys, std::vector<RowKey>({8, 9}));
  EXPECT_EQ(g.select(1, 2, view).blocks[0].keys, std::vector<RowKey>({1, 2}));
  EXPECT_EQ(g.select(1, 3, view).rows(), 0u);
}

TEST(SparseGossip, MixAveragesOverTheCarriersAndLeavesTheRest) {
  SparseGossipOptions o;
  o.tables = {{4, 1}};
  o.neighbors = {1, 2};
  SparseGossip g(o);
  std::vector<float> table = {0, 0, 0, 0};
  RowShare a;
  a.blocks.push_back({0, {1, 2}, {3, 6}, {0, 0}});
  RowShare b;
  b.blocks.push_back({0, {2}, {9}, {0}});
  const std::vector<CarriedShare> used = {{1, 2, &a}, {2, 2, &b}};
  const std::vector<std::span<float>> view = {table};
  const MixResult r = g.mix(0, view, MixingKind::kUniform, 2, used);
  EXPECT_EQ(r.rows_mixed, 2u);
  EXPECT_FLOAT_EQ(table[0], 0.0f);
  EXPECT_FLOAT_EQ(table[1], 1.5f);  // (0 + 3) / 2: only node 1 carried it
  EXPECT_FLOAT_EQ(table[2], 5.0f);  // (0 + 6 + 9) / 3
  EXPECT_FLOAT_EQ(table[3], 0.0f);
  // Row 1 changed through node 1's copy (hop 0): due to node 2, who did not carry it; row 2
  // was carried by both, so it is due to nobody.
  EXPECT_EQ(g.pendingRows(2), 1u);
  EXPECT_EQ(g.pendingRows(1), 0u);
}

TEST(SparseGossip, MergeKeepsTheNewestCopyOfARow) {
  RowShare old_share;
  old_share.round = 3;
  old_share.blocks.push_back({0, {1, 4}, {1, 1, 4, 4}, {0, 1}});
  RowShare new_share;
  new_share.round = 5;
  new_share.blocks.push_back({0, {4, 6}, {40, 40, 6, 6}, {0, 0}});
  new_share.blocks.push_back({1, {0}, {7}, {2}});
  const std::vector<const RowShare*> both = {&old_share, &new_share};
  const RowShare m = mergeShares(both);
  EXPECT_EQ(m.round, 5);
  ASSERT_EQ(m.blocks.size(), 2u);
  EXPECT_EQ(m.blocks[0].keys, std::vector<RowKey>({1, 4, 6}));
  EXPECT_EQ(m.blocks[0].values, std::vector<float>({1, 1, 40, 40, 6, 6}));
  EXPECT_EQ(m.blocks[1].keys, std::vector<RowKey>({0}));
}

TEST(SparseGossip, BadSharesAreRefusedNamingTheSender) {
  const std::vector<GossipTableShape> shapes = {{4, 2}};
  RowShare s;
  s.blocks.push_back({0, {1, 1}, {0, 0, 0, 0}, {0, 0}});
  EXPECT_NE(checkRowShare(s, shapes, 3)->find("node 3"), std::string::npos);
  s.blocks[0] = {0, {5}, {0, 0}, {0}};
  EXPECT_NE(checkRowShare(s, shapes, 3)->find("beyond"), std::string::npos);
  s.blocks[0] = {1, {0}, {0, 0}, {0}};
  EXPECT_NE(checkRowShare(s, shapes, 3), std::nullopt);
  s.blocks[0] = {0, {0}, {0}, {0}};
  EXPECT_NE(checkRowShare(s, shapes, 3), std::nullopt);
  s.blocks[0] = {0, {0}, {0, std::numeric_limits<float>::quiet_NaN()}, {0}};
  EXPECT_NE(checkRowShare(s, shapes, 3)->find("finite"), std::string::npos);
  s.blocks[0] = {0, {0, 3}, {0, 0, 1, 1}, {0, 0}};
  EXPECT_EQ(checkRowShare(s, shapes, 3), std::nullopt);
}

// A share is checked part by part as it arrives: a part that is bad alone, or that does not
// continue the parts before it, is refused before it is kept; parts that pass append to a share
// that checkRowShare accepts whole.
TEST(SparseGossip, EachPartIsCheckedBeforeItJoinsTheShare) {
  const std::vector<GossipTableShape> shapes = {{6, 2}, {3, 1}};
  RowShare assembled;
  RowShare first;
  first.blocks.push_back({0, {1, 2}, {1, 1, 2, 2}, {0, 0}});
  ASSERT_EQ(checkRowSharePart(assembled, first, shapes, 4), std::nullopt);
  appendRowSharePart(assembled, std::move(first));

  // Wrong widths, a key out of range, a non-finite value: refused on their own.
  RowShare wide;
  wide.blocks.push_back({0, {3}, {3, 3, 3}, {0}});
  EXPECT_NE(checkRowSharePart(assembled, wide, shapes, 4)->find("node 4"), std::string::npos);
  RowShare beyond;
  beyond.blocks.push_back({0, {6}, {6, 6}, {0}});
  EXPECT_NE(checkRowSharePart(assembled, beyond, shapes, 4)->find("beyond"), std::string::npos);
  RowShare nan;
  nan.blocks.push_back({0, {3}, {3, std::numeric_limits<float>::infinity()}, {0}});
  EXPECT_NE(checkRowSharePart(assembled, nan, shapes, 4)->find("finite"), std::string::npos);
  // Good alone, but not after the earlier part: a key again, or keys going back.
  RowShare again;
  again.blocks.push_back({0, {2, 3}, {2, 2, 3, 3}, {0, 0}});
  EXPECT_NE(checkRowSharePart(assembled, again, shapes, 4)->find("across parts"),
            std::string::npos);
  EXPECT_EQ(checkRowShare(again, shapes, 4), std::nullopt);  // alone it is a good share

  RowShare second;
  second.blocks.push_back({0, {3, 5}, {3, 3, 5, 5}, {1, 1}});
  second.blocks.push_back({1, {0}, {7}, {0}});
  ASSERT_EQ(checkRowSharePart(assembled, second, shapes, 4), std::nullopt);
  appendRowSharePart(assembled, std::move(second));
  // A table before the last part's table.
  RowShare back;
  back.blocks.push_back({0, {0}, {0, 0}, {0}});
  EXPECT_NE(checkRowSharePart(assembled, back, shapes, 4)->find("earlier part"), std::string::npos);

  ASSERT_EQ(assembled.blocks.size(), 2u);
  EXPECT_EQ(assembled.blocks[0].keys, std::vector<RowKey>({1, 2, 3, 5}));
  EXPECT_EQ(assembled.blocks[0].values, std::vector<float>({1, 1, 2, 2, 3, 3, 5, 5}));
  EXPECT_EQ(assembled.blocks[0].hops, std::vector<uint8_t>({0, 0, 1, 1}));
  EXPECT_EQ(assembled.blocks[1].keys, std::vector<RowKey>({0}));
  EXPECT_EQ(checkRowShare(assembled, shapes, 4), std::nullopt);
}

// Whole-cluster checkpoints: a gossip whose send state was exported at a round and imported
// into a fresh one (a resumed node) sends exactly what the first one sends, round after round.
TEST(SparseGossipState, AnImportedStateSendsWhatTheExportedOneWould) {
  const std::vector<GossipTableShape> shapes = {{40, 3}, {7, 3}};
  SparseGossipOptions o;
  o.tables = shapes;
  o.neighbors = {1, 2};
  o.hot = {{0, 5, 9}, {1}};
  o.cold_every = 8;
  o.round_bytes = 60;
  o.relay_hops = 3;
  std::vector<std::vector<float>> tables = {std::vector<float>(120, 1.0f),
                                            std::vector<float>(21, 2.0f)};
  auto view = [&] { return std::vector<std::span<const float>>{tables[0], tables[1]}; };
  std::mt19937_64 rng(11);
  // One round: local changes, a mixed share from node 1 (relayed on to node 2), the sends.
  auto round = [&](SparseGossip& g, Round r, std::mt19937_64& draw) {
    std::vector<RowKey> keys;
    for (int i = 0; i < 10; ++i)
      keys.push_back(draw() % 40);
    g.markLocal(0, keys, r);
    g.markLocal(1, std::vector<RowKey>{draw() % 7}, r);
    RowShare in;
    in.round = r;
    RowBlock block;
    block.table = 0;
    block.keys = {static_cast<RowKey>(draw() % 20), static_cast<RowKey>(20 + draw() % 20)};
    block.values.assign(6, 0.5f);
    block.hops = {0, 1};
    in.blocks.push_back(block);
    const CarriedShare used[] = {{1, 2, &in}};
    std::vector<std::span<float>> mutable_view = {tables[0], tables[1]};
    g.mix(r, mutable_view, MixingKind::kUniform, 2, used);
    std::vector<std::pair<std::vector<RowKey>, std::vector<uint8_t>>> sent;
    for (NodeId to : {NodeId{1}, NodeId{2}}) {
      const RowShare share = g.select(to, r, view());
      for (const RowBlock& b : share.blocks)
        sent.emplace_back(b.keys, b.hops);
    }
    return sent;
  };
  SparseGossip original(o);
  for (Round r = 0; r < 6; ++r)
    round(original, r, rng);
  const std::vector<uint64_t> state = original.exportState();
  // Rows are due (cold ones wait for round 7 or the budget): the state is not empty.
  EXPECT_GT(original.pendingRows(1) + original.pendingRows(2), 0u);
  SparseGossip resumed(o);
  resumed.importState(state, 6);
  EXPECT_EQ(resumed.exportState(), state);
  EXPECT_EQ(resumed.pendingRows(1), original.pendingRows(1));
  EXPECT_EQ(resumed.pendingRows(2), original.pendingRows(2));
  std::mt19937_64 a = rng, b = rng;
  for (Round r = 6; r < 14; ++r) {
    const std::vector<float> before0 = tables[0], before1 = tables[1];
    const auto sent_original = round(original, r, a);
    tables[0] = before0;
    tables[1] = before1;
    EXPECT_EQ(round(resumed, r, b), sent_original) << "round " << r;
  }

  // A state that does not fit is refused whole, and the gossip keeps its own.
  const std::vector<uint64_t> kept = resumed.exportState();
  std::vector<uint64_t> truncated(state.begin(), state.end() - 1);
  EXPECT_THROW(resumed.importState(truncated, 6), std::invalid_argument);
  EXPECT_THROW(resumed.importState(state, 2), std::invalid_argument);  // a round not run yet
  SparseGossipOptions other = o;
  other.neighbors = {1, 3};
  EXPECT_THROW(SparseGossip(other).importState(state, 6), std::invalid_argument);
  EXPECT_EQ(resumed.exportState(), kept);
}

}  // namespace
}  // namespace chorus::consensus
