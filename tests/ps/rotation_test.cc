// --mf-schedule rotation (Orion's block schedule for MF; ps/rotation.h, ps/rotation_driver.h,
// docs/orion.md): the plan as a pure function (cuts, blocks, the rotation, the clocks), and on a
// real loopback cluster the property the schedule exists for: N workers produce the factors that
// one worker produces visiting the same blocks in the same order, bit for bit.
#include "ps/rotation.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <set>

#include "ml/mf_workload.h"
#include "ml/ratings.h"
#include "ps/sparse_ps_peer.h"
#include "tests/support/local_cluster.h"

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;
using testsupport::LocalCluster;

ml::RatingsData zipfData(uint64_t cells = 30000) {
  ml::ZipfRatingsOptions zipf;
  zipf.rows = 400;
  zipf.cols = 200;
  zipf.cells = cells;
  zipf.rank = 4;
  zipf.noiseSigma = 0.3;
  zipf.seed = 4;
  return ml::makeZipfRatings(zipf);
}

struct Points {
  std::vector<uint64_t> rows, cols;
};

Points pointsOf(const ml::RatingsData& data) {
  Points p;
  for (const ml::Rating& r : data.train) {
    p.rows.push_back(r.row);
    p.cols.push_back(r.col);
  }
  return p;
}

TEST(RotationCuts, BalancedCutsCoverEveryIdOnceAndSplitTheCountsEvenly) {
  const std::vector<uint64_t> counts = {5, 1, 1, 1, 1, 5, 1, 1, 1, 1, 5, 1, 1, 1};
  const std::vector<uint64_t> cuts = balancedCuts(counts, 3);
  ASSERT_EQ(cuts.size(), 4u);
  EXPECT_EQ(cuts.front(), 0u);
  EXPECT_EQ(cuts.back(), counts.size());
  EXPECT_TRUE(std::is_sorted(cuts.begin(), cuts.end()));
  // 26 in all: three ranges of 8 or 9 (5+1+1+1 | 1+5+1+1 ... whole ids allow).
  for (size_t p = 0; p < 3; ++p) {
    const uint64_t sum =
        std::accumulate(counts.begin() + static_cast<ptrdiff_t>(cuts[p]),
                        counts.begin() + static_cast<ptrdiff_t>(cuts[p + 1]), uint64_t{0});
    EXPECT_GE(sum, 7u) << "range " << p;
    EXPECT_LE(sum, 10u) << "range " << p;
  }
  // One id heavier than a share: it stays whole, and a range may be empty; no id is lost.
  const std::vector<uint64_t> heavy = {100, 1, 1};
  const std::vector<uint64_t> h = balancedCuts(heavy, 4);
  EXPECT_EQ(h.front(), 0u);
  EXPECT_EQ(h.back(), 3u);
  EXPECT_TRUE(std::is_sorted(h.begin(), h.end()));
  EXPECT_EQ(equalCuts(10, 3), (std::vector<uint64_t>{0, 3, 6, 10}));
}

TEST(RotationCuts, PackedBlocksGiveAHotIdItsOwnPartAndKeepThePartsWithinOneCount) {
  const std::vector<uint64_t> counts = {3, 40, 5, 5, 2, 9, 1, 0, 7, 6, 4, 8};
  for (size_t parts : {1u, 2u, 3u, 5u}) {
    const std::vector<uint32_t> part = packedBlocks(counts, parts);
    ASSERT_EQ(part.size(), counts.size());
    std::vector<uint64_t> load(parts, 0);
    for (size_t id = 0; id < counts.size(); ++id) {
      ASSERT_LT(part[id], parts);
      load[part[id]] += counts[id];
    }
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    EXPECT_LE(*hi - *lo, 40u) << parts;  // the greedy's bound: the largest count
    if (parts >= 3) {
      // 40 of 100 is more than a third: the hot id is alone in its part.
      for (size_t id = 0; id < counts.size(); ++id)
        if (id != 1) EXPECT_NE(part[id], part[1]) << parts << " parts, id " << id;
    }
    EXPECT_EQ(part, packedBlocks(counts, parts)) << "deterministic";
  }
  // Even counts: near-even parts (3 ids each of 12 ids with 4 parts).
  const std::vector<uint64_t> even(12, 5);
  const std::vector<uint32_t> p = packedBlocks(even, 4);
  for (uint32_t b = 0; b < 4; ++b)
    EXPECT_EQ(std::count(p.begin(), p.end(), b), 3);
  EXPECT_THROW((void)packedBlocks(even, 0), std::invalid_argument);
}

