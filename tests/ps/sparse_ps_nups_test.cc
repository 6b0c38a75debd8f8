// --technique nups end to end over the real runtime (nodes as threads on loopback, port 0, fixed
// seeds): the hot keys' replicas (ps/replica_shell.h) beside Lapse relocation, through the
// SparseRowAccess seam of sparse PS mode. Quality against the single-node driver, the share of
// local accesses against lapse's, --replicate 0 against lapse, the replicas' agreement once
// drained, and a node killed mid-run.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ml/kge_workload.h"
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

// The graph's expected accesses per table (entities, relations), as the CLI computes them.
std::vector<TableAccesses> accessesOf(const ml::KgData& graph, const ml::KgeConfig& config,
                                      size_t batch) {
  const double negatives = config.sharedNegatives ? 2.0 * static_cast<double>(config.negatives) /
                                                        static_cast<double>(batch)
                                                  : 2.0 * static_cast<double>(config.negatives);
  ml::KgAccessStats stats = ml::kgAccessStats(graph, negatives);
  return {std::move(stats.entities), std::move(stats.relations)};
}

struct RunSetup {
  SparseTechnique technique = SparseTechnique::kNups;
  std::optional<size_t> replicate;
  double syncs_per_second = 50;
  std::string staleness = "0";
};

// Trains `nodes` peers on `graph` with `config`, each on its iid shard.
std::vector<SparsePsReport> trainCluster(size_t nodes, const ml::KgData& graph,
                                         const ml::KgeConfig& config,
                                         const ml::SparseTrainOptions& train, const RunSetup& setup,
                                         const std::string& name) {
  const auto argsFor = [&](size_t) {
    SparsePsOptions options;
    options.ps.staleness = run::StalenessBound::read(setup.staleness).value();
    options.ps.tick_every = 20ms;
    options.train = train;
    options.technique = setup.technique;
    options.replication.accesses = accessesOf(graph, config, train.batchSize);
    options.replication.replicate = setup.replicate;
    options.replication.syncs_per_second = setup.syncs_per_second;
    return std::make_tuple(testsupport::membersOf(nodes), options);
  };
  return testsupport::trainSparseCluster<SparsePsPeer, SparsePsReport>(
      nodes, name, [&] { return std::make_unique<ml::KgeWorkload>(graph, config, 11); }, train.seed,
      argsFor, std::nullopt, 240s);
}

// Three nodes, BSP for the relocated rows, the 4 relations (8 rows with reciprocals: every
// step's) and the most used entities replicated: the single node's MRR (within the 50% of the
// lapse and classic runs whose update order follows the threads' timing), and once drained every
// node's replicas are the same bits.
TEST(SparsePsNups, ThreeNodesReachTheSingleNodeMrrAndTheirReplicasAgree) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  const ml::KgeConfig config = smallComplEx();
  const ml::SparseTrainOptions train = sparseTrainOptions(12, 32, 0.1);
  ml::KgeWorkload alone_workload(graph, config, 11);
  const auto alone = testsupport::trainAlone(alone_workload, train);

  RunSetup setup;
  setup.replicate = 40;
  const std::vector<SparsePsReport> reports = trainCluster(3, graph, config, train, setup, "nups");
  ASSERT_EQ(reports[0].final.size(), 2u);
  const double single = finalMetric(alone, "test", "mrr");
  const double mrr = finalMetric(reports[0].final, "test", "mrr");
  EXPECT_GT(single, 0.08);
  EXPECT_NEAR(mrr, single, 0.5 * single);
  for (size_t i = 0; i < 3; ++i) {
    const SparsePsReport& r = reports[i];
    EXPECT_FALSE(r.stopped);
    EXPECT_EQ(r.epochs_done, 12);
    EXPECT_EQ(r.technique, SparseTechnique::kNups);
    EXPECT_EQ(r.failed_pulls + r.failed_pushes, 0u) << "node " << i;
    EXPECT_EQ(r.access.replicated_keys, 40u);
    EXPECT_GT(r.replica_share, 0.0);
    EXPECT_GT(r.access.keys_replica, 0u);
    EXPECT_LE(r.access.keys_replica, r.access.keys_local);
    EXPECT_GT(r.access.replica_rounds, 0u);
    EXPECT_EQ(r.access.replica_lost_deltas, 0u);
    EXPECT_GT(r.access.localized, 0u);
    EXPECT_GT(r.access.replica_staleness_max_s, 0.0);
    EXPECT_NE(r.access.replica_digest, 0u);
    EXPECT_EQ(r.access.replica_digest, reports[0].access.replica_digest) << "node " << i;
  }
}

