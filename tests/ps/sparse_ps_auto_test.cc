// --technique auto end to end over the real runtime (nodes as threads on loopback, port 0, fixed
// seeds): each key's technique chosen from every node's shard (ps/technique_choice.h), through
// nups's data path with the keys left at home never localized. Quality against the single-node
// driver, the replicas' agreement, and MF's row blocks relocated beside replicated columns.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ml/kge_workload.h"
#include "ml/mf_workload.h"
#include "ml/ratings.h"
#include "ml/sharding.h"
#include "ml/sparse_stats.h"
#include "ps/sparse_ps_peer.h"
#include "tests/support/local_cluster.h"
#include "tests/support/planted_graph.h"
#include "tests/support/sparse_cluster.h"

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;
using testsupport::LocalCluster;

using testsupport::finalMetric;
using testsupport::smallComplEx;
using testsupport::sparseTrainOptions;
using testsupport::trainAlone;

// Each shard's expected accesses per table, as the CLI computes them (KGE: its triples' entities
// and relations plus its negatives' uniform share; negatives shared by a batch of 32).
std::vector<std::vector<TableAccesses>> kgNodeAccesses(const ml::KgData& graph,
                                                       const ml::KgeConfig& config,
                                                       const ml::Shards& shards) {
  const double negatives = 2.0 * static_cast<double>(config.negatives) / 32;  // shared, batch 32
  std::vector<std::vector<TableAccesses>> out;
  for (const std::vector<size_t>& shard : shards) {
    ml::KgAccessStats stats = ml::kgShardAccessStats(graph, shard, negatives);
    out.push_back({std::move(stats.entities), std::move(stats.relations)});
  }
  return out;
}

std::vector<std::vector<TableAccesses>> mfNodeAccesses(const ml::RatingsData& data,
                                                       const ml::Shards& shards) {
  std::vector<std::vector<TableAccesses>> out;
  for (const std::vector<size_t>& shard : shards) {
    ml::MfAccessStats stats = ml::mfShardAccessStats(data, shard);
    out.push_back({std::move(stats.rows), std::move(stats.cols)});
  }
  return out;
}

// Trains `workloads.size()` peers with `technique`, node i on shards[i].
std::vector<SparsePsReport> trainCluster(
    std::vector<std::unique_ptr<ml::SparseWorkload>>& workloads, const ml::Shards& shards,
    const ml::SparseTrainOptions& train, SparseTechnique technique,
    const std::vector<std::vector<TableAccesses>>& node_accesses, const std::string& name) {
  const size_t nodes = workloads.size();
  LocalCluster cluster(nodes, 0, {.cluster = name});
  for (size_t i = 0; i < nodes; ++i) {
    SparsePsOptions options;
    options.ps.staleness = run::StalenessBound::read("0").value();
    options.ps.tick_every = 20ms;
    options.train = train;
    options.technique = technique;
    options.replication.node_accesses = node_accesses;
    options.replication.syncs_per_second = 50;
    options.replication.budget_bytes = uint64_t{64} << 20;
    cluster.attach<SparsePsPeer>(i, *workloads[i], shards[i], testsupport::membersOf(nodes),
                                 options);
  }
  cluster.connect();
  cluster.start();
  std::vector<SparsePsReport> reports;
  for (size_t i = 0; i < nodes; ++i)
    reports.push_back(cluster.result<SparsePsReport>(i, 240s));
  return reports;
}