TEST(RotationPlanTest, BlocksPartitionThePointsAndASubEpochsBlocksShareNoRowOrColumn) {
  const ml::RatingsData data = zipfData();
  const Points p = pointsOf(data);
  for (size_t n : {1u, 2u, 3u, 4u}) {
    const RotationPlan plan(p.rows, p.cols, data.rows, data.cols, n, 64);
    std::vector<int> seen(p.rows.size(), 0);
    for (size_t r = 0; r < n; ++r) {
      for (size_t c = 0; c < n; ++c) {
        for (size_t i : plan.points(r, c)) {
          ++seen[i];
          EXPECT_EQ(plan.rowBlockOf(p.rows[i]), r);
          EXPECT_EQ(plan.colBlockOf(p.cols[i]), c);
        }
      }
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }))
        << n << " blocks: a point in no block or in two";
    // Every id in exactly the block that lists it.
    size_t listed_rows = 0;
    size_t listed_cols = 0;
    for (size_t b = 0; b < n; ++b) {
      for (const uint64_t row : plan.rowIds(b))
        EXPECT_EQ(plan.rowBlockOf(row), b);
      for (const uint64_t col : plan.colIds(b))
        EXPECT_EQ(plan.colBlockOf(col), b);
      EXPECT_TRUE(std::is_sorted(plan.rowIds(b).begin(), plan.rowIds(b).end()));
      listed_rows += plan.rowIds(b).size();
      listed_cols += plan.colIds(b).size();
    }
    EXPECT_EQ(listed_rows, data.rows);
    EXPECT_EQ(listed_cols, data.cols);
    // Every sub-epoch pairs each row block with a different column block, and over an epoch
    // each row block meets every column block once.
    std::set<std::pair<size_t, size_t>> pairs;
    for (size_t t = 0; t < n; ++t) {
      std::set<size_t> cols;
      for (size_t r = 0; r < n; ++r) {
        cols.insert(plan.columnBlock(r, t));
        pairs.emplace(r, plan.columnBlock(r, t));
      }
      EXPECT_EQ(cols.size(), n) << "sub-epoch " << t << " gives one column block to two rows";
      // The rotation: the block row block r uses at t + 1 is the one row block r + 1 used at t.
      for (size_t r = 0; r < n; ++r)
        EXPECT_EQ(plan.columnBlock(r, (t + 1) % n), plan.columnBlock((r + 1) % n, t) % n);
    }
    EXPECT_EQ(pairs.size(), n * n);
  }
}

