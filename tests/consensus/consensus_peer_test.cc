// Consensus mode end to end over the real runtime: nodes as threads in this process (and one as
// a child process killed for real), loopback, port 0, fixed seeds.
#include "consensus/consensus_peer.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "ml/dataset.h"
#include "node/node.h"
#include "ps/ps_peer.h"
#include "run/training_run.h"
#include "tests/support/local_cluster.h"

namespace chorus::consensus {
namespace {

using namespace std::chrono_literals;

using testsupport::complete;
using testsupport::Graph;
using testsupport::layoutOf;
using testsupport::LocalCluster;
using testsupport::ring;
using testsupport::syntheticData;

// The nodes of these tests: info lines kept (tests look for them), a 3 s peer time-out.
testsupport::NodeSettings nodeSettings() {
  return {.cluster = "consensus-test", .log_level = spdlog::level::info};
}

node::NodeOptions nodeOptions(NodeId self, size_t n) {
  return testsupport::nodeOptions(nodeSettings(), self, n);
}

// Nodes 0..n-1 of a cluster of `members` nodes (0: n) in this process.
class Cluster : public LocalCluster {
 public:
  explicit Cluster(size_t n, size_t members = 0) : LocalCluster(n, members, nodeSettings()) {}
  // Puts a consensus peer on node i (before connect()).
  ConsensusPeer& attach(size_t i, run::NodeJob job, PeerLayout layout, ConsensusOptions options) {
    return LocalCluster::attach<ConsensusPeer>(i, std::move(job), std::move(layout), options);
  }
  ConsensusPeer& peer(size_t i) { return LocalCluster::peer<ConsensusPeer>(i); }
  // Node i's report, waiting for it.
  ConsensusReport report(size_t i) { return result<ConsensusReport>(i); }
};

// A job on `data` for `nodes` nodes through the shared run layer.
run::NodeJob makeJob(const run::RunOptions& options, std::shared_ptr<const ml::DataSplit> data,
                     NodeId id, size_t nodes) {
  return run::prepareNodeJob(options, std::move(data), id, static_cast<int>(nodes)).value();
}

// The report of a peer run outside a cluster (a restarted node's lives).
ConsensusReport getReport(std::future<ConsensusReport>& f, std::chrono::seconds timeout = 300s) {
  if (f.wait_for(timeout) != std::future_status::ready) {
    ADD_FAILURE() << "a node did not finish within " << timeout.count() << " s";
    return {};
  }
  return f.get();
}

// With learning rate 0 and synchronous rounds (wait-all, tau = 0) the symmetric, doubly
// stochastic uniform weights of a regular graph keep the average and drive every node to it.
void expectExactAverage(const Graph& g, int64_t rounds) {
  const size_t n = g.size();
  auto data = syntheticData(200, 50);
  Cluster cluster(n);
  std::vector<double> average;
  for (size_t i = 0; i < n; ++i) {
    run::RunOptions options;
    options.data.name = "synthetic";
    options.model.name = "softmax";
    options.lr = 0;
    options.rounds = rounds;
    options.eval_every = 0;
    options.seed = 100 + i;  // a different initial model on every node
    run::NodeJob job = makeJob(options, data, static_cast<NodeId>(i), n);
    if (average.empty()) average.assign(job.model->size(), 0.0);
    for (size_t p = 0; p < average.size(); ++p)
      average[p] += job.model->params()[p] / static_cast<double>(n);
    ConsensusOptions co;
    co.backup = chorus::consensus::BackupRuleSpec::read("wait-all").value();
    co.staleness = {0};
    co.chunk_floats = 1000;  // several chunks per model
    cluster.attach(i, std::move(job), layoutOf(g, static_cast<NodeId>(i)), co);
  }
  cluster.connect();
  cluster.start();
  for (size_t i = 0; i < n; ++i) {
    ConsensusReport r = cluster.report(i);
    EXPECT_EQ(r.rounds_done, rounds);
    ASSERT_EQ(r.final_model.size(), average.size());
    double max_error = 0, spread = 0;
    for (size_t p = 0; p < average.size(); ++p) {
      max_error = std::max(max_error, std::abs(r.final_model[p] - average[p]));
      spread = std::max(spread, std::abs(average[p]));
    }
    EXPECT_LT(max_error, 1e-5) << "node " << i << " (largest |average| " << spread << ")";
    EXPECT_GT(spread, 1e-3);  // the initial models differ: the test is not trivial
    for (size_t b : r.backups)
      EXPECT_EQ(b, 0u);
  }
}

TEST(ConsensusPeer, PureAveragingOnARingReachesTheExactAverage) {
  expectExactAverage(ring(5), 60);
}

TEST(ConsensusPeer, PureAveragingOnACompleteGraphReachesTheExactAverage) {
  expectExactAverage(complete(4), 8);
}

run::RunOptions trainingOptions() {
  run::RunOptions options = testsupport::syntheticTraining();
  options.lr = 0.05;
  options.momentum = 0.9;
  options.rounds = 400;
  return options;
}

// A softmax model for `rounds` rounds, evaluated only at the end.
run::RunOptions softmaxOptions(int64_t rounds) {
  run::RunOptions options = trainingOptions();
  options.model.name = "softmax";
  options.model.hidden.clear();
  options.rounds = rounds;
  options.eval_every = 0;
  return options;
}

// The number after `key` in a metrics line; NaN (failing any comparison) when it is missing.
double numberAfter(const std::string& line, const std::string& key) {
  const size_t at = line.find(key);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(line.c_str() + at + key.size(), nullptr);
}

TEST(ConsensusPeer, FourNodesTrainSyntheticDataToNinetyFivePercent) {
  auto data = syntheticData(10000, 1000);
  const Graph g = ring(4);
  Cluster cluster(4);
  const auto out =
      std::filesystem::temp_directory_path() / ("consensus-train-" + std::to_string(getpid()));
  for (NodeId i = 0; i < 4; ++i) {
    run::RunOptions options = trainingOptions();
    options.out_dir = out.string();
    ConsensusOptions co;  // dynamic rule, tau 2
    cluster.attach(i, makeJob(options, data, i, 4), layoutOf(g, i), co);
  }
  cluster.connect();
  cluster.start();
  for (NodeId i = 0; i < 4; ++i) {
    ConsensusReport r = cluster.report(i);
    EXPECT_EQ(r.rounds_done, 400);
    EXPECT_GE(r.final_accuracy, 0.95) << "node " << i;
    EXPECT_LE(r.max_staleness, 2);
    EXPECT_TRUE(r.time_to_target.has_value()) << "node " << i;
    EXPECT_EQ(r.finished_peers.size(), 3u);
    if (i == 0) {
      ASSERT_TRUE(r.average_accuracy.has_value());
      EXPECT_EQ(r.averaged_models, 4u);
      EXPECT_GE(*r.average_accuracy, 0.95);
    } else {
      EXPECT_FALSE(r.average_accuracy.has_value());
    }
    // One metrics line per round, plus start, evaluations and the final line.
    std::ifstream metrics(out / ("node-" + std::to_string(i) + ".jsonl"));
    std::string line;
    size_t rounds = 0;
    bool final_seen = false;
    while (std::getline(metrics, line)) {
      if (line.find("\"event\":\"step\"") != std::string::npos) {
        ++rounds;
        EXPECT_NE(line.find("\"consensus_distance\":"), std::string::npos) << line;
        EXPECT_NE(line.find("\"bytes_sent\":"), std::string::npos) << line;
        EXPECT_NE(line.find("\"staleness_max\":"), std::string::npos) << line;
        // The dynamic rule's staleness cost: per backup, the models mixed anyway (at most one)
        // and their staleness sum, each model at most tau = 2 rounds old.
        const double used = numberAfter(line, "\"backup_used\":");
        const double stale = numberAfter(line, "\"backup_staleness\":");
        EXPECT_GE(used, 0.0) << line;
        EXPECT_LE(used, 1.0) << line;
        EXPECT_GE(stale, 0.0) << line;
        EXPECT_LE(stale, 2.0 * used + 1e-9) << line;
      }
      if (line.find("\"event\":\"final\"") != std::string::npos) final_seen = true;
    }
    // A node that skipped rounds (iteration skipping) has no line for them.
    EXPECT_EQ(static_cast<int64_t>(rounds) + r.skipped_rounds, 400);
    EXPECT_TRUE(final_seen);
  }
  std::filesystem::remove_all(out);
}

// At their synchronous ends the two modes compute the same model. Consensus with wait-all and
// tau = 0 on a complete graph averages every round, so each node steps from the same model
// and the mean of the nodes' velocities follows synchronous SGD with momentum. PS with
// staleness 0 takes that step at the owners on the workers' mean gradient. The batches are the
// same (same shards, same batcher seeds), so the final models agree up to float rounding.
TEST(ConsensusPeer, WaitAllOnACompleteGraphComputesWhatPsBspComputes) {
  constexpr size_t kNodes = 4;
  constexpr int64_t kRounds = 40;
  auto data = syntheticData(2000, 200);
  run::RunOptions options = trainingOptions();
  options.model.hidden = {32};
  options.momentum = 0.9;
  options.weight_decay = 1e-3;
  options.rounds = kRounds;
  options.eval_every = 0;
  const Graph g = complete(kNodes);

  std::vector<float> initial, consensus_model;
  {
    Cluster cluster(kNodes);
    for (NodeId i = 0; i < kNodes; ++i) {
      ConsensusOptions co;
      co.backup = chorus::consensus::BackupRuleSpec::read("wait-all").value();
      co.staleness = {0};
      run::NodeJob job = makeJob(options, data, i, kNodes);
      if (i == 0) initial.assign(job.model->params().begin(), job.model->params().end());
      cluster.attach(i, std::move(job), layoutOf(g, i), co);
    }
    cluster.connect();
    cluster.start();
    for (NodeId i = 0; i < kNodes; ++i) {
      ConsensusReport r = cluster.report(i);
      EXPECT_EQ(r.rounds_done, kRounds);
      if (i == 0) consensus_model = r.final_model;
    }
  }

  std::vector<float> ps_model;
  {
    LocalCluster cluster(kNodes, 0, nodeSettings());
    const std::vector<NodeId> members = testsupport::membersOf(kNodes);
    for (NodeId i = 0; i < kNodes; ++i) {
      ps::PsOptions po;
      po.staleness = {0};
      po.key_floats = 500;  // several keys per owner
      cluster.attach<ps::PsPeer>(i, makeJob(options, data, i, kNodes), members, po);
    }
    cluster.connect();
    cluster.start();
    for (NodeId i = 0; i < kNodes; ++i) {
      ps::PsReport r = cluster.result<ps::PsReport>(i);
      EXPECT_EQ(r.clocks_done, kRounds);
      if (!r.owner_model.empty()) ps_model = r.owner_model;  // node 0 reads it
    }
  }

  ASSERT_EQ(consensus_model.size(), initial.size());
  ASSERT_EQ(ps_model.size(), initial.size());
  double moved = 0, apart = 0;
  for (size_t p = 0; p < initial.size(); ++p) {
    moved = std::max(moved, static_cast<double>(std::abs(consensus_model[p] - initial[p])));
    apart = std::max(apart, static_cast<double>(std::abs(consensus_model[p] - ps_model[p])));
  }
  EXPECT_GT(moved, 0.05);  // training moved the model: the comparison is not trivial
  EXPECT_LT(apart, 1e-3 * moved) << "largest difference " << apart << ", largest move " << moved;
}

// Random straggler delays with one backup worker: every model mixed in is within tau rounds.
TEST(ConsensusPeer, TheStalenessBoundHoldsUnderRandomDelays) {
  auto data = syntheticData(400, 50);
  const Graph g = ring(4);
  Cluster cluster(4);
  for (NodeId i = 0; i < 4; ++i) {
    run::RunOptions options = softmaxOptions(60);
    options.stragglers = chorus::faults::StragglerProfile::read("shifted-exp:0,2+slow:1=3").value();
    options.seed = 11;
    ConsensusOptions co;
    co.backup = chorus::consensus::BackupRuleSpec::read("static:1").value();
    co.staleness = {1};
    cluster.attach(i, makeJob(options, data, i, 4), layoutOf(g, i), co);
  }
  cluster.connect();
  cluster.start();
  for (NodeId i = 0; i < 4; ++i) {
    ConsensusReport r = cluster.report(i);
    EXPECT_EQ(r.rounds_done, 60);
    EXPECT_LE(r.max_staleness, 1) << "node " << i;
  }
}

// Node 1 of a ring is 20x slower at every step. With one backup worker its neighbors run to the
// staleness bound and wait for it there; it then skips to their round, so every node still
// runs all rounds and mixes nothing older than tau. With wait-all nobody is ever ahead of the
// node it waits for, so nobody skips.
TEST(ConsensusPeer, APersistentlySlowNodeSkipsRoundsUnlessEveryoneWaitsForIt) {
  auto data = syntheticData(400, 50);
  const Graph g = ring(4);
  for (const char* rule : {"static:1", "wait-all"}) {
    SCOPED_TRACE(rule);
    Cluster cluster(4);
    for (NodeId i = 0; i < 4; ++i) {
      run::RunOptions options = trainingOptions();
      options.model.name = "softmax";
      options.model.hidden.clear();
      options.rounds = 60;
      options.eval_every = 25;
      options.stragglers = chorus::faults::StragglerProfile::read("fixed:1+slow:1=20").value();
      options.seed = 5;
      ConsensusOptions co;
      co.backup = BackupRuleSpec::read(rule).value();
      co.staleness = {2};
      cluster.attach(i, makeJob(options, data, i, 4), layoutOf(g, i), co);
    }
    cluster.connect();
    cluster.start();
    for (NodeId i = 0; i < 4; ++i) {
      ConsensusReport r = cluster.report(i);
      EXPECT_EQ(r.rounds_done, 60) << "node " << i;
      EXPECT_LE(r.max_staleness, 2) << "node " << i;
      EXPECT_EQ(static_cast<int64_t>(r.backups.size()) + r.skipped_rounds, 60) << "node " << i;
      if (std::string(rule) == "wait-all") {
        EXPECT_EQ(r.skips, 0) << "node " << i;
      } else if (i == 1) {
        EXPECT_GT(r.skips, 0);
        EXPECT_GE(r.skipped_rounds, r.skips);
        EXPECT_NE(cluster.log(1).find("skipping to round"), std::string::npos);
      }
    }
  }
}

// Nodes 0 and 1 run; node 2 is connected but never sends a model.
TEST(ConsensusPeer, OneBackupWorkerLetsRoundsGoOnWithoutASilentNeighbor) {
  auto data = syntheticData(300, 50);
  const Graph g = complete(3);
  Cluster cluster(3);
  for (NodeId i = 0; i < 2; ++i) {
    run::RunOptions options = softmaxOptions(30);
    ConsensusOptions co;
    co.backup = chorus::consensus::BackupRuleSpec::read("static:1").value();
    co.stall_timeout = 300ms;   // the silent node stops holding the staleness gate quickly
    co.finish_timeout = 500ms;  // node 2 never says TrainingDone
    cluster.attach(i, makeJob(options, data, i, 3), layoutOf(g, i), co);
  }
  cluster.connect();
  cluster.start();
  for (NodeId i = 0; i < 2; ++i) {
    ConsensusReport r = cluster.report(i);
    EXPECT_EQ(r.rounds_done, 30) << "node " << i;
    EXPECT_FALSE(r.stopped);
    for (size_t b : r.backups)
      EXPECT_EQ(b, 1u);
  }
}

TEST(ConsensusPeer, WaitAllBlocksOnASilentNeighborAndSaysWhomItWaitsFor) {
  auto data = syntheticData(300, 50);
  const Graph g = complete(3);
  Cluster cluster(3);
  std::mutex mu;
  std::map<NodeId, std::set<NodeId>> waiting_for;
  std::promise<void> both_reported;
  bool reported = false;
  for (NodeId i = 0; i < 2; ++i) {
    run::RunOptions options = trainingOptions();
    options.model.name = "softmax";
    options.model.hidden.clear();
    options.rounds = 30;
    ConsensusOptions co;
    co.backup = chorus::consensus::BackupRuleSpec::read("wait-all").value();
    co.report_every = 100ms;
    co.on_waiting = [&, i](Round, const std::vector<NodeId>& missing) {
      std::lock_guard lock(mu);
      waiting_for[i].insert(missing.begin(), missing.end());
      if (!reported && waiting_for.size() == 2) {
        reported = true;
        both_reported.set_value();
      }
    };
    cluster.attach(i, makeJob(options, data, i, 3), layoutOf(g, i), co);
  }
  cluster.connect();
  auto done = both_reported.get_future();
  cluster.start();
  ASSERT_EQ(done.wait_for(60s), std::future_status::ready);
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(waiting_for[0], std::set<NodeId>{2});
    EXPECT_EQ(waiting_for[1], std::set<NodeId>{2});
  }
  EXPECT_NE(cluster.log(0).find("waiting for node 2"), std::string::npos) << cluster.log(0);
  // Still blocked in the first round: stop them.
  EXPECT_FALSE(cluster.finishedWithin(0, 200ms));
  cluster.peer(0).stop();
  cluster.peer(1).stop();
  for (size_t i = 0; i < 2; ++i) {
    ConsensusReport r = cluster.report(i);
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.rounds_done, 0);
  }
}

