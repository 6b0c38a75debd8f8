// Sparse PS mode end to end over the real runtime: nodes as threads in this process on
// loopback (port 0, fixed seeds) train one knowledge-graph embedding or matrix factorization
// together, with the rows as keys; the quality is held against the single-node driver's on the
// same data and seed, and each step's reads against the rows it touches. Also the pure pieces:
// the step's keys and the clocks' batches.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>

#include "ml/kge_workload.h"
#include "ml/mf_workload.h"
#include "ml/ratings.h"
#include "ml/sharding.h"
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

struct ClusterRun {
  std::vector<SparsePsReport> reports;
  std::vector<size_t> max_pulled;  // per node: the most keys one step read
  std::vector<bool> sorted_unique;
};

// Trains `nodes` peers, each on its own copy of the workload `make` builds (the seed's model)
// and its iid shard of the points.
template <typename Make>
ClusterRun trainCluster(size_t nodes, Make make, const ml::SparseTrainOptions& train,
                        const std::string& staleness, const std::string& name,
                        std::optional<sampling::SampleSchemeOptions> sampling = std::nullopt,
                        SparseTechnique technique = SparseTechnique::kClassic,
                        std::optional<ml::Shards> given_shards = std::nullopt) {
  ClusterRun run;
  run.max_pulled.assign(nodes, 0);
  run.sorted_unique.assign(nodes, true);
  std::mutex mu;
  const auto argsFor = [&](size_t i) {
    SparsePsOptions options;
    options.ps.staleness = run::StalenessBound::read(staleness).value();
    options.ps.tick_every = 20ms;
    options.train = train;
    options.sampling = sampling;
    options.technique = technique;
    options.on_pull = [&run, &mu, i](Clock, std::span<const Key> keys) {
      std::lock_guard lock(mu);
      run.max_pulled[i] = std::max(run.max_pulled[i], keys.size());
      for (size_t k = 1; k < keys.size(); ++k) {
        if (keys[k - 1] >= keys[k]) run.sorted_unique[i] = false;
      }
    };
    return std::make_tuple(testsupport::membersOf(nodes), options);
  };
  run.reports = testsupport::trainSparseCluster<SparsePsPeer, SparsePsReport>(
      nodes, name, make, train.seed, argsFor, given_shards);
  return run;
}

class SparsePsKge : public ::testing::TestWithParam<const char*> {};