TEST(RotationPlanTest, EveryWorkerRunsTheSameClocksAndEachBlockSliceOnce) {
  const ml::RatingsData data = zipfData();
  const Points p = pointsOf(data);
  const RotationPlan plan(p.rows, p.cols, data.rows, data.cols, 4, 100);
  EXPECT_FALSE(plan.fitsWorkers(3));
  EXPECT_FALSE(plan.fitsWorkers(0));
  for (size_t workers : {1u, 2u, 4u}) {
    ASSERT_TRUE(plan.fitsWorkers(workers));
    const int64_t clocks = plan.clocksPerEpoch(workers);
    std::set<std::tuple<size_t, size_t, int64_t>> slices;
    std::vector<size_t> shard_total;
    for (size_t w = 0; w < workers; ++w) {
      size_t last_subepoch = 0;
      for (int64_t c = 0; c < clocks; ++c) {
        const RotationPlan::Slot s = plan.slotOf(c, w, workers);
        EXPECT_GE(s.subepoch, last_subepoch) << "sub-epochs in order";
        EXPECT_EQ(s.starts_subepoch, c == 0 || s.subepoch != last_subepoch);
        last_subepoch = s.subepoch;
        const std::vector<size_t> mine = plan.rowBlocksOf(w, workers);
        EXPECT_NE(std::find(mine.begin(), mine.end(), s.row_block), mine.end());
        EXPECT_EQ(s.col_block, plan.columnBlock(s.row_block, s.subepoch));
        EXPECT_EQ(s.slices, plan.sliceClocks(s.subepoch));
        EXPECT_TRUE(slices.emplace(s.row_block, s.col_block, s.slice).second);
      }
      shard_total.push_back(plan.shardOf(w, workers).size());
    }
    // Every slice of every block exactly once, whoever runs it.
    int64_t expected = 0;
    for (size_t t = 0; t < 4; ++t)
      expected += 4 * plan.sliceClocks(t);
    EXPECT_EQ(static_cast<int64_t>(slices.size()), expected);
    EXPECT_EQ(std::accumulate(shard_total.begin(), shard_total.end(), size_t{0}),
              data.train.size());
  }
  EXPECT_THROW((void)plan.slotOf(plan.clocksPerEpoch(1), 0, 1), std::out_of_range);
  const std::vector<uint64_t> outside = {400};
  const std::vector<uint64_t> col = {0};
  EXPECT_THROW(RotationPlan(outside, col, 400, 200, 2, 10), std::invalid_argument);
}

// Zipf skew (docs/orion.md, "Load balance"): cut by ids, the hot rows and columns pile into
// some blocks; cut by rating count into contiguous ranges, a range cannot isolate a hot column
// from its neighbours; packed by rating count, a hot column gets a block of its own and the
// others share the rest evenly. The expected idle share falls in that order, the hand-off waits
// less than the barrier, and nothing goes below the floor of the hottest column.
TEST(RotationPlanTest, PackedBlocksBalanceZipfBetterThanContiguousCuts) {
  ml::ZipfRatingsOptions zipf;
  zipf.rows = 10000;
  zipf.cols = 2000;
  zipf.cells = 1000000;  // the measured workload's (docs/orion.md)
  zipf.seed = 1;
  const ml::RatingsData data = ml::makeZipfRatings(zipf);
  const Points p = pointsOf(data);
  for (size_t n : {4u, 8u}) {
    const RotationPlan packed(p.rows, p.cols, data.rows, data.cols, n, 1000);
    const RotationPlan by_ratings(p.rows, p.cols, data.rows, data.cols, n, 1000,
                                  RotationCuts::kByRatings);
    const RotationPlan by_ids(p.rows, p.cols, data.rows, data.cols, n, 1000, RotationCuts::kByIds);
    std::printf("%zu blocks: packed     %s\n%zu blocks: by ratings %s\n%zu blocks: by ids     %s\n",
                n, packed.describe(n).c_str(), n, by_ratings.describe(n).c_str(), n,
                by_ids.describe(n).c_str());
    const RotationBalance k = packed.balance(n);
    const RotationBalance b = by_ratings.balance(n);
    const RotationBalance i = by_ids.balance(n);
    EXPECT_LT(k.idle_share, b.idle_share) << n;
    EXPECT_LT(b.idle_share, i.idle_share) << n;
    EXPECT_LT(k.max_over_mean, b.max_over_mean) << n;
    for (const RotationBalance& x : {k, b, i}) {
      EXPECT_NEAR(x.idle_share, 1.0 - 1.0 / x.max_over_mean, 1e-9);
      EXPECT_LE(x.handoff_idle_share, x.idle_share + 1e-9) << n;
      EXPECT_LE(x.floor_idle_share, x.handoff_idle_share + 1e-9) << n;
    }
    // Packed, the barrier's idle share is within a few points of what no schedule can avoid.
    EXPECT_LT(k.idle_share, k.floor_idle_share + 0.05) << n;
  }
}