// Node 3 runs in a child process and is killed with SIGKILL mid-run; 0..2 finish without it.
TEST(ConsensusPeer, ANodeKilledMidRunLeavesTheOthersFinishing) {
  auto data = syntheticData(1000, 200);
  const Graph g = complete(4);
  const size_t n = 4;
  int to_parent[2];
  ASSERT_EQ(pipe(to_parent), 0);
  // Fork first, while this process has no other thread (earlier tests joined theirs): the
  // child runs only its own node and peer, then _exits.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(to_parent[0]);
    run::RunOptions ro = softmaxOptions(1'000'000);
    node::NodeOptions options = nodeOptions(3, n);
    options.log_level = spdlog::level::warn;
    node::Node node(options);
    // The handlers are in place before the listener accepts anyone.
    ConsensusPeer peer(node, makeJob(ro, data, 3, n), layoutOf(g, 3), ConsensusOptions{});
    if (!node.listen().ok()) _exit(3);
    const uint16_t port = node.port();
    if (write(to_parent[1], &port, sizeof port) != sizeof port) _exit(4);
    // Node 3 has the highest id: the others dial it, so their addresses are only named here.
    std::vector<node::PeerAddress> peers;
    for (NodeId j = 0; j < 3; ++j)
      peers.push_back({j, "127.0.0.1", 1});
    if (!node.connect(peers).ok() || !node.waitClusterReady(30s).ok()) _exit(5);
    peer.run();
    _exit(0);
  }
  // However this test ends, the child does not outlive it.
  struct KillOnExit {
    pid_t pid;
    ~KillOnExit() {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } reaper{child};
  close(to_parent[1]);
  uint16_t child_port = 0;
  const ssize_t got = read(to_parent[0], &child_port, sizeof child_port);
  close(to_parent[0]);
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof child_port)) << "the child did not report its port";
  Cluster cluster(3, 4);  // nodes 0..2 here, 3 in the child

  std::promise<void> round_five;
  bool past_five = false;  // node 0's trainer thread only
  for (NodeId i = 0; i < 3; ++i) {
    run::RunOptions options = softmaxOptions(40);
    ConsensusOptions co;
    if (i == 0) {
      // At or past round 5: iteration skipping can jump over round 5 itself.
      co.on_round_end = [&](Round k) {
        if (k >= 5 && !past_five) {
          past_five = true;
          round_five.set_value();
        }
      };
    }
    cluster.attach(i, makeJob(options, data, i, n), layoutOf(g, i), co);
  }
  cluster.connect({{3, child_port}});
  auto reached = round_five.get_future();
  cluster.start();
  const bool got_there = reached.wait_for(60s) == std::future_status::ready;
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  reaper.pid = 0;
  // Once seen failing under heavy load (2026-11-23, a ctest run at nice 19 beside a build),
  // without a clue: the nodes' logs say where they were.
  ASSERT_TRUE(got_there) << "node 0 did not reach round 5 within 60 s.\nnode 0:\n"
                         << cluster.log(0) << "\nnode 1:\n"
                         << cluster.log(1) << "\nnode 2:\n"
                         << cluster.log(2);
  EXPECT_TRUE(WIFSIGNALED(status));
  for (NodeId i = 0; i < 3; ++i) {
    ConsensusReport r = cluster.report(i);
    EXPECT_EQ(r.rounds_done, 40) << "node " << i;
    EXPECT_EQ(r.departed_peers, std::vector<NodeId>{3}) << "node " << i;
    EXPECT_EQ(r.finished_peers.size(), 2u);
    if (i == 0) {
      EXPECT_EQ(r.averaged_models, 3u);
    }
  }
}

