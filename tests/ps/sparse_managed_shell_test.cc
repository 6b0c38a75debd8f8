// Managed communication for sparse rows on real nodes over loopback (ps/sparse_managed_shell.h
// under --technique classic): owners push their changed rows into every worker's copy, the
// steps' reads are served from it, the model trains as well as without a budget, and a node
// never sends managed bytes beyond its budget.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "ml/mf_workload.h"
#include "ml/ratings.h"
#include "ps/sparse_ps_peer.h"
#include "tests/support/local_cluster.h"
#include "tests/support/sparse_cluster.h"

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;

struct MfRun {
  std::vector<SparsePsReport> reports;
  double seconds = 0;  // the cluster's whole run, wall time
};

MfRun trainMf(size_t nodes, double bandwidth_mbps, const std::string& name) {
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
  const ml::SparseTrainOptions train = testsupport::sparseTrainOptions(8, 200, 0.1);
  const auto argsFor = [&](size_t) {
    SparsePsOptions options;
    options.ps.staleness = run::StalenessBound::read("2").value();
    options.ps.tick_every = 20ms;
    options.ps.bandwidth_mbps = bandwidth_mbps;
    options.train = train;
    return std::make_tuple(testsupport::membersOf(nodes), options);
  };
  MfRun run;
  const auto start = std::chrono::steady_clock::now();
  run.reports = testsupport::trainSparseCluster<SparsePsPeer, SparsePsReport>(nodes, name, make,
                                                                              train.seed, argsFor);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

double finalRmse(const SparsePsReport& report) {
  return testsupport::finalMetric(report.final, "test", "rmse");
}

TEST(SparseManagedComm, OwnersPushRowsAndTheStepsReadThemAndTrainAsWithout) {
  const MfRun without = trainMf(3, 0, "sparse-managed-off");
  const MfRun with = trainMf(3, 200, "sparse-managed-on");
  const double base = finalRmse(without.reports[0]);
  EXPECT_LT(base, 0.6);  // the planted signal has variance 1
  EXPECT_NEAR(finalRmse(with.reports[0]), base, 0.1 * base);
  for (const SparsePsReport& r : with.reports) {
    EXPECT_GT(r.access.managed_frames, 0u);
    EXPECT_GT(r.access.managed_rows_sent, 0u);
    EXPECT_GT(r.access.managed_rows_received, 0u);
    EXPECT_EQ(r.access.managed_refused, 0u);
    // Some of the steps' row reads come from the pushed copy. How many depends on the pace:
    // here a clock takes about a millisecond and the owners push every 5 ms, so the copy is
    // often more than s clocks behind; over links with a delay most reads come from it (the
    // CLI test, tests/cli/sparse_launch_test.cc, with --link-delay).
    EXPECT_GT(r.access.cache_hits, 0u);
    EXPECT_EQ(r.failed_pulls, 0u);
  }
  for (const SparsePsReport& r : without.reports) {
    EXPECT_EQ(r.access.managed_frames, 0u);
    EXPECT_EQ(r.access.cache_hits, 0u);
  }
}

// The budget holds on what the node measured of its own frames: the managed bytes stay within
// the rate over the run plus the first burst (one message of 32 KiB to every node) and the one
// frame that may overshoot a positive balance. With so small a budget the ordinary traffic
// alone uses it up (it is charged too), so at most the burst goes, often nothing.
TEST(SparseManagedComm, ANodeNeverSendsManagedBytesBeyondItsBudget) {
  const double mbps = 0.05;  // 6,250 bytes a second
  const MfRun run = trainMf(3, mbps, "sparse-managed-budget");
  const double rate = mbps * 1e6 / 8;
  const double message = 32 * 1024 + 512;  // the frame's floats and its keys and header
  const double burst = std::max(rate * 0.05, 32.0 * 1024 * 3);
  for (const SparsePsReport& r : run.reports) {
    EXPECT_LE(static_cast<double>(r.access.managed_bytes), rate * run.seconds + burst + 2 * message)
        << "over " << run.seconds << " s";
  }
  EXPECT_LT(finalRmse(run.reports[0]), 0.6);
}

}  // namespace
}  // namespace chorus::ps
