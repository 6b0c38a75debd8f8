// The relocation core's wire (ps/relocation_codec.h) and its network shell
// (ps/relocation_shell.h) without sockets: every message kind survives the trip through its
// table, malformed tables are refused with the reason, and frames a FrameDecoder verified reach
// the shell's real handlers through Node::deliverForTesting, where garbage is refused with a log
// line naming the peer and changes nothing. The shell over the network is trained end to end in
// tests/ps/sparse_ps_test.cc (SparsePsLapse).
#include "ps/relocation_shell.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <future>

#include "node/frame.h"
#include "node/node.h"
#include "ps/ps_service.h"
#include "ps/relocation_codec.h"
#include "tests/node/test_util.h"

namespace chorus::ps {
namespace {

KeySpace twoTables() {
  KeySpace space;
  space.addTable("entities", 10, 3);
  space.addTable("relations", 4, 2);
  return space;
}

// Writes `messages` as their table, verifies the message as a peer would, and reads it back.
std::optional<std::string> roundTrip(const std::vector<RelocationBody>& messages,
                                     const KeySpace& space, RelocationFrame& out) {
  flatbuffers::FlatBufferBuilder b;
  const flatbuffers::Offset<void> body = writeRelocation(b, messages);
  wire::MessageBuilder root(b);
  root.add_body(body);
  root.add_body_type(relocationWireBody(messages.front()));
  b.Finish(root.Finish());
  flatbuffers::Verifier verifier(b.GetBufferPointer(), b.GetSize());
  EXPECT_TRUE(wire::VerifyMessageBuffer(verifier));
  return readRelocation(*flatbuffers::GetRoot<wire::Message>(b.GetBufferPointer()), space, out);
}

TEST(RelocationCodec, EveryMessageKindSurvivesTheTrip) {
  const KeySpace space = twoTables();
  KeyEntry row;
  row.values = {1, 2, 3};
  row.state = {4, 5, 6};
  row.updates = 7;
  KeyEntry relation_row;
  relation_row.values = {8, 9};
  relation_row.updates = 1;
  const std::vector<std::vector<RelocationBody>> batches = {
      {LocalizeRequest{3}, LocalizeRequest{11}},
      {HandOver{3, 2, 5, 4}, HandOver{12, 1, 9, 0}},
      {Transfer{3, 5, row}, Transfer{12, 6, relation_row}},
      {KeyPush{3, 1, 17, 4, {0.5f, 0.25f, -1}}, KeyPush{13, 2, 18, 5, {1, 2}}},
      {KeyPull{3, 1, 19}, KeyPull{10, 0, 20}},
      {PushApplied{3, 17, 2, 5}},
      {PullAnswer{10, 20, 1, 3, {7, 6}}},
      {Refusal{RefusedKind::kTransfer, 3, 0, "not asked for"},
       Refusal{RefusedKind::kPull, 4, 21, "no such key"}},
      {LocalizeAccepted{3, 5, 2}},
      {TransferLost{3, 5, 2}},
      {RowLost{3, 5, 2}},
      {TransferQuery{3, 5}},
      {NoHandOver{3, 5}},
      {OpLost{3, 17, 2}},
  };
  for (const auto& batch : batches) {
    RelocationFrame out;
    ASSERT_EQ(roundTrip(batch, space, out), std::nullopt) << relocationKindName(batch.front());
    ASSERT_EQ(out.messages.size(), batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      EXPECT_EQ(out.messages[i].index(), batch[i].index());
      EXPECT_EQ(relocationKey(out.messages[i]), relocationKey(batch[i]));
    }
  }
  // Field by field for the ones that carry rows.
  RelocationFrame out;
  ASSERT_EQ(roundTrip(batches[2], space, out), std::nullopt);
  const auto& t = std::get<Transfer>(out.messages[0]);
  EXPECT_EQ(t.version, 5u);
  EXPECT_EQ(t.row.values, row.values);
  EXPECT_EQ(t.row.state, row.state);
  EXPECT_EQ(t.row.updates, 7u);
  EXPECT_TRUE(std::get<Transfer>(out.messages[1]).row.state.empty());
  out = {};
  ASSERT_EQ(roundTrip(batches[3], space, out), std::nullopt);
  const auto& p = std::get<KeyPush>(out.messages[1]);
  EXPECT_EQ(p.origin, 2u);
  EXPECT_EQ(p.op, 18u);
  EXPECT_EQ(p.clock, 5);
  EXPECT_EQ(p.grad, (std::vector<float>{1, 2}));
  out = {};
  ASSERT_EQ(roundTrip(batches[1], space, out), std::nullopt);
  const auto& h = std::get<HandOver>(out.messages[0]);
  EXPECT_EQ(h.to, 2u);
  EXPECT_EQ(h.version, 5u);
  EXPECT_EQ(h.from_version, 4u);
}

TEST(RelocationCodec, MalformedTablesAreRefusedWithTheReason) {
  const KeySpace space = twoTables();
  RelocationFrame out;
  // A gradient for a key outside the space cannot even be sized.
  auto error = roundTrip({KeyPush{99, 1, 1, 0, {1, 2, 3}}}, space, out);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("key 99 is outside the key space"), std::string::npos) << *error;
  // A row of the wrong length: the floats do not add up.
  KeyEntry short_row;
  short_row.values = {1, 2};
  error = roundTrip({Transfer{3, 1, short_row}}, space, out);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("floats of values"), std::string::npos) << *error;
  // Vectors of different lengths.
  flatbuffers::FlatBufferBuilder b;
  const std::vector<uint64_t> keys = {1, 2};
  const std::vector<uint32_t> to = {1};
  const std::vector<uint64_t> versions = {1, 2};
  const auto body = wire::CreateRelocHandOverDirect(b, &keys, &to, &versions, &versions);
  b.Finish(wire::CreateMessage(b, wire::Body::RelocHandOver, body.Union()));
  error = readRelocation(*flatbuffers::GetRoot<wire::Message>(b.GetBufferPointer()), space, out);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("differ in length"), std::string::npos) << *error;
  EXPECT_TRUE(out.messages.empty());
}

