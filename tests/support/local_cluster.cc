#include "tests/support/local_cluster.h"

#include <spdlog/sinks/null_sink.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "ml/metrics.h"

namespace chorus::testsupport {

using namespace std::chrono_literals;

Graph ring(size_t n) {
  Graph g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = {static_cast<NodeId>((i + n - 1) % n), static_cast<NodeId>((i + 1) % n)};
    std::sort(g[i].begin(), g[i].end());
    g[i].erase(std::unique(g[i].begin(), g[i].end()), g[i].end());
  }
  return g;
}

Graph complete(size_t n) {
  Graph g(n);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i != j) g[i].push_back(static_cast<NodeId>(j));
    }
  }
  return g;
}

Graph star(size_t n) {
  Graph g(n);
  for (size_t i = 1; i < n; ++i) {
    g[0].push_back(static_cast<NodeId>(i));
    g[i].push_back(0);
  }
  return g;
}

consensus::PeerLayout layoutOf(const Graph& g, NodeId self) {
  consensus::PeerLayout l;
  l.self = self;
  l.neighbors = g[self];
  for (size_t i = 0; i < g.size(); ++i) {
    l.members.push_back(static_cast<NodeId>(i));
    l.degrees[static_cast<NodeId>(i)] = g[i].size();
  }
  return l;
}

std::vector<NodeId> membersOf(size_t n) {
  std::vector<NodeId> members;
  for (size_t i = 0; i < n; ++i)
    members.push_back(static_cast<NodeId>(i));
  return members;
}

run::RunOptions syntheticTraining() {
  run::RunOptions options;
  options.data.name = "synthetic";
  options.model.name = "mlp";
  options.model.hidden = {64};
  options.batch = 32;
  options.eval_every = 100;
  options.target_acc = 0.95;
  options.seed = 3;
  return options;
}

std::shared_ptr<const ml::DataSplit> syntheticData(size_t train, size_t test, uint64_t seed) {
  return std::make_shared<const ml::DataSplit>(ml::makeSynthetic(train, test, seed));
}

node::NodeOptions nodeOptions(const NodeSettings& settings, NodeId self, size_t members,
                              uint16_t port) {
  node::NodeOptions o;
  o.cluster = settings.cluster;
  o.self = self;
  o.members = membersOf(members);
  o.listen_port = port;
  o.heartbeat_interval = settings.heartbeat_interval;
  o.dial_backoff_max = settings.dial_backoff_max;
  o.peer_timeout = settings.peer_timeout;
  o.log_level = settings.log_level;
  return o;
}

AlonePeer::AlonePeer(node::Node& node, run::NodeJob job, run::SingleOptions options)
    : node_(node), job_(std::move(job)), options_(std::move(options)) {
  options_.stop = stop_;
}

run::SingleReport AlonePeer::run() {
  std::FILE* sink = std::fopen("/dev/null", "w");
  ml::ProgressReporter progress(sink, false);
  run::SingleReport report;
  try {
    report = run::trainAlone(job_, options_, progress, node_.logger());
  } catch (...) {
    std::fclose(sink);
    throw;
  }
  std::fclose(sink);
  return report;
}

std::map<std::string, size_t> countEvents(const std::string& metrics_path) {
  std::map<std::string, size_t> counts;
  std::ifstream in(metrics_path);
  const std::string key = "\"event\":\"";
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(key);
    if (at == std::string::npos) continue;
    const size_t begin = at + key.size();
    const size_t end = line.find('"', begin);
    if (end != std::string::npos) ++counts[line.substr(begin, end - begin)];
  }
  return counts;
}

LocalCluster::LocalCluster(size_t n, size_t members, NodeSettings settings) : slots_(n) {
  for (size_t i = 0; i < n; ++i) {
    node::NodeOptions options =
        nodeOptions(settings, static_cast<NodeId>(i), members == 0 ? n : members);
    slots_[i].log = std::make_shared<node::testing::LogCapture>();
    options.log_sinks = {slots_[i].log};
    slots_[i].node = std::make_unique<node::Node>(options);
    const node::Status listening = slots_[i].node->listen();
    EXPECT_TRUE(listening.ok()) << "node " << i << ": " << listening.message();
  }
}

LocalCluster::~LocalCluster() {
  stopAll();
  for (Slot& slot : slots_) {
    if (slot.trainer.joinable()) slot.trainer.join();
  }
  for (Slot& slot : slots_)
    slot.node->shutdown(0ms);
  for (Slot& slot : slots_)
    slot.peer.reset();
}

void LocalCluster::connect(const std::vector<std::pair<NodeId, uint16_t>>& extra) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    std::vector<node::PeerAddress> peers;
    for (size_t j = 0; j < slots_.size(); ++j) {
      if (j != i) peers.push_back({static_cast<NodeId>(j), "127.0.0.1", slots_[j].node->port()});
    }
    for (const auto& [id, port] : extra)
      peers.push_back({id, "127.0.0.1", port});
    const node::Status connecting = slots_[i].node->connect(peers);
    ASSERT_TRUE(connecting.ok()) << "node " << i << ": " << connecting.message();
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    const node::Status ready = slots_[i].node->waitClusterReady(30s);
    ASSERT_TRUE(ready.ok()) << "node " << i << ": " << ready.message();
  }
}

void LocalCluster::connectOutside(node::Node& outside) {
  std::vector<node::PeerAddress> peers;
  for (size_t j = 0; j < slots_.size(); ++j)
    peers.push_back({static_cast<NodeId>(j), "127.0.0.1", slots_[j].node->port()});
  const node::Status connecting = outside.connect(peers);
  ASSERT_TRUE(connecting.ok()) << connecting.message();
}

void LocalCluster::start() {
  for (Slot& slot : slots_) {
    if (!slot.run) continue;
    auto task = std::make_shared<std::packaged_task<std::any()>>(slot.run);
    slot.result = task->get_future().share();
    slot.trainer = std::thread([task] { (*task)(); });
  }
}

void LocalCluster::stop(size_t i) {
  if (slots_[i].stop) slots_[i].stop();
}

void LocalCluster::stopAll() {
  for (size_t i = 0; i < slots_.size(); ++i)
    stop(i);
}

void LocalCluster::kill(size_t i) {
  stop(i);
  slots_[i].node->shutdown(0ms);
}

bool LocalCluster::awaitResult(size_t i, std::chrono::seconds timeout) {
  Slot& slot = slots_[i];
  if (!slot.result.valid()) {
    ADD_FAILURE() << "node " << i << " has no running peer";
    return false;
  }
  if (slot.result.wait_for(timeout) == std::future_status::ready) return true;
  ADD_FAILURE() << "node " << i << " did not finish within " << timeout.count()
                << " s; stopping every node";
  stopAll();
  if (slot.result.wait_for(60s) == std::future_status::ready) return true;
  ADD_FAILURE() << "node " << i << " did not end within 60 s of stop()";
  return false;
}

run::LoopReport LocalCluster::loopResult(size_t i, std::chrono::seconds timeout) {
  if (!awaitResult(i, timeout)) return {};
  return slots_[i].loop_report(slots_[i].result.get());
}

}  // namespace chorus::testsupport