// Three nodes on iid shards of the planted graph: every node uses the relations at every step
// (replicated), entities are shared now and then (left at their homes), no hand-set N; the
// single node's MRR (within the 50% of the other techniques' tests), and once drained every
// node's replicas are the same bits.
TEST(SparsePsAuto, ThreeNodesReachTheSingleNodeMrrWithNoTuning) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  const ml::KgeConfig config = smallComplEx(/*shared_negatives=*/true);
  const ml::SparseTrainOptions train = sparseTrainOptions(12, 32, 0.1);
  ml::KgeWorkload alone(graph, config, 11);
  const double single = finalMetric(trainAlone(alone, train), "test", "mrr");

  const ml::Shards shards = ml::shardIid(graph.train.size(), 3, train.seed);
  const std::vector<std::vector<TableAccesses>> accesses = kgNodeAccesses(graph, config, shards);
  std::vector<std::unique_ptr<ml::SparseWorkload>> workloads;
  for (size_t i = 0; i < 3; ++i)
    workloads.push_back(std::make_unique<ml::KgeWorkload>(graph, config, 11));
  const std::vector<SparsePsReport> reports =
      trainCluster(workloads, shards, train, SparseTechnique::kAuto, accesses, "auto-kge");

  // The choice every node made (the same function, the same inputs).
  const KeySpace space = sparseKeySpace(workloads[0]->tables());
  ReplicationOptions replication;
  replication.node_accesses = accesses;
  replication.syncs_per_second = 50;
  replication.budget_bytes = uint64_t{64} << 20;
  const int64_t clocks = sparseClocksPerEpoch(graph.train.size(), 3, train.batchSize);
  const TechniqueChoice choice = chooseAutoTechniques(
      space, replication, AdagradPolicy(AdagradConfig{}), clocks, clocks * train.epochs);
  // Every relation is in (nearly) every step of every node.
  for (Key key = space.tables()[1].first; key < space.tables()[1].end(); ++key)
    EXPECT_TRUE(std::binary_search(choice.replicated.begin(), choice.replicated.end(), key));
  EXPECT_GT(choice.home, 0u);

  ASSERT_EQ(reports[0].final.size(), 2u);
  const double mrr = finalMetric(reports[0].final, "test", "mrr");
  EXPECT_GT(single, 0.08);
  EXPECT_NEAR(mrr, single, 0.5 * single);
  for (size_t i = 0; i < 3; ++i) {
    const SparsePsReport& r = reports[i];
    EXPECT_FALSE(r.stopped);
    EXPECT_EQ(r.epochs_done, 12);
    EXPECT_EQ(r.technique, SparseTechnique::kAuto);
    EXPECT_EQ(r.failed_pulls + r.failed_pushes, 0u) << "node " << i;
    EXPECT_EQ(r.access.replicated_keys, choice.replicated.size());
    EXPECT_GT(r.access.keys_replica, 0u);
    EXPECT_EQ(r.access.replica_lost_deltas, 0u);
    EXPECT_NE(r.access.replica_digest, 0u);
    EXPECT_EQ(r.access.replica_digest, reports[0].access.replica_digest) << "node " << i;
    // The keys left at home go through the classic path (KvWorker: batched per owner, rows by
    // slot): some of every node's reads and writes, not all (the relations are replicated).
    EXPECT_GT(r.access.keys_home, 0u) << "node " << i;
    EXPECT_LT(r.access.keys_home, r.access.keys_local + r.access.keys_remote) << "node " << i;
    // Only the relocated keys are ever asked to move (the loop localizes every step's entities
    // one clock ahead: lapse would ask for thousands).
    if (choice.relocated.empty()) {
      EXPECT_EQ(r.access.localized, 0u) << "node " << i;
    }
  }
}

// MF on row blocks (as the CLI splits it for every technique but classic): a row is used by its
// block's node alone (relocated there), the most rated columns by both nodes at every clock
// (replicated). The single node's RMSE, and far more of the accesses local than classic's.
TEST(SparsePsAuto, MfRowsAreRelocatedAndHotColumnsReplicated) {
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
  const ml::SparseTrainOptions train = sparseTrainOptions(8, 200, 0.1);
  ml::MfWorkload alone(data, mf);
  const double single = finalMetric(trainAlone(alone, train), "test", "rmse");
  ml::Shards blocks(2);
  for (size_t i = 0; i < data.train.size(); ++i)
    blocks[data.train[i].row * 2 / data.rows].push_back(i);
  const std::vector<std::vector<TableAccesses>> accesses = mfNodeAccesses(data, blocks);
  const auto run = [&](SparseTechnique technique, const std::string& name) {
    std::vector<std::unique_ptr<ml::SparseWorkload>> workloads;
    for (size_t i = 0; i < 2; ++i)
      workloads.push_back(std::make_unique<ml::MfWorkload>(data, mf));
    return trainCluster(workloads, blocks, train, technique, accesses, name);
  };
  const std::vector<SparsePsReport> classic = run(SparseTechnique::kClassic, "auto-mf-classic");
  const std::vector<SparsePsReport> reports = run(SparseTechnique::kAuto, "auto-mf");
  EXPECT_LT(single, 0.6);
  EXPECT_NEAR(finalMetric(reports[0].final, "test", "rmse"), single, 0.1 * single);
  for (size_t i = 0; i < 2; ++i) {
    const SparsePsReport& r = reports[i];
    EXPECT_EQ(r.failed_pulls + r.failed_pushes, 0u);
    EXPECT_GT(r.access.replicated_keys, 0u);
    EXPECT_GT(r.access.keys_replica, 0u);
    EXPECT_GT(r.access.localized, 0u) << "node " << i << ": its rows are relocated to it";
    EXPECT_EQ(r.access.replica_digest, reports[0].access.replica_digest);
    EXPECT_GT(r.localShare(), classic[i].localShare() + 0.2)
        << "node " << i << ": auto " << r.localShare() << ", classic " << classic[i].localShare();
  }
}

// auto without every node's expected accesses cannot choose: refused up front.
TEST(SparsePsAuto, RefusedWithoutTheNodesAccesses) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  ml::KgeWorkload workload(graph, smallComplEx(), 11);
  LocalCluster cluster(1, 0, {.cluster = "auto-none"});
  SparsePsOptions options;
  options.train = sparseTrainOptions(1, 32, 0.1);
  options.technique = SparseTechnique::kAuto;
  EXPECT_THROW(cluster.attach<SparsePsPeer>(0, workload, std::vector<size_t>{0, 1},
                                            testsupport::membersOf(1), options),
               std::invalid_argument);
}

}  // namespace
}  // namespace chorus::ps
