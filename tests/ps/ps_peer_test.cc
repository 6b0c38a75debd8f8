// PS mode end to end over the real runtime: four nodes as threads in this process, loopback,
// port 0, fixed seeds; every node owns a shard of the keys and trains.
#include "ps/ps_peer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>

#include "chorus/chorus_generated.h"
#include "ml/dataset.h"
#include "node/node.h"
#include "run/training_run.h"
#include "tests/support/local_cluster.h"

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;

run::RunOptions trainingOptions() {
  run::RunOptions options = testsupport::syntheticTraining();
  options.lr = 0.1;
  options.momentum = 0;
  options.rounds = 800;
  return options;
}

using testsupport::LocalCluster;
using testsupport::membersOf;
using testsupport::syntheticData;

// The nodes of cluster `name`: warnings only, a 5 s peer time-out unless told.
testsupport::NodeSettings nodeSettings(const std::string& name,
                                       std::chrono::milliseconds peer_timeout = 5000ms) {
  return {.cluster = name, .peer_timeout = peer_timeout};
}

struct RunResult {
  std::vector<PsReport> reports;
  std::filesystem::path out;
};

// `tweak` adjusts each node's PS options (it gets the node id).
RunResult trainFourNodes(const std::string& staleness,
                         const std::function<void(NodeId, PsOptions&)>& tweak = {}) {
  constexpr size_t kNodes = 4;
  auto data = syntheticData(10000, 1000);
  const auto out = std::filesystem::temp_directory_path() /
                   ("ps-train-" + staleness + "-" + std::to_string(getpid()));
  LocalCluster cluster(kNodes, 0, nodeSettings("ps-peer-test"));
  const std::vector<NodeId> members = membersOf(kNodes);
  for (NodeId i = 0; i < kNodes; ++i) {
    run::RunOptions options = trainingOptions();
    options.out_dir = out.string();
    PsOptions po;
    po.staleness = Staleness::read(staleness).value();
    po.key_floats = 1000;  // several keys per owner
    if (tweak) tweak(i, po);
    cluster.attach<PsPeer>(i, run::prepareNodeJob(options, data, i, kNodes).value(), members, po);
  }
  cluster.connect();
  cluster.start();
  RunResult result;
  result.out = out;
  for (NodeId i = 0; i < kNodes; ++i)
    result.reports.push_back(cluster.result<PsReport>(i, 300s));
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
      if (line.find("\"event\":\"step\"") != std::string::npos) ++clocks;
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
  // The three that kept going did node 3's share between them. How they split it depends on
  // the scheduler (one of them may do exactly kRounds), so only their sum is checked.
  EXPECT_GT(run.reports[0].clocks_done + run.reports[1].clocks_done + run.reports[2].clocks_done,
            3 * kRounds + kRounds / 2);
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
  auto data = syntheticData(3000, 300);
  const std::vector<NodeId> members = membersOf(kNodes);
  LocalCluster cluster(kNodes, 0, nodeSettings("ps-vanish-test", 2000ms));
  for (NodeId i = 0; i < kNodes; ++i) {
    run::RunOptions options = trainingOptions();
    options.rounds = kClocks;
    options.eval_every = 0;
    PsOptions po;
    po.staleness = {1};
    po.key_floats = 1000;
    po.down_timeout_s = 0.3;
    if (i == 2) {
      // Node 2 vanishes at clock 50: it stops training and its node closes every connection.
      po.on_clock_end = [&cluster](Clock c, std::span<const float>) {
        if (c == 50) cluster.kill(2);
      };
    }
    cluster.attach<PsPeer>(i, run::prepareNodeJob(options, data, i, kNodes).value(), members, po);
  }
  cluster.connect();
  cluster.start();
  std::vector<PsReport> reports;
  for (NodeId i = 0; i < kNodes; ++i)
    reports.push_back(cluster.result<PsReport>(i, 300s));
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

// The probe of the hardening issue: a member pushes NaN gradients (before, every node that read
// the keys died within seconds, blaming --lr) and announces clock INT64_MAX, as an impostor on
// its connection could. The owners refuse both with a line naming node 2 and what was wrong,
// and every node, node 2 included, trains to the end with finite parameters.
TEST(PsPeer, ANonFinitePushAndAnImpossibleClockAreRefusedAndEveryNodeFinishes) {
  constexpr size_t kNodes = 3;
  constexpr int64_t kClocks = 100;
  auto data = syntheticData(3000, 300);
  const std::vector<NodeId> members = membersOf(kNodes);
  LocalCluster cluster(kNodes, 0, nodeSettings("ps-poison-test"));
  for (NodeId i = 0; i < kNodes; ++i) {
    run::RunOptions options = trainingOptions();
    options.rounds = kClocks;
    options.eval_every = 0;
    PsOptions po;
    po.staleness = {2};
    po.key_floats = 1000;
    if (i == 2) {
      po.on_clock_end = [&cluster](Clock c, std::span<const float>) {
        if (c != 5) return;
        node::Node& node = cluster.node(2);
        const PsPeer& peer2 = cluster.peer<PsPeer>(2);
        for (NodeId owner : {NodeId{0}, NodeId{1}}) {
          std::vector<uint64_t> keys;
          size_t floats = 0;
          for (Key key = 0; key < peer2.layout().numKeys(); ++key) {
            if (peer2.shardMap().home(key) != owner) continue;
            keys.push_back(key);
            floats += peer2.layout().length(key);
          }
          std::vector<float> poisoned(floats, 0.01f);
          poisoned[floats / 2] = std::nanf("");
          node.send(owner,
                    encodeMessage(node, wire::Body::PsPush, [&](flatbuffers::FlatBufferBuilder& b) {
                      return wire::CreatePsPush(b, uint64_t{1} << 62, c + 1, b.CreateVector(keys),
                                                b.CreateVector(poisoned))
                          .Union();
                    }));
          node.send(owner,
                    encodeMessage(node, wire::Body::PsClock, [](flatbuffers::FlatBufferBuilder& b) {
                      return wire::CreatePsClock(b, std::numeric_limits<int64_t>::max()).Union();
                    }));
        }
      };
    }
    cluster.attach<PsPeer>(i, run::prepareNodeJob(options, data, i, kNodes).value(), members, po);
  }
  cluster.connect();
  cluster.start();
  std::vector<PsReport> reports;
  for (NodeId i = 0; i < kNodes; ++i)
    reports.push_back(cluster.result<PsReport>(i, 300s));  // rethrows "training diverged"
  for (NodeId i = 0; i < kNodes; ++i) {
    const PsReport& r = reports[i];
    EXPECT_EQ(r.clocks_done, kClocks) << "node " << i;
    EXPECT_TRUE(std::isfinite(r.final_loss)) << "node " << i;
    EXPECT_EQ(r.finished_peers.size(), 2u) << "node " << i;
  }
  for (NodeId owner : {0, 1}) {
    EXPECT_EQ(reports[owner].server.errors, 2u) << "owner " << owner;
    const std::string log = cluster.log(owner);
    EXPECT_NE(log.find("refused a Push request from node 2: push at clock 6 holds 1 non-finite "
                       "value(s) (the first, nan,"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("refused a Clock request from node 2: PsClock at clock "
                       "9223372036854775807, which no run reaches"),
              std::string::npos)
        << log;
  }
  ASSERT_TRUE(reports[0].owner_accuracy.has_value());
  for (float v : reports[0].owner_model)
    ASSERT_TRUE(std::isfinite(v));
  EXPECT_GT(*reports[0].owner_accuracy, 0.5);
}

// --rejoin: node 2 stops at clock 30 and restarts on the same port. Its new life gets its keys
// back from a live node's last read (not the initial model) and joins at the cluster's clock;
// everyone finishes and the owners' model is trained. Under SSP 2 and under BSP, where the
// owners hold pushes until every counted worker finished their clock.
class PsRejoin : public ::testing::TestWithParam<std::string> {};

TEST_P(PsRejoin, ARestartedNodeRejoinsWithItsKeysFromALiveNodesLastRead) {
  constexpr size_t kNodes = 3;
  constexpr int64_t kClocks = 400;
  auto data = syntheticData(3000, 300);
  const std::vector<NodeId> members = membersOf(kNodes);
  const testsupport::NodeSettings settings = nodeSettings("ps-rejoin-test");
  const auto out = std::filesystem::temp_directory_path() /
                   ("ps-rejoin-" + GetParam() + "-" + std::to_string(getpid()));
  auto runOptions = [&](NodeId i) {
    run::RunOptions options = trainingOptions();
    options.rounds = kClocks;
    options.eval_every = 0;
    options.out_dir = out.string();
    if (i != 2)
      options.stragglers = chorus::faults::StragglerProfile::read("fixed:3")
                               .value();  // keep them busy while node 2 restarts
    return options;
  };
  auto psOptions = [] {
    PsOptions po;
    po.staleness = Staleness::read(GetParam()).value();
    po.key_floats = 1000;
    po.down_timeout_s = 0.2;  // the others stop waiting for node 2 while it is gone
    return po;
  };
  // Node 0's latest read of the model, to compare node 2's restored keys with.
  std::mutex mu;
  std::vector<float> node0_view;
  LocalCluster cluster(2, kNodes, settings);  // nodes 0 and 1; node 2 is handled here
  for (NodeId i = 0; i < 2; ++i) {
    PsOptions po = psOptions();
    if (i == 0) {
      po.on_clock_end = [&](Clock, std::span<const float> params) {
        std::lock_guard lock(mu);
        node0_view.assign(params.begin(), params.end());
      };
    }
    cluster.attach<PsPeer>(i, run::prepareNodeJob(runOptions(i), data, i, kNodes).value(), members,
                           po);
  }
  const PsPeer& peer0 = cluster.peer<PsPeer>(0);

  // First life of node 2, until its clock 30.
  std::promise<void> clock30;
  PsOptions first = psOptions();
  first.on_clock_end = [&](Clock c, std::span<const float>) {
    if (c == 30) clock30.set_value();
  };
  auto node2 = std::make_unique<node::Node>(testsupport::nodeOptions(settings, 2, kNodes));
  run::NodeJob job2 = run::prepareNodeJob(runOptions(2), data, 2, kNodes).value();
  const std::vector<float> initial(job2.model->params().begin(), job2.model->params().end());
  auto peer2 = std::make_unique<PsPeer>(*node2, std::move(job2), members, first);
  ASSERT_TRUE(node2->listen().ok());
  const uint16_t port2 = node2->port();
  cluster.connect({{2, port2}});
  cluster.connectOutside(*node2);
  ASSERT_TRUE(node2->waitClusterReady(30s).ok());
  cluster.start();
  auto first_run = std::async(std::launch::async, [p = peer2.get()] { return p->run(); });
  ASSERT_EQ(clock30.get_future().wait_for(60s), std::future_status::ready);
  peer2->stop();
  ASSERT_EQ(first_run.wait_for(60s), std::future_status::ready);
  const PsReport first_life = first_run.get();
  EXPECT_TRUE(first_life.stopped);
  // The last clock it announced. That announcement may still have been in its node's queue
  // when the node shut down at once (as a killed process loses what it had not sent): the
  // others then last heard of clock died_at - 1.
  const Clock died_at = first_life.clocks_done;
  node2->shutdown(0ms);
  peer2.reset();
  node2.reset();

  // Second life: same id and port, --rejoin. Its first read of its own keys is what it restored.
  const std::vector<Key> own_keys = [&] {
    std::vector<Key> keys;
    for (Key k = 0; k < peer0.layout().numKeys(); ++k) {
      if (peer0.shardMap().home(k) == 2) keys.push_back(k);
    }
    return keys;
  }();
  ASSERT_FALSE(own_keys.empty());
  double restored_to_node0 = -1, initial_to_node0 = -1;
  PsOptions second = psOptions();
  second.rejoin = true;
  bool measured = false;
  second.on_clock_end = [&](Clock, std::span<const float> params) {
    if (measured) return;
    measured = true;
    std::lock_guard lock(mu);
    double restored = 0, init = 0;
    for (Key k : own_keys) {
      const size_t begin = peer0.layout().offset(k);
      for (size_t i = begin; i < begin + peer0.layout().length(k); ++i) {
        restored += std::pow(params[i] - node0_view[i], 2);
        init += std::pow(initial[i] - node0_view[i], 2);
      }
    }
    restored_to_node0 = std::sqrt(restored);
    initial_to_node0 = std::sqrt(init);
  };
  node2 = std::make_unique<node::Node>(testsupport::nodeOptions(settings, 2, kNodes, port2));
  peer2 = std::make_unique<PsPeer>(
      *node2, run::prepareNodeJob(runOptions(2), data, 2, kNodes).value(), members, second);
  ASSERT_TRUE(node2->listen().ok());
  cluster.connectOutside(*node2);
  ASSERT_TRUE(node2->waitClusterReady(30s).ok());
  auto second_run = std::async(std::launch::async, [p = peer2.get()] { return p->run(); });
  ASSERT_EQ(second_run.wait_for(300s), std::future_status::ready);
  const PsReport r = second_run.get();
  ASSERT_TRUE(r.rejoined_from.has_value());
  // Both live nodes answered; the keys came from the freshest last read, which holds every
  // update from before node 2's death but not from its own clocks after it.
  ASSERT_EQ(r.rejoin_answers.size(), 2u);
  EXPECT_EQ(*r.rejoined_from, freshestFirst(r.rejoin_answers).front());
  for (const auto& [helper, read_clock] : r.rejoin_answers)
    EXPECT_LE(read_clock, r.rejoin_read_clock) << "node " << helper;
  EXPECT_GE(r.rejoin_read_clock, 1);
  EXPECT_LE(r.rejoin_read_clock, died_at + 1);
  EXPECT_GT(r.first_clock, 30);
  EXPECT_EQ(r.clocks_done, kClocks);
  EXPECT_EQ(r.server.errors, 0u);
  // Its restored view of the others' clocks was a little old: their next clocks are no gap.
  EXPECT_TRUE(r.server.skipped.empty());
  // Restored from a live node's last read: far closer to what node 0 reads than the initial
  // model is (restarting from the initial model would give a ratio near 1).
  ASSERT_GT(initial_to_node0, 0);
  EXPECT_LT(restored_to_node0 / initial_to_node0, 0.3)
      << restored_to_node0 << " vs " << initial_to_node0;
  for (size_t i = 0; i < 2; ++i) {
    const PsReport other = cluster.result<PsReport>(i, 300s);
    EXPECT_EQ(other.clocks_done, kClocks) << "node " << i;
    EXPECT_EQ(other.server.errors, 0u) << "node " << i;
    // The clocks node 2 skipped are named as lost. It skips none when the others were still
    // waiting for it: it then joins at the clock after the last one they heard of.
    if (!other.server.skipped.empty()) {
      ASSERT_EQ(other.server.skipped.size(), 1u) << "node " << i;
      EXPECT_EQ(other.server.skipped[0].worker, 2u);
      EXPECT_GE(other.server.skipped[0].from, died_at - 1);
      EXPECT_LE(other.server.skipped[0].from, died_at);
      EXPECT_EQ(other.server.skipped[0].to, r.first_clock);
      EXPECT_GT(r.first_clock, other.server.skipped[0].from + 1);
    } else {
      EXPECT_GE(r.first_clock, died_at);
      EXPECT_LE(r.first_clock, died_at + 1);
    }
    if (i == 0) {
      ASSERT_TRUE(other.owner_accuracy.has_value());
      EXPECT_GE(*other.owner_accuracy, 0.9);
    }
  }
  node2->shutdown(0ms);
  // Node 2's metrics keep both lives: two start lines, a rejoin line, two final lines.
  std::ifstream metrics(out / "node-2.jsonl");
  size_t starts = 0, rejoins = 0, finals = 0;
  for (std::string line; std::getline(metrics, line);) {
    starts += line.find("\"event\":\"start\"") != std::string::npos;
    if (line.find("\"event\":\"rejoin\"") != std::string::npos) {
      ++rejoins;
      EXPECT_NE(line.find(fmt::format("\"read_clock\":{}", r.rejoin_read_clock)), std::string::npos)
          << line;
    }
    finals += line.find("\"event\":\"final\"") != std::string::npos;
  }
  EXPECT_EQ(starts, 2u);
  EXPECT_EQ(rejoins, 1u);
  EXPECT_EQ(finals, 2u);
  std::filesystem::remove_all(out);
}

// Node 0's job of a two-node run of 10 clocks on a little synthetic data.
run::NodeJob tinyJob() {
  auto data = syntheticData(300, 30);
  run::RunOptions options = trainingOptions();
  options.rounds = 10;
  return run::prepareNodeJob(options, data, 0, 2).value();
}

INSTANTIATE_TEST_SUITE_P(Staleness, PsRejoin, ::testing::Values("2", "0"),
                         [](const auto& info) { return "S" + info.param; });

// A rejoining node trusts the freshest catch-up answer first; equally fresh ones by node id.
TEST(PsPeer, RejoinTrustsTheFreshestAnswerFirst) {
  EXPECT_EQ(freshestFirst({{0, 12}, {1, 15}, {3, -1}, {2, 15}}), (std::vector<NodeId>{1, 2, 0, 3}));
  EXPECT_EQ(freshestFirst({{4, -1}}), (std::vector<NodeId>{4}));
  EXPECT_TRUE(freshestFirst({}).empty());
}

// A rejoining worker resumes after the latest clock any helper heard of it, not only the
// freshest answer's: an owner that heard a later one would refuse the clocks below it.
TEST(PsPeer, RejoinResumesAfterTheLatestClockAnyHelperHeard) {
  const std::vector<std::vector<WorkerView>> views = {
      {{0, 40, true}, {2, 17, true}},           // the freshest read, an older view of node 2
      {{0, 38, true}, {2, 19, false}, {1, 5}},  // dropped node 2 after hearing clock 19
  };
  EXPECT_EQ(lastClockHeard(2, views), 19);
  EXPECT_EQ(lastClockHeard(0, views), 40);
  EXPECT_EQ(lastClockHeard(3, views), 0);
  EXPECT_EQ(lastClockHeard(2, {}), 0);
}

// --rejoin with no node that answers: a clear error, not a run from the initial model.
TEST(PsPeer, ARejoinThatNobodyAnswersFailsWithAClearError) {
  const std::vector<NodeId> members{0, 1};
  // Node 1 is a bare runtime node: it has no PS handlers and never answers.
  LocalCluster cluster(2, 0, nodeSettings("ps-rejoin-alone"));
  PsOptions po;
  po.rejoin = true;
  po.rejoin_timeout = 300ms;
  PsPeer& peer = cluster.attach<PsPeer>(0, tinyJob(), members, po);
  cluster.connect();
  try {
    peer.run();
    ADD_FAILURE() << "the rejoin went on without anyone's keys";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no live node gave this node's keys back"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("asked: 1"), std::string::npos) << e.what();
  }
}

// A node that restarts into a running job without --rejoin would serve the initial model for
// its keys: the first clock it hears from a worker gives it away, and it stops with what to do.
TEST(PsPeer, StartingIntoARunningJobWithoutRejoinIsAClearError) {
  const std::vector<NodeId> members{0, 1};
  LocalCluster cluster(2, 0, nodeSettings("ps-running-job"));
  cluster.attach<PsPeer>(0, tinyJob(), members, PsOptions{});
  cluster.connect();
  cluster.start();
  node::Node& node1 = cluster.node(1);
  // Node 1 is a bare runtime node playing a worker that has been training for a while: its
  // first request is a pull at clock 57. The pull must not be answered with initial values.
  std::atomic<int> replies{0};
  node1.setHandler(messageType(wire::Body::PsReply),
                   [&replies](NodeId, const node::InboundFrame&) { ++replies; });
  const std::vector<uint64_t> keys{0};
  node1.send(0, encodeMessage(node1, wire::Body::PsPull, [&](flatbuffers::FlatBufferBuilder& b) {
               return wire::CreatePsPull(b, 1, 57, 0, b.CreateVector(keys)).Union();
             }));
  ASSERT_TRUE(cluster.finishedWithin(0, 60s));
  try {
    cluster.result<PsReport>(0);
    ADD_FAILURE() << "the node trained on with the initial model for its keys";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("worker node 1 is already at clock 57"), std::string::npos) << what;
    EXPECT_NE(what.find("--rejoin"), std::string::npos) << what;
  }
  for (size_t i = 0; i < cluster.size(); ++i)
    cluster.node(i).shutdown(0ms);
  EXPECT_EQ(replies.load(), 0);
}

// --async-rounds shapes only fully asynchronous runs. Given with a bound, it is ignored, and the
// node says so; its default value alone says nothing.
TEST(PsOptions, AsyncRoundsWithABoundIsIgnoredWithAWarning) {
  for (const bool given : {false, true}) {
    CLI::App app;
    PsOptions po;
    addPsOptions(app, po);
    run::addStalenessOption(app, po.staleness);  // --staleness is both modes' flag
    std::vector<std::string> args{"--staleness", "2"};
    if (given) args.insert(args.end(), {"--async-rounds", "worker"});
    std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last first
    app.parse(args);
    EXPECT_EQ(po.async_rounds_given, given);

    std::ostringstream log;
    node::NodeOptions options = testsupport::nodeOptions(nodeSettings("ps-async-rounds"), 0, 2);
    options.log_sinks = {std::make_shared<spdlog::sinks::ostream_sink_mt>(log)};
    node::Node node(options);
    {
      PsPeer peer(node, tinyJob(), {0, 1}, po);
      node.shutdown(0ms);
    }
    const bool warned =
        log.str().find("--async-rounds worker is ignored with --staleness 2") != std::string::npos;
    EXPECT_EQ(warned, given) << log.str();
  }
}

TEST(PsOptions, BadValuesNameTheFlag) {
  PsOptions o;
  o.staleness = Staleness{-1};
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
