// Sparse consensus end to end over the real runtime: nodes as threads in this process on
// loopback (port 0, fixed seeds), each with a replica of a knowledge-graph embedding or matrix
// factorization, gossiping changed rows with their neighbors. Quality is held against the
// single-node driver's on the same data and seed; bytes against the dense exchange; a bad frame
// against the refusal it must get.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "consensus/sparse_consensus_peer.h"
#include "ml/kge_workload.h"
#include "ml/mf_workload.h"
#include "ml/ratings.h"
#include "ml/sharding.h"
#include "ml/sparse_stats.h"
#include "node/node.h"
#include "tests/support/local_cluster.h"
#include "tests/support/planted_graph.h"
#include "tests/support/sparse_cluster.h"

namespace chorus::consensus {
namespace {

using namespace std::chrono_literals;
using testsupport::LocalCluster;
using Final = std::vector<std::pair<std::string, std::vector<ml::NamedMetric>>>;

using testsupport::finalMetric;
using testsupport::sparseTrainOptions;
using testsupport::trainAlone;

// Sparse gossip's model: its negatives shared by the batch.
ml::KgeConfig smallComplEx() {
  return testsupport::smallComplEx(/*shared_negatives=*/true);
}

SparseLayout sparseLayout(const testsupport::Graph& g, NodeId self) {
  const PeerLayout dense = testsupport::layoutOf(g, self);
  SparseLayout layout;
  layout.self = self;
  layout.neighbors = dense.neighbors;
  layout.members = dense.members;
  layout.degrees = dense.degrees;
  layout.graph = dense.graph;
  return layout;
}

// Trains a cluster on graph `g`, each node with its own workload from `make` (the seed's model)
// and its iid shard.
template <typename Make>
std::vector<SparseConsensusReport> trainCluster(const testsupport::Graph& g, Make make,
                                                SparseConsensusOptions options,
                                                const std::string& name) {
  return testsupport::trainSparseCluster<SparseConsensusPeer, SparseConsensusReport>(
      g.size(), name, make, options.train.seed,
      [&](size_t i) { return std::make_tuple(sparseLayout(g, static_cast<NodeId>(i)), options); });
}

TEST(SparseConsensus, ARingOfFourReachesTheSingleNodeMrrWithFarFewerBytesThanDense) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  auto make = [&] { return std::make_unique<ml::KgeWorkload>(graph, smallComplEx(), 11); };
  const ml::SparseTrainOptions train = sparseTrainOptions(12, 32, 0.1);
  const Final alone = trainAlone(*make(), train);
  SparseConsensusOptions options;
  options.backup = chorus::consensus::BackupRuleSpec::read("wait-all").value();
  options.staleness = run::StalenessBound{0};
  options.train = train;
  options.gossip.cold_every = 4;
  options.chunk_floats = 1000;  // shares of several parts
  // The hot set: the most accessed entities, as the CLI chooses it.
  const ml::KgAccessStats stats = ml::kgAccessStats(graph, 16.0 / 32.0);
  options.hot = {sampling::chooseHotSet(stats.entities, 32 * 4, 32 * 4 * 20).keys,
                 sampling::chooseHotSet(stats.relations, 32 * 4, 1 << 20).keys};
  const auto sparse = trainCluster(testsupport::ring(4), make, options, "sparse-gossip");
  options.gossip.dense_exchange = true;
  const auto dense = trainCluster(testsupport::ring(4), make, options, "dense-gossip");

