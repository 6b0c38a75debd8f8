// The replica sync's network shell (ps/replica_shell.h) on real nodes over loopback (port 0):
// its wire codec, convergence to the sum of all pushes for 1, 2, 3 and 5 nodes (SGD exactly,
// AdaGrad bit for bit), a node killed mid-sync (deterministically: it stops answering, then
// dies; and at random moments under the timer), and bad frames: garbage, misaligned, from a
// non-member, meaningless from a member. Nothing waits on sleeps: tests wait on the shell's
// counters and drain(), with generous time-outs; pushes come from seeded generators.
#include "ps/replica_shell.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "modes/registry.h"
#include "node/node.h"
#include "ps/replica_codec.h"
#include "tests/node/test_util.h"
#include "tests/support/local_cluster.h"

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;
using node::testing::LogCapture;

constexpr auto kLong = 120s;  // generous: the machine is shared and loaded

// Hot keys: rows of 1, 4 and 16 floats in three tables.
KeySpace hotSpace() {
  KeySpace space;
  space.addTable("relations", 0, 12, 1);
  space.addTable("entities", 100, 8, 4);
  space.addTable("words", 200, 4, 16);
  return space;
}

std::shared_ptr<const UpdatePolicy> unitSgd() {
  OwnerOptimizer optimizer;
  optimizer.sgd.momentum = 0.0;
  optimizer.schedule.baseLr = 1.0;  // w -= g: integer gradients give exact integer changes
  return std::make_shared<SgdPolicy>(optimizer);
}

std::shared_ptr<const UpdatePolicy> adagrad() {
  AdagradConfig config;
  config.schedule.baseLr = 0.1;
  return std::make_shared<AdagradPolicy>(config);
}

// A random push: a few distinct hot keys, sorted, with integer gradients in [-3, 3] times
// `scale`.
struct Push {
  std::vector<Key> keys;
  std::vector<float> grads;
};
Push randomPush(const ReplicaLayout& layout, std::mt19937_64& rng, float scale = 1) {
  std::set<size_t> rows;
  const size_t count = 1 + rng() % 4;
  while (rows.size() < count)
    rows.insert(rng() % layout.size());
  Push push;
  for (size_t i : rows) {
    push.keys.push_back(layout.keys()[i]);
    for (size_t j = 0; j < layout.length(i); ++j)
      push.grads.push_back(scale * static_cast<float>(static_cast<int>(rng() % 7) - 3));
  }
  return push;
}

// Per hot key, the floats of every gradient pushed (summed in doubles: exact for integers).
using GradSums = std::map<Key, std::vector<double>>;
void addPush(const ReplicaLayout& layout, const Push& push, GradSums& sums) {
  size_t at = 0;
  for (Key key : push.keys) {
    const size_t length = layout.length(*layout.indexOf(key));
    std::vector<double>& sum = sums[key];
    sum.resize(length, 0.0);
    for (size_t j = 0; j < length; ++j)
      sum[j] += push.grads[at + j];
    at += length;
  }
}

std::vector<float> initialValues(const ReplicaLayout& layout) {
  std::vector<float> initial(layout.totalLength());
  for (size_t j = 0; j < initial.size(); ++j)
    initial[j] = static_cast<float>(static_cast<int>(j % 9) - 4);
  return initial;
}

// Nodes `ids` of a cluster of `cluster_size` members (ids 0..cluster_size-1) on loopback, all
// connected; a ReplicaShell on each node of `replica_members`, which forwards its node's peer
// events to it. Destruction shuts the nodes down, then destroys the shells.
class ReplicaNodes {
 public:
  struct Options {
    std::vector<NodeId> ids;
    size_t cluster_size = 0;              // 0: ids.size() (then ids must be 0..n-1)
    std::vector<NodeId> replica_members;  // empty: every node here
    std::shared_ptr<const UpdatePolicy> policy = unitSgd();
    ReplicaShellOptions shell;
    // A member declared down leaves the sync for good: only real deaths (closed connections)
    // may end one here, never a slow heartbeat on a loaded machine.
    testsupport::NodeSettings settings{.peer_timeout = std::chrono::milliseconds(60000)};
  };

  explicit ReplicaNodes(Options options) : options_(std::move(options)) {
    if (options_.cluster_size == 0) options_.cluster_size = options_.ids.size();
    if (options_.replica_members.empty()) options_.replica_members = options_.ids;
    layout_ = std::make_shared<const ReplicaLayout>(hotSpace(), hotSpace().allKeys(),
                                                    ShardMap(options_.replica_members),
                                                    options_.policy.get());
    initial_ = initialValues(*layout_);
    for (NodeId id : options_.ids) {
      node::NodeOptions node_options =
          testsupport::nodeOptions(options_.settings, id, options_.cluster_size);
      auto log = std::make_shared<LogCapture>();
      node_options.log_sinks = {log};
      logs_[id] = log;
      nodes_[id] = std::make_unique<node::Node>(node_options);
      const node::Status listening = nodes_[id]->listen();
      EXPECT_TRUE(listening.ok()) << listening.message();
    }
    for (NodeId id : options_.ids) {
      std::vector<node::PeerAddress> peers;
      for (NodeId other : options_.ids) {
        if (other != id) peers.push_back({other, "127.0.0.1", nodes_[other]->port()});
      }
      EXPECT_TRUE(nodes_[id]->connect(peers).ok());
    }
    for (NodeId id : options_.ids) {
      const node::Status ready = nodes_[id]->waitClusterReady(30s);
      EXPECT_TRUE(ready.ok()) << "node " << id << ": " << ready.message();
    }
    for (NodeId id : options_.replica_members) {
      shells_[id] = std::make_unique<ReplicaShell>(*nodes_[id], layout_, initial_, options_.policy,
                                                   options_.shell);
      ReplicaShell* shell = shells_[id].get();
      nodes_[id]->setEventHandler(
          [shell](const node::PeerEvent& event) { shell->onPeerEvent(event); });
      shell->start();
    }
  }

