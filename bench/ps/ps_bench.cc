// PS push/pull throughput between 2 and 4 nodes on loopback (issue 5, "Benchmarks"), next to
// two baselines moving the same payload bytes in as many messages: a raw TCP socket pair
// (bench/ps/raw_stream.h), and a bare epoll request/reply pair doing the PS's work and nothing
// else (bench/ps/event_floor.h). All three are measured in every iteration, one after the
// other, so that the load of the shared machine hits them alike; the ratios are counters. Each
// measured transfer follows an unmeasured one of its own kind, so that none is timed while the
// machine still settles what the previous kind left (a raw transfer timed right after a
// 2-node loop-driven PS round was 20-30% slower than one timed after another raw transfer).
//
// Every node runs a KvServer and a KvWorker, wired as in PS mode. Each worker moves every key it
// does not own (keys it owns never touch the network), one owner's keys per message, keeping
// `window` operations in flight, from its own thread (as PS training does) or from the loop
// thread through completion callbacks (`driver` 1: no thread hand-offs). Staleness inf and no
// cache: every read travels and no owner waits for a clock. Counters (bench/README.md "## ps"):
//   keys_per_s, MB_per_s      payload (values) pushed + pulled per second, all workers together
//   raw_MB_per_s              the socket pair moving the same payload bytes, same message count
//   ratio                     MB_per_s / raw_MB_per_s
//   sliced_MB_per_s, sliced_ratio   the socket pair sending each message in slices of two
//                             packets, as node/ writes (BBR paces larger send() calls; the
//                             same as raw_MB_per_s for messages of one slice or less)
//   wire_per_payload          bytes the nodes wrote to sockets per payload byte (keys, frames,
//                             pull requests and push acks are the overhead)
//   cpu_ns_per_B, raw_cpu_ns_per_B   process CPU time per payload byte (all threads): on two
//                             shared cores, throughput is bounded by this, not by latency
//   cpu_ns_per_key            the same per key pushed or pulled (issue 25's per-key cost)
//   cpu_ratio                 raw_cpu_ns_per_B / cpu_ns_per_B: the ratio the PS would reach if
//                             both got the same CPU, steadier than `ratio` under outside load
//   floor_MB_per_s            the bare epoll pair (2 nodes) moving the same payload bytes
//   floor_ratio, floor_cpu_ratio   the floor against the raw pair: what request/reply traffic
//                             through an event loop leaves of the raw bandwidth on this machine
//   of_floor                  MB_per_s / floor_MB_per_s: the share of the floor ps/ keeps
//   floor_held                share of the floor's pulled bytes it had to copy (replies the
//                             socket could not take at once); the floor copies no other value
//   retrans_per_GB, ofo_per_GB, floor_retrans_per_GB, floor_ofo_per_GB   TCP segments sent
//                             again and received out of order per GB of payload, during the
//                             PS rounds and the floor (machine-wide counters, tcp_counters.h):
//                             on loopback both mean the connection's pattern went wrong
// Under `valgrind --tool=callgrind` (bench/README.md, "Per-key cost"), each timed PS
// round is dumped on its own (CALLGRIND_ZERO_STATS / DUMP_STATS), so that the user-space
// instructions per key of all threads can be read without hardware counters.
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define CHORUS_CALLGRIND 1
#endif

#include "bench/ps/event_floor.h"
#include "bench/ps/raw_stream.h"
#include "bench/ps/tcp_counters.h"
#include "chorus/chorus_generated.h"
#include "node/node.h"
#include "node/uv_handles.h"
#include "ps/kv_server.h"
#include "ps/kv_worker.h"

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;

enum class Traffic { kPushPull = 0, kPush = 1, kPull = 2 };
enum class Driver { kThread = 0, kLoop = 1 };

const char* trafficName(Traffic traffic) {
  switch (traffic) {
    case Traffic::kPushPull:
      return "push+pull";
    case Traffic::kPush:
      return "push";
    case Traffic::kPull:
      return "pull";
  }
  return "?";
}

struct BenchConfig {
  size_t nodes = 2;
  size_t key_floats = 4096;  // one key = one value of this many floats
  Traffic traffic = Traffic::kPushPull;
  size_t message_bytes = 128 * 1024;  // value bytes per message (whole keys, at least one)
  size_t window = 8;                  // operations in flight per worker
  // Who issues the worker's operations: its own thread, waiting on handles (as PS training
  // does), or the node's loop thread, issuing the next one from each completion callback.
  Driver driver = Driver::kThread;
};

