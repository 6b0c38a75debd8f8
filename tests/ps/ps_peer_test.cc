// PS mode end to end over the real runtime: four nodes as threads in this process, loopback,
// port 0, fixed seeds; every node owns a shard of the keys and trains.
#include "ps/ps_peer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "ml/dataset.h"
#include "node/node.h"
#include "run/training_run.h"

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;

run::RunOptions trainingOptions() {
  run::RunOptions options;
  options.data.name = "synthetic";
  options.model.name = "mlp";
  options.model.hidden = {64};
  options.lr = 0.1;
  options.momentum = 0;
  options.batch = 32;
  options.rounds = 800;
  options.eval_every = 100;
  options.target_acc = 0.95;
  options.seed = 3;
  return options;
}

// Connects listening nodes as a full mesh on loopback and waits until all are connected.
void connectAll(const std::vector<std::unique_ptr<node::Node>>& nodes) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::vector<node::PeerAddress> addresses;
    for (size_t j = 0; j < nodes.size(); ++j) {
      if (j != i) addresses.push_back({static_cast<NodeId>(j), "127.0.0.1", nodes[j]->port()});
    }
    EXPECT_TRUE(nodes[i]->connect(addresses).ok());
  }
  for (const auto& n : nodes) {
    const node::Status ready = n->waitClusterReady(30s);
    EXPECT_TRUE(ready.ok()) << ready.message();
  }
}

struct RunResult {
  std::vector<PsReport> reports;
  std::filesystem::path out;
};

// `tweak` adjusts each node's PS options (it gets the node id).
RunResult trainFourNodes(const std::string& staleness,
                         const std::function<void(NodeId, PsOptions&)>& tweak = {}) {
  constexpr size_t kNodes = 4;
  auto data = std::make_shared<const ml::DataSplit>(ml::makeSynthetic(10000, 1000, 7));
  const auto out = std::filesystem::temp_directory_path() /
                   ("ps-train-" + staleness + "-" + std::to_string(getpid()));
  std::vector<std::unique_ptr<node::Node>> nodes;
  std::vector<std::unique_ptr<PsPeer>> peers;
  std::vector<NodeId> members{0, 1, 2, 3};
  for (NodeId i = 0; i < kNodes; ++i) {
    node::NodeOptions o;
    o.cluster = "ps-peer-test";
    o.self = i;
    o.members = members;
    o.heartbeat_interval = 100ms;
    o.dial_backoff_max = 100ms;
    o.peer_timeout = 5000ms;
    o.log_level = spdlog::level::warn;
    nodes.push_back(std::make_unique<node::Node>(o));
    run::RunOptions options = trainingOptions();
    options.out_dir = out.string();
    PsOptions po;
    po.staleness = staleness;
    po.key_floats = 1000;  // several keys per owner
    if (tweak) tweak(i, po);
    peers.push_back(std::make_unique<PsPeer>(
        *nodes.back(), run::prepareNodeJob(options, data, i, kNodes, ""), members, po));
    EXPECT_TRUE(nodes.back()->listen().ok());
  }
  connectAll(nodes);
  std::vector<std::future<PsReport>> futures;
  for (auto& p : peers)
    futures.push_back(std::async(std::launch::async, [peer = p.get()] { return peer->run(); }));
  RunResult result;
  result.out = out;
  for (auto& f : futures) {
    if (f.wait_for(300s) != std::future_status::ready) {
      ADD_FAILURE() << "a node did not finish within 300 s";
      for (auto& p : peers)
        p->stop();
    }
    result.reports.push_back(f.get());
  }
  for (auto& n : nodes)
    n->shutdown(0ms);
  return result;
}

class PsTraining : public ::testing::TestWithParam<std::string> {};