  ~ReplicaNodes() {
    for (auto& [id, node] : nodes_)
      node->shutdown(0ms);
    shells_.clear();
  }

  node::Node& node(NodeId id) { return *nodes_.at(id); }
  ReplicaShell& shell(NodeId id) { return *shells_.at(id); }
  LogCapture& log(NodeId id) { return *logs_.at(id); }
  const ReplicaLayout& layout() const { return *layout_; }
  const std::vector<float>& initial() const { return initial_; }
  const std::vector<NodeId>& members() const { return options_.replica_members; }

  // Kills node `id` for real, as LocalCluster::kill does: every connection closes at once, no
  // Leave (the peers see it go down).
  void kill(NodeId id) { nodes_.at(id)->shutdown(0ms); }
  // Node `id`'s replica service stops answering (a hung process): its shell is gone, its node
  // still runs and drops replica frames.
  void freeze(NodeId id) {
    nodes_.at(id)->setEventHandler({});
    shells_.erase(id);
  }

  // The value floats of every hot key on member `id`, in key order.
  std::vector<float> allValues(NodeId id) {
    std::vector<float> out;
    shell(id).pull(layout_->keys(), out);
    return out;
  }

  // What every replica must hold with unit SGD: the initial values minus every gradient.
  std::vector<float> expected(const GradSums& sums) const {
    std::vector<float> out = initial_;
    for (const auto& [key, sum] : sums) {
      const size_t i = *layout_->indexOf(key);
      size_t begin = 0;  // value offset of row i among the values
      for (size_t r = 0; r < i; ++r)
        begin += layout_->length(r);
      for (size_t j = 0; j < sum.size(); ++j)
        out[begin + j] = static_cast<float>(static_cast<double>(out[begin + j]) - sum[j]);
    }
    return out;
  }

 private:
  Options options_;
  std::shared_ptr<const ReplicaLayout> layout_;
  std::vector<float> initial_;
  std::map<NodeId, std::shared_ptr<LogCapture>> logs_;
  std::map<NodeId, std::unique_ptr<node::Node>> nodes_;
  std::map<NodeId, std::unique_ptr<ReplicaShell>> shells_;
};

std::vector<NodeId> idsUpTo(size_t n) {
  std::vector<NodeId> ids;
  for (size_t i = 0; i < n; ++i)
    ids.push_back(static_cast<NodeId>(i));
  return ids;
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- the codec ----

// A message through the frame encoder and verifier and back, as a receiving node reads it.
ReplicaSyncMessage roundTrip(const ReplicaSyncMessage& message) {
  const node::SharedFrame frame =
      encodeReplicaFrame({.sender = 1, .cluster = "c", .sequence = 1}, replicaSyncFrame(message));
  std::vector<uint8_t> bytes = node::testing::wireBytes(frame);
  EXPECT_TRUE(node::verifyFrame(bytes.data(), frame->envelopeSize(), node::FrameLimits{}).ok());
  const auto* envelope_message = node::envelopeOf(bytes.data()).message();
  const std::span<const uint8_t> view(envelope_message->data(), envelope_message->size());
  EXPECT_TRUE(node::verifyMessage(kReplicaService, view, {}).ok());
  const auto* root = flatbuffers::GetRoot<replica_wire::Message>(view.data());
  EXPECT_EQ(root->body_type(), replica_wire::Body::ReplicaSync);
  // The attachment, copied to float-aligned storage as the receiver's buffer is.
  std::vector<float> attachment(frame->attachmentSize() / sizeof(float));
  std::memcpy(attachment.data(), bytes.data() + frame->envelopeSize(), frame->attachmentSize());
  ReplicaSyncMessage out;
  const auto error = decodeReplicaSync(
      *root->body_as_ReplicaSync(),
      {reinterpret_cast<const uint8_t*>(attachment.data()), frame->attachmentSize()}, out);
  EXPECT_FALSE(error) << *error;
  return out;
}

TEST(ReplicaCodec, ContributionsAndSumsRoundTrip) {
  auto rows = std::make_shared<SparseRows>();
  rows->keys = {3, 101, 200};
  rows->values = {1.5f, -2, 3, 4, 5};
  ReplicaSyncMessage sum{ReplicaSyncKind::kSum, 42, 7, {1, 7, 9}, rows};
  const ReplicaSyncMessage back = roundTrip(sum);
  EXPECT_EQ(back.kind, ReplicaSyncKind::kSum);
  EXPECT_EQ(back.round, 42u);
  EXPECT_EQ(back.part, 7u);
  EXPECT_EQ(back.contributors, sum.contributors);
  EXPECT_EQ(back.rows->keys, rows->keys);
  EXPECT_EQ(back.rows->values, rows->values);

  // An empty contribution (a member that changed nothing of the part) still travels.
  ReplicaSyncMessage empty{
      ReplicaSyncKind::kContribution, 1, 0, {}, std::make_shared<SparseRows>()};
  const ReplicaSyncMessage back_empty = roundTrip(empty);
  EXPECT_EQ(back_empty.kind, ReplicaSyncKind::kContribution);
  EXPECT_TRUE(back_empty.rows->empty());
  EXPECT_TRUE(back_empty.rows->values.empty());
}

TEST(ReplicaCodec, RefusesUnknownKindsAndPartialFloats) {
  flatbuffers::FlatBufferBuilder b;
  const auto keys = b.CreateVector(std::vector<uint64_t>{1});
  b.Finish(replica_wire::CreateReplicaSync(b, static_cast<replica_wire::ReplicaSyncKind>(9), 1, 0,
                                           0, keys));
  const auto* body = flatbuffers::GetRoot<replica_wire::ReplicaSync>(b.GetBufferPointer());
  ReplicaSyncMessage out;
  const float value = 1;
  const auto four = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&value), 4);
  auto error = decodeReplicaSync(*body, four, out);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("unknown kind 9"), std::string::npos) << *error;

  flatbuffers::FlatBufferBuilder c;
  const auto c_keys = c.CreateVector(std::vector<uint64_t>{1});
  c.Finish(replica_wire::CreateReplicaSync(c, replica_wire::ReplicaSyncKind::Sum, 1, 0, 0, c_keys));
  error = decodeReplicaSync(*flatbuffers::GetRoot<replica_wire::ReplicaSync>(c.GetBufferPointer()),
                            four.first(3), out);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("not whole floats"), std::string::npos) << *error;
}

