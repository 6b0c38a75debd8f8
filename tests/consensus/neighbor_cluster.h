// A consensus cluster whose nodes connect to their topology neighbors only, as threads in one
// test process (loopback, port 0): the harness of the neighbor-graph tests (neighbors_only_test,
// tree_repair_test).
#pragma once

#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "consensus/consensus_peer.h"
#include "ml/dataset.h"
#include "node/node.h"
#include "run/training_run.h"

namespace chorus::consensus::testing_neighbors {

using namespace std::chrono_literals;
using Graph = std::map<NodeId, std::vector<NodeId>>;

inline Graph ring(NodeId n) {
  Graph g;
  for (NodeId i = 0; i < n; ++i) {
    g[i] = {(i + n - 1) % n, (i + 1) % n};
    std::sort(g[i].begin(), g[i].end());
  }
  return g;
}

// Keeps every log line, for asserting what a node said.
class LineSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::string all() {
    std::lock_guard lock(mutex_);
    return text_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    text_.append(message.payload.data(), message.payload.size());
    text_ += '\n';
  }
  void flush_() override {}

 private:
  std::string text_;
};

inline node::NodeOptions nodeOptions(NodeId self, size_t n) {
  node::NodeOptions o;
  o.cluster = "neighbors-test";
  o.self = self;
  for (size_t i = 0; i < n; ++i)
    o.members.push_back(static_cast<NodeId>(i));
  o.heartbeat_interval = 100ms;
  o.dial_backoff_max = 100ms;
  o.peer_timeout = 3000ms;
  o.log_level = spdlog::level::warn;
  return o;
}

inline PeerLayout layoutOf(const Graph& g, NodeId self) {
  PeerLayout l;
  l.self = self;
  l.neighbors = g.at(self);
  l.graph = g;
  for (const auto& [id, n] : g) {
    l.members.push_back(id);
    l.degrees[id] = n.size();
  }
  return l;
}

inline run::RunOptions smallRun(int64_t rounds, uint64_t seed) {
  run::RunOptions options;
  options.data.name = "synthetic";
  options.model.name = "softmax";
  options.lr = 0.05;
  options.batch = 16;
  options.rounds = rounds;
  options.eval_every = 0;
  options.seed = seed;
  return options;
}

inline std::shared_ptr<const ml::DataSplit> syntheticData() {
  return std::make_shared<const ml::DataSplit>(ml::makeSynthetic(600, 100, 7));
}

inline ConsensusReport getReport(std::future<ConsensusReport>& f) {
  if (f.wait_for(120s) != std::future_status::ready) {
    ADD_FAILURE() << "a node did not finish within 120 s";
    return {};
  }
  return f.get();
}

// Nodes `local` of a graph's cluster in this process, each connected to its neighbors only
// (the ones with a higher id are dialed; `remote` names where nodes elsewhere listen).
class NeighborCluster {
 public:
  // `tune` may change each node's runtime options (link faults, queue limits) before it starts.
  NeighborCluster(Graph graph, std::vector<NodeId> local,
                  const std::function<void(node::NodeOptions&)>& tune = {})
      : graph_(std::move(graph)), local_(std::move(local)) {
    for (NodeId id : local_) {
      node::NodeOptions options = nodeOptions(id, graph_.size());
      if (tune) tune(options);
      sinks_[id] = std::make_shared<LineSink>();
      options.log_sinks = {sinks_[id]};
      nodes_[id] = std::make_unique<node::Node>(options);
      EXPECT_TRUE(nodes_[id]->listen().ok());
    }
  }
  ~NeighborCluster() {
    for (auto& [id, peer] : peers_)
      peer->stop();
    for (auto& t : threads_)
      t.join();
    for (auto& [id, n] : nodes_)
      n->shutdown(0ms);
  }
  node::Node& node(NodeId id) { return *nodes_.at(id); }
  ConsensusPeer& peer(NodeId id) { return *peers_.at(id); }
  std::string log(NodeId id) { return sinks_.at(id)->all(); }