// Frames from peer `from` to a shell whose node never listens, through the real decoder.
class ShellSeam : public ::testing::Test {
 protected:
  ShellSeam() : node_(options()), space_(twoTables()) {
    KeyStore store(space_, std::make_shared<SgdPolicy>(OwnerOptimizer{}));
    const KeyDirectory directory(map_, space_);
    for (Key key = 0; key < space_.keyEnd(); ++key) {
      if (directory.owner(key) != 0) continue;
      KeyEntry entry;
      entry.values.assign(space_.length(key), 0.5f);
      EXPECT_EQ(store.insert(key, std::move(entry)), std::nullopt);
    }
    held_ = store.size();
    shell_ = std::make_unique<RelocationShell>(node_, map_, std::move(store), members_,
                                               RelocationShellOptions{});
  }
  node::NodeOptions options() {
    node::NodeOptions o;
    o.log_sinks = {log_};
    o.cluster = "reloc-seam";
    o.self = 0;
    o.members = {0, 1, 2};
    return o;
  }
  void deliver(NodeId from, wire::Body kind, const node::BodyWriter& write_body) {
    const node::EnvelopeHeader header{.sender = from, .cluster = "reloc-seam", .sequence = 1};
    const node::SharedFrame frame =
        node::encodeFrame(header, messageType(kind), messageWriter(kind, write_body));
    std::vector<uint8_t> bytes;
    for (auto piece : frame->pieces())
      bytes.insert(bytes.end(), piece.begin(), piece.end());
    node::FrameDecoder decoder(node::FrameLimits{});
    decoder.setServices([](node::ServiceId id) -> const node::ServiceSpec* {
      return id == kPsServiceId ? &kPsService : nullptr;
    });
    int delivered = 0;
    const node::Status status =
        decoder.consume(bytes.data(), bytes.size(), [&](node::InboundFrame&& in) {
          delivered += node_.deliverForTesting(from, in) ? 1 : 0;
          return true;
        });
    ASSERT_TRUE(status.ok()) << status.message();
    EXPECT_EQ(delivered, 1);
  }
  void deliverMessages(NodeId from, std::vector<RelocationBody> messages) {
    deliver(from, relocationWireBody(messages.front()),
            [&](flatbuffers::FlatBufferBuilder& b) { return writeRelocation(b, messages); });
  }

  std::shared_ptr<node::testing::LogCapture> log_ = std::make_shared<node::testing::LogCapture>();
  std::vector<NodeId> members_{0, 1, 2};
  ShardMap map_{members_};
  node::Node node_;
  KeySpace space_;
  size_t held_ = 0;
  std::unique_ptr<RelocationShell> shell_;
};