// Hole 3 of issue 27 on the replica path: a NaN or infinity from a peer never reaches a replica.
// A sum carrying one is refused; a contribution carrying one is the member's delta of that part
// dropped (an empty contribution: the round goes on without it), with the values counted.
TEST(ReplicaCodec, RefusesNonFiniteValues) {
  flatbuffers::FlatBufferBuilder b;
  const auto keys = b.CreateVector(std::vector<uint64_t>{1, 2});
  b.Finish(replica_wire::CreateReplicaSync(b, replica_wire::ReplicaSyncKind::Sum, 5, 3, 0, keys));
  const auto* body = flatbuffers::GetRoot<replica_wire::ReplicaSync>(b.GetBufferPointer());
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    const std::vector<float> values = {1, 2, bad, 4};
    ReplicaSyncMessage out;
    const auto error = decodeReplicaSync(
        *body, {reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(float)},
        out);
    ASSERT_TRUE(error) << bad;
    EXPECT_NE(error->find("round-5 part-3 replica sync message holds 1 non-finite value(s)"),
              std::string::npos)
        << *error;
    EXPECT_NE(error->find("is float 2 of its 4"), std::string::npos) << *error;
  }
  const std::vector<float> finite = {1, -2, 3e38f, -0.0f};
  ReplicaSyncMessage out;
  EXPECT_FALSE(decodeReplicaSync(
      *body, {reinterpret_cast<const uint8_t*>(finite.data()), finite.size() * sizeof(float)},
      out));
  EXPECT_EQ(out.dropped_non_finite, 0u);

  flatbuffers::FlatBufferBuilder c;
  const auto c_keys = c.CreateVector(std::vector<uint64_t>{1, 2});
  c.Finish(replica_wire::CreateReplicaSync(c, replica_wire::ReplicaSyncKind::Contribution, 5, 3, 0,
                                           c_keys));
  const auto* contribution = flatbuffers::GetRoot<replica_wire::ReplicaSync>(c.GetBufferPointer());
  const std::vector<float> poisoned = {std::numeric_limits<float>::quiet_NaN(), 2,
                                       std::numeric_limits<float>::infinity(), 4};
  ReplicaSyncMessage dropped;
  EXPECT_FALSE(decodeReplicaSync(
      *contribution,
      {reinterpret_cast<const uint8_t*>(poisoned.data()), poisoned.size() * sizeof(float)},
      dropped));
  EXPECT_EQ(dropped.kind, ReplicaSyncKind::kContribution);
  EXPECT_EQ(dropped.round, 5u);
  EXPECT_EQ(dropped.part, 3u);
  ASSERT_TRUE(dropped.rows);
  EXPECT_TRUE(dropped.rows->keys.empty());
  EXPECT_TRUE(dropped.rows->values.empty());
  EXPECT_EQ(dropped.dropped_non_finite, 2u);
}

// The Verifier checks a vector's length prefix for 4-byte alignment only: keys at an address
// that is 4 but not 8 aligned pass it, and the service's own check refuses them.
TEST(ReplicaCodec, KeysNotAlignedTo8BytesAreRefused) {
  auto rows = std::make_shared<SparseRows>();
  rows->keys = {2, 9};
  rows->values = {1, 2};
  const node::SharedFrame frame =
      encodeReplicaFrame({.sender = 1, .cluster = "c", .sequence = 1},
                         replicaSyncFrame({ReplicaSyncKind::kContribution, 1, 0, {}, rows}));
  const std::vector<uint8_t> bytes = node::testing::wireBytes(frame);
  const auto* message = node::envelopeOf(bytes.data()).message();
  EXPECT_TRUE(replicaVectorsAligned(message->data()));
  std::vector<uint64_t> storage(message->size() / 8 + 2);
  auto* shifted = reinterpret_cast<uint8_t*>(storage.data()) + 4;
  std::memcpy(shifted, message->data(), message->size());
  flatbuffers::Verifier verifier(shifted, message->size());
  EXPECT_TRUE(replica_wire::VerifyMessageBuffer(verifier));
  EXPECT_FALSE(replicaVectorsAligned(shifted));
}

// The service id is fixed on the wire and must be no mode's.
TEST(ReplicaCodec, TheServiceIdIsNoModes) {
  for (const modes::Mode& mode : modes::registry()) {
    if (mode.service != nullptr) {
      EXPECT_NE(mode.service->id, kReplicaServiceId) << mode.name;
    }
  }
  EXPECT_NE(kReplicaServiceId, node::kRuntimeService);
}