  const double single = finalMetric(alone, "test", "mrr");
  EXPECT_GT(single, 0.08);  // a random ranking of 300 entities: about 0.02
  ASSERT_EQ(sparse[0].final.size(), 2u);
  ASSERT_EQ(dense[0].final.size(), 2u);
  const double sparse_mrr = finalMetric(sparse[0].final, "test", "mrr");
  const double dense_mrr = finalMetric(dense[0].final, "test", "mrr");
  EXPECT_NEAR(sparse_mrr, single, 0.35 * single);
  EXPECT_NEAR(dense_mrr, single, 0.35 * single);
  for (size_t i = 0; i < 4; ++i) {
    const SparseConsensusReport& s = sparse[i];
    EXPECT_FALSE(s.stopped);
    EXPECT_EQ(s.epochs_done, 12);
    EXPECT_EQ(s.rounds_done, 12 * s.rounds_per_epoch);
    EXPECT_EQ(s.finished_peers.size(), 2u);
    EXPECT_EQ(s.shares_refused, 0u);
    EXPECT_EQ(s.parts_lost, 0u);
    EXPECT_EQ(s.max_staleness, 0);
    if (i > 0) {
      EXPECT_TRUE(s.final.empty());
    }
    // Every node evaluated its own replica on the final split; the replicas agree closely.
    ASSERT_FALSE(s.replica.empty()) << "node " << i;
    EXPECT_EQ(s.replica.front().name, "mrr");
    EXPECT_NEAR(s.replica.front().value, sparse_mrr, 0.15 * sparse_mrr) << "node " << i;
    if (i == 0) {
      EXPECT_EQ(s.replica.front().value, sparse_mrr);
    }
    // The dense exchange sends every row of the model to both neighbors every round.
    const uint64_t rows = graph.entities() + graph.relations();
    EXPECT_EQ(dense[i].rows_sent, 2 * rows * static_cast<uint64_t>(dense[i].rounds_done));
    // A step of 32 triples touches at most 64 + 16 entities and 4 relations of 304 rows.
    EXPECT_LT(s.rows_sent * 2, dense[i].rows_sent) << "node " << i;
    EXPECT_LT(s.bytes_out * 2, dense[i].bytes_out) << "node " << i;
  }
}

TEST(SparseConsensus, TwoNodesFactorizeAsWellAsOneWithBackupWorkers) {
  ml::ZipfRatingsOptions zipf;
  zipf.rows = 400;
  zipf.cols = 200;
  zipf.cells = 30000;
  zipf.rank = 4;
  zipf.noiseSigma = 0.3;
  zipf.seed = 4;
  const ml::RatingsData data = ml::makeZipfRatings(zipf);
  ml::MfOptions mf;
  mf.rank = 8;
  mf.reg = 0.01;
  mf.seed = 4;
  auto make = [&] { return std::make_unique<ml::MfWorkload>(data, mf); };
  const ml::SparseTrainOptions train = sparseTrainOptions(8, 200, 0.1);
  const Final alone = trainAlone(*make(), train);
  SparseConsensusOptions options;
  options.backup = chorus::consensus::BackupRuleSpec::read("dynamic").value();
  options.staleness = run::StalenessBound{2};
  options.train = train;
  options.gossip.round_bytes = 4096;
  const auto reports = trainCluster(testsupport::complete(3), make, options, "sparse-mf");
  const double single = finalMetric(alone, "test", "rmse");
  EXPECT_LT(single, 0.6);
  EXPECT_NEAR(finalMetric(reports[0].final, "test", "rmse"), single, 0.15 * single);
  for (const SparseConsensusReport& r : reports) {
    EXPECT_FALSE(r.stopped);
    EXPECT_LE(r.max_staleness, 2);
  }
}

// A node killed mid-run leaves its neighbors' wait sets (and its shares their inboxes) at once:
// the others run every round and name it departed.
TEST(SparseConsensus, AKilledNodeLeavesTheOthersFinishing) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  const testsupport::Graph g = testsupport::ring(4);
  // Before the cluster: its nodes' threads (a killed node's among them) use the workloads
  // until the cluster's destructor joins them.
  std::vector<std::unique_ptr<ml::SparseWorkload>> workloads;
  LocalCluster cluster(4, 0, {.cluster = "sparse-kill"});
  const ml::SparseTrainOptions train = sparseTrainOptions(3, 32, 0.1);
  const ml::Shards shards = ml::shardIid(graph.train.size(), 4, train.seed);
  const NodeId victim = 3;
  for (NodeId i = 0; i < 4; ++i) {
    workloads.push_back(std::make_unique<ml::KgeWorkload>(graph, smallComplEx(), 11));
    SparseConsensusOptions options;
    options.backup = chorus::consensus::BackupRuleSpec::read("wait-all").value();
    options.train = train;
    if (i == victim) {
      options.on_round_end = [&cluster, victim, killed = std::make_shared<bool>(false)](Round r) {
        if (r >= 5 && !*killed) {
          *killed = true;
          cluster.kill(victim);
        }
      };
    }
    cluster.attach<SparseConsensusPeer>(i, *workloads[i], shards[i], sparseLayout(g, i), options);
  }
  cluster.connect();
  cluster.start();
  const SparseConsensusReport killed = cluster.result<SparseConsensusReport>(victim);
  EXPECT_TRUE(killed.stopped);
  for (NodeId i = 0; i < victim; ++i) {
    const SparseConsensusReport r = cluster.result<SparseConsensusReport>(i);
    EXPECT_FALSE(r.stopped) << "node " << i;
    EXPECT_EQ(r.rounds_done, 3 * r.rounds_per_epoch) << "node " << i;
    EXPECT_EQ(r.shares_refused, 0u) << "node " << i;
    if (i == 0 || i == 2) {
      EXPECT_EQ(r.departed_peers, std::vector<uint32_t>{victim}) << "node " << i;
    }
  }
  EXPECT_EQ(cluster.result<SparseConsensusReport>(0).final.size(), 2u);
}