ml::SparseTrainOptions trainOptions(int64_t epochs, size_t batch) {
  ml::SparseTrainOptions train;
  train.epochs = epochs;
  train.batchSize = batch;
  train.optimizer.kind = ml::SparseOptimizerKind::kAdagrad;
  train.optimizer.lr = 0.1;
  train.seed = 11;
  train.evalEvery = 0;
  train.logEverySteps = 10;
  return train;
}

struct RotationRun {
  std::vector<SparsePsReport> reports;
  std::vector<float> rows, cols;  // node 0's tables after the final read: the owners' model
};

// `nodes` loopback nodes under --mf-schedule rotation with `blocks` blocks per dimension (1 node:
// the serial reference, visiting every block of a sub-epoch in row-block order).
RotationRun trainRotation(const ml::RatingsData& data, size_t nodes, size_t blocks,
                          const std::string& name,
                          SparseTechnique technique = SparseTechnique::kLapse,
                          size_t rotation_blocks_override = SIZE_MAX, bool barrier = false) {
  ml::MfOptions mf;
  mf.rank = 8;
  mf.reg = 0.01;
  mf.seed = 4;
  LocalCluster cluster(nodes, 0, {.cluster = name});
  std::vector<std::unique_ptr<ml::MfWorkload>> workloads;
  for (size_t i = 0; i < nodes; ++i)
    workloads.push_back(std::make_unique<ml::MfWorkload>(data, mf));
  for (size_t i = 0; i < nodes; ++i) {
    SparsePsOptions options;
    options.ps.staleness = run::StalenessBound{0};
    options.ps.tick_every = 20ms;
    options.train = trainOptions(3, 200);
    options.technique = technique;
    options.rotation_blocks =
        rotation_blocks_override == SIZE_MAX ? blocks : rotation_blocks_override;
    options.rotation_barrier = barrier;
    // Under rotation the peer takes its row blocks' ratings itself; the data-parallel run gets
    // Lapse's row-block shard.
    std::vector<size_t> shard;
    for (size_t k = 0; k < data.train.size(); ++k) {
      if (data.train[k].row * nodes / data.rows == i) shard.push_back(k);
    }
    cluster.attach<SparsePsPeer>(i, *workloads[i], shard, testsupport::membersOf(nodes), options);
  }
  cluster.connect();
  cluster.start();
  RotationRun run;
  for (size_t i = 0; i < nodes; ++i)
    run.reports.push_back(cluster.result<SparsePsReport>(i));
  const std::vector<ml::SparseTable*> tables = workloads[0]->tables();
  run.rows.assign(tables[0]->values().begin(), tables[0]->values().end());
  run.cols.assign(tables[1]->values().begin(), tables[1]->values().end());
  return run;
}

