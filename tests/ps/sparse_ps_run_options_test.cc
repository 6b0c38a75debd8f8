// Sparse PS mode's run options over the real runtime (nodes as threads on loopback, port 0,
// fixed seeds): --time-limit (a node whose time is up ends its clocks without steps and never
// holds the others), --keep-best (node 0 evaluates its best kept tables) and --stragglers (the
// per-clock hook spends the injector's extra time on the trainer thread).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "faults/straggler.h"
#include "ml/kge_workload.h"
#include "ps/sparse_ps_peer.h"
#include "tests/support/local_cluster.h"
#include "tests/support/planted_graph.h"
#include "tests/support/sparse_cluster.h"

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;
using testsupport::finalMetric;
using testsupport::smallComplEx;
using testsupport::sparseTrainOptions;

// Trains `nodes` peers on the planted graph under a bound of 0 (a worker's read at clock c waits
// for every worker's clock c: a node that stopped announcing would hold the others), node i
// with `options(i)`.
template <typename OptionsOf>
std::vector<SparsePsReport> trainKge(size_t nodes, const std::string& name,
                                     const ml::SparseTrainOptions& train, OptionsOf options_of) {
  const ml::KgData graph = testsupport::makePlantedGraph({});
  auto make = [&] { return std::make_unique<ml::KgeWorkload>(graph, smallComplEx(), 11); };
  const auto argsFor = [&](size_t i) {
    SparsePsOptions options;
    options.ps.staleness = run::StalenessBound::read("0").value();
    options.ps.tick_every = 20ms;
    options.train = train;
    options_of(i, options);
    return std::make_tuple(testsupport::membersOf(nodes), options);
  };
  return testsupport::trainSparseCluster<SparsePsPeer, SparsePsReport>(nodes, name, make,
                                                                       train.seed, argsFor);
}

// Node 1's time is up after its first epoch; node 0 has no limit. Node 1 ends its clocks at
// once and node 0 trains every epoch without waiting for it, then reads and evaluates the model.
TEST(SparsePsTimeLimit, ANodeWhoseTimeIsUpNeverHoldsTheOthers) {
  const ml::SparseTrainOptions train = sparseTrainOptions(4, 32, 0.1);
  const std::vector<SparsePsReport> reports =
      trainKge(2, "time-limit-one", train, [](size_t i, SparsePsOptions& options) {
        if (i == 1) options.train.timeLimitSeconds = 1e-9;
      });
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_TRUE(reports[1].time_limited);
  EXPECT_EQ(reports[1].epochs_done, 1);
  EXPECT_EQ(reports[1].clocks_done, reports[1].clocks_per_epoch);
  EXPECT_FALSE(reports[0].time_limited);
  EXPECT_EQ(reports[0].epochs_done, 4);
  for (const SparsePsReport& r : reports) {
    EXPECT_FALSE(r.stopped);
    EXPECT_EQ(r.failed_pulls + r.failed_pushes, 0u);
  }
  ASSERT_EQ(reports[0].final.size(), 2u);
  EXPECT_GT(finalMetric(reports[0].final, "test", "mrr"), 0.0);
}

// Every node's time is up after the first epoch: all stop there, node 0 evaluates the model.
TEST(SparsePsTimeLimit, EveryNodeStopsAfterTheEpochThatPassedIt) {
  ml::SparseTrainOptions train = sparseTrainOptions(50, 32, 0.1);
  train.timeLimitSeconds = 1e-9;
  const std::vector<SparsePsReport> reports =
      trainKge(3, "time-limit-all", train, [](size_t, SparsePsOptions&) {});
  for (const SparsePsReport& r : reports) {
    EXPECT_TRUE(r.time_limited);
    EXPECT_EQ(r.epochs_done, 1);
    EXPECT_FALSE(r.stopped);
  }
  ASSERT_EQ(reports[0].final.size(), 2u);
  EXPECT_EQ(reports[0].evaluated_epoch, 1);
}

// --keep-best: node 0 evaluates the valid MRR after every epoch; what it evaluates at the end is
// never worse on valid than the best of those, and when it is an earlier epoch's tables, their
// valid MRR is exactly the one measured then (the same tables, the same evaluation). A high
// rate on a small graph overfits, so the last epoch tends not to be the best.
TEST(SparsePsKeepBest, NodeZeroEvaluatesItsBestKeptTables) {
  ml::SparseTrainOptions train = sparseTrainOptions(8, 32, 0.5);
  train.keepBest = true;
  train.evalEvery = 1;
  const std::vector<SparsePsReport> reports =
      trainKge(2, "keep-best", train, [](size_t, SparsePsOptions&) {});
  const SparsePsReport& r = reports[0];
  ASSERT_EQ(r.epoch_quality.size(), 7u);  // epochs 1-7 (the last is evaluated at the end)
  ASSERT_EQ(r.final.size(), 2u);
  const double valid = finalMetric(r.final, "valid", "mrr");
  double best = 0;
  for (const auto& [epoch, quality] : r.epoch_quality)
    best = std::max(best, quality);
  EXPECT_GE(valid, best);
  EXPECT_GE(r.evaluated_epoch, 1);
  EXPECT_LE(r.evaluated_epoch, 8);
  if (r.evaluated_epoch < 8) {
    const auto kept = std::find_if(r.epoch_quality.begin(), r.epoch_quality.end(),
                                   [&](const auto& e) { return e.first == r.evaluated_epoch; });
    ASSERT_NE(kept, r.epoch_quality.end());
    EXPECT_DOUBLE_EQ(valid, kept->second);
    EXPECT_DOUBLE_EQ(valid, best);
  }
}

// --stragglers fixed:30 on node 1 only: its hook runs once per clock with the step's compute
// time and spends 30 ms each time, so its training takes at least that per clock.
TEST(SparsePsStragglers, TheHookSpendsTheInjectorsTimeOncePerClock) {
  const ml::SparseTrainOptions train = sparseTrainOptions(1, 32, 0.1);
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> computed{0};
  const faults::StragglerProfile profile = faults::StragglerProfile::read("fixed:30").value();
  auto injector = std::make_shared<faults::StragglerInjector>(profile, 1, train.seed);
  const std::vector<SparsePsReport> reports =
      trainKge(2, "stragglers", train, [&](size_t i, SparsePsOptions& options) {
        if (i != 1) return;
        options.after_step = [&, injector](std::chrono::nanoseconds compute) {
          ++calls;
          if (compute.count() > 0) ++computed;
          injector->waitAfterStep(compute);
        };
      });
  const SparsePsReport& slow = reports[1];
  EXPECT_EQ(calls.load(), slow.clocks_done);
  EXPECT_GT(computed.load(), 0);
  EXPECT_EQ(injector->totalDelay(), slow.clocks_done * 30ms);
  EXPECT_GE(slow.train_seconds, 0.030 * static_cast<double>(slow.clocks_done));
}

}  // namespace
}  // namespace chorus::ps