// ---- the node's timer, which the shell's sync runs on ----

TEST(NodeTimer, FiresOnTheLoopThreadUntilStopped) {
  ReplicaNodes::Options options;
  options.ids = idsUpTo(1);
  options.replica_members = {0};
  ReplicaNodes cluster(options);
  node::Node& node = cluster.node(0);
  std::mutex mu;
  std::condition_variable fired;
  int count = 0;
  bool off_loop = false;
  const uint64_t timer = node.startTimer(1ms, [&] {
    std::lock_guard lock(mu);
    off_loop |= !node.onLoopThread();
    ++count;
    fired.notify_all();
  });
  ASSERT_NE(timer, 0u);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(fired.wait_for(lock, kLong, [&] { return count >= 3; }));
  }
  node.stopTimer(timer);
  int after_stop = 0;
  {
    std::lock_guard lock(mu);
    after_stop = count;
  }
  // Anything posted after the stop runs after every firing the timer will ever make.
  std::promise<void> flushed;
  ASSERT_TRUE(node.post([&] { flushed.set_value(); }));
  flushed.get_future().wait();
  std::lock_guard lock(mu);
  EXPECT_EQ(count, after_stop);
  EXPECT_FALSE(off_loop);
  node.stopTimer(timer);  // a repeat does nothing
  node.shutdown(0ms);
  EXPECT_EQ(node.startTimer(1ms, [] {}), 0u);  // not running: nothing armed
}

// ---- convergence ----

struct ConvergenceCase {
  size_t nodes;
  bool adagrad;
};

void PrintTo(const ConvergenceCase& c, std::ostream* out) {
  *out << c.nodes << " nodes, " << (c.adagrad ? "AdaGrad" : "SGD");
}

class ReplicaShellConvergence : public ::testing::TestWithParam<ConvergenceCase> {};

