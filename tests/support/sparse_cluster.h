// The small knowledge-graph (or matrix-factorization) cluster the sparse modes' tests train:
// every node of a LocalCluster with its own copy of one sparse workload (the seed's model, so
// that every node starts alike) and its shard of the training points, plus the single-node
// driver's run on the same workload for the quality the cluster is held against. Used by the
// sparse PS tests (tests/ps/sparse_ps_test.cc, sparse_ps_nups_test.cc) and sparse consensus's
// (tests/consensus/sparse_consensus_test.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ml/kge.h"
#include "ml/sharding.h"
#include "ml/sparse_train.h"
#include "tests/support/local_cluster.h"

namespace chorus::testsupport {

// Final metrics of a sparse run, per split ("valid", "test").
using FinalMetrics = std::vector<std::pair<std::string, std::vector<ml::NamedMetric>>>;

// ComplEx of 32 dimensions, 16 negatives per point (shared by the batch when
// `shared_negatives`), no regularizer, initial scale 0.1: small enough to train in seconds on
// the planted graph (tests/support/planted_graph.h).
ml::KgeConfig smallComplEx(bool shared_negatives = false);

// `epochs` of Adagrad at `lr` in batches of `batch`, seed 11, no evaluation before the end, a
// progress line every 10 steps.
ml::SparseTrainOptions sparseTrainOptions(int64_t epochs, size_t batch, double lr);

// Metric `name` of `split` in `final`; a test failure (and 0) when it is not there.
double finalMetric(const FinalMetrics& final, const std::string& split, const std::string& name);

// The single-node driver's final metrics of `workload` trained with `train` (progress lines to
// nowhere).
FinalMetrics trainAlone(ml::SparseWorkload& workload, const ml::SparseTrainOptions& train);

// Makes a fresh workload: the same data and model seed every call.
using MakeWorkload = std::function<std::unique_ptr<ml::SparseWorkload>()>;

// Trains a `Peer` (a sparse mode's peer, constructed as Peer(node, workload, shard, args...))
// on each of `nodes` nodes of a LocalCluster named `name`, connected as a full mesh: node i gets
// its own workload from `make`, its shard (`shards`, or iid shards of the training points with
// `shard_seed`), and the arguments `argsFor(i)` returns as a tuple (members or layout, options).
// Returns every node's report, each waited for within `timeout`.
template <typename Peer, typename Report, typename ArgsFor>
std::vector<Report> trainSparseCluster(size_t nodes, const std::string& name,
                                       const MakeWorkload& make, uint64_t shard_seed,
                                       ArgsFor argsFor,
                                       std::optional<ml::Shards> shards = std::nullopt,
                                       std::chrono::seconds timeout = std::chrono::seconds(300)) {
  // The workloads outlive the cluster, whose peers train them until it is destroyed.
  std::vector<std::unique_ptr<ml::SparseWorkload>> workloads;
  for (size_t i = 0; i < nodes; ++i)
    workloads.push_back(make());
  if (!shards) {
    shards = ml::shardIid(workloads[0]->trainPoints(), static_cast<int>(nodes), shard_seed);
  }
  LocalCluster cluster(nodes, 0, {.cluster = name});
  for (size_t i = 0; i < nodes; ++i) {
    std::apply(
        [&](auto&&... args) {
          cluster.attach<Peer>(i, *workloads[i], (*shards)[i],
                               std::forward<decltype(args)>(args)...);
        },
        argsFor(i));
  }
  cluster.connect();
  cluster.start();
  std::vector<Report> reports;
  for (size_t i = 0; i < nodes; ++i)
    reports.push_back(cluster.result<Report>(i, timeout));
  return reports;
}

}  // namespace chorus::testsupport