TEST_P(SparsePsKge, ThreeNodesReachTheSingleNodeMrr) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  auto make = [&] { return std::make_unique<ml::KgeWorkload>(graph, smallComplEx(), 11); };
  const ml::SparseTrainOptions train = sparseTrainOptions(12, 32, 0.1);
  const auto alone = trainAlone(*make(), train);
  const ClusterRun run = trainCluster(3, make, train, GetParam(), "sparse-kge");
  ASSERT_EQ(run.reports[0].final.size(), 2u);
  const double single = finalMetric(alone, "test", "mrr");
  const double ps = finalMetric(run.reports[0].final, "test", "mrr");
  // A random ranking of 300 entities has an MRR near 0.02; the planted groups allow ~0.1+.
  EXPECT_GT(single, 0.08);
  // BSP is one order of updates; with staleness the order follows the threads' timing, and the
  // MRR of this small graph moves by about 20% from run to run (0.105 against 0.141 once under
  // load): BSP gets 25% either side, runs with staleness 50% (still far above the 0.02 of a
  // random ranking).
  const double slack = std::string_view(GetParam()) == "0" ? 0.25 : 0.5;
  EXPECT_NEAR(ps, single, slack * single) << "staleness " << GetParam();
  for (size_t i = 0; i < run.reports.size(); ++i) {
    const SparsePsReport& r = run.reports[i];
    EXPECT_FALSE(r.stopped);
    EXPECT_EQ(r.epochs_done, 12);
    EXPECT_EQ(r.clocks_done, 12 * r.clocks_per_epoch);
    EXPECT_EQ(r.failed_pulls + r.failed_pushes, 0u);
    EXPECT_EQ(r.finished_peers.size(), 2u);
    EXPECT_TRUE(run.sorted_unique[i]);
    // Classic placement: about a third of the rows are this node's.
    EXPECT_GT(r.localShare(), 0.15);
    EXPECT_LT(r.localShare(), 0.55);
    if (i > 0) {
      EXPECT_TRUE(r.final.empty());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Staleness, SparsePsKge, ::testing::Values("0", "2", "inf"),
                         [](const auto& info) {
                           return std::string(info.param) == "inf" ? std::string("async")
                                                                   : std::string("s") + info.param;
                         });

// The negatives drawn through the PS's sampling primitives (--sample-scheme), each scheme on two
// nodes under each technique, against the workload's own draws (i.i.d. per step, what naive
// does) under classic on the same data and seed, BSP (under a bound the timing changes the order
// of the owners' updates, and the MRR by about 20%; BSP runs repeat here). Tolerance: classic
// within 25% of that MRR; measured: reference 0.133, naive and preloc 0.122, pool and postpone
// (reuse 16, groups spanning 16 steps) 0.131, onlylocal 0.119 (onlylocal samples from this
// node's half of the entities only: about 10% lower here). Lapse applies pushes in the order
// they reach the moving rows, so its runs vary: the 50% of SparsePsLapse's runs; measured in
// two runs naive 0.125-0.143, preloc 0.110-0.119, pool 0.150-0.154, postpone 0.145-0.170,
// onlylocal 0.126-0.130. Under lapse the sampled keys' local share says little here: both
// nodes' samples (1,024 keys a step) cover most of the 300 entities, so preloc's localizes pull
// the same rows to and fro (measured: naive 46%, preloc 32%, pool and postpone 52%); onlylocal
// is still never remote.
using SamplingParam = std::tuple<const char*, SparseTechnique>;
class SparsePsSampling : public ::testing::TestWithParam<SamplingParam> {};

TEST_P(SparsePsSampling, EachSchemeTrainsNearTheWorkloadsOwnDraws) {
  const char* scheme = std::get<0>(GetParam());
  const SparseTechnique technique = std::get<1>(GetParam());
  const ml::KgData graph = testsupport::makePlantedGraph({});
  auto make = [&] { return std::make_unique<ml::KgeWorkload>(graph, smallComplEx(), 11); };
  const ml::SparseTrainOptions train = sparseTrainOptions(12, 32, 0.1);
  static const double reference = [&] {
    const ClusterRun own = trainCluster(2, make, train, "0", "sparse-own-draws");
    return finalMetric(own.reports[0].final, "test", "mrr");
  }();
  sampling::SampleSchemeOptions options;
  ASSERT_FALSE(sampling::sampleOptionsFromFlags(scheme, std::nullopt, options));
  const ClusterRun run = trainCluster(2, make, train, "0", "sparse-sampling", options, technique);
  ASSERT_EQ(run.reports[0].final.size(), 2u);
  const double mrr = finalMetric(run.reports[0].final, "test", "mrr");
  const bool onlylocal = options.kind == sampling::SampleSchemeKind::kOnlyLocal;
  const bool lapse = technique == SparseTechnique::kLapse;
  EXPECT_GT(reference, 0.08);
  EXPECT_NEAR(mrr, reference, (lapse ? 0.5 : 0.25) * reference) << scheme;
  uint64_t handed_out = 0;
  for (size_t i = 0; i < run.reports.size(); ++i) {
    const SparsePsReport& r = run.reports[i];
    EXPECT_FALSE(r.stopped);
    EXPECT_EQ(r.failed_pulls + r.failed_pushes, 0u);
    ASSERT_TRUE(r.sampling.has_value());
    handed_out += r.sampling->scheme.handed_out;
    if (onlylocal) {
      // Only rows held here: no sampled row was read from the other node.
      EXPECT_EQ(r.sampling->remote_keys, 0u) << "node " << i;
      EXPECT_DOUBLE_EQ(r.sampleLocalShare(), 1.0) << "node " << i;
    } else if (!lapse) {
      // Classic placement: about half of the entities are this node's.
      EXPECT_GT(r.sampleLocalShare(), 0.35) << "node " << i;
      EXPECT_LT(r.sampleLocalShare(), 0.65) << "node " << i;
      EXPECT_GT(r.sampling->remote_keys, 0u) << "node " << i;
    }
  }
  // Every step's negatives came through the samplers: 2 directions x 16 per triple, 12 epochs.
  EXPECT_EQ(handed_out, uint64_t{12} * 2 * 16 * graph.train.size());
}

INSTANTIATE_TEST_SUITE_P(
    Schemes, SparsePsSampling,
    ::testing::Combine(::testing::Values("naive", "preloc", "pool", "postpone", "onlylocal"),
                       ::testing::Values(SparseTechnique::kClassic, SparseTechnique::kLapse)),
    [](const ::testing::TestParamInfo<SamplingParam>& info) {
      return std::string(std::get<0>(info.param)) + "_" +
             sparseTechniqueName(std::get<1>(info.param));
    });

TEST(SparsePs, AStepReadsOnlyTheRowsItTouches) {
  // 4000 entities, batches of 8 triples with 4 negatives per direction: a step touches at most
  // 8 * (2 + 2 * 4) entity rows and 8 relation rows, 1-2% of the table.
  testsupport::PlantedGraphOptions options;
  options.entities = 4000;
  options.groups = 40;
  options.train = 800;
  const ml::KgData graph = testsupport::makePlantedGraph(options);
  ml::KgeConfig config = smallComplEx();
  config.negatives = 4;
  auto make = [&] { return std::make_unique<ml::KgeWorkload>(graph, config, 3); };
  const ml::SparseTrainOptions train = sparseTrainOptions(1, 8, 0.1);
  const ClusterRun run = trainCluster(2, make, train, "2", "sparse-rows");
  const size_t per_step = 8 * (2 + 2 * 4) + 8;
  const size_t row_bytes = config.dim * sizeof(float);
  for (size_t i = 0; i < 2; ++i) {
    const SparsePsReport& r = run.reports[i];
    EXPECT_GT(run.max_pulled[i], 8u);
    EXPECT_LE(run.max_pulled[i], per_step);
    EXPECT_LE(r.rows_pulled, static_cast<uint64_t>(r.clocks_done) * per_step);
    // The bytes a node received: its remote rows' values (and each reply's frame), plus node
    // 0's final read of the whole model. Nothing near a whole model per step.
    const uint64_t model_bytes = (options.entities + options.relations) * row_bytes;
    const uint64_t step_bytes =
        r.worker.keys_remote * (row_bytes + 16) + static_cast<uint64_t>(r.clocks_done) * 512;
    EXPECT_LE(r.bytes_in, step_bytes + (i == 0 ? model_bytes : 0) + 64 * 1024)
        << "node " << i << ": " << r.clocks_done << " clocks, " << r.worker.keys_remote
        << " remote keys";
    EXPECT_LT(r.bytes_in, static_cast<uint64_t>(r.clocks_done) * model_bytes / 20);
  }
}

TEST(SparsePs, TheBytesOfAStepFollowTheRowsTouchedNotTheTableSize) {
  // The same triples (ids below 2000) over a table of 2,000 and one of 20,000 entities: a
  // node's clocks move about the same bytes, though one table is 10x the other. Node 0's figure:
  // it takes it on its trainer thread before its own final read of the whole model. Node 1's
  // may hold half of that read (10x larger with the larger table): node 1's server answers it
  // on the loop thread as soon as node 1 announced its last clock, which can come before node
  // 1's trainer thread reads its counters (it did under load: 2.06 MB against 0.61 MB).
  auto bytesFor = [](size_t entities) {
    testsupport::PlantedGraphOptions options;
    options.entities = 2000;
    options.groups = 20;
    options.train = 600;
    ml::KgData graph = testsupport::makePlantedGraph(options);
    for (size_t e = graph.entities(); e < entities; ++e)
      graph.entityNames.push_back("unused" + std::to_string(e));
    ml::KgeConfig config = smallComplEx();
    config.negatives = 2;
    // Negatives over the whole table: the rows a step touches stay about as many.
    auto make = [&] { return std::make_unique<ml::KgeWorkload>(graph, config, 3); };
    const ClusterRun run =
        trainCluster(2, make, sparseTrainOptions(1, 8, 0.1), "2", "sparse-bytes");
    const SparsePsReport& r = run.reports[0];
    return std::pair(r.clock_bytes_in + r.clock_bytes_out, r.rows_pulled);
  };
  const auto [small_bytes, small_rows] = bytesFor(2000);
  const auto [large_bytes, large_rows] = bytesFor(20000);
  EXPECT_GT(small_bytes, 0u);
  EXPECT_NEAR(static_cast<double>(large_bytes), static_cast<double>(small_bytes),
              0.25 * static_cast<double>(small_bytes));
  EXPECT_NEAR(static_cast<double>(large_rows), static_cast<double>(small_rows),
              0.25 * static_cast<double>(small_rows));
}

TEST(SparsePs, TwoNodesFactorizeAsWellAsOne) {
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
  ml::SparseTrainOptions train = sparseTrainOptions(8, 200, 0.1);
  const auto alone = trainAlone(*make(), train);
  const ClusterRun run = trainCluster(2, make, train, "2", "sparse-mf");
  const double single = finalMetric(alone, "test", "rmse");
  const double ps = finalMetric(run.reports[0].final, "test", "rmse");
  EXPECT_LT(single, 0.6);  // the planted signal has variance 1
  EXPECT_NEAR(ps, single, 0.1 * single);
}

// --technique lapse: the entities of each clock's triples are localized one clock ahead (Lapse's
// relocation over the network, ps/relocation_shell.h). Three nodes, BSP: the same quality as one
// node (pushes apply as they reach the moving rows, in an order that follows the threads'
// timing: the tolerance of the classic runs with staleness, 50%).
TEST(SparsePsLapse, ThreeNodesReachTheSingleNodeMrr) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  auto make = [&] { return std::make_unique<ml::KgeWorkload>(graph, smallComplEx(), 11); };
  const ml::SparseTrainOptions train = sparseTrainOptions(12, 32, 0.1);
  const auto alone = trainAlone(*make(), train);
  const ClusterRun lapse =
      trainCluster(3, make, train, "0", "lapse-kge", std::nullopt, SparseTechnique::kLapse);
  ASSERT_EQ(lapse.reports[0].final.size(), 2u);
  const double single = finalMetric(alone, "test", "mrr");
  const double mrr = finalMetric(lapse.reports[0].final, "test", "mrr");
  EXPECT_GT(single, 0.08);
  EXPECT_NEAR(mrr, single, 0.5 * single);
  for (size_t i = 0; i < 3; ++i) {
    const SparsePsReport& r = lapse.reports[i];
    EXPECT_FALSE(r.stopped);
    EXPECT_EQ(r.epochs_done, 12);
    EXPECT_EQ(r.failed_pulls + r.failed_pushes, 0u) << "node " << i;
    EXPECT_EQ(r.technique, SparseTechnique::kLapse);
    EXPECT_GT(r.access.localized, 0u);
    EXPECT_EQ(r.access.localize_failed, 0u);
    EXPECT_TRUE(lapse.sorted_unique[i]);
  }
}

