// One replica sync round (NuPS replication, ps/replica_shell.h) of K hot keys of D floats among
// 2 to 4 nodes on loopback, next to a plain memcpy of the same bytes in the same iteration (the
// floor any all-reduce of them stands on). Every node first pushes to every hot key (untimed:
// each node then contributes every row, the point of hot keys), then node 0 starts a round and
// the time runs until every node finished it. Rounds start only when asked (no timer).
// Counters (bench/README.md "## replica"):
//   round_ms             one round, start to the last node's finish
//   bytes_per_round      replica frames' bytes on the wire, all nodes together
//   payload_per_round    the core's payload bytes of those (keys, floats, headers)
//   messages_per_round   replica frames sent, all nodes together: 2 N (N - 1)
//   memcpy_ms            memcpy of bytes_per_round bytes, timed in the same iteration
//   ratio                memcpy_ms / round_ms: the share of a copy's speed the round reaches
// Not tuned on this shared machine: it shows the round works at these sizes and what it costs.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "node/node.h"
#include "ps/replica_shell.h"

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class ReplicaCluster {
 public:
  ReplicaCluster(size_t nodes, size_t keys, size_t floats) {
    KeySpace space;
    space.addTable("hot", 0, keys, floats);
    std::vector<NodeId> members;
    for (size_t i = 0; i < nodes; ++i)
      members.push_back(static_cast<NodeId>(i));
    OwnerOptimizer optimizer;
    optimizer.sgd.momentum = 0.0;
    optimizer.schedule.baseLr = 0.01;
    auto policy = std::make_shared<SgdPolicy>(optimizer);
    layout_ = std::make_shared<const ReplicaLayout>(space, space.allKeys(), ShardMap(members),
                                                    policy.get());
    const std::vector<float> initial(layout_->totalLength(), 0.5f);
    for (NodeId id : members) {
      node::NodeOptions o;
      o.cluster = "bench-replica";
      o.self = id;
      o.members = members;
      nodes_.push_back(std::make_unique<node::Node>(o));
      if (!nodes_.back()->listen().ok()) std::abort();
    }
    for (size_t i = 0; i < nodes; ++i) {
      std::vector<node::PeerAddress> peers;
      for (size_t j = 0; j < nodes; ++j) {
        if (j != i) peers.push_back({static_cast<NodeId>(j), "127.0.0.1", nodes_[j]->port()});
      }
      if (!nodes_[i]->connect(peers).ok()) std::abort();
    }
    for (auto& n : nodes_) {
      if (!n->waitClusterReady(30s).ok()) std::abort();
    }
    ReplicaShellOptions options;
    options.syncs_per_second = 0;  // rounds only when the benchmark starts one
    for (size_t i = 0; i < nodes; ++i) {
      shells_.push_back(
          std::make_unique<ReplicaShell>(*nodes_[i], layout_, initial, policy, options));
      ReplicaShell* shell = shells_.back().get();
      nodes_[i]->setEventHandler([shell](const node::PeerEvent& e) { shell->onPeerEvent(e); });
    }
    grads_.assign(layout_->totalLength(), 0.25f);
  }

  ~ReplicaCluster() {
    // The ends of the nodes are no deaths to log.
    for (auto& n : nodes_)
      n->setEventHandler({});
    for (auto& n : nodes_)
      n->shutdown(0ms);
    shells_.clear();
  }

  // Every node pushes to every hot key.
  void pushEverywhere() {
    for (auto& shell : shells_)
      shell->push(layout_->keys(), grads_);
  }

  // One round, started by node 0; returns once every node finished it.
  void round() {
    const uint64_t next = shells_[0]->counters().round + 1;
    shells_[0]->syncNow();
    for (auto& shell : shells_) {
      if (!shell->waitRound(next, 60s)) std::abort();
    }
  }

  // Sums of every node's counters.
  ReplicaShellCounters totals() const {
    ReplicaShellCounters sum;
    for (const auto& shell : shells_) {
      const ReplicaShellCounters c = shell->counters();
      sum.messages_sent += c.messages_sent;
      sum.payload_bytes_sent += c.payload_bytes_sent;
      sum.wire_bytes_sent += c.wire_bytes_sent;
    }
    return sum;
  }

 private:
  std::shared_ptr<const ReplicaLayout> layout_;
  std::vector<std::unique_ptr<node::Node>> nodes_;
  std::vector<std::unique_ptr<ReplicaShell>> shells_;
  std::vector<float> grads_;
};

void BM_ReplicaRound(benchmark::State& state) {
  const auto nodes = static_cast<size_t>(state.range(0));
  const auto keys = static_cast<size_t>(state.range(1));
  const auto floats = static_cast<size_t>(state.range(2));
  ReplicaCluster cluster(nodes, keys, floats);
  // One unmeasured round: connections warm, buffers sized.
  cluster.pushEverywhere();
  cluster.round();

  double round_seconds = 0, memcpy_seconds = 0, wire = 0, payload = 0, messages = 0;
  std::vector<uint8_t> from, to;
  for (auto _ : state) {
    cluster.pushEverywhere();
    const ReplicaShellCounters before = cluster.totals();
    const auto start = Clock::now();
    cluster.round();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const ReplicaShellCounters after = cluster.totals();
    const auto bytes = static_cast<size_t>(after.wire_bytes_sent - before.wire_bytes_sent);
    // The baseline: the same bytes copied once, in memory.
    from.assign(bytes, 1);
    to.assign(bytes, 0);
    const auto copy_start = Clock::now();
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::DoNotOptimize(to.data());
    benchmark::ClobberMemory();
    memcpy_seconds += std::chrono::duration<double>(Clock::now() - copy_start).count();
    state.SetIterationTime(seconds);
    round_seconds += seconds;
    wire += static_cast<double>(bytes);
    payload += static_cast<double>(after.payload_bytes_sent - before.payload_bytes_sent);
    messages += static_cast<double>(after.messages_sent - before.messages_sent);
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["round_ms"] = round_seconds / n * 1e3;
  state.counters["bytes_per_round"] = wire / n;
  state.counters["payload_per_round"] = payload / n;
  state.counters["messages_per_round"] = messages / n;
  state.counters["memcpy_ms"] = memcpy_seconds / n * 1e3;
  state.counters["ratio"] = memcpy_seconds / round_seconds;
  state.SetLabel(std::to_string(nodes) + " nodes, " + std::to_string(keys) + " keys x " +
                 std::to_string(floats) + " floats");
}

BENCHMARK(BM_ReplicaRound)
    ->ArgsProduct({{2, 3, 4}, {1000}, {1, 64}})
    ->ArgNames({"nodes", "keys", "floats"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace chorus::ps

BENCHMARK_MAIN();
