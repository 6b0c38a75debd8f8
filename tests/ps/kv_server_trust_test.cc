// What an owner trusts of a member (issue 27): how many of its requests may wait here, and how
// far ahead its announced clock may be. Frames are verified by a FrameDecoder and delivered to
// the owner's real handlers through Node::deliverForTesting on a node that never listens (the
// seam of tests/fuzz/fuzz_ps_messages.cc): no sockets, no timing.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "node/node.h"
#include "ps/codec.h"
#include "ps/key_runs.h"
#include "ps/kv_server.h"

namespace chorus::ps {
namespace {

// One owner (node 0 of members 0, 1, 2) whose log is kept, and frames from the other members.
class Owner {
 public:
  explicit Owner(ServerOptions server_options) {
    node::NodeOptions options;
    options.cluster = "trust";
    options.self = 0;
    options.members = members_;
    options.log_sinks = {std::make_shared<spdlog::sinks::ostream_sink_mt>(log_)};
    node_ = std::make_unique<node::Node>(options);
    OwnerOptimizer optimizer;
    optimizer.sgd.momentum = 0;
    optimizer.schedule.baseLr = 0.5;
    server_ = std::make_unique<KvServer>(
        *node_, KeyStore(space_, map_, 0, std::vector<float>(space_.total(), 0.5f), optimizer),
        members_, std::move(server_options));
    mine_ = server_->store().ownedKeys();
  }
  ~Owner() {
    server_.reset();
    node_.reset();
  }

  void deliver(NodeId from, PsMessage message) {
    const node::EnvelopeHeader header{.sender = from, .cluster = "trust", .sequence = ++sequence_};
    const node::SharedFrame frame = ps::encodeFrame(header, std::move(message));
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
          delivered += node_->deliverForTesting(from, in) ? 1 : 0;
          return true;
        });
    ASSERT_TRUE(status.ok()) << status.message();
    ASSERT_EQ(delivered, 1);
  }
  void clock(NodeId from, Clock clock) { deliver(from, clockAnnouncement(clock)); }
  void pull(NodeId from, uint64_t id, Clock clock, Clock min_clock) {
    deliver(from, pullRequest(id, clock, min_clock, mine_));
  }
  void push(NodeId from, uint64_t id, Clock clock, float grad) {
    const std::vector<float> grads(space_.floatsOf(mine_), grad);
    const std::vector<std::span<const float>> pieces{grads};
    deliver(from, pushRequest(id, clock, mine_, pieces, grads.size(), /*attach=*/false));
  }
  // A push of all of this owner's keys named by slot, as if the store had `layout`.
  void pushBySlots(NodeId from, uint64_t id, Clock clock, uint64_t layout, float grad) {
    std::vector<KeyStore::Run> runs;
    ASSERT_EQ(server_->store().locate(mine_, std::nullopt, nullptr, runs), std::nullopt);
    std::vector<SlotRun> slots;
    KeyStore::slotRunsOf(runs, slots);
    std::vector<uint8_t> encoded;
    encodeSlotRuns(slots, encoded);
    const std::vector<float> grads(space_.floatsOf(mine_), grad);
    const std::vector<std::span<const float>> pieces{grads};
    deliver(from, ps::pushBySlots(id, clock, encoded, layout, pieces));
  }
  Clock clockOf(NodeId worker) const {
    for (const WorkerView& view : server_->workerViews()) {
      if (view.worker == worker) return view.clock;
    }
    return -1;
  }

  KvServer& server() { return *server_; }
  const std::vector<Key>& mine() const { return mine_; }
  std::string log() const { return log_.str(); }

