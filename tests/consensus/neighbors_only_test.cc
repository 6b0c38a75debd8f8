// Consensus mode with connections to the topology neighbors only (issue 23, item 5): the end of
// the run travels over the neighbor graph, and node 0 averages the final models that a
// convergecast on the BFS spanning tree brings it. Nodes as threads in this process (one as a
// child process killed for real), loopback, port 0, fixed seeds.
#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/sinks/base_sink.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "consensus/consensus_peer.h"
#include "consensus/spanning_tree.h"
#include "ml/dataset.h"
#include "node/node.h"
#include "run/training_run.h"
#include "tests/consensus/neighbor_cluster.h"

namespace chorus::consensus {
namespace {

using namespace std::chrono_literals;
using namespace testing_neighbors;
// ---- the tree alone ----

TEST(SpanningTree, ARingOfSixHangsFromNodeZeroByLowestIdParents) {
  const Graph g = ring(6);
  // Depths 0: 0; 1: 1, 5; 2: 2, 4; 3: 3, whose neighbors 2 and 4 are both one hop closer.
  EXPECT_EQ(spanningTreeLinks(g, 0, 0).parent, std::nullopt);
  EXPECT_EQ(spanningTreeLinks(g, 0, 0).children, (std::vector<NodeId>{1, 5}));
  EXPECT_EQ(spanningTreeLinks(g, 0, 1).parent, 0u);
  EXPECT_EQ(spanningTreeLinks(g, 0, 1).children, (std::vector<NodeId>{2}));
  EXPECT_EQ(spanningTreeLinks(g, 0, 2).children, (std::vector<NodeId>{3}));
  EXPECT_EQ(spanningTreeLinks(g, 0, 3).parent, 2u);
  EXPECT_EQ(spanningTreeLinks(g, 0, 3).depth, 3);
  EXPECT_TRUE(spanningTreeLinks(g, 0, 3).children.empty());
  EXPECT_EQ(spanningTreeLinks(g, 0, 4).parent, 5u);
  EXPECT_TRUE(spanningTreeLinks(g, 0, 4).children.empty());
}

TEST(SpanningTree, EveryReachableNodeHasOneNeighborParentThatNamesItAsChild) {
  // A ring of 64 with chords: the tree is over neighbor edges, parents and children agree, and
  // following parents always reaches the root.
  Graph g = ring(64);
  for (NodeId i = 0; i < 64; i += 8) {
    g[i].push_back((i + 32) % 64);
    g[(i + 32) % 64].push_back(i);
  }
  for (auto& [id, n] : g) {
    std::sort(n.begin(), n.end());
    n.erase(std::unique(n.begin(), n.end()), n.end());
  }
  g[64] = {};  // an isolated member: not in the tree
  size_t children = 0;
  for (const auto& [id, n] : g) {
    const TreeLinks links = spanningTreeLinks(g, 0, id);
    if (id == 64) {
      EXPECT_EQ(links.depth, -1);
      EXPECT_FALSE(links.parent.has_value());
      continue;
    }
    children += links.children.size();
    for (NodeId c : links.children) {
      EXPECT_TRUE(std::binary_search(n.begin(), n.end(), c));
      EXPECT_EQ(spanningTreeLinks(g, 0, c).parent, id);
    }
    if (id == 0) continue;
    ASSERT_TRUE(links.parent.has_value()) << id;
    EXPECT_TRUE(std::binary_search(n.begin(), n.end(), *links.parent));
    EXPECT_EQ(spanningTreeLinks(g, 0, *links.parent).depth, links.depth - 1);
  }
  EXPECT_EQ(children, 63u);  // a tree on the 64 reachable nodes
}

// ---- end to end ----

TEST(NeighborsOnly, ARingOfSevenTrainsAndNodeZeroAveragesEveryFinalModel) {
  constexpr NodeId kNodes = 7;
  const Graph g = ring(kNodes);
  auto data = syntheticData();
  NeighborCluster cluster(g, allOf(kNodes));
  for (NodeId i = 0; i < kNodes; ++i) {
    ConsensusOptions co;
    co.chunk_floats = 100;  // several chunks per model and per partial sum
    cluster.attach(i, run::prepareNodeJob(smallRun(30, 100 + i), data, i, kNodes).value(), co);
  }
  cluster.connect();
  for (NodeId i = 0; i < kNodes; ++i)
    EXPECT_EQ(cluster.node(i).connectedPeers(), g.at(i)) << "node " << i;
  auto futures = cluster.start();
  std::map<NodeId, ConsensusReport> reports;
  for (NodeId i = 0; i < kNodes; ++i)
    reports[i] = getReport(futures[i]);
  for (NodeId i = 0; i < kNodes; ++i) {
    const ConsensusReport& r = reports[i];
    EXPECT_EQ(r.rounds_done, 30) << "node " << i;
    EXPECT_EQ(r.finished_peers.size(), kNodes - 1) << "node " << i;
    EXPECT_TRUE(r.departed_peers.empty()) << "node " << i;
    if (i != 0) {
      EXPECT_FALSE(r.average_accuracy.has_value());
    }
    // Never connected to a non-neighbor, before or after the run.
    for (NodeId j = 0; j < kNodes; ++j) {
      const bool neighbor = std::binary_search(g.at(i).begin(), g.at(i).end(), j);
      if (j != i && !neighbor) {
        EXPECT_EQ(cluster.node(i).stats(j).times_up, 0u) << i << "-" << j;
      }
    }
  }
  // The mean of every final model, to one float ulp (the sums travel as double-float pairs).
  expectAverageOf(reports, allOf(kNodes));
}

// Node 3 of a ring of six runs in a child process and is killed mid-run. Its neighbors 2 and 4
// see it go down; everyone finishes, and node 0 averages the five survivors' models (node 3 is
// a leaf of the tree: 0 - 1 - 2 - 3 and 0 - 5 - 4).
TEST(NeighborsOnly, ANodeKilledInARingLeavesTheOthersFinishingAndTheAverageCountsTheSurvivors) {
  constexpr NodeId kNodes = 6;
  constexpr NodeId kVictim = 3;
  const Graph g = ring(kNodes);
  auto data = syntheticData();
  int to_parent[2];
  int to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  // Fork first, while this process has no other thread; the child learns node 4's port (it
  // dials node 4) from the pipe once the parent's nodes listen.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(to_parent[0]);
    close(to_child[1]);
    uint16_t port4 = 0;
    if (read(to_child[0], &port4, sizeof port4) != sizeof port4) _exit(2);
    node::Node node(nodeOptions(kVictim, kNodes));
    ConsensusPeer peer(node,
                       run::prepareNodeJob(smallRun(1'000'000, 103), data, kVictim, kNodes).value(),
                       layoutOf(g, kVictim), ConsensusOptions{});
    if (!node.listen().ok()) _exit(3);
    const uint16_t port = node.port();
    if (write(to_parent[1], &port, sizeof port) != sizeof port) _exit(4);
    if (!node.connect({{2, "127.0.0.1", 1}, {4, "127.0.0.1", port4}}).ok() ||
        !node.waitClusterReady(60s).ok()) {
      _exit(5);
    }
    peer.run();
    _exit(0);
  }
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
  close(to_child[0]);
  std::vector<NodeId> local;
  for (NodeId i = 0; i < kNodes; ++i) {
    if (i != kVictim) local.push_back(i);
  }
  NeighborCluster cluster(g, local);
  const uint16_t port4 = cluster.port(4);
  ASSERT_EQ(write(to_child[1], &port4, sizeof port4), static_cast<ssize_t>(sizeof port4));
  close(to_child[1]);
  uint16_t child_port = 0;
  ASSERT_EQ(read(to_parent[0], &child_port, sizeof child_port),
            static_cast<ssize_t>(sizeof child_port));
  close(to_parent[0]);