// The point of relocation: with entities that each appear in a few triples (on the 300-entity
// graph every worker's next batch names nearly every entity, which relocation can only pass
// round) and a few shared negatives per step, most of a step's rows are local under lapse,
// against classic placement's third.
TEST(SparsePsLapse, MoreOfTheRowAccessesAreLocalThanUnderClassic) {
  testsupport::PlantedGraphOptions planted;
  planted.entities = 3000;
  planted.groups = 30;
  const ml::KgData graph = testsupport::makePlantedGraph(planted);
  ml::KgeConfig config = smallComplEx();
  config.sharedNegatives = true;
  auto make = [&] { return std::make_unique<ml::KgeWorkload>(graph, config, 11); };
  const ml::SparseTrainOptions train = sparseTrainOptions(2, 32, 0.1);
  const ClusterRun classic = trainCluster(3, make, train, "0", "local-classic");
  const ClusterRun lapse =
      trainCluster(3, make, train, "0", "local-lapse", std::nullopt, SparseTechnique::kLapse);
  for (size_t i = 0; i < 3; ++i) {
    const SparsePsReport& r = lapse.reports[i];
    EXPECT_EQ(r.failed_pulls + r.failed_pushes, 0u) << "node " << i;
    EXPECT_LT(classic.reports[i].localShare(), 0.45) << "node " << i;
    EXPECT_GT(r.localShare(), classic.reports[i].localShare() + 0.2)
        << "node " << i << ": lapse " << r.localShare() << ", classic "
        << classic.reports[i].localShare();
  }
}