// Node 2 is stopped and shut down at round 5, then restarts on the same port with --rejoin: it
// takes a neighbor's model, joins the rounds where that neighbor is, and finishes with the others.
TEST(ConsensusPeer, ARestartedNodeRejoinsFromANeighborsModel) {
  auto data = syntheticData(1000, 200);
  const Graph g = complete(3);
  Cluster cluster(2, 3);  // nodes 0 and 1; node 2 is handled here
  // One life of node 2; the node stops before its peer goes away, also when a check fails.
  struct Incarnation {
    std::unique_ptr<node::Node> node;
    std::unique_ptr<ConsensusPeer> peer;
    ~Incarnation() {
      if (node) node->shutdown(0ms);
    }
  };
  auto incarnation = [&](uint16_t port, bool rejoin, ConsensusOptions co) {
    node::NodeOptions options = nodeOptions(2, 3);
    options.listen_port = port;
    options.log_level = spdlog::level::warn;
    auto node = std::make_unique<node::Node>(options);
    EXPECT_TRUE(node->listen().ok());
    run::RunOptions ro = trainingOptions();
    ro.rounds = 400;
    ro.eval_every = 0;
    co.rejoin = rejoin;
    auto peer = std::make_unique<ConsensusPeer>(*node, makeJob(ro, data, 2, 3), layoutOf(g, 2), co);
    auto life = std::make_unique<Incarnation>();
    life->node = std::move(node);
    life->peer = std::move(peer);
    return life;
  };
  std::promise<void> round_five;
  bool past_five = false;  // node 2's trainer thread only
  ConsensusOptions first_co;
  // At or past round 5: iteration skipping can jump over round 5 itself (under load a node that
  // fell behind skips to its neighbors' round), and a promise for round 5 exactly then never
  // came (issue 23, item 7, as in ANodeKilledMidRunLeavesTheOthersFinishing).
  first_co.on_round_end = [&](Round k) {
    if (k >= 5 && !past_five) {
      past_five = true;
      round_five.set_value();
    }
  };
  auto first_life = incarnation(0, false, first_co);
  node::Node* node2 = first_life->node.get();
  ConsensusPeer* peer2 = first_life->peer.get();
  const uint16_t port2 = node2->port();
  for (NodeId i = 0; i < 2; ++i) {
    run::RunOptions options = trainingOptions();
    options.rounds = 400;
    options.eval_every = 0;
    options.stragglers = chorus::faults::StragglerProfile::read("fixed:3")
                             .value();  // keep them busy while node 2 restarts
    cluster.attach(i, makeJob(options, data, i, 3), layoutOf(g, i), ConsensusOptions{});
  }
  cluster.connect({{2, port2}});
  cluster.connectOutside(*node2);
  ASSERT_TRUE(node2->waitClusterReady(30s).ok());
  cluster.start();
  auto first_run = std::async(std::launch::async, [peer2] { return peer2->run(); });
  ASSERT_EQ(round_five.get_future().wait_for(60s), std::future_status::ready);
  peer2->stop();
  ConsensusReport stopped = getReport(first_run);
  EXPECT_TRUE(stopped.stopped);
  first_life.reset();

  auto second_life = incarnation(port2, true, ConsensusOptions{});
  cluster.connectOutside(*second_life->node);
  ASSERT_TRUE(second_life->node->waitClusterReady(30s).ok());
  auto second_run =
      std::async(std::launch::async, [p = second_life->peer.get()] { return p->run(); });
  ConsensusReport r = getReport(second_run);
  EXPECT_GT(r.first_round, 6);
  EXPECT_EQ(r.rounds_done, 400);
  for (NodeId i = 0; i < 2; ++i) {
    ConsensusReport other = cluster.report(i);
    // Having taken a trained model, the rejoined node ends where the others do.
    EXPECT_NEAR(r.final_accuracy, other.final_accuracy, 0.05) << "node " << i;
    EXPECT_GE(r.final_accuracy, 0.85);
    EXPECT_EQ(other.rounds_done, 400);
    EXPECT_EQ(other.finished_peers.size(), 2u) << "node " << i;
  }
}