constexpr double kLr = 0.01;    // owners' learning rate
constexpr float kGrad = 1e-3f;  // every pushed gradient float

// The model every node shares, in bytes: large enough that a round is tens of milliseconds.
constexpr size_t kModelBytes = 8u << 20;

double processCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// N full-mesh nodes, each with a KvServer, a KvWorker and a worker thread that runs rounds on
// request.
class PsBenchCluster {
 public:
  explicit PsBenchCluster(const BenchConfig& config)
      : config_(config),
        layout_(kModelBytes / sizeof(float), config.key_floats),
        map_(memberIds(config.nodes)) {
    const std::vector<NodeId> members = memberIds(config_.nodes);
    const std::vector<float> initial(layout_.total(), 0.0f);
    OwnerOptimizer optimizer;
    optimizer.sgd.momentum = 0.0;
    optimizer.schedule.baseLr = kLr;
    WorkerOptions worker_options;
    worker_options.staleness = Staleness{Staleness::kInfinite};
    worker_options.cache = false;
    for (NodeId id : members) {
      node::NodeOptions o;
      o.cluster = "bench-ps";
      o.self = id;
      o.members = members;
      o.log_level = spdlog::level::err;  // shutdown at the end makes every peer "down"
      o.heartbeat_interval = 1000ms;
      o.peer_timeout = 60000ms;  // a loaded machine must not declare a peer down mid-run
      o.high_watermark = 256u << 20;
      o.low_watermark = 64u << 20;
      nodes_.push_back(std::make_unique<node::Node>(o));
      node::Node& node = *nodes_.back();
      servers_.push_back(std::make_unique<KvServer>(
          node, KeyStore(layout_, map_, id, initial, optimizer), members, ServerOptions{}));
      workers_.push_back(std::make_unique<KvWorker>(node, *servers_.back(), map_, layout_,
                                                    optimizer, worker_options));
      KvServer* server = servers_.back().get();
      KvWorker* worker = workers_.back().get();
      node.setEventHandler([server, worker](const node::PeerEvent& event) {
        server->onPeerEvent(event);
        worker->onPeerEvent(event);
      });
    }
    for (auto& n : nodes_) {
      if (!n->listen().ok()) std::abort();
    }
    for (size_t i = 0; i < nodes_.size(); ++i) {
      std::vector<node::PeerAddress> peers;
      for (size_t j = 0; j < nodes_.size(); ++j) {
        if (j != i) peers.push_back({static_cast<NodeId>(j), "127.0.0.1", nodes_[j]->port()});
      }
      if (!nodes_[i]->connect(peers).ok()) std::abort();
    }
    for (auto& n : nodes_) {
      const node::Status ready = n->waitClusterReady(30s);
      if (!ready.ok()) {
        fmt::print(stderr, "bench_ps: cluster not ready: {}\n", ready.message());
        std::abort();
      }
    }
    for (NodeId id : members)
      plans_.push_back(planFor(id));
    loop_rounds_.resize(nodes_.size());
    if (config_.driver == Driver::kThread) {
      for (size_t i = 0; i < nodes_.size(); ++i)
        threads_.emplace_back([this, i] { workerLoop(i); });
    }
  }