// MF under lapse with Lapse's partition (each worker the ratings of a block of matrix rows):
// the row factors stay with their worker, the RMSE is one node's.
TEST(SparsePsLapse, TwoNodesFactorizeAsWellAsOneWithRowBlocks) {
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
  ml::SparseTrainOptions train = sparseTrainOptions(8, 200, 0.1);
  const auto alone = trainAlone(*make(), train);
  ml::Shards blocks(2);
  for (size_t i = 0; i < data.train.size(); ++i)
    blocks[data.train[i].row * 2 / data.rows].push_back(i);
  const ClusterRun classic = trainCluster(2, make, train, "2", "lapse-mf-classic");
  const ClusterRun run =
      trainCluster(2, make, train, "2", "lapse-mf", std::nullopt, SparseTechnique::kLapse, blocks);
  const double single = finalMetric(alone, "test", "rmse");
  const double ps = finalMetric(run.reports[0].final, "test", "rmse");
  EXPECT_LT(single, 0.6);
  EXPECT_NEAR(ps, single, 0.1 * single);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(run.reports[i].failed_pulls + run.reports[i].failed_pushes, 0u);
    EXPECT_GT(run.reports[i].localShare(), classic.reports[i].localShare() + 0.1) << "node " << i;
  }
}

// A node killed for real while it holds rows it localized: the others do not hang (they finish
// every clock; their reads and pushes of the lost rows fail and are counted) and the loss is
// logged with the node.
TEST(SparsePsLapse, ANodeKilledHoldingRelocatedRowsDoesNotHangTheOthers) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  auto make = [&] { return std::make_unique<ml::KgeWorkload>(graph, smallComplEx(), 11); };
  // Before the cluster: its nodes' threads (a killed node's among them) use the workloads
  // until the cluster's destructor joins them.
  std::vector<std::unique_ptr<ml::SparseWorkload>> workloads;
  LocalCluster cluster(3, 0, {.cluster = "lapse-kill"});
  const ml::Shards shards = ml::shardIid(graph.train.size(), 3, 1);
  for (size_t i = 0; i < 3; ++i) {
    workloads.push_back(make());
    SparsePsOptions options;
    options.ps.tick_every = 20ms;
    options.ps.staleness = run::StalenessBound::read("0").value();
    options.train = sparseTrainOptions(6, 32, 0.1);
    options.technique = SparseTechnique::kLapse;
    if (i == 2) {
      // Node 2 dies at its clock 20, holding the rows it localized for its steps.
      options.on_pull = [&cluster](Clock clock, std::span<const Key>) {
        if (clock == 20) cluster.kill(2);
      };
    }
    cluster.attach<SparsePsPeer>(i, *workloads[i], shards[i], testsupport::membersOf(3), options);
  }
  cluster.connect();
  cluster.start();
  for (size_t i = 0; i < 2; ++i) {
    const SparsePsReport r = cluster.result<SparsePsReport>(i, std::chrono::seconds(120));
    EXPECT_FALSE(r.stopped) << "node " << i;
    EXPECT_EQ(r.epochs_done, 6) << "node " << i;
    EXPECT_GT(r.failed_pulls + r.failed_pushes, 0u) << "node " << i;
    EXPECT_TRUE(cluster.logCapture(i).waitForLine({"relocation: node 2 went down", "lost"}))
        << cluster.log(i);
  }
}