// Node 2 is stopped and shut down at round 5, then restarts on the same port with --rejoin: it
// takes a neighbor's whole tables, runs the rounds after that neighbor's, and finishes with the
// others (who hold at round 20 until its second life has started, so that it finds them
// running).
TEST(SparseConsensus, ARestartedNodeRejoinsWithANeighborsTables) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  const testsupport::Graph g = testsupport::complete(3);
  const ml::SparseTrainOptions train = sparseTrainOptions(6, 32, 0.1);
  const ml::Shards shards = ml::shardIid(graph.train.size(), 3, train.seed);
  // Before the cluster: its nodes' threads (a killed node's among them) use the workloads
  // until the cluster's destructor joins them.
  std::vector<std::unique_ptr<ml::SparseWorkload>> workloads;
  LocalCluster cluster(2, 3, {.cluster = "sparse-rejoin"});
  std::promise<void> second_life_started;
  std::shared_future<void> released = second_life_started.get_future().share();
  // What nodes 0 and 1 hold after each round (AdaGrad's sums and the tables, hashed), to hold
  // against what node 2 took.
  const auto hashOf = [](std::span<const float> v) {
    return std::hash<std::string_view>{}(
        std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
  };
  std::mutex held_mu;
  std::map<std::pair<NodeId, Round>, std::pair<size_t, size_t>> held;  // (state, table 0)
  for (NodeId i = 0; i < 2; ++i) {
    workloads.push_back(std::make_unique<ml::KgeWorkload>(graph, smallComplEx(), 11));
    SparseConsensusOptions options;
    options.train = train;
    options.on_round_end = [released, i, &cluster, &workloads, &held_mu, &held, hashOf](Round r) {
      {
        const auto& peer = cluster.peer<SparseConsensusPeer>(i);
        std::lock_guard lock(held_mu);
        held[{i, r}] = {hashOf(peer.optimizerState(0)),
                        hashOf(workloads[i]->tables()[0]->values())};
      }
      if (r == 20) released.wait_for(60s);
    };
    cluster.attach<SparseConsensusPeer>(i, *workloads[i], shards[i], sparseLayout(g, i), options);
  }
  // One life of node 2; its node stops before its peer goes away.
  struct Life {
    std::unique_ptr<ml::SparseWorkload> workload;
    std::unique_ptr<node::Node> node;
    std::unique_ptr<SparseConsensusPeer> peer;
    ~Life() {
      if (node) node->shutdown(0ms);
    }
  };
  auto life = [&](uint16_t port, bool rejoin, std::function<void(Round)> on_round_end,
                  std::function<void(Round)> on_caught_up = {}) {
    auto l = std::make_unique<Life>();
    l->workload = std::make_unique<ml::KgeWorkload>(graph, smallComplEx(), 11);
    l->node = std::make_unique<node::Node>(
        testsupport::nodeOptions({.cluster = "sparse-rejoin"}, 2, 3, port));
    EXPECT_TRUE(l->node->listen().ok());
    SparseConsensusOptions options;
    options.train = train;
    options.rejoin = rejoin;
    options.on_round_end = std::move(on_round_end);
    options.on_caught_up = std::move(on_caught_up);
    l->peer = std::make_unique<SparseConsensusPeer>(*l->node, *l->workload, shards[2],
                                                    sparseLayout(g, 2), options);
    return l;
  };
  std::promise<void> round_five;
  auto first = life(0, false, [&, fired = std::make_shared<bool>(false)](Round r) {
    if (r == 5 && !*fired) {
      *fired = true;
      round_five.set_value();
    }
  });
  const uint16_t port = first->node->port();
  cluster.connect({{2, port}});
  cluster.connectOutside(*first->node);
  ASSERT_TRUE(first->node->waitClusterReady(30s).ok());
  cluster.start();
  auto first_run = std::async(std::launch::async, [p = first->peer.get()] { return p->run(); });
  ASSERT_EQ(round_five.get_future().wait_for(60s), std::future_status::ready);
  first->peer->stop();
  ASSERT_EQ(first_run.wait_for(60s), std::future_status::ready);
  EXPECT_TRUE(first_run.get().stopped);
  first.reset();

  // Node 2's optimizer state and entity table right after it caught up (the hook runs on its
  // trainer thread, inside run(), when `second` is set).
  std::optional<std::pair<size_t, size_t>> taken;
  std::vector<float> taken_state;
  Round caught_up_at = -1;
  std::unique_ptr<Life> second;
  second = life(port, true, {}, [&](Round first) {
    const std::span<const float> state = second->peer->optimizerState(0);
    caught_up_at = first;
    taken_state.assign(state.begin(), state.end());
    taken = std::make_pair(hashOf(state), hashOf(second->workload->tables()[0]->values()));
  });
  cluster.connectOutside(*second->node);
  ASSERT_TRUE(second->node->waitClusterReady(30s).ok());
  auto second_run = std::async(std::launch::async, [p = second->peer.get()] { return p->run(); });
  second_life_started.set_value();
  ASSERT_EQ(second_run.wait_for(120s), std::future_status::ready);
  const SparseConsensusReport r = second_run.get();
  EXPECT_FALSE(r.stopped);
  EXPECT_GT(r.first_round, 6);
  EXPECT_EQ(r.rounds_done, 6 * r.rounds_per_epoch);
  // It took a neighbor's tables and AdaGrad sums as they were after that neighbor's round
  // first_round - 1, not sums started afresh.
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(caught_up_at, r.first_round);
  {
    std::lock_guard lock(held_mu);
    const auto at0 = held.find({0, r.first_round - 1});
    const auto at1 = held.find({1, r.first_round - 1});
    EXPECT_TRUE((at0 != held.end() && at0->second == *taken) ||
                (at1 != held.end() && at1->second == *taken));
  }
  EXPECT_GT(*std::max_element(taken_state.begin(), taken_state.end()), 0.0f);
  for (NodeId i = 0; i < 2; ++i) {
    const SparseConsensusReport other = cluster.result<SparseConsensusReport>(i);
    EXPECT_EQ(other.rounds_done, 6 * other.rounds_per_epoch) << "node " << i;
    EXPECT_EQ(other.shares_refused, 0u) << "node " << i;
    EXPECT_EQ(other.finished_peers.size(), 2u) << "node " << i;
  }
}