  ~PsBenchCluster() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& t : threads_)
      t.join();
    for (auto& w : workers_)
      w->cancelAll({node::ErrorCode::kShutdown, "benchmark over"});
    // Nodes stop before the servers and workers their handlers point to go away.
    for (auto& n : nodes_)
      n->shutdown(0ms);
  }

  // One round: every worker moves all its remote keys; the first error, or "" when none.
  std::string round() {
    std::unique_lock lock(mu_);
    ++round_;
    finished_ = 0;
    error_.clear();
    if (config_.driver == Driver::kLoop) {
      for (size_t i = 0; i < nodes_.size(); ++i) {
        if (!nodes_[i]->post([this, i] { startLoopRound(i); })) return "a node stopped";
      }
    }
    changed_.notify_all();
    changed_.wait(lock, [&] { return finished_ == nodes_.size(); });
    return error_;
  }

  // After `rounds` rounds, checks that the work really happened: every read went to an owner,
  // and every push was applied (worker 0 reads its keys of one owner again and compares them
  // with the sum of all pushes). The problem, or "" when none.
  std::string check(size_t rounds) {
    for (size_t i = 0; i < workers_.size(); ++i) {
      const WorkerStats stats = workers_[i]->stats();
      const size_t keys = plans_[i].keys * operationsPerMessage() * rounds;
      if (stats.keys_local != 0 || stats.cache_hits != 0 || stats.keys_remote != keys) {
        return fmt::format("worker {}: {} local, {} cached, {} remote key operations ({} expected)",
                           i, stats.keys_local, stats.cache_hits, stats.keys_remote, keys);
      }
    }
    const Plan& plan = plans_[0];
    std::vector<float> values(plan.lengths[0]);
    if (node::Status status = workers_[0]->wait(workers_[0]->pull(plan.messages[0], values));
        !status.ok()) {
      return "final read: " + status.toString();
    }
    // Each key is pushed once per round by every worker but its owner: w -= lr * 1e-3 each time.
    const double pushes =
        config_.traffic == Traffic::kPull ? 0.0 : static_cast<double>(rounds * (nodes_.size() - 1));
    const double expected = -pushes * kLr * kGrad;
    for (float v : values) {
      if (std::abs(v - expected) > 1e-3 * std::abs(expected) + 1e-9) {
        return fmt::format("key value {} after {} pushes, expected {}", v, pushes, expected);
      }
    }
    return "";
  }

  // Keys pushed + pulled in one round, all workers.
  size_t keysPerRound() const { return sumOver(&Plan::keys) * operationsPerMessage(); }
  // Value bytes pushed + pulled in one round, all workers.
  size_t payloadPerRound() const {
    return sumOver(&Plan::floats) * sizeof(float) * operationsPerMessage();
  }
  // Push and pull messages (requests that carry or fetch values) in one round, all workers.
  size_t messagesPerRound() const {
    size_t n = 0;
    for (const Plan& p : plans_)
      n += p.messages.size();
    return n * operationsPerMessage();
  }
  // Bytes all nodes handed to their sockets so far.
  uint64_t wireBytesOut() const {
    uint64_t total = 0;
    for (const auto& n : nodes_) {
      for (NodeId peer = 0; peer < nodes_.size(); ++peer) {
        if (peer != n->id()) total += n->stats(peer).bytes_out;
      }
    }
    return total;
  }

 private:
  // A worker's messages: one owner's keys each, owners taken in turn so that every connection
  // carries traffic at once; each message's floats at `offsets[m]` in the worker's buffers.
  struct Plan {
    std::vector<std::vector<Key>> messages;
    std::vector<size_t> offsets;
    std::vector<size_t> lengths;
    size_t keys = 0;
    size_t floats = 0;
    std::vector<float> grads;
    std::vector<float> pulled;
  };

  static std::vector<NodeId> memberIds(size_t n) {
    std::vector<NodeId> ids(n);
    for (size_t i = 0; i < n; ++i)
      ids[i] = static_cast<NodeId>(i);
    return ids;
  }

  size_t operationsPerMessage() const { return config_.traffic == Traffic::kPushPull ? 2 : 1; }

  size_t sumOver(size_t Plan::*field) const {
    size_t n = 0;
    for (const Plan& p : plans_)
      n += p.*field;
    return n;
  }

  Plan planFor(NodeId self) const {
    const size_t per_message =
        std::max<size_t>(1, config_.message_bytes / (config_.key_floats * sizeof(float)));
    std::vector<std::vector<std::vector<Key>>> by_owner(config_.nodes);
    for (Key k = 0; k < layout_.numKeys(); ++k) {
      const NodeId owner = map_.home(k);
      if (owner == self) continue;
      auto& chunks = by_owner[owner];
      if (chunks.empty() || chunks.back().size() == per_message) chunks.emplace_back();
      chunks.back().push_back(k);
    }
    Plan plan;
    for (size_t i = 0;; ++i) {
      bool any = false;
      for (auto& chunks : by_owner) {
        if (i >= chunks.size()) continue;
        any = true;
        size_t floats = 0;
        for (Key k : chunks[i])
          floats += layout_.length(k);
        plan.offsets.push_back(plan.floats);
        plan.lengths.push_back(floats);
        plan.floats += floats;
        plan.keys += chunks[i].size();
        plan.messages.push_back(std::move(chunks[i]));
      }
      if (!any) break;
    }
    plan.grads.assign(plan.floats, kGrad);
    plan.pulled.assign(plan.floats, 0.0f);
    return plan;
  }

  void workerLoop(size_t index) {
    uint64_t done = 0;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        changed_.wait(lock, [&] { return stopping_ || round_ > done; });
        if (stopping_) return;
        done = round_;
      }
      finishRound(index, runRound(index));
    }
  }

  // A worker's round is over: keeps the first error and wakes round().
  void finishRound(size_t index, const node::Status& status) {
    {
      std::lock_guard lock(mu_);
      if (!status.ok() && error_.empty()) {
        error_ = fmt::format("worker {}: {}", index, status.toString());
      }
      ++finished_;
    }
    changed_.notify_all();
  }

  size_t operationsOf(size_t index) const {
    return plans_[index].messages.size() * operationsPerMessage();
  }

  // Issues operation `op` of worker `index`'s round: with push + pull, message m's push is
  // 2m and its pull 2m + 1.
  KvWorker::Handle issue(size_t index, size_t op, const KvWorker::Callback& done = {}) {
    KvWorker& worker = *workers_[index];
    Plan& plan = plans_[index];
    const size_t m = op / operationsPerMessage();
    const bool push =
        config_.traffic == Traffic::kPush || (config_.traffic == Traffic::kPushPull && op % 2 == 0);
    const std::span<const Key> keys = plan.messages[m];
    if (push) {
      // The gradients never change during a run: the frames are written straight from them.
      return worker.pushInPlace(
          keys, std::span<const float>(plan.grads).subspan(plan.offsets[m], plan.lengths[m]), done);
    }
    return worker.pull(
        keys, std::span<float>(plan.pulled).subspan(plan.offsets[m], plan.lengths[m]), done);
  }

  // Issues the worker's pushes and pulls with at most `window` in flight, waiting for the
  // oldest first (the order they complete in when every owner is equally fast).
  node::Status runRound(size_t index) {
    KvWorker& worker = *workers_[index];
    std::deque<KvWorker::Handle> in_flight;
    node::Status first;
    auto settle = [&](size_t keep) {
      while (in_flight.size() > keep) {
        node::Status status = worker.wait(in_flight.front());
        in_flight.pop_front();
        if (first.ok() && !status.ok()) first = status;
      }
    };
    for (size_t op = 0; op < operationsOf(index); ++op) {
      in_flight.push_back(issue(index, op));
      settle(config_.window);
    }
    settle(0);
    return first;
  }

  // A worker's round driven from its loop thread: the next operation to issue, how many are in
  // flight, and the first error. Touched only on that node's loop thread.
  struct LoopRound {
    size_t next = 0;
    size_t in_flight = 0;
    node::Status first;
    bool finished = false;
  };

  void startLoopRound(size_t index) {
    loop_rounds_[index] = LoopRound{};
    issueOnLoop(index);
  }

  // Loop thread: keeps `window` operations in flight; each completion issues the next. The
  // callback of an operation that completes at once runs inside push()/pull() (and may finish
  // the round there), so `in_flight` is counted before the call.
  void issueOnLoop(size_t index) {
    LoopRound& r = loop_rounds_[index];
    const size_t total = operationsOf(index);
    while (r.in_flight < config_.window && r.next < total) {
      ++r.in_flight;
      issue(index, r.next++, [this, index](const node::Status& status) {
        LoopRound& round = loop_rounds_[index];
        --round.in_flight;
        if (round.first.ok() && !status.ok()) round.first = status;
        issueOnLoop(index);
      });
    }
    if (r.in_flight == 0 && r.next == total && !r.finished) {
      r.finished = true;
      finishRound(index, r.first);
    }
  }

  BenchConfig config_;
  ChunkLayout layout_;
  ShardMap map_;
  std::vector<std::unique_ptr<node::Node>> nodes_;
  std::vector<std::unique_ptr<KvServer>> servers_;
  std::vector<std::unique_ptr<KvWorker>> workers_;
  std::vector<Plan> plans_;
  std::vector<std::thread> threads_;
  std::vector<LoopRound> loop_rounds_;
  std::mutex mu_;
  std::condition_variable changed_;
  uint64_t round_ = 0;
  size_t finished_ = 0;
  std::string error_;
  bool stopping_ = false;
};