size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    n += a[i] != b[i] ? 1 : 0;
  return n + (a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

struct ClusterCase {
  size_t workers;
  size_t blocks;
  bool barrier;  // the all-worker barrier instead of the neighbour hand-off
};

std::string describeCase(const ClusterCase& c) {
  return fmt::format("{}Workers{}Blocks{}", c.workers, c.blocks, c.barrier ? "Barrier" : "HandOff");
}

std::string caseName(const ::testing::TestParamInfo<ClusterCase>& info) {
  return describeCase(info.param);
}

// gtest prints a parameter's bytes otherwise (padding included, different from run to run).
void PrintTo(const ClusterCase& c, std::ostream* os) {
  *os << describeCase(c);
}

class RotationCluster : public ::testing::TestWithParam<ClusterCase> {};

// The one-worker reference is the same code (SparsePsPeer under rotation, one node, N blocks):
// it visits, sub-epoch by sub-epoch, the blocks the workers run in parallel, one after the
// other. The blocks of a sub-epoch share no row or column, the column blocks move with their
// AdaGrad state, and the hand-off (or the barrier) keeps a block with its holder until the
// holder's pushes are applied, so every row sees the same updates in the same order: the factors
// are equal bit for bit (the floats of each update are computed from the same inputs in the same
// order). With fewer workers than blocks a worker hands blocks to itself as well.
TEST_P(RotationCluster, WorkersMakeTheFactorsOfOneWorkerVisitingTheSameBlocks) {
  const size_t n = GetParam().blocks;
  const size_t workers = GetParam().workers;
  const ml::RatingsData data = zipfData();
  const RotationRun serial = trainRotation(data, 1, n, "rotation-serial");
  const RotationRun parallel = trainRotation(data, workers, n, "rotation-parallel",
                                             SparseTechnique::kLapse, n, GetParam().barrier);
  ASSERT_FALSE(parallel.reports[0].final.empty());
  ASSERT_EQ(serial.rows.size(), parallel.rows.size());
  EXPECT_EQ(differing(serial.rows, parallel.rows), 0u) << "row factors differ";
  EXPECT_EQ(differing(serial.cols, parallel.cols), 0u) << "column factors differ";
  // It trained (the factors moved from the seed's), and well.
  ml::MfOptions mf;
  mf.rank = 8;
  mf.seed = 4;
  ml::MfWorkload fresh(data, mf);
  EXPECT_GT(differing(serial.cols, std::vector<float>(fresh.tables()[1]->values().begin(),
                                                      fresh.tables()[1]->values().end())),
            serial.cols.size() / 2);
  double rmse = 0;
  for (const auto& [split, metrics] : parallel.reports[0].final) {
    for (const ml::NamedMetric& m : metrics)
      if (m.name == "rmse") rmse = m.value;
  }
  EXPECT_GT(rmse, 0.0);
  EXPECT_LT(rmse, 0.8);
  for (size_t i = 0; i < workers; ++i) {
    const SparsePsReport& r = parallel.reports[i];
    EXPECT_EQ(r.failed_pulls + r.failed_pushes, 0u) << "node " << i;
    // N sub-epochs per epoch, 3 epochs: a barrier at each sub-epoch start but the first.
    EXPECT_EQ(r.barriers, 3 * n - 1) << "node " << i;
    EXPECT_GT(r.access.localized, 0u) << "node " << i;
    // Every row a step reads or writes was moved here before (only the barrier's own row read
    // and the rows still on their way when a step reads them count as remote).
    EXPECT_GT(r.localShare(), 0.9) << "node " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, RotationCluster,
                         ::testing::Values(ClusterCase{2, 2, false}, ClusterCase{3, 3, false},
                                           ClusterCase{2, 4, false}, ClusterCase{3, 3, true}),
                         caseName);

// The check is not vacuous: the data-parallel schedule on the same nodes (lapse, row blocks, the
// same clocks) does not make the serial factors.
TEST(RotationClusterCheck, DataParallelTrainingDoesNotMakeTheSerialFactors) {
  const ml::RatingsData data = zipfData();
  const RotationRun serial = trainRotation(data, 1, 2, "rotation-serial-2");
  const RotationRun parallel = trainRotation(data, 2, 2, "dp-2", SparseTechnique::kLapse, 0);
  EXPECT_GT(differing(serial.cols, parallel.cols), 0u);
}

TEST(RotationOptions, RotationIsRefusedWithATechniqueOtherThanLapseAndForAWrongBlockCount) {
  SparsePsOptions options;
  options.train = trainOptions(1, 10);
  options.rotation_blocks = 2;
  options.technique = SparseTechnique::kNups;
  try {
    validateSparsePsOptions(options);
    FAIL() << "nups accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--technique lapse"), std::string::npos) << e.what();
  }
  options.technique = SparseTechnique::kClassic;
  EXPECT_THROW(validateSparsePsOptions(options), std::invalid_argument);
  options.technique = SparseTechnique::kLapse;
  EXPECT_NO_THROW(validateSparsePsOptions(options));
}

}  // namespace
}  // namespace chorus::ps