// Sends one ModelShare frame from `node` to `to`.
void sendShare(node::Node& node, NodeId to, Round round, uint64_t offset, uint64_t total,
               const std::vector<float>& values,
               wire::SharePurpose purpose = wire::SharePurpose::Gossip) {
  node.send(to, encodeMessage(node, wire::Body::ModelShare, [&](flatbuffers::FlatBufferBuilder& b) {
              auto v = b.CreateVector(values);
              return wire::CreateModelShare(b, round, offset, total, 0, v, purpose).Union();
            }));
}

// Polls `done` until it holds or `timeout` passes (for counters no event announces).
bool waitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout = 30s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Nodes 0 and 1 train (complete graph of three, one backup); node 2 is a bare runtime node that
// completed a real handshake and plays a neighbor that misbehaves.
struct FakeNeighborRun {
  static constexpr int64_t kRounds = 40;
  explicit FakeNeighborRun(Cluster& cluster) {
    auto data = syntheticData(300, 50);
    const Graph g = complete(3);
    for (NodeId i = 0; i < 2; ++i) {
      run::RunOptions options = softmaxOptions(kRounds);
      ConsensusOptions co;
      co.backup = chorus::consensus::BackupRuleSpec::read("static:1").value();
      co.stall_timeout = 300ms;   // the fake stops holding the staleness gate quickly
      co.finish_timeout = 500ms;  // it never says TrainingDone
      run::NodeJob job = makeJob(options, data, i, 3);
      model_size = job.model->size();
      cluster.attach(i, std::move(job), layoutOf(g, i), co);
    }
    cluster.connect();
  }
  // Both honest nodes ran every round and ended with finite parameters.
  static void expectFinishedFinite(Cluster& cluster) {
    for (NodeId i = 0; i < 2; ++i) {
      ConsensusReport r = cluster.report(i);
      EXPECT_EQ(r.rounds_done, kRounds) << "node " << i;
      EXPECT_FALSE(r.stopped);
      ASSERT_FALSE(r.final_model.empty());
      for (float v : r.final_model)
        ASSERT_TRUE(std::isfinite(v)) << "node " << i;
    }
  }
  size_t model_size = 0;
};