TEST_F(ShellSeam, GarbageFramesAreRefusedNamingThePeerAndChangeNothing) {
  const KeyDirectory directory(map_, space_);
  Key mine = 0, theirs = 0;
  for (Key key = 0; key < space_.keyEnd(); ++key) {
    if (directory.owner(key) == 0) mine = key;
    if (directory.owner(key) == 1) theirs = key;
  }
  // A table whose gradient does not fit its key.
  deliverMessages(1, {KeyPush{mine, 1, 1, 0, {1.0f}}});
  // A key outside the space.
  deliverMessages(2, {KeyPull{999, 2, 1}});
  // A transfer nobody asked for.
  KeyEntry row;
  row.values.assign(space_.length(theirs), 1.0f);
  deliverMessages(1, {Transfer{theirs, 3, row}});
  // A hand-over from a node that is not the key's home.
  deliverMessages(2, {HandOver{mine, 1, 4, 0}});
  // A localize of a key at a node that is not its home.
  deliverMessages(2, {LocalizeRequest{theirs}});
  // A non-finite gradient.
  deliverMessages(1,
                  {KeyPush{mine, 1, 2, 0, std::vector<float>(space_.length(mine), std::nanf(""))}});
  // A frame from a node that is no member.
  deliverMessages(7, {LocalizeRequest{mine}});
  EXPECT_EQ(shell_->stats().refused_from_peers, 7u);
  const std::string lines = log_->all();
  EXPECT_NE(lines.find("refused from node 1"), std::string::npos) << lines;
  EXPECT_NE(lines.find("refused from node 2"), std::string::npos) << lines;
  EXPECT_NE(lines.find("refused from node 7"), std::string::npos) << lines;
  EXPECT_NE(lines.find("floats of gradients"), std::string::npos) << lines;
  EXPECT_NE(lines.find("not finite"), std::string::npos) << lines;
  // Nothing changed: the rows held here are the ones it started with, at their values.
  shell_->inspect([&](const Relocation& core) {
    EXPECT_EQ(core.store().size(), held_);
    EXPECT_TRUE(core.holds(mine));
    EXPECT_FALSE(core.holds(theirs));
    for (const float v : core.store().valuesOf(mine))
      EXPECT_FLOAT_EQ(v, 0.5f);
  });
  // And it keeps serving: a good push from node 1 is applied.
  deliverMessages(1, {KeyPush{mine, 1, 3, 0, std::vector<float>(space_.length(mine), 1.0f)}});
  shell_->inspect(
      [&](const Relocation& core) { EXPECT_EQ(core.store().copyRow(mine)->updates, 1u); });
}

// Two shells over loopback: a push node 1 makes before its connection to the key's home is up
// is held, not lost, and reaches node 0 once the nodes connect (the shell used to send it with
// no callback, and the worker waited for its answer for good).
TEST(RelocationShellNetwork, AFrameToAPeerNotConnectedYetWaitsForTheConnection) {
  const std::vector<NodeId> members{0, 1};
  const ShardMap map(members);
  const KeySpace space = twoTables();
  const KeyDirectory directory(map, space);
  Key homed_at_0 = space.keyEnd();
  for (Key key = 0; key < space.keyEnd() && homed_at_0 == space.keyEnd(); ++key)
    if (directory.owner(key) == 0) homed_at_0 = key;
  ASSERT_LT(homed_at_0, space.keyEnd());

  auto log = std::make_shared<node::testing::LogCapture>();
  // The nodes go first (shut down, no handler left running) when the test ends early.
  std::vector<std::unique_ptr<RelocationShell>> shells;
  std::vector<std::unique_ptr<node::Node>> nodes;
  for (const NodeId self : members) {
    node::NodeOptions o = node::testing::fastOptions("reloc-held", self, members);
    o.log_sinks = {log};
    nodes.push_back(std::make_unique<node::Node>(o));
    KeyStore store(space, std::make_shared<SgdPolicy>(OwnerOptimizer{}));
    for (Key key = 0; key < space.keyEnd(); ++key) {
      if (directory.owner(key) != self) continue;
      KeyEntry entry;
      entry.values.assign(space.length(key), 0.5f);
      ASSERT_EQ(store.insert(key, std::move(entry)), std::nullopt);
    }
    shells.push_back(std::make_unique<RelocationShell>(*nodes.back(), map, std::move(store),
                                                       members, RelocationShellOptions{}));
    RelocationShell* shell = shells.back().get();
    nodes.back()->setEventHandler([shell](const node::PeerEvent& e) { shell->onPeerEvent(e); });
    ASSERT_TRUE(nodes.back()->listen().ok());
  }

  // Node 1 pushes to node 0's key while the two are not connected: the frame has to wait.
  const std::vector<Key> keys{homed_at_0};
  const std::vector<float> grads(space.length(homed_at_0), 1.0f);
  const RelocationShell::Handle handle = shells[1]->push(keys, grads);
  shells[1]->inspect([](const Relocation&) {});  // the loop took the push and tried to send it
  EXPECT_NE(log->all().find("node 0 is not connected yet"), std::string::npos) << log->all();
  auto waited = std::async(std::launch::async, [&] { return shells[1]->wait(handle); });

  for (const NodeId self : members) {
    std::vector<node::PeerAddress> peers;
    for (const NodeId other : members)
      if (other != self) peers.push_back({other, "127.0.0.1", nodes[other]->port()});
    ASSERT_TRUE(nodes[self]->connect(peers).ok());
  }
  const bool answered = waited.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  if (!answered) shells[1]->cancelAll(node::Status(node::ErrorCode::kTimeout, "test deadline"));
  const node::Status status = waited.get();
  EXPECT_TRUE(answered) << "the push held for node 0 never reached it";
  EXPECT_TRUE(status.ok()) << status.message();
  shells[0]->inspect(
      [&](const Relocation& core) { EXPECT_EQ(core.store().copyRow(homed_at_0)->updates, 1u); });
  for (auto& n : nodes)
    n->shutdown();
}