void BM_PsThroughput(benchmark::State& state) {
  BenchConfig config;
  config.nodes = static_cast<size_t>(state.range(0));
  config.key_floats = static_cast<size_t>(state.range(1));
  config.traffic = static_cast<Traffic>(state.range(2));
  config.message_bytes = static_cast<size_t>(state.range(3)) * 1024;
  config.window = static_cast<size_t>(state.range(4));
  config.driver = static_cast<Driver>(state.range(5));
  PsBenchCluster cluster(config);
  bench::RawStream raw;
  bench::EventFloor floor;
  const size_t messages = cluster.messagesPerRound();
  const size_t payload = cluster.payloadPerRound();
  if (messages == 0) {
    state.SkipWithError("a round moves no message: every key is owned locally");
    return;
  }
  const size_t raw_message = (payload + messages / 2) / messages;
  // The floor's two nodes share the messages; each works on half the model, as 2 PS nodes do.
  const size_t floor_value = raw_message / sizeof(float) * sizeof(float);
  const size_t floor_operations = messages / 2;  // per node
  const size_t floor_payload = floor_value * floor_operations * 2;
  auto floorTransfer = [&] {
    return floor.transfer(floor_value, floor_operations, config.window, kModelBytes / 2);
  };

  // One round and one raw transfer unmeasured: connections warm, buffers allocated.
  if (std::string error = cluster.round(); !error.empty()) {
    state.SkipWithError(error.c_str());
    return;
  }
  raw.transfer(raw_message, messages);
  floorTransfer();
  // Slices as node/ cuts its writes, with the MSS the connection has grown to by now.
  const size_t slice = node::uv::writeSliceFor(raw.mss(), 2);
  const bool sliced = slice > 0 && raw_message + 4 > slice;

  double ps_seconds = 0, raw_seconds = 0, floor_seconds = 0, ps_cpu = 0, raw_cpu = 0, floor_cpu = 0;
  double sliced_seconds = 0;
  uint64_t wire_bytes = 0, held_bytes = 0;  // during the measured rounds and floor transfers
  // Read outside the timed and CPU-measured spans.
  bench::TcpCounters ps_tcp, floor_tcp;
  auto addTcp = [](bench::TcpCounters& sum, const bench::TcpCounters& before) {
    const bench::TcpCounters after = bench::TcpCounters::now();
    sum.retransmitted += after.retransmitted - before.retransmitted;
    sum.out_of_order += after.out_of_order - before.out_of_order;
  };
  size_t ps_rounds = 1;   // the one above
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores): the benchmark idiom
    ++ps_rounds;
    if (std::string error = cluster.round(); !error.empty()) {
      state.SkipWithError(error.c_str());
      break;
    }
    const uint64_t wire_before = cluster.wireBytesOut();
    bench::TcpCounters tcp_before = bench::TcpCounters::now();
    double cpu = processCpuSeconds();