TEST(SparsePs, StopEndsEveryNodesRunEarly) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  auto make = [&] { return std::make_unique<ml::KgeWorkload>(graph, smallComplEx(), 11); };
  // Before the cluster: its nodes' threads (a killed node's among them) use the workloads
  // until the cluster's destructor joins them.
  std::vector<std::unique_ptr<ml::SparseWorkload>> workloads;
  LocalCluster cluster(2, 0, {.cluster = "sparse-stop"});
  const ml::Shards shards = ml::shardIid(graph.train.size(), 2, 1);
  for (size_t i = 0; i < 2; ++i) {
    workloads.push_back(make());
    SparsePsOptions options;
    options.train = sparseTrainOptions(1000, 32, 0.1);
    if (i == 0) {
      // Node 0 stops both runs (any thread may) at its clock 5.
      options.on_pull = [&cluster](Clock clock, std::span<const Key>) {
        if (clock == 5) cluster.stopAll();
      };
    }
    cluster.attach<SparsePsPeer>(i, *workloads[i], shards[i], testsupport::membersOf(2), options);
  }
  cluster.connect();
  cluster.start();
  for (size_t i = 0; i < 2; ++i) {
    const SparsePsReport r = cluster.result<SparsePsReport>(i, std::chrono::seconds(60));
    EXPECT_TRUE(r.stopped) << "node " << i;
    EXPECT_LT(r.epochs_done, 1000);
    EXPECT_TRUE(r.final.empty());
  }
}