TEST(SparseConsensus, ABadRowShareIsRefusedNamingThePeer) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  ml::KgeWorkload workload(graph, smallComplEx(), 11);
  LocalCluster cluster(2, 0, {.cluster = "sparse-bad-frame"});
  SparseConsensusOptions options;
  options.train = sparseTrainOptions(1000, 32, 0.1);
  options.backup = chorus::consensus::BackupRuleSpec::read("wait-all").value();
  // Node 1 is a bare node: it sends what the test writes.
  cluster.attach<SparseConsensusPeer>(0, workload, ml::shardIid(graph.train.size(), 2, 1)[0],
                                      sparseLayout(testsupport::complete(2), 0), options);
  cluster.connect();
  cluster.start();
  node::Node& bare = cluster.node(1);
  const auto send = [&](uint64_t key, uint32_t part, uint32_t parts) {
    node::SharedFrame frame =
        encodeMessage(bare, wire::Body::RowShare, [&](flatbuffers::FlatBufferBuilder& b) {
          const std::vector<uint64_t> keys = {key};
          const std::vector<float> values(32, 1.0f);
          const std::vector<uint8_t> hops = {0};
          auto block = wire::CreateRowBlock(b, 0, b.CreateVector(keys), b.CreateVector(values),
                                            b.CreateVector(hops));
          std::vector<flatbuffers::Offset<wire::RowBlock>> blocks = {block};
          return wire::CreateRowShare(b, 0, part, parts, 0, b.CreateVector(blocks)).Union();
        });
    bare.send(0, frame);
  };
  send(1'000'000, 0, 1);  // a key beyond the 300 entities
  EXPECT_TRUE(cluster.logCapture(0).waitForLine(
      {"refused a RowShare from node 1", "beyond its 300 rows"}, 30s));
  send(3, 1, 2);  // part 1 of a share whose part 0 never came
  EXPECT_TRUE(cluster.logCapture(0).waitForLine({"where part 0 of 2 was due"}, 30s));
  cluster.stopAll();
  const SparseConsensusReport r = cluster.result<SparseConsensusReport>(0, 60s);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.shares_refused, 2u);
}

