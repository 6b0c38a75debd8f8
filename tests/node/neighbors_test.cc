// A node connects to a given subset of the members (its topology neighbors) instead of all of
// them, and waitClusterReady() counts only those: a ring of N nodes holds N connections, not
// N(N-1)/2 (issue 23, item 5). The last test measures both at 64 nodes on loopback.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "node/node.h"
#include "tests/node/test_util.h"

namespace chorus::node {
namespace {

using namespace testing;
using namespace std::chrono_literals;

std::vector<NodeId> ids(NodeId n) {
  std::vector<NodeId> out;
  for (NodeId i = 0; i < n; ++i)
    out.push_back(i);
  return out;
}

std::vector<NodeId> ringNeighbors(NodeId i, NodeId n) {
  std::set<NodeId> both{(i + 1) % n, (i + n - 1) % n};
  both.erase(i);
  return {both.begin(), both.end()};
}

// Sockets this process holds open (listeners and connections of every node in it).
size_t openSockets() {
  size_t n = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  while (dirent* entry = readdir(dir)) {
    char target[64] = {};
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    const ssize_t len = readlink(path.c_str(), target, sizeof(target) - 1);
    if (len > 0 && std::string(target, static_cast<size_t>(len)).starts_with("socket:")) ++n;
  }
  closedir(dir);
  return n;
}

struct Cluster {
  std::vector<std::unique_ptr<Node>> nodes;
  std::chrono::milliseconds ready{0};
};

// Starts n nodes on port 0; node i connects to peers(i) and waits until they are connected.
void startCluster(Cluster& cluster, NodeId n,
                  const std::function<std::vector<NodeId>(NodeId)>& peers) {
  for (NodeId i = 0; i < n; ++i) {
    NodeOptions o = fastOptions("ring", i, ids(n));
    o.peer_timeout = 30s;
    o.heartbeat_interval = 500ms;
    o.handshake_timeout = 30s;
    o.connect_timeout = 30s;
    o.cluster_ready_timeout = 120s;
    o.log_level = spdlog::level::err;  // shutdown(0ms) makes every peer "down"
    cluster.nodes.push_back(std::make_unique<Node>(o));
    ASSERT_TRUE(cluster.nodes.back()->listen().ok());
  }
  const auto start = std::chrono::steady_clock::now();
  for (NodeId i = 0; i < n; ++i) {
    std::vector<PeerAddress> addresses;
    for (NodeId j : peers(i))
      addresses.push_back({j, "127.0.0.1", cluster.nodes[j]->port()});
    ASSERT_TRUE(cluster.nodes[i]->connect(addresses).ok());
  }
  for (auto& node : cluster.nodes) {
    const Status ready = node->waitClusterReady();
    ASSERT_TRUE(ready.ok()) << ready.message();
  }
  cluster.ready = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
}

void stopCluster(Cluster& cluster) {
  for (auto& node : cluster.nodes)
    node->shutdown(0ms);
  for (auto& node : cluster.nodes)
    EXPECT_EQ(node->loopCloseResult(), 0);
}

TEST(Neighbors, ARingConnectsEachNodeToItsTwoNeighborsOnlyAndGossipArrives) {
  constexpr NodeId kNodes = 8;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<NodeId, std::set<NodeId>> heard;  // receiver -> senders
  Cluster cluster;
  startCluster(cluster, kNodes, [](NodeId i) { return ringNeighbors(i, kNodes); });
  if (HasFatalFailure()) return;
  for (NodeId i = 0; i < kNodes; ++i) {
    cluster.nodes[i]->setHandler(ping::messageType(ping::wire::Body::Tensor),
                                 [&, i](NodeId from, const InboundFrame&) {
                                   std::lock_guard lock(mutex);
                                   heard[i].insert(from);
                                   changed.notify_all();
                                 });
  }
  for (NodeId i = 0; i < kNodes; ++i) {
    EXPECT_EQ(cluster.nodes[i]->connectedPeers(), ringNeighbors(i, kNodes)) << "node " << i;
    for (NodeId j = 0; j < kNodes; ++j) {
      if (j == i) continue;
      const bool neighbor = j == (i + 1) % kNodes || i == (j + 1) % kNodes;
      EXPECT_EQ(cluster.nodes[i]->stats(j).connected, neighbor) << i << " -> " << j;
    }
  }
  // Each node gossips to its neighbors; a send to a non-neighbor fails as not connected.
  std::vector<float> values(16, 1.0f);
  for (NodeId i = 0; i < kNodes; ++i) {
    auto frame = ping::encodeMessage(*cluster.nodes[i], ping::wire::Body::Tensor,
                                     [&](flatbuffers::FlatBufferBuilder& b) {
                                       return ping::wire::CreateTensorDirect(b, 0, &values).Union();
                                     });
    cluster.nodes[i]->broadcast(ringNeighbors(i, kNodes), frame);
  }
  std::promise<Status> far;
  cluster.nodes[0]->send(
      4,
      ping::encodeMessage(*cluster.nodes[0], ping::wire::Body::Tensor,
                          [&](flatbuffers::FlatBufferBuilder& b) {
                            return ping::wire::CreateTensorDirect(b, 0, &values).Union();
                          }),
      [&far](NodeId, const Status& s) { far.set_value(s); });
  EXPECT_EQ(far.get_future().get().code(), ErrorCode::kNotConnected);
  {
    std::unique_lock lock(mutex);
    EXPECT_TRUE(changed.wait_for(lock, kSoon, [&] {
      for (NodeId i = 0; i < kNodes; ++i) {
        const auto expected = ringNeighbors(i, kNodes);
        if (heard[i] != std::set<NodeId>(expected.begin(), expected.end())) return false;
      }
      return true;
    }));
  }
  stopCluster(cluster);
}

TEST(Neighbors, SixtyFourNodesOpenTwoConnectionsEachAsARingInsteadOf63AsAFullMesh) {
  constexpr NodeId kNodes = 64;
  const size_t sockets_before = openSockets();
  struct Measured {
    size_t per_node_min = 0, per_node_max = 0, sockets = 0;
    std::chrono::milliseconds ready{0};
  };
  const auto measure = [&](const std::function<std::vector<NodeId>(NodeId)>& peers) {
    Measured m;
    Cluster cluster;
    startCluster(cluster, kNodes, peers);
    if (::testing::Test::HasFatalFailure()) return m;
    m.per_node_min = SIZE_MAX;
    for (auto& node : cluster.nodes) {
      m.per_node_min = std::min(m.per_node_min, node->connectedPeers().size());
      m.per_node_max = std::max(m.per_node_max, node->connectedPeers().size());
    }
    m.sockets = openSockets() - sockets_before;
    m.ready = cluster.ready;
    stopCluster(cluster);
    return m;
  };
  const Measured mesh = measure([](NodeId i) {
    std::vector<NodeId> all;
    for (NodeId j = 0; j < kNodes; ++j) {
      if (j != i) all.push_back(j);
    }
    return all;
  });
  ASSERT_FALSE(HasFatalFailure());
  const Measured ring = measure([](NodeId i) { return ringNeighbors(i, kNodes); });
  ASSERT_FALSE(HasFatalFailure());
  std::printf(
      "64 nodes on loopback, open connections per node (min..max), sockets of the process "
      "(listeners included), time to ready:\n"
      "  full mesh: %zu..%zu per node, %zu sockets, ready in %lld ms\n"
      "  ring (neighbors only): %zu..%zu per node, %zu sockets, ready in %lld ms\n",
      mesh.per_node_min, mesh.per_node_max, mesh.sockets,
      static_cast<long long>(mesh.ready.count()), ring.per_node_min, ring.per_node_max,
      ring.sockets, static_cast<long long>(ring.ready.count()));
  EXPECT_EQ(mesh.per_node_min, kNodes - 1);
  EXPECT_EQ(mesh.per_node_max, kNodes - 1);
  EXPECT_EQ(ring.per_node_min, 2u);
  EXPECT_EQ(ring.per_node_max, 2u);
  // Two sockets per connection (one in each node of this process) plus the listeners.
  EXPECT_EQ(mesh.sockets, kNodes * (kNodes - 1) + kNodes);
  EXPECT_EQ(ring.sockets, 2 * kNodes + kNodes);
}

}  // namespace
}  // namespace chorus::node