TEST_P(PsTraining, FourNodesTrainSyntheticDataToNinetyFivePercent) {
  const RunResult run = trainFourNodes(GetParam());
  ASSERT_EQ(run.reports.size(), 4u);
  const bool async = GetParam() == "inf";
  int64_t total_clocks = 0;
  for (size_t i = 0; i < run.reports.size(); ++i) {
    const PsReport& r = run.reports[i];
    total_clocks += r.clocks_done;
    // Fully asynchronous runs end on the cluster's total (--async-rounds cluster, the default).
    if (!async) {
      EXPECT_EQ(r.clocks_done, 800);
    }
    EXPECT_GE(r.final_accuracy, 0.95) << "node " << i;
    EXPECT_EQ(r.finished_peers.size(), 3u);
    EXPECT_EQ(r.failed_pulls + r.failed_pushes, 0u);
    EXPECT_EQ(r.server.errors, 0u);
    EXPECT_GT(r.worker.keys_local, 0u);
    EXPECT_GT(r.worker.keys_remote, 0u);
    if (i == 0) {
      ASSERT_TRUE(r.owner_accuracy.has_value());
      EXPECT_GE(*r.owner_accuracy, 0.95);
    } else {
      EXPECT_FALSE(r.owner_accuracy.has_value());
    }
    // One metrics line per clock, plus start, target, and final.
    std::ifstream metrics(run.out / ("node-" + std::to_string(i) + ".jsonl"));
    size_t clocks = 0, finals = 0;
    for (std::string line; std::getline(metrics, line);) {
      if (line.find("\"event\":\"clock\"") != std::string::npos) ++clocks;
      if (line.find("\"event\":\"final\"") != std::string::npos) ++finals;
    }
    EXPECT_EQ(clocks, static_cast<size_t>(r.clocks_done));
    EXPECT_EQ(finals, 1u);
  }
  if (async) {
    // A worker stops once it has heard of 4 x 800 clocks; what it hears lags by at most the
    // clock each worker was in when the total was reached plus one more (every pull's replies
    // follow the owners' earlier clock messages on the same connection).
    EXPECT_GE(total_clocks, 4 * 800);
    EXPECT_LE(total_clocks, 4 * 800 + 2 * 4);
  }
  if (GetParam() == "2") {
    EXPECT_GT(run.reports[0].worker.cache_hits, 0u) << "SSP reads never came from the cache";
  }
  std::filesystem::remove_all(run.out);
}

INSTANTIATE_TEST_SUITE_P(Staleness, PsTraining, ::testing::Values("0", "2", "inf"),
                         [](const auto& info) {
                           return info.param == "inf" ? std::string("Async") : "S" + info.param;
                         });

// --async-rounds cluster: a worker that stalls does not hold the run's end, and the fast ones
// do its share. Node 3 stalls after its first clock until the others have run the whole budget
// between them; it then runs at most one more clock (the one whose reads bring it the others'
// clocks), where --async-rounds worker would have had it run 799 more alone.
TEST(PsPeer, AsyncRunsEndOnTheClustersClockTotal) {
  constexpr int64_t kRounds = 800, kNodes = 4;
  std::mutex mu;
  std::condition_variable changed;
  std::vector<int64_t> reached(kNodes, 0);
  auto othersReached = [&] { return reached[0] + reached[1] + reached[2] + 1 >= kNodes * kRounds; };
  const RunResult run = trainFourNodes("inf", [&](NodeId id, PsOptions& po) {
    po.on_clock_end = [&, id](Clock c, std::span<const float>) {
      std::unique_lock lock(mu);
      reached[id] = c + 1;
      changed.notify_all();
      if (id == 3 && c == 0) {
        EXPECT_TRUE(changed.wait_for(lock, 300s, othersReached))
            << "the other workers stopped before running the budget between them";
      }
    };
  });
  ASSERT_EQ(run.reports.size(), static_cast<size_t>(kNodes));
  int64_t total = 0;
  for (const PsReport& r : run.reports)
    total += r.clocks_done;
  EXPECT_GE(total, kNodes * kRounds);
  EXPECT_LE(total, kNodes * kRounds + 2 * kNodes);
  EXPECT_LE(run.reports[3].clocks_done, 2);
  for (NodeId i = 0; i < 3; ++i)
    EXPECT_GT(run.reports[i].clocks_done, kRounds) << "node " << i;
  for (NodeId i = 0; i < kNodes; ++i) {
    const PsReport& r = run.reports[i];
    // Every worker's every clock pushed to every owner, and each owner applied them all.
    EXPECT_EQ(r.server.pushes, static_cast<uint64_t>(total)) << "owner " << i;
    EXPECT_EQ(r.failed_pulls + r.failed_pushes, 0u) << "node " << i;
    EXPECT_EQ(r.finished_peers.size(), 3u) << "node " << i;
  }
  ASSERT_TRUE(run.reports[0].owner_accuracy.has_value());
  EXPECT_GE(*run.reports[0].owner_accuracy, 0.95);
  std::filesystem::remove_all(run.out);
}