// A part with rows of the wrong width is refused as it arrives, not when its share is complete:
// nothing of it is kept (the share being assembled is dropped), so the next part of that share
// is refused too. A hostile neighbor's wrong parts cost no memory beyond the frame in hand.
TEST(SparseConsensus, AWrongWidthPartIsRefusedBeforeAnythingIsKept) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  ml::KgeWorkload workload(graph, smallComplEx(), 11);
  LocalCluster cluster(2, 0, {.cluster = "sparse-wide-part"});
  SparseConsensusOptions options;
  options.train = sparseTrainOptions(1000, 32, 0.1);
  options.backup = chorus::consensus::BackupRuleSpec::read("wait-all").value();
  cluster.attach<SparseConsensusPeer>(0, workload, ml::shardIid(graph.train.size(), 2, 1)[0],
                                      sparseLayout(testsupport::complete(2), 0), options);
  cluster.connect();
  cluster.start();
  node::Node& bare = cluster.node(1);
  // Part `part` of 3 of round 0: rows 10 * part + 0..9 of the entity table, `floats` per row
  // (its rows are 32 floats).
  const auto send = [&](uint32_t part, size_t floats) {
    node::SharedFrame frame =
        encodeMessage(bare, wire::Body::RowShare, [&](flatbuffers::FlatBufferBuilder& b) {
          std::vector<uint64_t> keys;
          for (uint64_t k = 0; k < 10; ++k)
            keys.push_back(10 * part + k);
          const std::vector<float> values(keys.size() * floats, 0.5f);
          const std::vector<uint8_t> hops(keys.size(), 0);
          auto block = wire::CreateRowBlock(b, 0, b.CreateVector(keys), b.CreateVector(values),
                                            b.CreateVector(hops));
          std::vector<flatbuffers::Offset<wire::RowBlock>> blocks = {block};
          return wire::CreateRowShare(b, 0, part, 3, 0, b.CreateVector(blocks)).Union();
        });
    bare.send(0, frame);
  };
  send(0, 33);
  EXPECT_TRUE(cluster.logCapture(0).waitForLine(
      {"refused a RowShare from node 1", "10 keys with 330 values", "rows of 32 floats"}, 30s));
  send(1, 32);  // a good part, but of a share whose part 0 was not kept
  EXPECT_TRUE(cluster.logCapture(0).waitForLine({"part 1 of 3 of round 0", "part 0 of 3"}, 30s));
  cluster.stopAll();
  const SparseConsensusReport r = cluster.result<SparseConsensusReport>(0, 60s);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.shares_refused, 2u);
}

TEST(SparseConsensus, TheDiameterIsTheDefaultRelayLimit) {
  std::map<NodeId, std::vector<NodeId>> ring5;
  for (NodeId i = 0; i < 5; ++i)
    ring5[i] = {(i + 4) % 5, (i + 1) % 5};
  EXPECT_EQ(graphDiameter(ring5), 2);
  std::map<NodeId, std::vector<NodeId>> line = {{0, {1}}, {1, {0, 2}}, {2, {1, 3}}, {3, {2}}};
  EXPECT_EQ(graphDiameter(line), 3);
  EXPECT_EQ(graphDiameter({{0, {}}}), 0);
}

}  // namespace
}  // namespace chorus::consensus