// Every node pushes random gradients to random hot keys from its own thread while the timer
// syncs (20 rounds a second), reading its replicas now and then; then every node drains. With
// unit SGD every replica is then exactly the initial values minus every gradient pushed
// anywhere; with AdaGrad the replicas of all nodes agree bit for bit and every accumulator holds
// exactly the squares of every gradient pushed anywhere.
TEST_P(ReplicaShellConvergence, EveryReplicaHoldsEveryPushAfterTheDrain) {
  const ConvergenceCase c = GetParam();
  ReplicaNodes::Options options;
  options.ids = idsUpTo(c.nodes);
  options.policy = c.adagrad ? adagrad() : unitSgd();
  options.shell.syncs_per_second = 20;
  ReplicaNodes cluster(options);

  // What a node's replicas hold when its drain returns (read at once, on its own thread).
  struct Drained {
    node::Status status;
    std::vector<float> values;
    std::map<Key, std::vector<float>> states;
  };
  std::vector<GradSums> sums(c.nodes);
  std::vector<GradSums> squares(c.nodes);
  std::vector<std::future<Drained>> drains;
  for (NodeId id : cluster.members()) {
    drains.push_back(std::async(std::launch::async, [&, id] {
      std::mt19937_64 rng(1000 + 17 * id + c.nodes);
      ReplicaShell& shell = cluster.shell(id);
      for (int step = 0; step < 300; ++step) {
        const Push push = randomPush(cluster.layout(), rng);
        shell.push(push.keys, push.grads, step);
        addPush(cluster.layout(), push, sums[id]);
        Push squared = push;
        for (float& g : squared.grads)
          g *= g;
        addPush(cluster.layout(), squared, squares[id]);
        if (step % 50 == 0) {
          std::vector<float> read;
          shell.pull(push.keys, read);
          EXPECT_EQ(read.size(), push.grads.size());
        }
        // Some steps wait for a round, so that pushes and rounds interleave.
        if (step == 99 || step == 199) {
          const uint64_t round = shell.counters().round;
          EXPECT_TRUE(shell.waitRound(round + 1, kLong));
        }
      }
      Drained drained;
      drained.status = shell.drain(kLong);
      drained.values = cluster.allValues(id);
      for (Key key : cluster.layout().keys())
        drained.states[key] = shell.state(key);
      return drained;
    }));
  }
  std::vector<Drained> results;
  for (auto& drain : drains) {
    results.push_back(drain.get());
    ASSERT_TRUE(results.back().status.ok()) << results.back().status.message();
  }

  GradSums all, all_squares;
  for (size_t m = 0; m < c.nodes; ++m) {
    for (const auto& [key, sum] : sums[m]) {
      auto& acc = all[key];
      acc.resize(sum.size(), 0.0);
      for (size_t j = 0; j < sum.size(); ++j)
        acc[j] += sum[j];
    }
    for (const auto& [key, sum] : squares[m]) {
      auto& acc = all_squares[key];
      acc.resize(sum.size(), 0.0);
      for (size_t j = 0; j < sum.size(); ++j)
        acc[j] += sum[j];
    }
  }
  for (NodeId id : cluster.members()) {
    const Drained& drained = results[id];
    EXPECT_TRUE(sameBits(drained.values, results[0].values))
        << "node " << id << " disagrees with node 0";
    if (!c.adagrad) {
      EXPECT_EQ(drained.values, cluster.expected(all)) << "node " << id;
    } else {
      for (Key key : cluster.layout().keys()) {
        const std::vector<float>& state = drained.states.at(key);
        std::vector<double> want(state.size(), 0.0);
        if (auto it = all_squares.find(key); it != all_squares.end()) want = it->second;
        for (size_t j = 0; j < state.size(); ++j)
          ASSERT_EQ(state[j], static_cast<float>(want[j])) << "node " << id << " key " << key;
      }
    }
    const ReplicaShellCounters counters = cluster.shell(id).counters();
    EXPECT_GE(counters.rounds, 1u);
    EXPECT_EQ(counters.pushes, 300u);
    EXPECT_EQ(counters.lost_deltas, 0u);
    EXPECT_EQ(counters.refused_messages, 0u);
    EXPECT_TRUE(counters.staleness.has_value());
    if (c.nodes > 1) {
      EXPECT_GT(counters.messages_sent, 0u);
      EXPECT_GT(counters.wire_bytes_sent, counters.payload_bytes_sent);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Nodes, ReplicaShellConvergence,
                         ::testing::Values(ConvergenceCase{1, false}, ConvergenceCase{2, false},
                                           ConvergenceCase{3, false}, ConvergenceCase{5, false},
                                           ConvergenceCase{3, true}, ConvergenceCase{5, true}),
                         [](const auto& info) {
                           return std::to_string(info.param.nodes) + "Nodes" +
                                  (info.param.adagrad ? "Adagrad" : "Sgd");
                         });

// Pushes after drain() break its promise.
TEST(ReplicaShell, RefusesBadPushesAndPushesAfterTheDrain) {
  ReplicaNodes::Options options;
  options.ids = idsUpTo(1);
  ReplicaNodes cluster(options);
  ReplicaShell& shell = cluster.shell(0);
  EXPECT_TRUE(shell.isReplicated(0));
  EXPECT_FALSE(shell.isReplicated(50));
  const std::vector<Key> cold{50};
  EXPECT_THROW(shell.push(cold, std::vector<float>{1}), std::invalid_argument);
  const std::vector<Key> unsorted{3, 1};
  std::vector<float> out;
  EXPECT_THROW(shell.pull(unsorted, out), std::invalid_argument);
  const std::vector<Key> one{0};
  EXPECT_THROW(shell.push(one, std::vector<float>{1, 2}), std::invalid_argument);
  shell.push(one, std::vector<float>{2});
  ASSERT_TRUE(shell.drain(kLong).ok());
  EXPECT_EQ(shell.values(0), std::vector<float>{cluster.initial()[0] - 2});
  EXPECT_THROW(shell.push(one, std::vector<float>{1}), std::logic_error);
}

// ---- failures ----

// A node whose replica service stops answering mid-sync (hung), then dies: a round the others
// started waits for it until its death, then finishes among the live nodes, and every survivor
// logs that node's delta as lost. Deterministic: the victim was live when the round started and
// never contributed. Its earlier pushes, synced in round 1, stay; its later ones are lost; every
// survivor's pushes are in every survivor's replicas, exactly.
// A node is pulled into a round before all of its connections are up (in a launch, each node's
// sync starts when its own connections are up, and a contribution pulls the others in): its
// frames to a member not connected yet wait and go out, in order, when that member comes up. Here
// node 0 connects only after nodes 1 and 2 ran a round that needs it: without the held frames
// node 0 would never get its contributions, and nobody's drain would finish.
TEST(ReplicaShell, FramesForAMemberNotConnectedYetWaitForIt) {
  const std::vector<NodeId> ids = {0, 1, 2};
  auto layout = std::make_shared<const ReplicaLayout>(hotSpace(), hotSpace().allKeys(),
                                                      ShardMap(ids), unitSgd().get());
  const std::vector<float> initial = initialValues(*layout);
  const testsupport::NodeSettings settings{.peer_timeout = std::chrono::milliseconds(60000)};
  std::map<NodeId, std::unique_ptr<node::Node>> nodes;
  std::map<NodeId, std::unique_ptr<ReplicaShell>> shells;
  for (NodeId id : ids) {
    nodes[id] = std::make_unique<node::Node>(testsupport::nodeOptions(settings, id, ids.size()));
    ASSERT_TRUE(nodes[id]->listen().ok());
    shells[id] = std::make_unique<ReplicaShell>(*nodes[id], layout, initial, unitSgd(),
                                                ReplicaShellOptions{.syncs_per_second = 0});
    ReplicaShell* shell = shells[id].get();
    nodes[id]->setEventHandler(
        [shell](const node::PeerEvent& event) { shell->onPeerEvent(event); });
  }
  const auto peersOf = [&](NodeId id) {
    std::vector<node::PeerAddress> peers;
    for (NodeId other : ids) {
      if (other != id) peers.push_back({other, "127.0.0.1", nodes[other]->port()});
    }
    return peers;
  };
  // Nodes 1 and 2 connect to each other; node 0, the one that dials them both, not yet.
  ASSERT_TRUE(nodes[1]->connect(peersOf(1)).ok());
  ASSERT_TRUE(nodes[2]->connect(peersOf(2)).ok());
  for (int i = 0; i < 600 && nodes[1]->connectedPeers().empty(); ++i)
    std::this_thread::sleep_for(50ms);  // polling a state, not synchronizing on time
  ASSERT_EQ(nodes[1]->connectedPeers(), std::vector<NodeId>{2});
  // Node 1 pushes and starts round 1: its contribution to node 0 and node 2's (pulled in) wait.
  std::mt19937_64 rng(3);
  const Push push = randomPush(*layout, rng);
  shells[1]->push(push.keys, push.grads);
  shells[1]->syncNow();
  ASSERT_FALSE(shells[1]->waitRound(1, 300ms)) << "round 1 finished without node 0";
  ASSERT_TRUE(nodes[0]->connect(peersOf(0)).ok());
  for (NodeId id : ids) {
    ASSERT_TRUE(nodes[id]->waitClusterReady(30s).ok()) << "node " << id;
  }
  std::vector<std::future<node::Status>> drains;
  for (NodeId id : ids)
    drains.push_back(
        std::async(std::launch::async, [&shells, id] { return shells[id]->drain(kLong); }));
  for (size_t i = 0; i < drains.size(); ++i)
    EXPECT_TRUE(drains[i].get().ok()) << "node " << ids[i];
  GradSums sums;
  addPush(*layout, push, sums);
  std::vector<float> expected = initial;
  for (const auto& [key, sum] : sums) {
    const size_t i = *layout->indexOf(key);
    size_t begin = 0;
    for (size_t r = 0; r < i; ++r)
      begin += layout->length(r);
    for (size_t j = 0; j < sum.size(); ++j)
      expected[begin + j] = static_cast<float>(static_cast<double>(expected[begin + j]) - sum[j]);
  }
  for (NodeId id : ids) {
    std::vector<float> values;
    shells[id]->pull(layout->keys(), values);
    EXPECT_TRUE(sameBits(values, expected)) << "node " << id;
    EXPECT_EQ(shells[id]->counters().send_failures, 0u) << "node " << id;
  }
  for (auto& [id, node] : nodes)
    node->shutdown(0ms);
  shells.clear();
}

TEST(ReplicaShellFailure, ANodeKilledMidSyncIsNamedAndTheOthersGoOn) {
  ReplicaNodes::Options options;
  options.ids = idsUpTo(4);
  options.shell.syncs_per_second = 0;  // rounds only when the test asks
  ReplicaNodes cluster(options);
  const NodeId victim = 2;

  GradSums kept;
  std::mt19937_64 rng(7);
  for (NodeId id : cluster.members()) {
    for (int k = 0; k < 20; ++k) {
      const Push push = randomPush(cluster.layout(), rng);
      cluster.shell(id).push(push.keys, push.grads);
      addPush(cluster.layout(), push, kept);
    }
  }
  cluster.shell(0).syncNow();
  for (NodeId id : cluster.members())
    ASSERT_TRUE(cluster.shell(id).waitRound(1, kLong)) << "node " << id;

  // Round 2: the victim's pushes never leave it.
  for (int k = 0; k < 20; ++k) {
    const Push push = randomPush(cluster.layout(), rng, 1024);
    cluster.shell(victim).push(push.keys, push.grads);
  }
  cluster.freeze(victim);
  for (NodeId id : cluster.members()) {
    if (id == victim) continue;
    const Push push = randomPush(cluster.layout(), rng);
    cluster.shell(id).push(push.keys, push.grads);
    addPush(cluster.layout(), push, kept);
  }
  const uint64_t sent_before = cluster.shell(0).counters().messages_sent;
  cluster.shell(0).syncNow();
  // Node 0 has sent its round-2 contributions: the round is under way.
  const auto deadline = std::chrono::steady_clock::now() + kLong;
  while (cluster.shell(0).counters().messages_sent == sent_before) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "node 0 never started round 2";
    std::this_thread::yield();
  }
  cluster.kill(victim);

  for (NodeId id : {0u, 1u, 3u}) {
    ReplicaShell& shell = cluster.shell(id);
    ASSERT_TRUE(shell.waitRound(2, kLong)) << "node " << id << " hangs";
    EXPECT_TRUE(cluster.log(id).waitForLine({"replica sync round 2", "delta of node 2 is lost"}))
        << cluster.log(id).all();
    EXPECT_TRUE(cluster.log(id).waitForLine({"node 2 is down", "pushes since"}));
    EXPECT_EQ(shell.counters().lost_deltas, 1u);
    EXPECT_EQ(shell.counters().live_members, (std::vector<NodeId>{0, 1, 3}));
  }
  // More pushes after the loss, which only the drain syncs.
  for (NodeId id : {0u, 1u, 3u}) {
    const Push push = randomPush(cluster.layout(), rng);
    cluster.shell(id).push(push.keys, push.grads);
    addPush(cluster.layout(), push, kept);
  }
  std::vector<std::future<node::Status>> drains;
  for (NodeId id : {0u, 1u, 3u}) {
    drains.push_back(
        std::async(std::launch::async, [&, id] { return cluster.shell(id).drain(kLong); }));
  }
  for (auto& drain : drains) {
    const node::Status status = drain.get();
    ASSERT_TRUE(status.ok()) << status.message();
  }
  for (NodeId id : {0u, 1u, 3u})
    EXPECT_EQ(cluster.allValues(id), cluster.expected(kept)) << "node " << id;
}

// Kills at random moments while every node pushes and the timer syncs 200 times a second: the
// survivors never hang (their drain finishes), agree bit for bit, and hold every survivor's
// push exactly. The victim's gradients are multiples of 1024 and the survivors' sums stay far
// below 512, so each float's residue modulo 1024 is the survivors' part whatever of the
// victim's pushes got out.
TEST(ReplicaShellFailure, RandomKillsNeverHangTheSurvivors) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    ReplicaNodes::Options options;
    options.ids = idsUpTo(3);
    options.shell.syncs_per_second = 200;
    ReplicaNodes cluster(options);
    const NodeId victim = static_cast<NodeId>(seed % 3);
    std::mt19937_64 rng(seed);
    const int kill_at = static_cast<int>(20 + rng() % 60);

    std::vector<GradSums> sums(3);
    std::vector<std::thread> trainers;
    std::promise<void> victim_pushed;
    for (NodeId id : cluster.members()) {
      trainers.emplace_back([&, id] {
        std::mt19937_64 local(seed * 31 + id);
        const float scale = id == victim ? 1024 : 1;
        const int steps = id == victim ? kill_at : 40;
        for (int step = 0; step < steps; ++step) {
          Push push = randomPush(cluster.layout(), local, scale);
          if (id != victim) {
            for (float& g : push.grads)
              g = static_cast<float>(static_cast<int>(g) % 2);  // |sum| <= 40 per float
          }
          cluster.shell(id).push(push.keys, push.grads, step);
          if (id != victim) addPush(cluster.layout(), push, sums[id]);
          if (step % 10 == 9)
            cluster.shell(id).waitRound(cluster.shell(id).counters().round + 1, kLong);
        }
        if (id == victim) victim_pushed.set_value();
      });
    }
    victim_pushed.get_future().wait();
    cluster.kill(victim);
    for (std::thread& t : trainers)
      t.join();
    std::vector<NodeId> survivors;
    for (NodeId id : cluster.members()) {
      if (id != victim) survivors.push_back(id);
    }
    std::vector<std::future<node::Status>> drains;
    for (NodeId id : survivors) {
      drains.push_back(
          std::async(std::launch::async, [&, id] { return cluster.shell(id).drain(kLong); }));
    }
    for (auto& drain : drains) {
      const node::Status status = drain.get();
      ASSERT_TRUE(status.ok()) << status.message();
    }
    GradSums kept;
    for (NodeId id : survivors) {
      for (const auto& [key, sum] : sums[id]) {
        auto& acc = kept[key];
        acc.resize(sum.size(), 0.0);
        for (size_t j = 0; j < sum.size(); ++j)
          acc[j] += sum[j];
      }
    }
    const std::vector<float> want = cluster.expected(kept);
    const std::vector<float> first = cluster.allValues(survivors[0]);
    for (NodeId id : survivors) {
      const std::vector<float> values = cluster.allValues(id);
      EXPECT_TRUE(sameBits(values, first)) << "node " << id;
      for (size_t j = 0; j < values.size(); ++j) {
        const double residue = std::fmod(static_cast<double>(values[j]) - want[j], 1024.0);
        ASSERT_EQ(residue, 0.0) << "node " << id << " float " << j << ": " << values[j]
                                << " against " << want[j];
      }
      EXPECT_TRUE(cluster.log(id).waitForLine(
          {"replica sync: node " + std::to_string(victim) + " is down"}));
    }
  }
}