TEST(StepKeys, SortsDeduplicatesAndPutsValuesBack) {
  ml::SparseTable a("a", 5, 2), b("b", 3, 1);
  std::vector<ml::SparseTable*> tables = {&a, &b};
  const KeySpace space = sparseKeySpace(tables);
  EXPECT_EQ(space.numKeys(), 8u);
  StepKeys keys(space);
  std::vector<std::vector<ml::RowKey>> rows = {{4, 1, 4, 0}, {2, 2}};
  keys.assign(rows);
  EXPECT_EQ(std::vector<Key>(keys.keys().begin(), keys.keys().end()),
            (std::vector<Key>{0, 1, 4, 7}));
  EXPECT_EQ(keys.floats(), 7u);
  EXPECT_TRUE(rows[0].empty());
  const std::vector<float> values = {1, 2, 3, 4, 5, 6, 7};
  keys.scatter(values, tables);
  EXPECT_EQ(a.row(0)[1], 2);
  EXPECT_EQ(a.row(4)[0], 5);
  EXPECT_EQ(b.row(2)[0], 7);
  // The next step starts afresh.
  rows = {{1}, {}};
  keys.assign(rows);
  EXPECT_EQ(std::vector<Key>(keys.keys().begin(), keys.keys().end()), (std::vector<Key>{1}));
  rows = {{5}, {}};
  EXPECT_THROW(keys.assign(rows), std::out_of_range);

  ml::SparseGrad grad;
  grad.dim = 1;
  grad.keys = {0, 2};
  grad.rows.assign({0.5f, 0.25f});
  std::vector<Key> push_keys;
  std::vector<float> push_floats;
  appendGrad(space.tables()[1], grad, push_keys, push_floats);
  EXPECT_EQ(push_keys, (std::vector<Key>{5, 7}));
  EXPECT_EQ(push_floats, (std::vector<float>{0.5f, 0.25f}));
}

TEST(SparseClocks, EveryWorkerRunsTheSameClocksAndEveryPointOnce) {
  for (size_t points : {1u, 7u, 100u, 1001u}) {
    for (size_t workers : {1u, 3u, 4u}) {
      for (size_t batch : {1u, 8u, 64u}) {
        const int64_t clocks = sparseClocksPerEpoch(points, workers, batch);
        const ml::Shards shards = ml::shardIid(points, static_cast<int>(workers), 1);
        std::multiset<size_t> seen;
        for (const auto& shard : shards) {
          for (int64_t c = 0; c < clocks; ++c) {
            const auto part = sparseClockBatch(shard, c, clocks);
            EXPECT_LE(part.size(), batch) << points << " " << workers << " " << batch;
            seen.insert(part.begin(), part.end());
          }
        }
        ASSERT_EQ(seen.size(), points);
        size_t expect = 0;
        for (size_t p : seen)
          EXPECT_EQ(p, expect++);
      }
    }
  }
}

TEST(SparsePsOptions, UnsupportedSettingsNameTheFlag) {
  SparsePsOptions options;
  options.train.savePath = "model.ckpt";
  EXPECT_THROW(
      {
        try {
          validateSparsePsOptions(options);
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("--save"), std::string::npos);
          throw;
        }
      },
      std::invalid_argument);
  options.train.savePath.clear();
  // --time-limit with --mf-schedule rotation: a node that stopped would hold the barriers.
  options.train.timeLimitSeconds = 10;
  options.rotation_blocks = 2;
  EXPECT_THROW(validateSparsePsOptions(options), std::invalid_argument);
  options.rotation_blocks = 0;
  options.train.keepBest = true;  // taken in PS mode
  EXPECT_NO_THROW(validateSparsePsOptions(options));
  options.train.keepBest = false;
  options.train.timeLimitSeconds = 0;
  options.ps.rejoin = true;
  EXPECT_THROW(validateSparsePsOptions(options), std::invalid_argument);
}

}  // namespace
}  // namespace chorus::ps
