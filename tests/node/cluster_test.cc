// Several nodes in one process (threads) and one node in a child process killed for real.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "node/node.h"
#include "ping/ping_exchange.h"
#include "tests/node/test_util.h"

namespace chorus::node {
namespace testing {

// Child mode of test_node: argv = cluster, self, member count, then "id:port" per peer to dial.
// Runs one node until a signal ends the process.
int runChildNode(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string cluster = argv[0];
  const auto self = static_cast<NodeId>(std::stoul(argv[1]));
  const auto count = static_cast<NodeId>(std::stoul(argv[2]));
  std::vector<NodeId> members;
  for (NodeId id = 0; id < count; ++id)
    members.push_back(id);
  NodeOptions options = fastOptions(cluster, self, members);
  options.peer_timeout = 600ms;
  options.log_level = spdlog::level::warn;
  std::vector<PeerAddress> peers;
  for (int i = 3; i < argc; ++i) {
    const std::string spec = argv[i];
    const auto colon = spec.find(':');
    peers.push_back({static_cast<NodeId>(std::stoul(spec.substr(0, colon))), "127.0.0.1",
                     static_cast<uint16_t>(std::stoul(spec.substr(colon + 1)))});
  }
  Node node(options);
  if (!node.listen().ok() || !node.connect(peers).ok()) return 3;
  for (;;)
    pause();  // runs until the parent test stops or kills this process
}

}  // namespace testing

namespace {

using namespace testing;
using namespace std::chrono_literals;
using ping::PingExchange;
using ping::PingOptions;
using ping::PingReport;

std::vector<NodeId> range(NodeId n) {
  std::vector<NodeId> ids;
  for (NodeId i = 0; i < n; ++i)
    ids.push_back(i);
  return ids;
}

TEST(Cluster, EightNodesConnectFullyAndExchangeMessages) {
  constexpr NodeId kNodes = 8;
  constexpr uint32_t kPings = 5;
  // Declared before the nodes, so they outlive every handler that points at them.
  std::mutex mutex;
  std::condition_variable changed;
  std::map<NodeId, uint64_t> sequences;
  std::vector<std::unique_ptr<EventRecorder>> events;
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<std::unique_ptr<PingExchange>> exchanges;
  for (NodeId i = 0; i < kNodes; ++i) {
    NodeOptions o = fastOptions("octet", i, range(kNodes));
    o.peer_timeout = 5s;
    o.log_level = spdlog::level::warn;
    nodes.push_back(std::make_unique<Node>(o));
    events.push_back(std::make_unique<EventRecorder>());
    events.back()->attach(*nodes.back());
    std::vector<NodeId> peers;
    for (NodeId j = 0; j < kNodes; ++j) {
      if (j != i) peers.push_back(j);
    }
    PingOptions ping;
    ping.pings_per_peer = kPings;
    ping.payload_bytes = 4096;
    exchanges.push_back(std::make_unique<PingExchange>(*nodes.back(), peers, ping));
    // Handlers are set before listen(), so no frame can arrive before them.
    nodes.back()->setHandler(ping::messageType(ping::wire::Body::Tensor),
                             [&, i](NodeId from, const InboundFrame& frame) {
                               const auto& message = ping::messageOf(frame);
                               EXPECT_EQ(from, 0u);
                               EXPECT_EQ(message.body_as_Tensor()->values()->size(), 1000u);
                               std::lock_guard lock(mutex);
                               sequences[i] = frame.envelope().header()->sequence();
                               changed.notify_all();
                             });
    ASSERT_TRUE(nodes.back()->listen().ok());
  }
  for (NodeId i = 0; i < kNodes; ++i) {
    std::vector<PeerAddress> peers;
    for (NodeId j = 0; j < kNodes; ++j) {
      if (j != i) peers.push_back({j, "127.0.0.1", nodes[j]->port()});
    }
    ASSERT_TRUE(nodes[i]->connect(peers).ok());
  }
  for (auto& node : nodes) {
    const Status ready = node->waitClusterReady();  // options' cluster_ready_timeout
    ASSERT_TRUE(ready.ok()) << ready.message();
    EXPECT_EQ(node->connectedPeers().size(), kNodes - 1);
  }
  std::vector<PingReport> reports(kNodes);
  std::vector<std::thread> threads;
  for (NodeId i = 0; i < kNodes; ++i) {
    threads.emplace_back([&, i] { reports[i] = exchanges[i]->run(); });
  }
  for (auto& t : threads)
    t.join();
  for (NodeId i = 0; i < kNodes; ++i) {
    ASSERT_TRUE(reports[i].status.ok()) << "node " << i << ": " << reports[i].status.message();
    ASSERT_EQ(reports[i].peers.size(), kNodes - 1);
    for (const auto& peer : reports[i].peers) {
      EXPECT_EQ(peer.pongs_verified, kPings);
      EXPECT_EQ(peer.pings_answered, kPings);
      EXPECT_GT(peer.rtt_mean_us, 0.0);
    }
  }
  // A broadcast is serialized once: every neighbor receives the same sequence number.
  std::vector<float> values(1000, 0.25f);
  auto frame = ping::encodeMessage(*nodes[0], ping::wire::Body::Tensor,
                                   [&](flatbuffers::FlatBufferBuilder& b) {
                                     return ping::wire::CreateTensorDirect(b, 3, &values).Union();
                                   });
  std::vector<NodeId> neighbors;
  for (NodeId j = 1; j < kNodes; ++j)
    neighbors.push_back(j);
  nodes[0]->broadcast(neighbors, frame);
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(changed.wait_for(lock, kSoon, [&] { return sequences.size() == kNodes - 1; }));
    for (const auto& [id, sequence] : sequences)
      EXPECT_EQ(sequence, frame->sequence()) << id;
  }
  exchanges.clear();
  threads.clear();
  for (auto& node : nodes)
    threads.emplace_back([&node] { node->shutdown(3s); });
  for (auto& t : threads)
    t.join();
  for (NodeId i = 0; i < kNodes; ++i) {
    EXPECT_EQ(nodes[i]->loopCloseResult(), 0);
    // Read after shutdown: the last Pongs' writes have completed by then.
    uint64_t bytes_in = 0, bytes_out = 0, frames_out = 0;
    for (NodeId j = 0; j < kNodes; ++j) {
      if (j == i) continue;
      const PeerStats stats = nodes[i]->stats(j);
      bytes_in += stats.bytes_in;
      bytes_out += stats.bytes_out;
      frames_out += stats.frames_out;
      EXPECT_FALSE(stats.connected);
      EXPECT_GE(stats.frames_out, 2 * kPings);  // pings + pongs (+ heartbeats, Leave)
      EXPECT_GE(stats.bytes_out, 2 * kPings * 4096);
      EXPECT_GE(stats.frames_in, 2 * kPings);
      EXPECT_GE(stats.bytes_in, 2 * kPings * 4096);
    }
    const PeerStats totals = nodes[i]->totals();
    EXPECT_EQ(totals.bytes_in, bytes_in);
    EXPECT_EQ(totals.bytes_out, bytes_out);
    EXPECT_EQ(totals.frames_out, frames_out);
    for (NodeId j = 0; j < kNodes; ++j) {
      if (j == i) continue;
      EXPECT_EQ(events[i]->count(PeerEventKind::kUp, j), 1u) << i << " -> " << j;
      EXPECT_EQ(events[i]->count(PeerEventKind::kDown, j), 0u) << i << " -> " << j;
    }
  }
}

TEST(Cluster, ReadyErrorNamesMissingPeers) {
  // A port that was free a moment ago: nothing listens there.
  uint16_t dead_port = 0;
  {
    Node probe(fastOptions("delta", 9, {9}));
    ASSERT_TRUE(probe.listen().ok());
    dead_port = probe.port();
    probe.shutdown(0ms);
  }
  NodeOptions o = fastOptions("delta", 1, {0, 1, 2});
  o.log_level = spdlog::level::err;
  Node node(o);
  ASSERT_TRUE(node.listen().ok());
  // Node 0 should dial us (it never does); we dial node 2, where nothing listens.
  ASSERT_TRUE(node.connect({{0, "", 0}, {2, "127.0.0.1", dead_port}}).ok());
  const Status ready = node.waitClusterReady(300ms);
  EXPECT_EQ(ready.code(), ErrorCode::kTimeout);
  EXPECT_NE(ready.message().find("2 of 2 peers missing"), std::string::npos) << ready.message();
  EXPECT_NE(ready.message().find("peer 0 (it dials this node and has not yet: not started?)"),
            std::string::npos)
      << ready.message();
  EXPECT_NE(ready.message().find("peer 2 (io: connect to peer 2"), std::string::npos)
      << ready.message();
  EXPECT_NE(ready.message().find("ECONNREFUSED"), std::string::npos) << ready.message();
  node.shutdown(100ms);
  EXPECT_EQ(node.loopCloseResult(), 0);
}

TEST(RunDifference, NamesTheFirstSettingThatDiffersWithBothValues) {
  EXPECT_EQ(runDifference("mode=ps\nlr=0.05\n", "mode=ps\nlr=0.05\n", 1, 0), "");
  EXPECT_EQ(runDifference("", "mode=ps\n", 1, 0), "");  // not compared
  EXPECT_NE(runDifference("mode=ps\nlr=0.05\nseed=1\n", "mode=ps\nlr=0.1\nseed=2\n", 3, 0)
                .find("node 3 runs with lr=0.1, node 0 with lr=0.05: every node"),
            std::string::npos);
  EXPECT_NE(runDifference("mode=ps\n", "mode=ps\ncache=no\n", 2, 1)
                .find("node 2 runs with cache=no, node 1 with cache unset"),
            std::string::npos);
}

// Two nodes started with other settings: the acceptor refuses, naming the first difference; the
// dialer stops waiting at once. Without a secret the acceptor keeps waiting (anyone could claim
// a member's id with other settings), and says whom it waits for and why.
TEST(Cluster, NodesWithOtherRunSettingsAreRefusedAndTheDialerStopsAtOnce) {
  auto log = std::make_shared<LogCapture>();
  NodeOptions a = fastOptions("runs", 0, {0, 1});
  a.run_fingerprint = "mode=ps\nmodel=mlp\nlr=0.05\n";
  NodeOptions b = fastOptions("runs", 1, {0, 1});
  b.run_fingerprint = "mode=ps\nmodel=softmax\nlr=0.05\n";
  b.log_sinks = {log};
  b.ready_progress_interval = 50ms;
  Node n0(a), n1(b);
  ASSERT_TRUE(n0.listen().ok());
  ASSERT_TRUE(n1.listen().ok());
  ASSERT_TRUE(n1.connect({{0, "", 0}}).ok());
  ASSERT_TRUE(n0.connect({{1, "127.0.0.1", n1.port()}}).ok());
  const Status refused = n0.waitClusterReady(kSoon);
  EXPECT_EQ(refused.code(), ErrorCode::kRefused);
  EXPECT_NE(refused.message().find(
                "node 1 refused this node: node 0 runs with model=mlp, node 1 with model=softmax"),
            std::string::npos)
      << refused.message();
  const Status waited = n1.waitClusterReady(300ms);
  EXPECT_EQ(waited.code(), ErrorCode::kTimeout);
  EXPECT_NE(waited.message().find("node 0 runs with model=mlp"), std::string::npos)
      << waited.message();
  EXPECT_TRUE(
      log->waitForLine({"still waiting for 1 of 1 peers: peer 0 (refused: node 0 runs "
                        "with model=mlp"}))
      << log->all();
  n0.shutdown(0ms);
  n1.shutdown(0ms);
}

TEST(Cluster, OptionsAreValidated) {
  NodeOptions o = fastOptions("x", 5, {0, 1});
  Node node(o);
  const Status status = node.listen();
  EXPECT_EQ(status.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(status.message().find("own id 5"), std::string::npos);
  o = fastOptions("x", 0, {0, 1});
  o.low_watermark = o.high_watermark + 1;
  EXPECT_EQ(validateOptions(o).code(), ErrorCode::kInvalidArgument);
  o = fastOptions("x", 0, {0, 1});
  o.write_slice_packets = kMaxWriteSlicePackets + 1;
  EXPECT_NE(validateOptions(o).message().find("write_slice_packets"), std::string::npos);
  o = fastOptions("x", 0, {0, 1});
  o.max_frame_bytes = 2047u << 20;
  EXPECT_TRUE(validateOptions(o).ok());
  o.max_frame_bytes = 1u << 31;  // a frame that large would be a FlatBuffer of 2 GiB
  EXPECT_NE(validateOptions(o).message().find("outside"), std::string::npos);
  o = fastOptions("x", 0, {0, 1});
  o.link_delay = 400ms;  // four trips of 500 ms would not fit in the 2 s handshake
  o.link_jitter = 100ms;
  EXPECT_NE(validateOptions(o).message().find("link_delay + link_jitter (500 ms)"),
            std::string::npos);
  o = fastOptions("x", 0, {0, 1});
  o.link_delay = 300ms;
  o.heartbeat_interval = 800ms;  // a heartbeat could land after the 1 s peer time-out
  EXPECT_NE(validateOptions(o).message().find("peer_timeout"), std::string::npos);
  o = fastOptions("x", 0, {0, 1});
  o.link_loss = 0.6;
  EXPECT_NE(validateOptions(o).message().find("link_loss 0.6 is outside 0..0.5"),
            std::string::npos);
  o.link_loss = 0.1;
  o.link_rto = 100ms;  // 1 + 2 + 4 time-outs: a handshake of four trips would take 2.8 s
  EXPECT_NE(validateOptions(o).message().find("link_loss's retransmissions"), std::string::npos);
  o.link_rto = 10ms;
  EXPECT_TRUE(validateOptions(o).ok());
  o = fastOptions("x", 0, {0, 1});
  ASSERT_TRUE(validateOptions(o).ok());
  Node ok(o);
  ASSERT_TRUE(ok.listen().ok());
  EXPECT_EQ(ok.connect({{7, "127.0.0.1", 1}}).code(), ErrorCode::kInvalidArgument);
  ok.shutdown();
}

// The listener's log line writes an IPv6 host in brackets, as the topology file does.
TEST(Cluster, AnIpv6ListenerIsLoggedInBrackets) {
  auto log = std::make_shared<LogCapture>();
  NodeOptions o = fastOptions("six", 0, {0, 1});
  o.listen_host = "::1";
  o.log_sinks = {log};
  Node node(o);
  const Status listening = node.listen();
  if (!listening.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << listening.message();
  EXPECT_TRUE(log->waitForLine({"listening on [::1]:" + std::to_string(node.port()) + " "}))
      << log->all();
  node.shutdown();
}

// Two connected nodes, lower id dials.
struct Pair {
  explicit Pair(
      const std::string& cluster,
      const std::function<void(NodeOptions&)>& tune = [](NodeOptions&) {}) {
    NodeOptions lo = fastOptions(cluster, 0, {0, 1, 2});
    lo.log_level = spdlog::level::warn;
    tune(lo);
    NodeOptions hi = fastOptions(cluster, 1, {0, 1, 2});
    hi.log_level = spdlog::level::warn;
    tune(hi);
    low = std::make_unique<Node>(lo);
    high = std::make_unique<Node>(hi);
    low_events.attach(*low);
    high_events.attach(*high);
    EXPECT_TRUE(low->listen().ok());
    EXPECT_TRUE(high->listen().ok());
    EXPECT_TRUE(low->connect({{1, "127.0.0.1", high->port()}}).ok());
    EXPECT_TRUE(high->connect({{0, "", 0}}).ok());
    EXPECT_TRUE(low->waitClusterReady(kSoon).ok());
    EXPECT_TRUE(high->waitClusterReady(kSoon).ok());
  }
  // Recorders first: members are destroyed in reverse order, so they outlive the nodes.
  EventRecorder low_events;
  EventRecorder high_events;
  std::unique_ptr<Node> low;
  std::unique_ptr<Node> high;
};

// The time-out is 50 heartbeats: a loop thread that a loaded machine does not schedule for
// 130 ms (what 20 ms and 150 ms allowed, and what a `ctest -j4` on two busy cores once did) must
// not count as a silent peer; a missing heartbeat still would, as the frame count shows.
TEST(Cluster, HeartbeatsKeepAnIdleConnectionAlive) {
  Pair pair("lambda", [](NodeOptions& o) {
    o.heartbeat_interval = 20ms;
    o.peer_timeout = 1000ms;
  });
  const uint64_t frames_before = pair.low->stats(1).frames_in;
  // Idle for three peer timeouts: only heartbeats flow, and nobody is declared down.
  EXPECT_FALSE(pair.low_events.waitFor(PeerEventKind::kDown, 1, 1, 3000ms));
  EXPECT_EQ(pair.high_events.count(PeerEventKind::kDown, 0), 0u);
  EXPECT_GE(pair.low->stats(1).frames_in, frames_before + 10);
  EXPECT_TRUE(pair.low->stats(1).connected);
  pair.low->shutdown(1s);
  pair.high->shutdown(1s);
  EXPECT_EQ(pair.low->loopCloseResult(), 0);
  EXPECT_EQ(pair.high->loopCloseResult(), 0);
}

TEST(Cluster, OrderlyShutdownIsReportedAsLeaveNotDown) {
  Pair pair("epsilon");
  pair.high->shutdown(2s);
  EXPECT_EQ(pair.high->loopCloseResult(), 0);
  ASSERT_TRUE(pair.low_events.waitFor(PeerEventKind::kLeft, 1));
  EXPECT_NE(pair.low_events.lastReason(PeerEventKind::kLeft, 1).find("node shutting down"),
            std::string::npos);
  EXPECT_EQ(pair.low_events.count(PeerEventKind::kDown, 1), 0u);
  EXPECT_EQ(pair.high_events.count(PeerEventKind::kLeft, 0), 1u);  // the acknowledgement
  pair.low->shutdown(1s);
  EXPECT_EQ(pair.low->loopCloseResult(), 0);
}

// Sends `count` Tensor frames to `peer`, frame i carrying the one value i.
void sendNumberedTensors(Node& node, NodeId peer, int count) {
  for (int i = 0; i < count; ++i) {
    std::vector<float> values{static_cast<float>(i)};
    node.send(peer, ping::encodeMessage(
                        node, ping::wire::Body::Tensor, [&](flatbuffers::FlatBufferBuilder& b) {
                          return ping::wire::CreateTensorDirect(b, 1, &values).Union();
                        }));
  }
}

// Takes sendNumberedTensors' frames on the receiving node and remembers when they came.
// Declare it before the nodes: it must outlive the handler it installs.
class NumberedTensorSink {
 public:
  void attach(Node& node) {
    node.setHandler(ping::messageType(ping::wire::Body::Tensor),
                    [this](NodeId, const InboundFrame& frame) {
                      const auto& message = ping::messageOf(frame);
                      std::lock_guard lock(mutex_);
                      last_arrival_ = std::chrono::steady_clock::now();
                      if (received_.empty()) first_arrival_ = last_arrival_;
                      received_.push_back(message.body_as_Tensor()->values()->Get(0));
                      changed_.notify_all();
                    });
  }
  // Waits for `count` frames and checks that they came in the order sent.
  void expectAllInOrder(size_t count) {
    std::unique_lock lock(mutex_);
    ASSERT_TRUE(changed_.wait_for(lock, kSoon, [&] { return received_.size() >= count; }))
        << received_.size() << " of " << count << " frames arrived, the last "
        << (received_.empty() ? -1.0f : received_.back()) << "; missing: " << [&] {
             std::string missing;
             for (size_t i = 0, j = 0; i < count; ++i) {
               if (j < received_.size() && received_[j] == static_cast<float>(i)) {
                 ++j;
               } else {
                 missing += std::to_string(i) + " ";
               }
             }
             return missing;
           }();
    ASSERT_EQ(received_.size(), count) << "frames arrived twice";
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(received_[i], static_cast<float>(i)) << "frame " << i << " arrived out of order";
  }
  std::chrono::steady_clock::time_point firstArrival() const {
    std::lock_guard lock(mutex_);
    return first_arrival_;
  }
  std::chrono::steady_clock::time_point lastArrival() const {
    std::lock_guard lock(mutex_);
    return last_arrival_;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<float> received_;  // the value each frame carried, in arrival order
  std::chrono::steady_clock::time_point first_arrival_, last_arrival_;
};

TEST(Cluster, LinkDelayHoldsEveryFrameBackInOrder) {
  constexpr auto kDelay = 40ms;
  constexpr int kFrames = 200;
  NumberedTensorSink sink;
  Pair pair("kappa", [&](NodeOptions& o) {
    o.link_delay = kDelay;
    o.link_jitter = 30ms;  // draws larger than the gap between two sends: they must not reorder
  });
  sink.attach(*pair.high);
  const auto first_send = std::chrono::steady_clock::now();
  sendNumberedTensors(*pair.low, 1, kFrames);
  sink.expectAllInOrder(kFrames);
  EXPECT_GE(sink.firstArrival() - first_send, kDelay);
  // A round trip crosses the link twice.
  PingOptions ping;
  ping.pings_per_peer = 3;
  PingExchange low_pings(*pair.low, {1}, ping);
  PingExchange high_pings(*pair.high, {0}, ping);
  PingReport high_report;
  std::thread high_thread([&] { high_report = high_pings.run(); });
  const PingReport low_report = low_pings.run();
  high_thread.join();
  ASSERT_TRUE(low_report.status.ok()) << low_report.status.message();
  ASSERT_TRUE(high_report.status.ok()) << high_report.status.message();
  EXPECT_GE(low_report.peers.at(0).rtt_min_us, 2.0 * 40'000);
  // Leave is delayed like every frame, and still arrives before the connection closes.
  pair.high->shutdown(2s);
  ASSERT_TRUE(pair.low_events.waitFor(PeerEventKind::kLeft, 1));
  EXPECT_EQ(pair.low_events.count(PeerEventKind::kDown, 1), 0u);
  pair.low->shutdown(2s);
  EXPECT_EQ(pair.low->loopCloseResult(), 0);
  EXPECT_EQ(pair.high->loopCloseResult(), 0);
}

// A lost frame waits for its retransmission time-out, and TCP delivers nothing behind it before
// it: every frame still arrives, in order, later; the peers stay up.
TEST(Cluster, LinkLossHoldsALostFrameAndTheFramesBehindIt) {
  constexpr auto kRto = 20ms;
  constexpr int kFrames = 200;
  NumberedTensorSink sink;
  Pair pair("mu", [&](NodeOptions& o) {
    o.link_loss = 0.2;  // 200 frames: no loss at all has probability 0.8^200, about 4e-20
    o.link_rto = kRto;
  });
  sink.attach(*pair.high);
  const auto first_send = std::chrono::steady_clock::now();
  sendNumberedTensors(*pair.low, 1, kFrames);
  sink.expectAllInOrder(kFrames);
  // At least one frame was lost, and the last one waited for it.
  EXPECT_GE(sink.lastArrival() - first_send, kRto);
  EXPECT_GT(pair.low->stats(1).frames_lost, 0u);
  EXPECT_EQ(pair.low->totals().frames_lost, pair.low->stats(1).frames_lost);
  EXPECT_EQ(pair.low_events.count(PeerEventKind::kDown, 1), 0u);
  pair.high->shutdown(2s);
  pair.low->shutdown(2s);
  EXPECT_EQ(pair.low->loopCloseResult(), 0);
  EXPECT_EQ(pair.high->loopCloseResult(), 0);
}

// Node 1 of `pair` is gone: starts it again on `port` and checks that node 0 redials it (its
// second time up), then shuts both down.
void expectNodeOneComesBack(Pair& pair, const std::string& cluster, uint16_t port) {
  NodeOptions hi = fastOptions(cluster, 1, {0, 1, 2});
  hi.listen_port = port;
  hi.log_level = spdlog::level::warn;
  Node again(hi);
  ASSERT_TRUE(again.listen().ok());
  ASSERT_TRUE(again.connect({{0, "", 0}}).ok());
  ASSERT_TRUE(pair.low_events.waitFor(PeerEventKind::kUp, 1, 2));  // redialed with backoff
  ASSERT_TRUE(again.waitClusterReady(kSoon).ok());
  EXPECT_EQ(pair.low->stats(1).times_up, 2u);
  again.shutdown(1s);
  pair.low->shutdown(1s);
  EXPECT_EQ(again.loopCloseResult(), 0);
  EXPECT_EQ(pair.low->loopCloseResult(), 0);
}

TEST(Cluster, PeerDownThenUpWhenItReturns) {
  Pair pair("zeta");
  const uint16_t port = pair.high->port();
  pair.high->shutdown(0ms);  // abrupt: no Leave, the socket just closes
  ASSERT_TRUE(pair.low_events.waitFor(PeerEventKind::kDown, 1));
  EXPECT_FALSE(pair.low->stats(1).connected);
  expectNodeOneComesBack(pair, "zeta", port);
}

// Only the lower id dials, so a higher id that said Leave (an orderly stop) can come back, as
// `--rejoin` does, only if the lower one keeps dialing it.
TEST(Cluster, APeerThatLeftIsRedialedWhenItReturns) {
  Pair pair("eta");
  const uint16_t port = pair.high->port();
  pair.high->shutdown(2s);  // orderly: says Leave
  ASSERT_TRUE(pair.low_events.waitFor(PeerEventKind::kLeft, 1));
  expectNodeOneComesBack(pair, "eta", port);
  EXPECT_EQ(pair.low_events.count(PeerEventKind::kDown, 1), 0u);
}

TEST(Cluster, EverySendCallbackFiresExactlyOnce) {
  Pair pair("eta");
  CallbackLedger ledger;
  std::atomic<int> ok_count{0};
  auto frame =
      ping::encodeMessage(*pair.low, ping::wire::Body::Ping, [](flatbuffers::FlatBufferBuilder& b) {
        return ping::wire::CreatePingDirect(b, 1, nullptr).Union();
      });
  auto track = [&](const std::string& name, ErrorCode expected, bool strict) {
    auto fired = ledger.expect(name);
    return [&, fired, expected, strict, name](NodeId, const Status& status) {
      if (status.ok()) ok_count++;
      if (strict) {
        EXPECT_EQ(status.code(), expected) << name << ": " << status.toString();
      }
      fired();
    };
  };
  for (int i = 0; i < 200; ++i)
    pair.low->send(1, frame, track("ok" + std::to_string(i), ErrorCode::kOk, true));
  pair.low->send(2, frame, track("unconnected", ErrorCode::kNotConnected, true));
  pair.low->send(9, frame, track("non-member", ErrorCode::kNotConnected, true));
  pair.low->broadcast({1, 2}, frame,
                      [&, a = ledger.expect("bcast1"), b = ledger.expect("bcast2")](
                          NodeId peer, const Status& status) {
                        if (peer == 1) {
                          EXPECT_TRUE(status.ok());
                          a();
                        } else {
                          EXPECT_EQ(status.code(), ErrorCode::kNotConnected);
                          b();
                        }
                      });
  ASSERT_TRUE(ledger.waitAll());
  // Sends racing with shutdown: each completes exactly once, whatever the outcome.
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    for (int i = 0; i < 500 && !stop; ++i) {
      pair.low->send(1, frame, track("race" + std::to_string(i), ErrorCode::kOk, false));
    }
  });
  pair.low->shutdown(0ms);
  stop = true;
  sender.join();
  pair.low->send(1, frame, track("after-shutdown", ErrorCode::kShutdown, true));
  ASSERT_TRUE(ledger.waitAll());
  EXPECT_EQ(ledger.problems(), "");
  EXPECT_GE(ok_count.load(), 200);
  EXPECT_EQ(pair.low->loopCloseResult(), 0);
  pair.high->shutdown(0ms);
  EXPECT_EQ(pair.high->loopCloseResult(), 0);
}

TEST(Cluster, LedgerFailsWhenACallbackNeverFires) {
  CallbackLedger ledger;
  auto fire_twice = ledger.expect("twice");
  (void)ledger.expect("never");
  fire_twice();
  fire_twice();
  EXPECT_FALSE(ledger.waitAll(20ms));
  EXPECT_EQ(ledger.problems(), "never fired 0 times; twice fired 2 times; ");
}

TEST(Cluster, BackpressureRaisesSlowThenDrained) {
  NodeOptions o = fastOptions("theta", 1, {0, 1});
  o.peer_timeout = 30s;  // the raw peer sends no heartbeats
  o.high_watermark = 1 << 20;
  o.low_watermark = 256 << 10;
  o.log_level = spdlog::level::warn;
  EventRecorder events;  // outlives the node
  Node node(o);
  events.attach(node);
  ASSERT_TRUE(node.listen().ok());
  ASSERT_TRUE(node.connect({{0, "", 0}}).ok());
  RawPeer raw(node.port());
  ASSERT_TRUE(raw.handshake("theta", 0));
  ASSERT_TRUE(node.waitClusterReady(kSoon).ok());
  constexpr int kFrames = 32;
  std::vector<float> values(256 * 1024);  // 1 MiB
  auto frame = ping::encodeMessage(
      node, ping::wire::Body::Tensor,
      [&](flatbuffers::FlatBufferBuilder& b) {
        return ping::wire::CreateTensorDirect(b, 5, &values).Union();
      },
      values.size() * sizeof(float));
  CallbackLedger ledger;
  for (int i = 0; i < kFrames; ++i) {
    auto fired = ledger.expect("tensor" + std::to_string(i));
    node.send(0, frame, [fired](NodeId, const Status& status) {
      EXPECT_TRUE(status.ok()) << status.toString();
      fired();
    });
  }
  ASSERT_TRUE(events.waitFor(PeerEventKind::kSlow, 0));
  EXPECT_NE(events.lastReason(PeerEventKind::kSlow, 0).find("high watermark 1048576"),
            std::string::npos);
  // No check of stats(0).slow here: the kernel's loopback buffers may take the queue below the
  // low watermark before this line runs, even while the raw peer reads nothing (seen under
  // ASan). The event sequence below is what the test holds the node to.
  int tensors = 0;
  while (tensors < kFrames) {
    auto envelope = raw.readFrame();
    ASSERT_TRUE(envelope.has_value());
    const auto* e = pingMessageOf(*envelope);
    if (e != nullptr && e->body_type() == ping::wire::Body::Tensor) {
      ASSERT_EQ(e->body_as_Tensor()->values()->size(), values.size());
      ++tensors;
    }
  }
  ASSERT_TRUE(events.waitFor(PeerEventKind::kDrained, 0));
  EXPECT_FALSE(node.stats(0).slow);
  ASSERT_TRUE(ledger.waitAll());
  EXPECT_EQ(ledger.problems(), "");
  // While the sends were still arriving the queue may have crossed the watermarks more than
  // once; the events must alternate slow, drained, ... and end drained.
  std::vector<PeerEventKind> flow;
  for (const auto& e : events.events()) {
    if (e.kind == PeerEventKind::kSlow || e.kind == PeerEventKind::kDrained) flow.push_back(e.kind);
  }
  ASSERT_FALSE(flow.empty());
  for (size_t i = 0; i < flow.size(); ++i) {
    EXPECT_EQ(flow[i], i % 2 == 0 ? PeerEventKind::kSlow : PeerEventKind::kDrained) << i;
  }
  EXPECT_EQ(flow.back(), PeerEventKind::kDrained);
  node.shutdown(200ms);
  EXPECT_EQ(node.loopCloseResult(), 0);
}

// Whatever the write slice, frames of several packets arrive whole and in order.
TEST(Cluster, LargeFramesArriveWholeWithAnyWriteSlice) {
  for (size_t packets : {size_t{0}, size_t{1}, size_t{2}, size_t{7}}) {
    SCOPED_TRACE(packets);
    NodeOptions o = fastOptions("iota", 1, {0, 1});
    o.peer_timeout = 30s;  // the raw peer sends no heartbeats
    o.write_slice_packets = packets;
    o.log_level = spdlog::level::warn;
    Node node(o);
    ASSERT_TRUE(node.listen().ok());
    ASSERT_TRUE(node.connect({{0, "", 0}}).ok());
    RawPeer raw(node.port());
    ASSERT_TRUE(raw.handshake("iota", 0));
    ASSERT_TRUE(node.waitClusterReady(kSoon).ok());
    constexpr int kFrames = 6;
    // Frame f's values: 1 MiB, 40 bytes and 300 KiB in turn, so that batches mix frames above
    // and below a slice.
    auto valuesOf = [](int f) {
      std::vector<float> values(f % 3 == 0 ? 256 * 1024 : (f % 3 == 1 ? 10 : 75 * 1024));
      for (size_t i = 0; i < values.size(); ++i)
        values[i] = static_cast<float>(f * 1000 + static_cast<int>(i % 997));
      return values;
    };
    for (int f = 0; f < kFrames; ++f) {
      const std::vector<float> values = valuesOf(f);
      node.send(
          0,
          ping::encodeMessage(
              node, ping::wire::Body::Tensor, [&](flatbuffers::FlatBufferBuilder& b) {
                return ping::wire::CreateTensorDirect(b, static_cast<uint64_t>(f), &values).Union();
              }));
    }
    int seen = 0;
    while (seen < kFrames) {
      auto frame = raw.readFrame();
      ASSERT_TRUE(frame.has_value());
      ASSERT_TRUE(verifyFrame(frame->data(), frame->size(), FrameLimits{}).ok());
      const auto* e = pingMessageOf(*frame);
      if (e == nullptr || e->body_type() != ping::wire::Body::Tensor) continue;
      const auto* tensor = e->body_as_Tensor();
      ASSERT_EQ(tensor->tag(), static_cast<uint64_t>(seen));
      const std::vector<float> expected = valuesOf(seen);
      ASSERT_EQ(tensor->values()->size(), expected.size());
      for (size_t i = 0; i < expected.size(); ++i) {
        ASSERT_EQ(tensor->values()->Get(static_cast<flatbuffers::uoffset_t>(i)), expected[i])
            << "frame " << seen << " value " << i;
      }
      ++seen;
    }
    node.shutdown(200ms);
    EXPECT_EQ(node.loopCloseResult(), 0);
  }
}

// Attachments arrive whole and in order, in the frame's own buffer or where the receiver's
// placer said; a transient send carries the bytes as they were when it was called, although
// the sender overwrites them at once (the socket cannot take 8 MiB before that). The patterns
// are made here, not on the loop threads: made there (32 MiB byte by byte, seconds under ASan)
// they held both loops past the 1 s peer timeout, and the nodes dropped each other.
//
// The loop threads still copy and overwrite 32 MiB (the transient sends' own copies, the
// source's overwrite): under ThreadSanitizer on a loaded machine that held them past a 1 s peer
// timeout too, so this test, which is not about liveness, gives its peers 30 s.
TEST(Cluster, AttachmentsArriveWholeAndTransientSendsKeepTheBytesOfTheirCall) {
  Pair pair("omicron", [](NodeOptions& o) { o.peer_timeout = 30s; });
  constexpr size_t kBytes = 8u << 20;
  constexpr uint64_t kFrames = 4;
  std::vector<std::vector<uint8_t>> patterns;
  for (uint64_t tag = 0; tag < kFrames; ++tag) {
    std::vector<uint8_t> bytes(kBytes);
    for (size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<uint8_t>(i * 13 + tag * 101 + i / 4096);
    patterns.push_back(std::move(bytes));
  }
  // Odd tags land in buffers of the receiver's; even ones stay in their frames.
  std::vector<std::vector<uint8_t>> landed(kFrames, std::vector<uint8_t>(kBytes));
  std::mutex mu;
  std::condition_variable changed;
  std::vector<std::pair<uint64_t, bool>> received;  // tag, bytes as sent
  pair.high->setAttachmentPlacer(
      ping::messageType(ping::wire::Body::Tensor),
      [&](NodeId from, const InboundFrame& frame,
          size_t bytes) -> std::unique_ptr<AttachmentLanding> {
        const uint64_t tag = ping::messageOf(frame).body_as_Tensor()->tag();
        if (from != 0 || tag % 2 == 0 || bytes != kBytes) return nullptr;
        return std::make_unique<AttachmentLanding>(std::vector<std::span<uint8_t>>{landed[tag]});
      });
  pair.high->setHandler(
      ping::messageType(ping::wire::Body::Tensor), [&](NodeId, const InboundFrame& frame) {
        const uint64_t tag = ping::messageOf(frame).body_as_Tensor()->tag();
        bool same = false;
        if (tag < kFrames) {
          const std::vector<uint8_t>& expected = patterns[tag];
          if (frame.landing() != nullptr) {
            same = tag % 2 == 1 && landed[tag] == expected;
          } else {
            const auto got = frame.attachment();
            same = tag % 2 == 0 &&
                   std::equal(got.begin(), got.end(), expected.begin(), expected.end());
          }
        }
        {
          std::lock_guard lock(mu);
          received.emplace_back(tag, same);
        }
        changed.notify_all();
      });
  std::vector<uint8_t> source;
  std::atomic<int> sent_ok{0};
  // The loops use the locals above until the nodes stop: stop them before those locals go,
  // also when an assertion below returns early (ThreadSanitizer saw the locals freed under a
  // running loop).
  struct StopFirst {
    Pair& pair;
    ~StopFirst() {
      pair.low->shutdown(1s);
      pair.high->shutdown(1s);
    }
  } stop_first{pair};
  ASSERT_TRUE(pair.low->post([&] {
    for (uint64_t tag = 0; tag < kFrames; ++tag) {
      source = patterns[tag];
      auto frame = ping::encodeMessage(*pair.low, ping::wire::Body::Tensor,
                                       [&](flatbuffers::FlatBufferBuilder& b) {
                                         return ping::wire::CreateTensor(b, tag).Union();
                                       },
                                       0, {std::span<const uint8_t>(source)});
      pair.low->sendTransient(1, frame, [&](NodeId, const Status& status) {
        {
          std::lock_guard sent_lock(mu);
          if (status.ok()) ++sent_ok;
        }
        changed.notify_all();
      });
      std::fill(source.begin(), source.end(), uint8_t{0xEE});
    }
  }));
  std::unique_lock lock(mu);
  // The last frame can be read before the sender's loop has run its write's callback: wait for
  // both (a check of sent_ok right after the frames arrived once saw 1 of 4).
  ASSERT_TRUE(changed.wait_for(lock, kSoon, [&] {
    return received.size() == kFrames && sent_ok.load() == static_cast<int>(kFrames);
  }));
  for (uint64_t tag = 0; tag < kFrames; ++tag) {
    EXPECT_EQ(received[tag].first, tag);
    EXPECT_TRUE(received[tag].second) << "frame " << tag << " does not hold its bytes";
  }
  lock.unlock();
  EXPECT_EQ(sent_ok.load(), static_cast<int>(kFrames));
  pair.low->shutdown(1s);
  pair.high->shutdown(1s);
}

// Starts test_node itself as node 0 in a child process.
pid_t spawnChildNode(const std::string& cluster, NodeId self, NodeId members,
                     const std::vector<std::string>& peers) {
  std::vector<std::string> args = {"/proc/self/exe", "--chorus-child-node", cluster,
                                   std::to_string(self), std::to_string(members)};
  args.insert(args.end(), peers.begin(), peers.end());
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    if (getppid() != parent) _exit(4);
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(5);
  }
  return pid;
}

TEST(Cluster, ChildProcessStoppedThenKilledIsReportedDown) {
  constexpr auto kPeerTimeout = 600ms;
  std::vector<std::unique_ptr<EventRecorder>> events;  // outlives the nodes
  std::vector<std::unique_ptr<Node>> nodes;
  for (NodeId id : {1u, 2u}) {
    NodeOptions o = fastOptions("kappa", id, {0, 1, 2});
    o.peer_timeout = kPeerTimeout;
    o.log_level = spdlog::level::warn;
    nodes.push_back(std::make_unique<Node>(o));
    events.push_back(std::make_unique<EventRecorder>());
    events.back()->attach(*nodes.back());
    ASSERT_TRUE(nodes.back()->listen().ok());
  }
  ASSERT_TRUE(nodes[0]->connect({{0, "", 0}, {2, "127.0.0.1", nodes[1]->port()}}).ok());
  ASSERT_TRUE(nodes[1]->connect({{0, "", 0}, {1, "", 0}}).ok());
  const pid_t child = spawnChildNode(
      "kappa", 0, 3,
      {"1:" + std::to_string(nodes[0]->port()), "2:" + std::to_string(nodes[1]->port())});
  ASSERT_GT(child, 0);
  for (auto& node : nodes)
    ASSERT_TRUE(node->waitClusterReady(kSoon).ok());

  // Frozen: the sockets stay open but silent, so only the heartbeat timeout can notice.
  ASSERT_EQ(kill(child, SIGSTOP), 0);
  auto start = std::chrono::steady_clock::now();
  for (auto& e : events)
    ASSERT_TRUE(e->waitFor(PeerEventKind::kDown, 0, 1));
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, kPeerTimeout + 1s);
  for (auto& e : events) {
    EXPECT_NE(e->lastReason(PeerEventKind::kDown, 0).find("no frame from peer 0"),
              std::string::npos);
  }

  // Thawed: it notices its closed connections and redials.
  ASSERT_EQ(kill(child, SIGCONT), 0);
  for (auto& e : events)
    ASSERT_TRUE(e->waitFor(PeerEventKind::kUp, 0, 2));

  // Killed for real: the kernel closes its sockets; peers see it within the timeout.
  ASSERT_EQ(kill(child, SIGKILL), 0);
  start = std::chrono::steady_clock::now();
  for (auto& e : events)
    ASSERT_TRUE(e->waitFor(PeerEventKind::kDown, 0, 2));
  elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, kPeerTimeout);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  // The survivors still talk to each other.
  EXPECT_TRUE(nodes[0]->stats(2).connected);
  for (auto& node : nodes) {
    node->shutdown(1s);
    EXPECT_EQ(node->loopCloseResult(), 0);
  }
}

}  // namespace
}  // namespace chorus::node