// waitWorkerClock (rotation's hand-off, ps/rotation_driver.h): node 0 waits for node 1's clock
// alone; node 1 announces it only once its push before it was applied at node 0, so when the
// wait returns the push is in the row. A wait for a node that went down ends with an error, and
// one for a node that is not a member at once.
TEST(RelocationShellNetwork, WaitingForOneWorkersClockSeesItsPushesAndEndsWhenItGoesDown) {
  const std::vector<NodeId> members{0, 1};
  const ShardMap map(members);
  const KeySpace space = twoTables();
  const KeyDirectory directory(map, space);
  Key homed_at_0 = space.keyEnd();
  for (Key key = 0; key < space.keyEnd() && homed_at_0 == space.keyEnd(); ++key)
    if (directory.owner(key) == 0) homed_at_0 = key;
  ASSERT_LT(homed_at_0, space.keyEnd());
  std::vector<std::unique_ptr<RelocationShell>> shells;
  std::vector<std::unique_ptr<node::Node>> nodes;
  for (const NodeId self : members) {
    nodes.push_back(
        std::make_unique<node::Node>(node::testing::fastOptions("reloc-wait", self, members)));
    KeyStore store(space, std::make_shared<SgdPolicy>(OwnerOptimizer{}));
    for (Key key = 0; key < space.keyEnd(); ++key) {
      if (directory.owner(key) != self) continue;
      KeyEntry entry;
      entry.values.assign(space.length(key), 0.5f);
      ASSERT_EQ(store.insert(key, std::move(entry)), std::nullopt);
    }
    shells.push_back(std::make_unique<RelocationShell>(*nodes.back(), map, std::move(store),
                                                       members, RelocationShellOptions{}));
    RelocationShell* shell = shells.back().get();
    nodes.back()->setEventHandler([shell](const node::PeerEvent& e) { shell->onPeerEvent(e); });
    ASSERT_TRUE(nodes.back()->listen().ok());
  }
  for (const NodeId self : members) {
    std::vector<node::PeerAddress> peers;
    for (const NodeId other : members)
      if (other != self) peers.push_back({other, "127.0.0.1", nodes[other]->port()});
    ASSERT_TRUE(nodes[self]->connect(peers).ok());
  }
  EXPECT_TRUE(shells[0]->waitWorkerClock(1, 0).ok()) << "every worker starts at clock 0";
  EXPECT_EQ(shells[0]->waitWorkerClock(7, 1).code(), node::ErrorCode::kInvalidArgument);

  auto waited = std::async(std::launch::async, [&] { return shells[0]->waitWorkerClock(1, 1); });
  const std::vector<Key> keys{homed_at_0};
  const std::vector<float> grads(space.length(homed_at_0), 1.0f);
  const RelocationShell::Handle push = shells[1]->push(keys, grads);
  shells[1]->clock();
  const bool answered = waited.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  if (!answered) shells[0]->cancelAll(node::Status(node::ErrorCode::kTimeout, "test deadline"));
  const node::Status status = waited.get();
  ASSERT_TRUE(answered) << "node 1's clock 1 never reached node 0";
  EXPECT_TRUE(status.ok()) << status.message();
  shells[0]->inspect(
      [&](const Relocation& core) { EXPECT_EQ(core.store().copyRow(homed_at_0)->updates, 1u); });
  EXPECT_TRUE(shells[1]->wait(push).ok());
  EXPECT_TRUE(shells[1]->waitWorkerClock(1, 1).ok()) << "its own announcement";

  // Node 1 goes down before clock 5: the wait ends, with the reason.
  auto never = std::async(std::launch::async, [&] { return shells[0]->waitWorkerClock(1, 5); });
  nodes[1]->shutdown();
  const bool ended = never.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  if (!ended) shells[0]->cancelAll(node::Status(node::ErrorCode::kTimeout, "test deadline"));
  const node::Status gone = never.get();
  EXPECT_TRUE(ended) << "the wait for a node that went down did not end";
  EXPECT_FALSE(gone.ok());
  EXPECT_NE(gone.message().find("node 1"), std::string::npos) << gone.message();
  for (auto& n : nodes)
    n->shutdown();
}

}  // namespace
}  // namespace chorus::ps