  std::promise<void> round_five;
  bool past_five = false;  // node 2's trainer thread only
  for (NodeId i : local) {
    ConsensusOptions co;
    if (i == 2) {
      co.on_round_end = [&](Round k) {
        if (k >= 5 && !past_five) {
          past_five = true;
          round_five.set_value();
        }
      };
    }
    cluster.attach(i, run::prepareNodeJob(smallRun(40, 100 + i), data, i, kNodes).value(), co);
  }
  cluster.connect({{kVictim, child_port}});
  auto reached = round_five.get_future();
  auto futures = cluster.start();
  ASSERT_EQ(reached.wait_for(60s), std::future_status::ready) << "node 2 did not reach round 5";
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  reaper.pid = 0;
  EXPECT_TRUE(WIFSIGNALED(status));
  for (NodeId i : local) {
    const ConsensusReport r = getReport(futures[i]);
    EXPECT_EQ(r.rounds_done, 40) << "node " << i;
    EXPECT_EQ(r.departed_peers, std::vector<NodeId>{kVictim}) << "node " << i;
    EXPECT_EQ(r.finished_peers.size(), kNodes - 2) << "node " << i;
    if (i == 0) {
      ASSERT_TRUE(r.average_accuracy.has_value());
      EXPECT_EQ(r.averaged_models, kNodes - 1);
    }
  }
}

// Sends one PartialSum chunk (the whole model) from `node` to `to`; `models` absent when null.
void sendPartialSum(node::Node& node, NodeId to, size_t size, const std::vector<NodeId>* models) {
  node.send(to, encodeMessage(node, wire::Body::ModelShare, [&](flatbuffers::FlatBufferBuilder& b) {
              auto values = b.CreateVector(std::vector<float>(size, 0.5f));
              auto ids = models != nullptr ? b.CreateVector(*models) : 0;
              return wire::CreateModelShare(b, 3, 0, size, 0, values,
                                            wire::SharePurpose::PartialSum, ids)
                  .Union();
            }));
}

// Partial sums are untrusted input: one from a node that did not name the receiver its parent
// (TrainingDone.parent), or whose models are absent, repeated, leave out the sender or name the
// receiver, is dropped with a warning naming the sender; a well-formed one is taken. Nodes 1 and 3
// of a ring of four are bare runtime nodes playing neighbors (node 3 is node 0's child, node 1 is
// node 2's parent).
TEST(NeighborsOnly, BadPartialSumsAreRefusedAndNamed) {
  const Graph g = ring(4);
  auto data = syntheticData();
  NeighborCluster cluster(g, allOf(4));
  size_t size = 0;
  for (NodeId i : {0u, 2u}) {
    run::NodeJob job = run::prepareNodeJob(smallRun(10, 100 + i), data, i, 4).value();
    size = job.model->size();
    cluster.attach(i, std::move(job), ConsensusOptions{});
  }
  cluster.connect();
  const std::vector<NodeId> without_sender{1};
  const std::vector<NodeId> names_receiver{0, 3};
  const std::vector<NodeId> repeated{3, 3};
  const std::vector<NodeId> good{2, 3};
  node::Node& three = cluster.node(3);
  three.send(0,
             encodeMessage(three, wire::Body::TrainingDone, [&](flatbuffers::FlatBufferBuilder& b) {
               return wire::CreateTrainingDone(b, 10, 0, /*parent=*/0).Union();
             }));
  sendPartialSum(three, 0, size, nullptr);
  sendPartialSum(three, 0, size, &without_sender);
  sendPartialSum(three, 0, size, &names_receiver);
  sendPartialSum(three, 0, size, &repeated);
  sendPartialSum(three, 0, size, &good);
  sendPartialSum(cluster.node(1), 2, size, &without_sender);
  auto handled = [&](NodeId id, uint64_t chunks) {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (cluster.peer(id).held().chunks < chunks) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(1ms);  // polling a counter no event announces
    }
    return true;
  };
  ASSERT_TRUE(handled(0, 5));
  ASSERT_TRUE(handled(2, 1));
  EXPECT_EQ(cluster.peer(0).held().refused, 4u);
  EXPECT_EQ(cluster.peer(2).held().refused, 1u);
  const std::string log0 = cluster.log(0);
  EXPECT_NE(log0.find("partial sum chunk from node 3 names no models"), std::string::npos) << log0;
  EXPECT_NE(log0.find("names models [1]"), std::string::npos) << log0;
  EXPECT_NE(log0.find("names models [0, 3]"), std::string::npos) << log0;
  EXPECT_NE(log0.find("names models [3, 3]"), std::string::npos) << log0;
  EXPECT_NE(cluster.log(2).find("partial sum chunk from node 1, which did not name this node as "
                                "its parent"),
            std::string::npos)
      << cluster.log(2);
}

}  // namespace
}  // namespace chorus::consensus