#ifdef CHORUS_CALLGRIND
    CALLGRIND_ZERO_STATS;  // under callgrind: one dump per timed round, all threads
#endif
    const auto start = std::chrono::steady_clock::now();
    const std::string error = cluster.round();
#ifdef CHORUS_CALLGRIND
    CALLGRIND_DUMP_STATS_AT("ps round");
#endif
    ++ps_rounds;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ps_cpu += processCpuSeconds() - cpu;
    addTcp(ps_tcp, tcp_before);
    wire_bytes += cluster.wireBytesOut() - wire_before;
    if (!error.empty()) {
      state.SkipWithError(error.c_str());
      break;  // the loop must end through the iterator once an error is set
    }
    state.SetIterationTime(seconds);
    ps_seconds += seconds;
    raw.transfer(raw_message, messages);
    cpu = processCpuSeconds();
    raw_seconds += raw.transfer(raw_message, messages);
    raw_cpu += processCpuSeconds() - cpu;
    if (sliced) {
      raw.transfer(raw_message, messages, slice);
      sliced_seconds += raw.transfer(raw_message, messages, slice);
    }
    floorTransfer();
    const uint64_t held_before = floor.heldBytes();
    tcp_before = bench::TcpCounters::now();
    cpu = processCpuSeconds();
    floor_seconds += floorTransfer();
    floor_cpu += processCpuSeconds() - cpu;
    addTcp(floor_tcp, tcp_before);
    held_bytes += floor.heldBytes() - held_before;
  }
  if (state.error_occurred()) return;
  if (std::string problem = cluster.check(ps_rounds); !problem.empty()) {
    state.SkipWithError(problem.c_str());
    return;
  }
  const double rounds = static_cast<double>(state.iterations());
  const double bytes = rounds * static_cast<double>(payload);
  state.counters["keys_per_s"] = rounds * static_cast<double>(cluster.keysPerRound()) / ps_seconds;
  state.counters["MB_per_s"] = bytes / ps_seconds / 1e6;
  state.counters["raw_MB_per_s"] = bytes / raw_seconds / 1e6;
  state.counters["ratio"] = raw_seconds / ps_seconds;
  if (!sliced) sliced_seconds = raw_seconds;
  state.counters["sliced_MB_per_s"] = bytes / sliced_seconds / 1e6;
  state.counters["sliced_ratio"] = sliced_seconds / ps_seconds;
  state.counters["wire_per_payload"] = static_cast<double>(wire_bytes) / bytes;
  state.counters["cpu_ns_per_B"] = ps_cpu / bytes * 1e9;
  state.counters["cpu_ns_per_key"] =
      ps_cpu / (rounds * static_cast<double>(cluster.keysPerRound())) * 1e9;
  state.counters["raw_cpu_ns_per_B"] = raw_cpu / bytes * 1e9;
  state.counters["cpu_ratio"] = raw_cpu / ps_cpu;
  const double floor_bytes = rounds * static_cast<double>(floor_payload);
  state.counters["floor_MB_per_s"] = floor_bytes / floor_seconds / 1e6;
  state.counters["floor_ratio"] = (floor_bytes / floor_seconds) / (bytes / raw_seconds);
  state.counters["floor_cpu_ratio"] = (raw_cpu / bytes) / (floor_cpu / floor_bytes);
  state.counters["of_floor"] = (bytes / ps_seconds) / (floor_bytes / floor_seconds);
  state.counters["retrans_per_GB"] = static_cast<double>(ps_tcp.retransmitted) / bytes * 1e9;
  state.counters["ofo_per_GB"] = static_cast<double>(ps_tcp.out_of_order) / bytes * 1e9;
  state.counters["floor_retrans_per_GB"] =
      static_cast<double>(floor_tcp.retransmitted) / floor_bytes * 1e9;
  state.counters["floor_ofo_per_GB"] =
      static_cast<double>(floor_tcp.out_of_order) / floor_bytes * 1e9;
  state.counters["floor_held"] = static_cast<double>(held_bytes) / (floor_bytes / 2);
  state.SetLabel(fmt::format("{} nodes, {} floats/key, {}, {} KiB/msg, window {}, {}", config.nodes,
                             config.key_floats, trafficName(config.traffic), raw_message / 1024,
                             config.window,
                             config.driver == Driver::kLoop ? "loop-driven" : "worker thread"));
}