// Relations are few and used by every worker (20 relations, 40 rows with reciprocals, most of
// them in every step here): lapse leaves them at their homes (it relocates a step's entities
// only), so a node of three reads about two thirds of them remotely; nups replicates them, and
// the share of local accesses rises above lapse's on every node.
TEST(SparsePsNups, MoreOfTheRowAccessesAreLocalThanUnderLapse) {
  testsupport::PlantedGraphOptions planted;
  planted.entities = 3000;
  planted.relations = 20;
  planted.groups = 30;
  const ml::KgData graph = testsupport::makePlantedGraph(planted);
  ml::KgeConfig config = smallComplEx();
  config.sharedNegatives = true;
  const ml::SparseTrainOptions train = sparseTrainOptions(2, 32, 0.1);
  RunSetup lapse;
  lapse.technique = SparseTechnique::kLapse;
  const std::vector<SparsePsReport> l = trainCluster(3, graph, config, train, lapse, "nl-lapse");
  RunSetup nups;
  nups.replicate = 40;  // the relations' rows
  const std::vector<SparsePsReport> n = trainCluster(3, graph, config, train, nups, "nl-nups");
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(n[i].failed_pulls + n[i].failed_pushes, 0u) << "node " << i;
    EXPECT_EQ(n[i].access.replicated_keys, 40u);
    EXPECT_GT(n[i].localShare(), l[i].localShare() + 0.05)
        << "node " << i << ": nups " << n[i].localShare() << ", lapse " << l[i].localShare();
  }
}

// --replicate 0: nothing is replicated, no replica frame is sent, and the run is lapse's (the same
// rows localized ahead, a local share within a few points of lapse's, the single node's quality).
TEST(SparsePsNups, ReplicateZeroBehavesLikeLapse) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  const ml::KgeConfig config = smallComplEx();
  const ml::SparseTrainOptions train = sparseTrainOptions(6, 32, 0.1);
  RunSetup lapse;
  lapse.technique = SparseTechnique::kLapse;
  const std::vector<SparsePsReport> l = trainCluster(2, graph, config, train, lapse, "z-lapse");
  RunSetup zero;
  zero.replicate = 0;
  const std::vector<SparsePsReport> z = trainCluster(2, graph, config, train, zero, "z-nups");
  EXPECT_NEAR(finalMetric(z[0].final, "test", "mrr"), finalMetric(l[0].final, "test", "mrr"),
              0.3 * finalMetric(l[0].final, "test", "mrr"));
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(z[i].technique, SparseTechnique::kNups);
    EXPECT_EQ(z[i].access.replicated_keys, 0u);
    EXPECT_EQ(z[i].access.keys_replica, 0u);
    EXPECT_EQ(z[i].access.replica_rounds, 0u);
    EXPECT_EQ(z[i].access.replica_bytes_sent, 0u);
    EXPECT_EQ(z[i].failed_pulls + z[i].failed_pushes, 0u);
    EXPECT_EQ(z[i].access.localized, l[i].access.localized) << "node " << i;
    EXPECT_NEAR(z[i].localShare(), l[i].localShare(), 0.1) << "node " << i;
  }
}

// A node killed for real mid-run, with replica sync rounds running (200 a second): the others
// finish every clock and drain among themselves, their replicas agree, and each log names the
// dead node as down for the sync and says its pushes since its last round are lost.
TEST(SparsePsNups, ANodeKilledMidRunHangsNobodyAndIsNamed) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  const ml::KgeConfig config = smallComplEx();
  // Before the cluster: its nodes' threads (a killed node's among them) use the workloads
  // until the cluster's destructor joins them.
  std::vector<std::unique_ptr<ml::SparseWorkload>> workloads;
  LocalCluster cluster(3, 0, {.cluster = "nups-kill"});
  const ml::Shards shards = ml::shardIid(graph.train.size(), 3, 1);
  for (size_t i = 0; i < 3; ++i) {
    workloads.push_back(std::make_unique<ml::KgeWorkload>(graph, config, 11));
    SparsePsOptions options;
    options.ps.tick_every = 20ms;
    options.ps.staleness = run::StalenessBound::read("0").value();
    options.train = sparseTrainOptions(6, 32, 0.1);
    options.technique = SparseTechnique::kNups;
    options.replication.accesses = accessesOf(graph, config, 32);
    options.replication.replicate = 20;
    options.replication.syncs_per_second = 200;
    if (i == 2) {
      // Node 2 dies at its clock 20, with pushes of its own in its replicas.
      options.on_pull = [&cluster](Clock clock, std::span<const Key>) {
        if (clock == 20) cluster.kill(2);
      };
    }
    cluster.attach<SparsePsPeer>(i, *workloads[i], shards[i], testsupport::membersOf(3), options);
  }
  cluster.connect();
  cluster.start();
  std::vector<SparsePsReport> reports;
  for (size_t i = 0; i < 2; ++i) {
    reports.push_back(cluster.result<SparsePsReport>(i, std::chrono::seconds(180)));
    const SparsePsReport& r = reports.back();
    EXPECT_FALSE(r.stopped) << "node " << i;
    EXPECT_EQ(r.epochs_done, 6) << "node " << i;
    EXPECT_GT(r.access.replica_rounds, 0u);
    EXPECT_NE(r.access.replica_digest, 0u) << "node " << i << " did not drain";
    EXPECT_TRUE(cluster.logCapture(i).waitForLine(
        {"replica sync: node 2 is down", "its pushes since it started its last round are lost"}))
        << cluster.log(i);
  }
  EXPECT_EQ(reports[0].access.replica_digest, reports[1].access.replica_digest);
}

TEST(SparsePsNups, ABadSyncRateIsRefusedWithTheFlag) {
  SparsePsOptions options;
  options.train = sparseTrainOptions(1, 32, 0.1);
  options.technique = SparseTechnique::kNups;
  options.replication.syncs_per_second = -1;
  try {
    validateSparsePsOptions(options);
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--replica-syncs-per-s -1"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace chorus::ps