// Bad frames: node 0 is a raw socket that is a member of the cluster but not of the replica
// group (nodes 1, 2, 3). Garbage and a misaligned message close its connection with a log line
// naming it (the runtime's rule for frames that fail verification); a well-formed replica
// message or drain announcement from it is refused with a log line naming it, and so is a
// meaningless message from a member, whose connection stays. The group keeps syncing.
TEST(ReplicaShellBadInput, BadFramesAreRefusedAndTheNodeKeepsServing) {
  ReplicaNodes::Options options;
  options.ids = {1, 2, 3};
  options.cluster_size = 4;
  options.shell.syncs_per_second = 50;
  ReplicaNodes cluster(options);
  const std::string cluster_name = testsupport::NodeSettings{}.cluster;

  auto handshaken = [&] {
    auto raw = std::make_unique<node::testing::RawPeer>(cluster.node(1).port());
    EXPECT_TRUE(raw->connected());
    EXPECT_TRUE(raw->handshake(cluster_name, 0));
    return raw;
  };
  auto rows = std::make_shared<SparseRows>();
  rows->keys = {cluster.layout().keys()[0]};
  rows->values = {1};
  const ReplicaSyncMessage contribution{ReplicaSyncKind::kContribution, 1, 1, {}, rows};
  const node::EnvelopeHeader header{.sender = 0, .cluster = cluster_name, .sequence = 1};

  {  // a well-formed message from a non-member
    auto raw = handshaken();
    raw->sendFrame(encodeReplicaFrame(header, replicaSyncFrame(contribution)));
    EXPECT_TRUE(cluster.log(1).waitForLine({"from node 0", "no other member"}))
        << cluster.log(1).all();
    raw->sendFrame(encodeReplicaFrame(header, replicaDrainFrame(1)));
    EXPECT_TRUE(cluster.log(1).waitForLine({"drain announcement from node 0", "no other member"}));
  }
  {  // garbage in the replica service's message
    auto raw = handshaken();
    std::vector<uint8_t> garbage(64);
    std::mt19937_64 rng(5);
    for (uint8_t& byte : garbage)
      byte = static_cast<uint8_t>(rng());
    const auto frame =
        node::testing::handMadeServiceFrame(0, cluster_name, kReplicaServiceId, garbage);
    raw->sendBytes(frame.data(), frame.size());
    EXPECT_TRUE(raw->waitClosed());
    EXPECT_TRUE(cluster.log(1).waitForLine({"peer 0", "ps-replica message", "Verifier"}))
        << cluster.log(1).all();
  }
  {  // a valid message misaligned within the frame
    auto raw = handshaken();
    const node::SharedFrame valid = encodeReplicaFrame(header, replicaSyncFrame(contribution));
    const std::vector<uint8_t> valid_bytes = node::testing::wireBytes(valid);
    const auto* message = node::envelopeOf(valid_bytes.data()).message();
    const std::vector<uint8_t> message_bytes(message->data(), message->data() + message->size());
    const auto frame =
        node::testing::handMadeServiceFrame(0, cluster_name, kReplicaServiceId, message_bytes, 4);
    raw->sendBytes(frame.data(), frame.size());
    EXPECT_TRUE(raw->waitClosed());
    EXPECT_TRUE(cluster.log(1).waitForLine({"peer 0", "ps-replica message not aligned"}))
        << cluster.log(1).all();
  }
  {  // a meaningless message from a member: a key that is not hot
    auto cold = std::make_shared<SparseRows>();
    cold->keys = {50};
    cold->values = {1};
    ReplicaFrameParts parts =
        replicaSyncFrame({ReplicaSyncKind::kContribution, 1, 1, {}, std::move(cold)});
    node::Node& member = cluster.node(2);
    const node::SharedFrame frame = node::encodeMessage(
        member, parts.type, std::move(parts.write), parts.size_hint, std::move(parts.attachment));
    // The attachment points into the rows: they live until the send completed.
    member.send(1, frame, [rows = parts.rows](NodeId, const node::Status&) {});
    EXPECT_TRUE(cluster.log(1).waitForLine({"replica sync message from node 2", "dropped"}))
        << cluster.log(1).all();
  }
  {  // a member's contribution to a hot key with a NaN: its delta dropped, naming the member
    auto poisoned = std::make_shared<SparseRows>();
    poisoned->keys = {cluster.layout().keys()[0]};
    poisoned->values.assign(cluster.layout().width(0), std::numeric_limits<float>::quiet_NaN());
    ReplicaFrameParts parts =
        replicaSyncFrame({ReplicaSyncKind::kContribution, 1, 1, {}, std::move(poisoned)});
    node::Node& member = cluster.node(3);
    const node::SharedFrame frame = node::encodeMessage(
        member, parts.type, std::move(parts.write), parts.size_hint, std::move(parts.attachment));
    member.send(1, frame, [rows = parts.rows](NodeId, const node::Status&) {});
    EXPECT_TRUE(cluster.log(1).waitForLine(
        {"replica sync: node 3's round-1 delta of part 1", "non-finite value(s)", "dropped"}))
        << cluster.log(1).all();
  }
  EXPECT_GE(cluster.shell(1).counters().refused_messages, 3u);
  EXPECT_EQ(cluster.shell(1).counters().dropped_non_finite, 1u);

  // The group still syncs: pushes everywhere, drained, exact.
  GradSums sums;
  std::mt19937_64 rng(11);
  for (NodeId id : cluster.members()) {
    const Push push = randomPush(cluster.layout(), rng);
    cluster.shell(id).push(push.keys, push.grads);
    addPush(cluster.layout(), push, sums);
  }
  std::vector<std::future<node::Status>> drains;
  for (NodeId id : cluster.members()) {
    drains.push_back(
        std::async(std::launch::async, [&, id] { return cluster.shell(id).drain(kLong); }));
  }
  for (auto& drain : drains) {
    const node::Status status = drain.get();
    ASSERT_TRUE(status.ok()) << status.message();
  }
  for (NodeId id : cluster.members()) {
    EXPECT_EQ(cluster.allValues(id), cluster.expected(sums)) << "node " << id;
    EXPECT_EQ(cluster.shell(id).counters().live_members, (std::vector<NodeId>{1, 2, 3}));
  }
}

