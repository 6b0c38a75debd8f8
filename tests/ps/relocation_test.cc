// Lapse-style relocation (ps/relocation.h) one step at a time: each test fixes the order in
// which the simulated network (relocation_cluster.h) delivers the messages, to check one rule of
// the protocol, the handling of bad messages from peers, and what a node's death does.
#include "ps/relocation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tests/ps/relocation_cluster.h"

namespace chorus::ps {
namespace {

using namespace chorus::ps::testing;  // NOLINT(google-build-using-namespace)

// --- The protocol, one step at a time --------------------------------------------------------

TEST(Relocation, ALocalizeIsThreeMessagesAndMovesTheRowWithItsOptimizerState) {
  AdagradConfig adagrad;
  adagrad.schedule.baseLr = 0.1;
  Cluster c(3, smallSpace(40, 4), std::make_shared<AdagradPolicy>(adagrad));
  const NodeId home = 0, old_owner = 1, requester = 2;
  const Key key = keyHomedAt(c, home);

  // Node 1 takes the key from its home: the home holds it, so two messages do (and the notice
  // that names the giver).
  c.node(old_owner).localize(key);
  EXPECT_EQ(kindOf(c.link(old_owner, home).front()), "localize");
  c.deliver(old_owner, home);
  ASSERT_EQ(c.link(home, old_owner).size(), 2u);
  EXPECT_EQ(kindOf(c.link(home, old_owner).front()), "localize-accepted");
  EXPECT_EQ(kindOf(c.link(home, old_owner).back()), "transfer");
  c.deliverAll();
  ASSERT_TRUE(c.node(old_owner).holds(key));
  const std::vector<float> grad{1.0f, -2.0f, 0.5f, 3.0f};
  c.node(old_owner).push(key, grad, 0);
  const KeyEntry before = *c.node(old_owner).store().copyRow(key);
  ASSERT_NE(before.state, std::vector<float>(4, 0.0f));

  // Node 2 takes it from node 1: requester -> home -> old owner -> requester. The home's notice
  // to the requester (who gives the row) is off that path.
  const uint64_t op = c.node(requester).localize(key);
  EXPECT_EQ(c.inFlight(), std::vector<std::string>{"2->0:localize"});
  c.deliver(requester, home);
  EXPECT_EQ(c.inFlight(), (std::vector<std::string>{"0->1:hand-over", "0->2:localize-accepted"}));
  EXPECT_EQ(c.node(home).directoryOwner(key), requester);  // the home changed its entry first
  c.deliver(home, old_owner);
  EXPECT_EQ(c.inFlight(), (std::vector<std::string>{"0->2:localize-accepted", "1->2:transfer"}));
  EXPECT_FALSE(c.node(old_owner).holds(key));
  c.deliver(old_owner, requester);  // the row may come before the notice
  EXPECT_TRUE(c.node(requester).holds(key));
  EXPECT_FALSE(c.node(requester).idle());  // it still expects the notice
  c.deliver(home, requester);
  EXPECT_TRUE(c.node(requester).idle());
  EXPECT_EQ(c.messagesInFlight(), 0u);

  ASSERT_TRUE(c.node(requester).holds(key));
  const KeyEntry after = *c.node(requester).store().copyRow(key);
  EXPECT_EQ(after.values, before.values);
  EXPECT_EQ(after.state, before.state);  // AdaGrad's sums of squares came along
  EXPECT_EQ(after.updates, 1u);
  EXPECT_EQ(c.node(requester).heldVersion(key), c.node(home).directoryVersion(key));
  const auto done = c.take(requester, op);
  ASSERT_TRUE(done);
  EXPECT_EQ(done->error, std::nullopt);
  EXPECT_TRUE(c.errors().empty());

  // The next AdaGrad step at the new owner is the one the old owner would have taken.
  KeyStore reference(c.space(), std::make_shared<AdagradPolicy>(adagrad));
  ASSERT_EQ(reference.insert(key, before), std::nullopt);
  const Key keys[1] = {key};
  reference.apply(keys, grad, 1);
  c.node(requester).push(key, grad, 1);
  EXPECT_EQ(c.node(requester).store().copyRow(key)->values, reference.copyRow(key)->values);
}

TEST(Relocation, OperationsOnAKeyInTransferWaitAndAreAppliedInOrder) {
  Cluster c(3, smallSpace(40, 3), counting());
  const NodeId home = 0, requester = 1, other = 2;
  const Key key = keyHomedAt(c, home);
  c.node(requester).localize(key);
  c.deliver(requester, home);  // the transfer is on its way to node 1
  c.deliver(home, requester);  // after the notice that names its giver

  // Node 2's push goes to the home, which sends it on to the owner its directory names.
  const uint64_t remote = c.node(other).push(key, std::vector<float>{0, 0, 100}, 0);
  c.deliver(other, home);
  ASSERT_EQ(c.link(home, requester).size(), 2u);  // the transfer, then the push
  const uint64_t p1 = c.node(requester).push(key, std::vector<float>{1, 0, 0}, 0);
  const uint64_t read = c.node(requester).pull(key, 0);
  const uint64_t p2 = c.node(requester).push(key, std::vector<float>{2, 0, 0}, 0);
  EXPECT_EQ(c.node(requester).queuedOps(key), 3u);
  EXPECT_TRUE(c.completions(requester).empty());

  c.deliver(home, requester);  // the row: the three local operations, in order
  EXPECT_EQ(c.node(requester).queuedOps(key), 0u);
  ASSERT_TRUE(c.take(requester, p1));
  const auto pulled = c.take(requester, read);
  ASSERT_TRUE(pulled);
  EXPECT_EQ(pulled->values, (std::vector<float>{1, 0, 0}));  // after p1, before p2
  ASSERT_TRUE(c.take(requester, p2));
  c.deliverAll();  // the forwarded push reached the new owner after the row
  EXPECT_EQ(c.node(requester).store().copyRow(key)->values, (std::vector<float>{3, 0, 100}));
  const auto applied = c.take(other, remote);
  ASSERT_TRUE(applied);
  EXPECT_EQ(applied->error, std::nullopt);
  EXPECT_EQ(c.node(requester).stats().queued, 3u);
  EXPECT_TRUE(c.errors().empty());
}

TEST(Relocation, ALocalizeThatArrivesDuringATransferIsPassedOnWhenTheRowComes) {
  Cluster c(3, smallSpace(40, 3), counting());
  const NodeId home = 0, first = 1, second = 2;
  const Key key = keyHomedAt(c, home);
  c.node(first).localize(key);
  c.node(second).localize(key);
  c.deliver(first, home);   // home -> 1: notice, transfer
  c.deliver(second, home);  // home -> 1: hand-over to node 2, behind the transfer
  ASSERT_EQ(c.link(home, first).size(), 3u);
  c.deliver(home, first);  // the notice
  EXPECT_EQ(c.node(home).directoryOwner(key), second);

  // The home's messages to node 1 are FIFO, so the transfer comes first; node 1's own push,
  // made while the row travels, is applied there before the row goes on.
  const uint64_t push = c.node(first).push(key, std::vector<float>{0, 5, 0}, 0);
  c.deliver(home, first);
  EXPECT_TRUE(c.node(first).holds(key));
  ASSERT_TRUE(c.take(first, push));
  c.deliver(home, first);  // the hand-over
  EXPECT_FALSE(c.node(first).holds(key));
  EXPECT_EQ(c.inFlight(), (std::vector<std::string>{"0->2:localize-accepted", "1->2:transfer"}));
  c.deliverAll();
  EXPECT_EQ(c.holder(key), second);
  EXPECT_EQ(c.node(second).store().copyRow(key)->values, (std::vector<float>{0, 5, 0}));
  EXPECT_TRUE(c.errors().empty());
}

TEST(Relocation, AHandOverThatOvertakesItsRowWaitsAtTheOldOwnerAndFollowsIt) {
  // The hand-over to node 2 reaches node 1 before node 1's own row does (they come from
  // different nodes): node 1 notes it and passes the row on right after it arrived.
  Cluster c(4, smallSpace(60, 2), counting());
  const NodeId home = 0, holder = 3, first = 1, second = 2;
  const Key key = keyHomedAt(c, home);
  c.node(holder).localize(key);
  c.deliverAll();
  ASSERT_TRUE(c.node(holder).holds(key));

  c.node(first).localize(key);
  c.node(second).localize(key);
  c.deliver(first, home);   // home -> 3: hand-over to 1 (and home -> 1: the notice)
  c.deliver(second, home);  // home -> 1: hand-over to 2
  c.deliver(home, first);   // the notice
  c.deliver(home, first);   // the hand-over arrives before the row: noted
  EXPECT_EQ(c.node(first).awaiting(key), 1u);
  const uint64_t pull = c.node(first).pull(key, 0);
  c.deliver(home, holder);  // node 3 sends the row to node 1
  c.deliver(holder, first);
  EXPECT_EQ(c.node(first).stats().passed_through, 1u);
  ASSERT_TRUE(c.take(first, pull));  // served during the row's short stay
  c.deliverAll();
  EXPECT_EQ(c.holder(key), second);
  EXPECT_EQ(c.node(home).directoryOwner(key), second);
  for (NodeId n = 0; n < c.size(); ++n)
    EXPECT_TRUE(c.node(n).idle()) << "node " << n;
  EXPECT_TRUE(c.errors().empty());
}

TEST(Relocation, TheLocationCacheShortensRemoteAccessAndAStaleEntryIsForwarded) {
  Cluster c(3, smallSpace(40, 2), counting());
  const NodeId home = 0, owner = 1, reader = 2;
  const Key key = keyHomedAt(c, home);
  c.node(owner).localize(key);
  c.deliverAll();

  // First access: reader -> home -> owner -> reader; the answer names the owner.
  uint64_t op = c.node(reader).pull(key, 0);
  EXPECT_EQ(c.inFlight(), std::vector<std::string>{"2->0:pull"});
  c.deliverAll();
  ASSERT_TRUE(c.take(reader, op));
  EXPECT_EQ(c.node(reader).cachedOwner(key), owner);
  // Then straight to the owner.
  op = c.node(reader).push(key, std::vector<float>{1, 1}, 0);
  EXPECT_EQ(c.inFlight(), std::vector<std::string>{"2->1:push"});
  c.deliverAll();
  ASSERT_TRUE(c.take(reader, op));
  EXPECT_EQ(c.node(reader).stats().cache_hits, 1u);

  // The key moves home; the reader's entry is stale: the old owner forwards the push along
  // the row's way (its own entry), and the answer corrects the cache.
  c.node(home).localize(key);
  c.deliverAll();
  ASSERT_TRUE(c.node(home).holds(key));
  op = c.node(reader).push(key, std::vector<float>{2, 2}, 0);
  EXPECT_EQ(c.inFlight(), std::vector<std::string>{"2->1:push"});
  c.deliver(reader, owner);
  EXPECT_EQ(c.inFlight(), std::vector<std::string>{"1->0:push"});
  c.deliverAll();
  const auto done = c.take(reader, op);
  ASSERT_TRUE(done);
  EXPECT_EQ(done->error, std::nullopt);
  EXPECT_EQ(c.node(home).store().copyRow(key)->values, (std::vector<float>{3, 3}));
  EXPECT_EQ(c.node(reader).cachedOwner(key), home);
  EXPECT_EQ(c.node(reader).stats().cache_hits, 2u);
  EXPECT_TRUE(c.errors().empty());
}

TEST(Relocation, ALocalizeOfAKeyHeldHereOrAlreadyOnItsWayCompletesWithoutNewMessages) {
  Cluster c(2, smallSpace(20, 2), counting());
  const Key mine = keyHomedAt(c, 0);
  const Key theirs = keyHomedAt(c, 1);
  const uint64_t here = c.node(0).localize(mine);
  ASSERT_TRUE(c.take(0, here));
  EXPECT_EQ(c.messagesInFlight(), 0u);
  const uint64_t a = c.node(0).localize(theirs);
  const uint64_t b = c.node(0).localize(theirs);
  EXPECT_EQ(c.messagesInFlight(), 1u);  // one request for both
  c.deliverAll();
  EXPECT_TRUE(c.take(0, a));
  EXPECT_TRUE(c.take(0, b));
  EXPECT_TRUE(c.node(0).holds(theirs));
}

// --- SSP at the reader -----------------------------------------------------------------------

TEST(Relocation, APullWaitsUntilEveryWorkerAnnouncedItsMinimumClock) {
  Cluster c(2, smallSpace(20, 2), counting(), /*gate_reads=*/true);
  const Key key = keyHomedAt(c, 1);
  // Worker 1 pushes at clock 0 and announces clock 1 once the push was applied.
  const uint64_t push = c.node(1).push(key, std::vector<float>{0, 4}, 0);
  ASSERT_TRUE(c.take(1, push));
  // Worker 0 at clock 1 with staleness 0 reads with min_clock 1: it waits for worker 1.
  c.announce(0, 1);
  const uint64_t read = c.node(0).pull(key, 1);
  EXPECT_EQ(c.messagesInFlight(), 1u);  // worker 0's clock note to node 1 only
  c.deliverAll();
  EXPECT_FALSE(c.take(0, read));
  c.announce(1, 1);
  c.deliverAll();
  const auto answer = c.take(0, read);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->values, (std::vector<float>{0, 4}));
  EXPECT_NE(c.node(0).workerClock(1, 0), std::nullopt);  // a clock going back
  EXPECT_NE(c.node(0).workerClock(7, 3), std::nullopt);  // no such worker
}

// --- Bad input from peers ----------------------------------------------------------------------

// Everything about one key and the node's own state that a bad message must leave alone.
struct Snapshot {
  std::vector<Key> held;
  std::vector<std::optional<NodeId>> directory;
  std::vector<uint32_t> awaiting;
  size_t completions = 0;
  bool operator==(const Snapshot&) const = default;
};
Snapshot snapshot(Cluster& c, NodeId n) {
  Snapshot s;
  s.held = c.node(n).store().ownedKeys();
  for (Key k : c.space().allKeys()) {
    s.directory.push_back(c.node(n).directoryOwner(k));
    s.awaiting.push_back(c.node(n).awaiting(k));
  }
  s.completions = c.completions(n).size();
  return s;
}

// Hands `body` from `from` to node `to`; expects an error naming the peer and containing
// `what`, a Refusal back to `from`, and nothing else changed.
void expectRefused(Cluster& c, NodeId from, NodeId to, RelocationBody body,
                   const std::string& what) {
  const Snapshot before = snapshot(c, to);
  const std::optional<std::string> error = c.node(to).receive(from, std::move(body));
  ASSERT_TRUE(error) << what;
  EXPECT_NE(error->find("node " + std::to_string(from)), std::string::npos) << *error;
  EXPECT_NE(error->find(what), std::string::npos) << *error;
  const std::vector<Outgoing> out = c.node(to).takeOutgoing();
  ASSERT_EQ(out.size(), 1u) << *error;
  EXPECT_EQ(out[0].to, from);
  ASSERT_TRUE(std::holds_alternative<Refusal>(out[0].body));
  EXPECT_EQ(std::get<Refusal>(out[0].body).reason, *error);
  EXPECT_TRUE(c.node(to).takeCompletions().empty());
  EXPECT_EQ(snapshot(c, to), before) << *error;
}

TEST(Relocation, BadMessagesFromPeersGetARefusalNamingThePeerAndChangeNothing) {
  Cluster c(3, smallSpace(40, 3), counting());
  const Key at0 = keyHomedAt(c, 0);
  const Key other0 = keyHomedAt(c, 0, 1);
  const Key at1 = keyHomedAt(c, 1);
  const Key missing = 40;
  // Node 2 owns `at0`; node 1 waits for `other0`, whose request is still on its way.
  c.node(2).localize(at0);
  c.deliverAll();
  ASSERT_TRUE(c.node(2).holds(at0));
  c.node(1).localize(other0);
  c.collect();
  ASSERT_EQ(c.node(1).awaiting(other0), 1u);
  KeyEntry row;
  row.values = {1, 2, 3};
  row.state = {0};

  // Localize: unknown key, wrong home, a requester that owns the key already.
  expectRefused(c, 2, 0, LocalizeRequest{missing}, "does not exist");
  expectRefused(c, 2, 0, LocalizeRequest{at1}, "its home is node 1");
  expectRefused(c, 2, 0, LocalizeRequest{at0}, "owns already");
  // Hand-over: from a node that is not the home, of a key neither held nor awaited, of a
  // version the row here does not have, to a node that is no member.
  expectRefused(c, 1, 2, HandOver{at0, 1, 9, 1}, "node 0 is its home");
  expectRefused(c, 0, 1, HandOver{at0, 2, 9, 1}, "neither holds nor awaits");
  expectRefused(c, 0, 2, HandOver{at0, 1, 9, 4}, "the row here is at version");
  expectRefused(c, 0, 2, HandOver{at0, 7, 9, 1}, "to node 7");
  expectRefused(c, 0, 2, HandOver{missing, 1, 9, 1}, "does not exist");
  // Transfer: not asked for, unknown key, a row or a state of the wrong length.
  expectRefused(c, 2, 0, Transfer{at1, 3, row}, "did not ask for");
  expectRefused(c, 2, 1, Transfer{missing, 3, row}, "does not exist");
  KeyEntry short_row = row;
  short_row.values.pop_back();
  expectRefused(c, 2, 1, Transfer{other0, 3, short_row}, "with 2 floats; the row has 3");
  KeyEntry no_state = row;
  no_state.state.clear();
  expectRefused(c, 2, 1, Transfer{other0, 3, no_state}, "0 floats of optimizer state");
  // Pushes and pulls: unknown key, gradient of the wrong length or not finite, no such origin.
  expectRefused(c, 1, 0, KeyPush{missing, 1, 5, 0, {1, 2, 3}}, "does not exist");
  expectRefused(c, 1, 0, KeyPush{at0, 1, 5, 0, {1, 2}}, "with 2 floats; the row has 3");
  expectRefused(c, 1, 0, KeyPush{at0, 1, 5, 0, {1, NAN, 3}}, "not finite");
  expectRefused(c, 1, 0, KeyPush{at0, 9, 5, 0, {1, 2, 3}}, "from node 9");
  expectRefused(c, 1, 0, KeyPull{missing, 1, 5}, "does not exist");
  // Answers to operations that were never sent, or in another node's name.
  expectRefused(c, 0, 1, PushApplied{at0, 77, 0, 0}, "has not sent");
  const uint64_t pull = c.node(1).pull(at0, 0);
  c.collect();
  expectRefused(c, 0, 1, PullAnswer{at0, pull, 2, 1, {1, 2, 3}}, "in the name of node 2");
  expectRefused(c, 0, 1, PullAnswer{at0, pull, 0, 1, {1, 2}}, "with 2 floats; the row has 3");
  expectRefused(c, 0, 1, PullAnswer{at0, pull + 1, 0, 1, {1, 2, 3}}, "has not sent");
  // Failure notices: an acceptance from a node that is not the home or for no request, a
  // row said lost by a node that does not give it, a loss reported to a node that is not the
  // home, a query about a key homed here or unknown, answers about unknown keys.
  expectRefused(c, 2, 1, LocalizeAccepted{other0, 5, 2}, "it is not the home");
  expectRefused(c, 0, 1, LocalizeAccepted{at0, 5, 2}, "did not send");
  expectRefused(c, 2, 0, TransferLost{at0, 5, 2}, "awaits no such row");
  expectRefused(c, 2, 1, RowLost{at0, 5, 2}, "is not its home");
  expectRefused(c, 2, 0, TransferQuery{at0, 5}, "is homed here");
  expectRefused(c, 2, 0, TransferQuery{missing, 5}, "does not exist");
  expectRefused(c, 2, 0, NoHandOver{missing, 5}, "does not exist");
  expectRefused(c, 2, 0, OpLost{missing, 5, 1}, "no such key");
  // A message from no member: an error, no answer.
  EXPECT_NE(c.node(0).receive(9, LocalizeRequest{at0}), std::nullopt);
  EXPECT_TRUE(c.node(0).takeOutgoing().empty());

  // The nodes keep serving: everything in flight completes as if nothing had happened.
  c.deliverAll();
  ASSERT_TRUE(c.take(1, pull));
  EXPECT_TRUE(c.node(1).holds(other0));
  for (Key k : c.space().allKeys())
    EXPECT_TRUE(c.holder(k));
  for (NodeId n = 0; n < c.size(); ++n)
    EXPECT_TRUE(c.node(n).idle()) << "node " << n;
}

// --- A node that goes down ------------------------------------------------------------------

TEST(Relocation, AnOwnerThatGoesDownLosesItsKeysAndNobodyWaitsForThem) {
  Cluster c(3, smallSpace(60, 2), counting());
  const NodeId home = 0, survivor = 1, dead = 2;
  const Key moved = keyHomedAt(c, home);           // node 2 takes it: lost with node 2
  const Key in_transfer = keyHomedAt(c, home, 1);  // node 2 is sending it to node 1
  const Key stays = keyHomedAt(c, home, 2);        // never moves
  const Key homed_at_dead = keyHomedAt(c, dead);
  c.node(dead).localize(moved);
  c.node(dead).localize(in_transfer);
  c.deliverAll();
  const uint64_t localize = c.node(survivor).localize(in_transfer);
  c.deliver(survivor, home);
  c.deliver(home, survivor);  // the notice: the row comes from node 2
  c.deliver(home, dead);      // node 2 sent the row to node 1: it dies with the link
  ASSERT_EQ(c.inFlight(), std::vector<std::string>{"2->1:transfer"});
  // Node 1 pushes `in_transfer` (queued for the row), and `moved` and `stays` (on their way via
  // the home).
  const uint64_t queued = c.node(survivor).push(in_transfer, std::vector<float>{1, 1}, 0);
  const uint64_t push_moved = c.node(survivor).push(moved, std::vector<float>{1, 1}, 0);
  const uint64_t push_stays = c.node(survivor).push(stays, std::vector<float>{1, 1}, 0);
  c.collect();

  c.dropLinksOf(dead);
  const DownReport at_home = c.node(home).peerDown(dead);
  EXPECT_EQ(at_home.lost, std::vector<Key>{moved});
  EXPECT_EQ(at_home.handed_over, std::vector<Key>{in_transfer});
  const DownReport at_survivor = c.node(survivor).peerDown(dead);
  EXPECT_TRUE(at_survivor.lost.empty());
  EXPECT_EQ(at_survivor.given_up, std::vector<Key>{in_transfer});  // its giver is gone
  EXPECT_TRUE(at_survivor.waiting.empty());
  EXPECT_EQ(at_survivor.failed_ops, 2u);  // the two pushes on the network
  for (uint64_t op : {queued, localize}) {
    const auto died = c.take(survivor, op);
    ASSERT_TRUE(died);
    ASSERT_TRUE(died->error);
    EXPECT_NE(died->error->find("died with node 2 on its way to node 1"), std::string::npos)
        << *died->error;
  }
  for (uint64_t op : {push_moved, push_stays}) {
    const auto failed = c.take(survivor, op);
    ASSERT_TRUE(failed);
    ASSERT_TRUE(failed->error);
    EXPECT_NE(failed->error->find("node 2 went down"), std::string::npos) << *failed->error;
    EXPECT_NE(failed->error->find("may or may not have been applied"), std::string::npos);
  }
  // The push of `stays` was applied after all: its late answer is dropped, not an error. The
  // survivor's RowLost tells the home that `in_transfer` is gone too.
  c.deliverAll();
  EXPECT_TRUE(c.errors().empty()) << c.errors().front();
  EXPECT_TRUE(c.completions(survivor).empty());
  EXPECT_EQ(c.node(home).store().copyRow(stays)->values, (std::vector<float>{1, 1}));

  // Later operations and localizes of the lost keys fail at once, naming the dead node.
  std::vector<std::pair<NodeId, uint64_t>> ops;
  for (Key k : {moved, in_transfer}) {
    ops.emplace_back(survivor, c.node(survivor).pull(k, 0));
    ops.emplace_back(survivor, c.node(survivor).localize(k));
    ops.emplace_back(home, c.node(home).push(k, std::vector<float>{1, 1}, 0));
  }
  c.deliverAll();
  for (auto [n, op] : ops) {
    const auto failed = c.take(n, op);
    ASSERT_TRUE(failed) << "node " << n << " operation " << op;
    ASSERT_TRUE(failed->error);
    EXPECT_NE(failed->error->find("was lost with node 2"), std::string::npos) << *failed->error;
  }
  // A key whose home is down cannot move, and pulls of it routed to its home fail.
  const uint64_t stuck = c.node(survivor).localize(homed_at_dead);
  const auto refused = c.take(survivor, stuck);
  ASSERT_TRUE(refused);
  ASSERT_TRUE(refused->error);
  EXPECT_NE(refused->error->find("its home, node 2, is down"), std::string::npos);
  const auto unreachable = c.take(survivor, c.node(survivor).pull(homed_at_dead, 0));
  ASSERT_TRUE(unreachable);
  EXPECT_TRUE(unreachable->error);
  // The rest goes on as before, and nobody waits for anything.
  const uint64_t ok = c.node(survivor).push(stays, std::vector<float>{2, 2}, 1);
  c.deliverAll();
  const auto applied = c.take(survivor, ok);
  ASSERT_TRUE(applied);
  EXPECT_EQ(applied->error, std::nullopt);
  EXPECT_EQ(c.node(home).store().copyRow(stays)->values, (std::vector<float>{3, 3}));
  EXPECT_TRUE(c.errors().empty());
  EXPECT_TRUE(c.node(home).idle());
  EXPECT_TRUE(c.node(survivor).idle());
}

TEST(Relocation, ARowThatDiesOnItsWayTakesTheLocalizesQueuedBehindItDownWithIt) {
  // Node 3 holds the key; node 1 localizes it, then node 2 (noted at node 1 as a hand-over).
  // Node 3 dies before sending the row: node 1 gives up, tells node 2, and both tell the home.
  Cluster c(4, smallSpace(60, 2), counting());
  const NodeId home = 0, first = 1, second = 2, dead = 3;
  const Key key = keyHomedAt(c, home);
  c.node(dead).localize(key);
  c.deliverAll();
  c.node(first).localize(key);
  c.node(second).localize(key);
  c.deliver(first, home);
  c.deliver(second, home);
  c.deliver(home, first);   // the notice (giver: node 3)
  c.deliver(home, first);   // the hand-over to node 2: noted
  c.deliver(home, second);  // the notice (giver: node 1)
  const uint64_t waiting = c.node(second).pull(key, 0);
  c.dropLinksOf(dead);
  for (NodeId n : {home, second, first})
    c.node(n).peerDown(dead);
  c.deliverAll();
  const auto failed = c.take(second, waiting);
  ASSERT_TRUE(failed);
  ASSERT_TRUE(failed->error);
  EXPECT_NE(failed->error->find("died with node 3"), std::string::npos) << *failed->error;
  for (NodeId n : {home, first, second})
    EXPECT_TRUE(c.node(n).idle()) << "node " << n;
  const uint64_t after = c.node(first).localize(key);
  c.deliverAll();
  const auto refused = c.take(first, after);
  ASSERT_TRUE(refused);
  ASSERT_TRUE(refused->error);
  EXPECT_NE(refused->error->find("was lost with node 3"), std::string::npos);
  EXPECT_TRUE(c.errors().empty()) << c.errors().front();
}

}  // namespace
}  // namespace chorus::ps