// The amplification probe of the hardening issue: a neighbor sends a thousand one-float chunks
// of models of many rounds and a thousand one-float Final chunks (each once made the victim
// allocate a whole model). What the victim holds stays within a few models, what the fake half
// sent is freed when it leaves, and the honest nodes finish.
TEST(ConsensusPeer, AFloodOfOneFloatChunksAndFinalsHoldsAFewModelsAndIsFreedWhenTheSenderLeaves) {
  Cluster cluster(3);
  FakeNeighborRun run(cluster);
  const size_t size = run.model_size;
  const uint64_t model_bytes = size * sizeof(float);
  node::Node& fake = cluster.node(2);
  // Sent before the victim starts its rounds, so that none of it is merely too old.
  constexpr int kChunks = 1000;
  for (int i = 0; i < kChunks; ++i) {
    // 25 chunks of each round 0..35 (never a whole model), then rounds beyond the run.
    const Round round = i < 900 ? i / 25 : 1000 + i;
    sendShare(fake, 0, round, static_cast<uint64_t>(i % 25), size, {0.5f});
  }
  for (int i = 0; i < kChunks; ++i) {
    sendShare(fake, 0, i / 25, static_cast<uint64_t>(i % 25), size, {0.5f},
              wire::SharePurpose::Final);
  }
  // And whole models of every round: the board keeps the newest 2 tau + 2 of them.
  for (Round round = 0; round < FakeNeighborRun::kRounds; ++round)
    sendShare(fake, 0, round, 0, size, std::vector<float>(size, 0.5f));
  ASSERT_TRUE(waitUntil(
      [&] { return cluster.peer(0).held().chunks >= 2 * kChunks + FakeNeighborRun::kRounds; }));
  cluster.start();
  const HeldModels held = cluster.peer(0).held();
  // Per neighbor: its 2 tau + 2 newest models on the board and one partial model, one partial
  // and one complete final model: 2 x 6 + 2 + 2 + 2 = 18 models at most. Before the fix: one
  // model per round a chunk named, about 2,000.
  EXPECT_LE(held.peak_bytes, 18 * model_bytes)
      << held.peak_bytes / model_bytes << " models' worth at the peak";
  std::printf("victim held at most %.1f models' worth (%llu bytes) after %d chunks\n",
              static_cast<double>(held.peak_bytes) / static_cast<double>(model_bytes),
              static_cast<unsigned long long>(held.peak_bytes), 2 * kChunks);
  EXPECT_NE(cluster.log(0).find("outside this run's rounds 0..39"), std::string::npos);
  // The fake leaves: what it had half sent is freed (node 1's models remain: at most 6 on the
  // board, a partial one and its final model).
  fake.shutdown(500ms);
  EXPECT_TRUE(waitUntil([&] { return cluster.peer(0).held().bytes <= 8 * model_bytes; }))
      << cluster.peer(0).held().bytes / model_bytes << " models' worth still held";
  FakeNeighborRun::expectFinishedFinite(cluster);
}