// A member whose model diverged pushes NaN into its replicas round after round (issue 25). Its
// deltas are dropped for those rounds, each with a log line naming it, and the sync goes on
// among all three members at its pace: it is never stalled until the member is declared down
// (the peer timeout here is a minute, the drain's deadline two). The others' pushes are all in
// the drained replicas, exactly.
TEST(ReplicaShellNonFinite, AMemberSendingNonFiniteDeltasDoesNotStallTheSync) {
  ReplicaNodes::Options options;
  options.ids = {0, 1, 2};
  options.shell.syncs_per_second = 50;
  ReplicaNodes cluster(options);
  const ReplicaLayout& layout = cluster.layout();
  const std::vector<float> nan(layout.totalLength(), std::numeric_limits<float>::quiet_NaN());
  GradSums sums;
  std::mt19937_64 rng(17);
  constexpr int kRounds = 5;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t seen = cluster.shell(0).counters().round;
    for (NodeId id : {0u, 1u}) {
      const Push push = randomPush(layout, rng);
      cluster.shell(id).push(push.keys, push.grads);
      addPush(layout, push, sums);
    }
    cluster.shell(2).push(layout.keys(), nan);
    // Two rounds later node 2's push was in a round's delta (node 2 runs at most one round
    // ahead of node 0): the next iteration's lands in a later round.
    ASSERT_TRUE(cluster.shell(0).waitRound(seen + 2, kLong)) << "round " << r;
  }
  std::vector<std::future<node::Status>> drains;
  for (NodeId id : {0u, 1u, 2u}) {
    drains.push_back(
        std::async(std::launch::async, [&, id] { return cluster.shell(id).drain(kLong); }));
  }
  for (auto& drain : drains) {
    const node::Status status = drain.get();
    ASSERT_TRUE(status.ok()) << status.message();
  }
  for (NodeId id : {0u, 1u}) {
    EXPECT_EQ(cluster.allValues(id), cluster.expected(sums)) << "node " << id;
    EXPECT_EQ(cluster.shell(id).counters().live_members, (std::vector<NodeId>{0, 1, 2}));
    EXPECT_EQ(cluster.shell(id).counters().lost_deltas, 0u) << "node " << id;
  }
  EXPECT_EQ(cluster.shell(2).counters().dropped_non_finite, static_cast<uint64_t>(kRounds));
  EXPECT_TRUE(cluster.log(2).waitForLine(
      {"replica sync: this node's (node 2) delta of round", "non-finite", "dropped"}))
      << cluster.log(2).all();
}

}  // namespace
}  // namespace chorus::ps