  void attach(NodeId id, run::NodeJob job, ConsensusOptions options) {
    peers_[id] = std::make_unique<ConsensusPeer>(*nodes_.at(id), std::move(job),
                                                 layoutOf(graph_, id), std::move(options));
  }
  void connect(const std::map<NodeId, uint16_t>& remote = {}) {
    for (NodeId id : local_) {
      std::vector<node::PeerAddress> peers;
      for (NodeId n : graph_.at(id)) {
        // A node elsewhere that dials this one needs no real address.
        auto far = remote.find(n);
        uint16_t at = 1;
        if (far != remote.end()) {
          at = far->second;
        } else if (nodes_.count(n) > 0) {
          at = port(n);
        }
        peers.push_back({n, "127.0.0.1", at});
      }
      ASSERT_TRUE(nodes_[id]->connect(peers).ok());
    }
    for (NodeId id : local_) {
      node::Status ready = nodes_[id]->waitClusterReady(60s);
      ASSERT_TRUE(ready.ok()) << ready.message();
    }
  }
  uint16_t port(NodeId id) { return nodes_.at(id)->port(); }
  // Any thread, also node `id`'s own trainer thread: kills it for real mid-run (its peer stops,
  // its node closes every connection at once, as a crashed process's would).
  void kill(NodeId id) {
    peers_.at(id)->stop();
    nodes_.at(id)->shutdown(0ms);
  }
  // Starts every peer's run(); with `leave_when_done`, a node leaves the cluster as soon as its
  // run returns, as `chorus node` does (its neighbors see it leave).
  std::map<NodeId, std::future<ConsensusReport>> start(bool leave_when_done = false) {
    std::map<NodeId, std::future<ConsensusReport>> out;
    for (auto& [id, peer] : peers_) {
      auto task = std::make_shared<std::packaged_task<ConsensusReport()>>(
          [p = peer.get(), n = nodes_.at(id).get(), leave_when_done] {
            ConsensusReport report = p->run();
            if (leave_when_done) n->shutdown(1000ms);
            return report;
          });
      out[id] = task->get_future();
      threads_.emplace_back([task] { (*task)(); });
    }
    return out;
  }
  // start(), then every node's report (a failure for one not done within 120 s).
  std::map<NodeId, ConsensusReport> runAll(bool leave_when_done = false) {
    auto futures = start(leave_when_done);
    std::map<NodeId, ConsensusReport> reports;
    for (auto& [id, f] : futures)
      reports[id] = getReport(f);
    return reports;
  }

 private:
  Graph graph_;
  std::vector<NodeId> local_;
  std::map<NodeId, std::shared_ptr<LineSink>> sinks_;
  std::map<NodeId, std::unique_ptr<node::Node>> nodes_;
  std::map<NodeId, std::unique_ptr<ConsensusPeer>> peers_;
  std::vector<std::thread> threads_;
};

inline std::vector<NodeId> allOf(NodeId n) {
  std::vector<NodeId> ids(n);
  for (NodeId i = 0; i < n; ++i)
    ids[i] = i;
  return ids;
}

// The mean of the final models of `ids` in double, then rounded to float.
inline std::vector<float> meanOf(std::map<NodeId, ConsensusReport>& reports,
                                 const std::vector<NodeId>& ids) {
  const size_t size = reports.at(ids.front()).final_model.size();
  std::vector<double> sum(size, 0.0);
  for (NodeId id : ids) {
    EXPECT_EQ(reports.at(id).final_model.size(), size) << "node " << id;
    for (size_t p = 0; p < size && p < reports.at(id).final_model.size(); ++p)
      sum[p] += reports.at(id).final_model[p];
  }
  std::vector<float> mean(size);
  for (size_t p = 0; p < size; ++p)
    mean[p] = static_cast<float>(sum[p] / static_cast<double>(ids.size()));
  return mean;
}

// Node 0's average equals the double mean of exactly `ids`' final models, each once, to one float
// ulp (the tree adds in another order; the wire keeps ~48 bits).
inline void expectAverageOf(std::map<NodeId, ConsensusReport>& reports,
                            const std::vector<NodeId>& ids) {
  const ConsensusReport& root = reports.at(0);
  ASSERT_TRUE(root.average_accuracy.has_value());
  EXPECT_EQ(root.averaged_models, ids.size());
  const std::vector<float> mean = meanOf(reports, ids);
  ASSERT_EQ(root.average_model.size(), mean.size());
  size_t off = 0;
  for (size_t p = 0; p < mean.size(); ++p) {
    const float low = std::nextafter(mean[p], -INFINITY), high = std::nextafter(mean[p], INFINITY);
    if (root.average_model[p] < low || root.average_model[p] > high) off += 1;
  }
  EXPECT_EQ(off, 0u) << "parameters further than one ulp from the mean of the models";
}

}  // namespace chorus::consensus::testing_neighbors