// Args: nodes, floats per key, traffic (0 push+pull, 1 push, 2 pull), KiB per message, window,
// driver (0 a worker thread per node, 1 the loop thread through completion callbacks).
void throughputArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"nodes", "floats", "traffic", "msg_KiB", "window", "driver"});
  // The issue's figures: push + pull, 2 and 4 nodes, small and large values, both drivers.
  for (int64_t driver : {0, 1}) {
    for (int64_t nodes : {2, 4}) {
      for (int64_t floats : {64, 4096})
        b->Args({nodes, floats, 0, 128, 8, driver});
    }
  }
  // Per-key cost (issue 25): 1-float keys (ps-lite's weakest-link case), embedding rows of 64
  // and 512 floats, and 1-float keys in one 4 MiB message per owner and direction.
  for (int64_t driver : {0, 1}) {
    for (int64_t floats : {1, 512})
      b->Args({2, floats, 0, 128, 8, driver});
    b->Args({2, 1, 0, 4096, 8, driver});
  }
  // Push and pull alone, to see which side costs what.
  for (int64_t nodes : {2, 4}) {
    for (int64_t floats : {64, 4096}) {
      b->Args({nodes, floats, 1, 128, 8, 0});
      b->Args({nodes, floats, 2, 128, 8, 0});
    }
  }
  // Message size and window, 2 nodes, large values.
  for (int64_t kib : {16, 1024})
    b->Args({2, 4096, 0, kib, 8, 0});
  // Training's pattern: PsPeer reads and pushes a whole clock at once, one message per owner
  // and direction (4 MiB of values for 2 nodes, 2 MiB for 4).
  for (int64_t driver : {0, 1}) {
    for (int64_t nodes : {2, 4})
      b->Args({nodes, 4096, 0, 4096, 8, driver});
  }
  for (int64_t window : {1, 2, 32}) {
    for (int64_t driver : {0, 1})
      b->Args({2, 4096, 0, 128, window, driver});
  }
}

BENCHMARK(BM_PsThroughput)->Apply(throughputArgs)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace chorus::ps

BENCHMARK_MAIN();