 private:
  const std::vector<NodeId> members_{0, 1, 2};
  const KeySpace space_{ChunkLayout{24, 4}};
  const ShardMap map_{members_};
  std::ostringstream log_;
  std::unique_ptr<node::Node> node_;
  std::unique_ptr<KvServer> server_;
  std::vector<Key> mine_;
  uint64_t sequence_ = 0;
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Node 1 parks pulls for a clock nobody reached: three wait, the fourth and fifth are refused
// with a log line naming it; another member still parks its own; once the clock comes, the
// waiting ones are answered and node 1 may park again.
TEST(KvServerTrust, PullsParkedByOnePeerAreCappedAndTheRestRefusedNamingIt) {
  ServerOptions options;
  options.max_parked_per_worker = 3;
  Owner owner(options);
  owner.clock(1, 1);
  owner.clock(2, 1);
  // Node 0's own worker is at clock 0: a pull that needs clock 1 waits.
  for (uint64_t id = 1; id <= 5; ++id)
    owner.pull(1, id, 1, 1);
  EXPECT_EQ(owner.server().summary().parked, 3u);
  EXPECT_EQ(owner.server().summary().errors, 2u);
  EXPECT_TRUE(contains(owner.log(),
                       "refused a Pull request from node 1: pull refused: node 1 already has 3 "
                       "request(s) waiting here"))
      << owner.log();
  owner.pull(2, 6, 1, 1);  // the cap is per peer
  EXPECT_EQ(owner.server().summary().parked, 4u);
  EXPECT_EQ(owner.server().summary().errors, 2u);
  EXPECT_EQ(owner.server().summary().pulls, 0u);

  EXPECT_EQ(owner.server().clock(0, 1), std::nullopt);  // every parked pull is answered
  EXPECT_EQ(owner.server().summary().pulls, 4u);
  owner.clock(1, 2);
  for (uint64_t id = 7; id <= 9; ++id)
    owner.pull(1, id, 2, 2);
  EXPECT_EQ(owner.server().summary().parked, 7u);
  EXPECT_EQ(owner.server().summary().errors, 2u);
  // A pull that need not wait is never refused by the cap.
  owner.pull(1, 10, 2, 1);
  EXPECT_EQ(owner.server().summary().pulls, 5u);
  EXPECT_EQ(owner.server().summary().errors, 2u);
}

// A restarted owner holds requests until its keys are back: those count against the same cap,
// pushes included, and the held ones are applied after the restore.
TEST(KvServerTrust, RequestsHeldBeforeARestoreAreCappedPerPeer) {
  ServerOptions options;
  options.max_parked_per_worker = 2;
  options.hold_until_restored = true;
  Owner owner(options);
  owner.push(1, 1, 3, 1.0f);
  owner.push(1, 2, 3, 1.0f);
  owner.push(1, 3, 3, 1.0f);
  owner.pull(1, 4, 3, 1);
  EXPECT_EQ(owner.server().summary().errors, 2u);
  EXPECT_TRUE(contains(owner.log(),
                       "refused a Push request from node 1: push refused: node 1 already has 2 "
                       "request(s) waiting here"))
      << owner.log();
  const std::vector<float> restored(owner.mine().size() * 4, 10.0f);
  EXPECT_EQ(
      owner.server().restore(owner.mine(), restored, {{0, 3, true}, {1, 3, true}, {2, 3, true}}),
      std::nullopt);
  EXPECT_EQ(owner.server().summary().pushes, 2u);
  std::vector<float> value(restored.size());
  owner.server().store().copyTo(owner.mine(), value.data());
  for (float v : value)
    EXPECT_FLOAT_EQ(v, 10.0f - 2 * 0.5f * 1.0f);
}

// A member that claims a far-future clock (an impostor, or a bug) while the others wait for
// it: the claim is refused with a log line naming it, its clock stays, and the read parked for
// it stays parked until its real clock comes. A lead within the bound is taken.
TEST(KvServerTrust, AFarFutureClockDoesNotReleaseReadsParkedForItsSender) {
  ServerOptions options;
  options.max_clock = 1000;
  options.max_lead = leadLimit(Staleness::read("2").value());
  ASSERT_EQ(options.max_lead, 2 * 3 + kLeadSlack);
  Owner owner(options);
  for (Clock c = 1; c <= 5; ++c) {
    EXPECT_EQ(owner.server().clock(0, c), std::nullopt);
    owner.clock(2, c);
  }
  owner.clock(1, 1);
  owner.pull(2, 1, 5, 3);  // SSP 2 at clock 5: waits until node 1 reaches clock 3
  ASSERT_EQ(owner.server().summary().parked, 1u);

  owner.clock(1, 900);  // within the run's 1000 clocks, far beyond any worker's reach
  EXPECT_EQ(owner.server().summary().pulls, 0u) << "the far-future clock released the read";
  EXPECT_EQ(owner.clockOf(1), 1);
  EXPECT_EQ(owner.server().summary().errors, 1u);
  EXPECT_TRUE(contains(owner.log(),
                       "refused a Clock request from node 1: PsClock at clock 900 from node 1 "
                       "runs 895 clock(s) ahead of node 0 (at clock 5)"))
      << owner.log();
  EXPECT_TRUE(owner.server().summary().skipped.empty());

  owner.clock(1, 3);  // its real clock
  EXPECT_EQ(owner.server().summary().pulls, 1u);
  EXPECT_EQ(owner.clockOf(1), 3);
  // The bound itself: node 0 and node 2 are at clock 5, so 5 + 70 is the furthest.
  owner.clock(1, 5 + options.max_lead + 1);
  EXPECT_EQ(owner.clockOf(1), 3);
  EXPECT_EQ(owner.server().summary().errors, 2u);
  owner.clock(1, 5 + options.max_lead);
  EXPECT_EQ(owner.clockOf(1), 5 + options.max_lead);
  EXPECT_EQ(owner.server().summary().errors, 2u);
  // The same jump under asynchronous staleness (no read waits) is no error.
  EXPECT_EQ(leadLimit(Staleness::read("inf").value()), Staleness::kInfinite);
}

// A worker's push named by slot reaches an owner whose rows moved (here: an owner that
// restarted, with a new layout): the stale reply makes the worker send it again by keys, and by
// then it may have announced its next clock (pushes are not waited for before it). That one
// re-send is taken; another push of the old clock is still refused as going backwards.
TEST(KvServerTrust, APushAnsweredStaleIsTakenOnceByKeysAfterTheNextClock) {
  Owner owner(ServerOptions{});
  owner.clock(1, 3);
  owner.pushBySlots(1, 7, 3, owner.server().store().layout() + 1, 1.0f);
  EXPECT_EQ(owner.server().summary().errors, 1u);  // the stale reply
  owner.clock(1, 4);
  owner.push(1, 7, 3, 1.0f);
  EXPECT_EQ(owner.server().summary().pushes, 1u);
  EXPECT_EQ(owner.server().summary().errors, 1u);
  owner.push(1, 7, 3, 1.0f);  // the same request again: a replay
  owner.push(1, 8, 3, 1.0f);  // another push of the old clock
  EXPECT_EQ(owner.server().summary().pushes, 1u);
  EXPECT_EQ(owner.server().summary().errors, 3u);
  EXPECT_TRUE(contains(owner.log(), "push at clock 3 but node 1 already reached clock 4"))
      << owner.log();
  std::vector<float> value(owner.mine().size() * 4);
  owner.server().store().copyTo(owner.mine(), value.data());
  for (float v : value)
    EXPECT_FLOAT_EQ(v, 0.5f - 0.5f * 1.0f);
}

}  // namespace
}  // namespace chorus::ps