// A neighbor's model with NaN in it, and models of rounds no run has (INT64_MAX, -1), are
// refused with a line naming the sender and what was wrong; the honest nodes finish with finite
// parameters (before, mixing the NaN model killed the node).
TEST(ConsensusPeer, ANeighborsNonFiniteModelAndImpossibleRoundsAreRefusedAndNamed) {
  Cluster cluster(3);
  FakeNeighborRun run(cluster);
  const size_t size = run.model_size;
  cluster.start();
  node::Node& fake = cluster.node(2);
  std::vector<float> infinite(size, 0.25f);
  infinite[3] = std::numeric_limits<float>::infinity();
  sendShare(fake, 0, 6, 0, size, infinite);
  sendShare(fake, 0, std::numeric_limits<Round>::max(), 0, size, std::vector<float>(size, 1.0f));
  sendShare(fake, 0, -1, 0, size, std::vector<float>(size, 1.0f));
  std::vector<float> poisoned(size, 0.25f);
  poisoned[7] = std::nanf("");
  for (Round round = 0; round < 5; ++round) {
    sendShare(fake, 0, round, 0, size, poisoned);
    sendShare(fake, 1, round, 0, size, poisoned);
  }
  ASSERT_TRUE(waitUntil([&] { return cluster.peer(0).held().chunks >= 8; }));
  FakeNeighborRun::expectFinishedFinite(cluster);
  const std::string log = cluster.log(0);
  EXPECT_NE(log.find("model chunk [0, " + std::to_string(size) +
                     ") from node 2 holds 1 non-finite value(s) (the first, nan, at parameter 7)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("(the first, inf, at parameter 3)"), std::string::npos) << log;
  EXPECT_NE(log.find("model chunk from node 2 for round 9223372036854775807, outside this run's "
                     "rounds 0..39"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("for round -1, outside"), std::string::npos) << log;
  EXPECT_NE(cluster.log(1).find("from node 2 holds 1 non-finite value(s)"), std::string::npos);
  EXPECT_GE(cluster.peer(0).held().refused, 8u);
}

// Node 1 is a bare runtime node that sends node 0 broken chunks first: they are logged with the
// sender and dropped, and the valid model that follows is mixed in as usual.
TEST(ConsensusPeer, BadModelChunksAreLoggedAndDropped) {
  auto data = syntheticData(100, 20);
  const Graph g = complete(2);
  Cluster cluster(2);
  run::RunOptions options = trainingOptions();
  options.model.name = "softmax";
  options.model.hidden.clear();
  options.lr = 0;
  options.rounds = 1;
  options.eval_every = 0;
  run::NodeJob job = makeJob(options, data, 0, 2);
  const std::vector<float> initial(job.model->params().begin(), job.model->params().end());
  const size_t size = initial.size();
  ConsensusOptions co;
  co.backup = chorus::consensus::BackupRuleSpec::read("wait-all").value();
  co.finish_timeout = 300ms;  // node 1 never says TrainingDone
  cluster.attach(0, std::move(job), layoutOf(g, 0), co);
  cluster.connect();
  cluster.start();

  node::Node& sender = cluster.node(1);
  sendShare(sender, 0, 0, 0, size + 1, std::vector<float>(size + 1, 1.0f));  // wrong size
  sendShare(sender, 0, 0, size - 2, size, std::vector<float>(5, 1.0f));      // past the end
  std::vector<float> theirs(size);
  for (size_t i = 0; i < size; ++i)
    theirs[i] = static_cast<float>(i % 7) * 0.25f;
  // The valid model in two chunks.
  sendShare(sender, 0, 0, 0, size, std::vector<float>(theirs.begin(), theirs.begin() + 100));
  sendShare(sender, 0, 0, 100, size, std::vector<float>(theirs.begin() + 100, theirs.end()));

  ConsensusReport r = cluster.report(0);
  EXPECT_EQ(r.rounds_done, 1);
  ASSERT_EQ(r.final_model.size(), size);
  for (size_t i = 0; i < size; ++i) {
    ASSERT_NEAR(r.final_model[i], (initial[i] + theirs[i]) / 2, 1e-6) << "parameter " << i;
  }
  const std::string log = cluster.log(0);
  EXPECT_NE(log.find("ModelShare from node 1 is for a model of " + std::to_string(size + 1)),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("model chunk from node 1:"), std::string::npos) << log;
}

TEST(ConsensusOptions, BadValuesAreRejectedWithTheParsersMessages) {
  // The backup rule is read where --backup enters: a bad one never reaches the options.
  const node::Result<BackupRuleSpec> sometimes = BackupRuleSpec::read("sometimes");
  ASSERT_FALSE(sometimes.ok());
  EXPECT_NE(sometimes.message().find("unknown rule 'sometimes'"), std::string::npos)
      << sometimes.message();
  ConsensusOptions o;
  o.backup = chorus::consensus::BackupRuleSpec::read("static:1").value();
  o.mixing = "random";
  EXPECT_THROW(validateConsensusOptions(o), std::invalid_argument);
  o.mixing = "metropolis";
  EXPECT_NO_THROW(validateConsensusOptions(o));
}

}  // namespace
}  // namespace chorus::consensus