// --async-rounds worker keeps the per-worker count: every worker runs exactly --rounds clocks.
TEST(PsPeer, AsyncRoundsWorkerRunsRoundsClocksOnEveryWorker) {
  const RunResult run =
      trainFourNodes("inf", [](NodeId, PsOptions& po) { po.async_rounds = "worker"; });
  ASSERT_EQ(run.reports.size(), 4u);
  for (const PsReport& r : run.reports)
    EXPECT_EQ(r.clocks_done, 800);
  ASSERT_TRUE(run.reports[0].owner_accuracy.has_value());
  EXPECT_GE(*run.reports[0].owner_accuracy, 0.95);
  std::filesystem::remove_all(run.out);
}

TEST(PsPeer, ANodeThatVanishesMidRunLeavesTheOthersFinishingAndItsLostUpdatesNamed) {
  constexpr size_t kNodes = 3;
  constexpr int64_t kClocks = 200;
  auto data = std::make_shared<const ml::DataSplit>(ml::makeSynthetic(3000, 300, 7));
  std::vector<NodeId> members{0, 1, 2};
  std::vector<std::unique_ptr<node::Node>> nodes;
  std::vector<std::unique_ptr<PsPeer>> peers;
  for (NodeId i = 0; i < kNodes; ++i) {
    node::NodeOptions o;
    o.cluster = "ps-vanish-test";
    o.self = i;
    o.members = members;
    o.heartbeat_interval = 100ms;
    o.dial_backoff_max = 100ms;
    o.peer_timeout = 2000ms;
    o.log_level = spdlog::level::warn;
    nodes.push_back(std::make_unique<node::Node>(o));
  }
  for (NodeId i = 0; i < kNodes; ++i) {
    run::RunOptions options = trainingOptions();
    options.rounds = kClocks;
    options.eval_every = 0;
    PsOptions po;
    po.staleness = "1";
    po.key_floats = 1000;
    po.down_timeout_s = 0.3;
    if (i == 2) {
      // Node 2 vanishes at clock 50: it stops training and its node closes every connection.
      po.on_clock_end = [&nodes, &peers](Clock c, std::span<const float>) {
        if (c == 50) {
          peers[2]->stop();
          nodes[2]->shutdown(0ms);
        }
      };
    }
    peers.push_back(std::make_unique<PsPeer>(
        *nodes[i], run::prepareNodeJob(options, data, i, kNodes, ""), members, po));
    EXPECT_TRUE(nodes[i]->listen().ok());
  }
  connectAll(nodes);
  std::vector<std::future<PsReport>> futures;
  for (auto& p : peers)
    futures.push_back(std::async(std::launch::async, [peer = p.get()] { return peer->run(); }));
  std::vector<PsReport> reports;
  for (auto& f : futures) {
    ASSERT_EQ(f.wait_for(300s), std::future_status::ready) << "a node did not finish";
    reports.push_back(f.get());
  }
  for (auto& n : nodes)
    n->shutdown(0ms);
  EXPECT_TRUE(reports[2].stopped);
  for (size_t i = 0; i < 2; ++i) {
    const PsReport& r = reports[i];
    EXPECT_EQ(r.clocks_done, kClocks) << "node " << i;
    EXPECT_GT(r.failed_pulls, 0u) << "node " << i << " never missed node 2's keys";
    ASSERT_EQ(r.server.excluded.count(2), 1u) << "node " << i;
    EXPECT_GE(r.server.excluded.at(2), 50);
    EXPECT_EQ(r.departed_peers, std::vector<NodeId>{2});
  }
  ASSERT_TRUE(reports[0].owner_accuracy.has_value());
  EXPECT_GT(*reports[0].owner_accuracy, 0.5);
}

TEST(PsOptions, BadValuesNameTheFlag) {
  PsOptions o;
  o.staleness = "-1";
  EXPECT_THROW(validatePsOptions(o), std::invalid_argument);
  try {
    validatePsOptions(o);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--staleness"), std::string::npos);
  }
  o = PsOptions{};
  o.key_floats = 0;
  EXPECT_THROW(validatePsOptions(o), std::invalid_argument);
  o = PsOptions{};
  o.down_timeout_s = -1;
  EXPECT_THROW(validatePsOptions(o), std::invalid_argument);
  o = PsOptions{};
  o.async_rounds = "everyone";
  try {
    validatePsOptions(o);
    ADD_FAILURE() << "--async-rounds everyone was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--async-rounds"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace chorus::ps
