// Lapse-style relocation (ps/relocation.h) without a network: nodes exchange messages through a
// simulated network held here, which delivers them in an order the test chooses. Per-link FIFO
// is assumed (the real transport is TCP); across links any order goes, which is what random
// delays produce. The message-level tests fix one order to check a step of the protocol; the
// property test draws the order from a seeded RNG, hundreds of times, with several workers
// localizing the same keys while they push and pull, and checks at every quiescent point that
// each key has exactly one owner (the one its home names), that every push was applied exactly
// once with its optimizer state, and, at every read, SSP.
#include "ps/relocation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace chorus::ps {
namespace {

// w += g, exactly in floats for small integers, and one float of state that counts the pushes
// applied: the state has to travel with the row for the count to come out right.
class CountingPolicy final : public UpdatePolicy {
 public:
  std::string_view name() const override { return "counting"; }
  size_t stateFloats(size_t) const override { return 1; }
  void initState(std::span<float> state) const override { state[0] = 0.0f; }
  void applyPush(int64_t, std::span<const RowUpdate> rows) const override {
    for (const RowUpdate& row : rows) {
      for (size_t i = 0; i < row.values.size(); ++i)
        row.values[i] += row.grad[i];
      row.state[0] += 1.0f;
    }
  }
  void applyClockSum(int64_t clock, std::span<const RowUpdate> rows) const override {
    applyPush(clock, rows);
  }
  bool stepsPerClock() const override { return false; }
};

// A worker's clock announcement, on the same links as the relocation messages.
struct ClockNote {
  WorkerId worker = 0;
  Clock clock = 0;
};
using Wire = std::variant<RelocationBody, ClockNote>;

// N nodes and the messages between them, per directed link in FIFO order.
class Cluster {
 public:
  Cluster(size_t nodes, KeySpace space, std::shared_ptr<const UpdatePolicy> policy,
          bool gate_reads = false, size_t cache_capacity = size_t{1} << 16)
      : space_(std::move(space)) {
    std::vector<NodeId> ids;
    for (NodeId n = 0; n < nodes; ++n)
      ids.push_back(n);
    map_.emplace(ids);
    std::vector<WorkerId> workers;
    if (gate_reads) workers.assign(ids.begin(), ids.end());
    for (NodeId n : ids) {
      KeyStore store(space_, policy);
      for (Key key : space_.allKeys()) {
        if (map_->home(key) != n) continue;
        KeyEntry row;
        row.values.assign(space_.length(key), 0.0f);
        EXPECT_EQ(store.insert(key, std::move(row)), std::nullopt);
      }
      nodes_.push_back(std::make_unique<Relocation>(*map_, std::move(store),
                                                    RelocationOptions{n, workers, cache_capacity}));
    }
    completions_.resize(nodes);
  }

  Relocation& node(NodeId n) { return *nodes_[n]; }
  size_t size() const { return nodes_.size(); }
  const ShardMap& map() const { return *map_; }
  const KeySpace& space() const { return space_; }

  // Moves every node's outgoing messages onto the links and its completions to completions(n).
  void collect() {
    for (NodeId n = 0; n < nodes_.size(); ++n) {
      if (dead_.count(n)) continue;
      for (Outgoing& out : nodes_[n]->takeOutgoing())
        links_[{n, out.to}].push_back(Wire(std::move(out.body)));
      for (Completion& c : nodes_[n]->takeCompletions())
        completions_[n].push_back(std::move(c));
    }
  }
  void announce(WorkerId worker, Clock clock) {
    for (NodeId n = 0; n < nodes_.size(); ++n) {
      if (n == worker) {
        EXPECT_EQ(nodes_[n]->workerClock(worker, clock), std::nullopt);
      } else {
        links_[{worker, n}].push_back(ClockNote{worker, clock});
      }
    }
    collect();
  }

  // The messages waiting on the link from -> to, oldest first.
  const std::deque<Wire>& link(NodeId from, NodeId to) {
    collect();
    return links_[{from, to}];
  }
  // Kinds of every message in flight, "from->to:kind", per link in order.
  std::vector<std::string> inFlight() {
    collect();
    std::vector<std::string> out;
    for (const auto& [link, queue] : links_) {
      for (const Wire& w : queue) {
        const char* kind = std::holds_alternative<ClockNote>(w)
                               ? "clock"
                               : relocationKindName(std::get<RelocationBody>(w));
        out.push_back(std::to_string(link.first) + "->" + std::to_string(link.second) + ":" + kind);
      }
    }
    return out;
  }
  size_t messagesInFlight() {
    collect();
    size_t n = 0;
    for (const auto& [link, queue] : links_)
      n += queue.size();
    return n;
  }
  // Delivers the oldest message of from -> to; its error, if the receiver refused it.
  std::optional<std::string> deliver(NodeId from, NodeId to) {
    collect();
    std::deque<Wire>& queue = links_[{from, to}];
    EXPECT_FALSE(queue.empty()) << from << "->" << to;
    if (queue.empty()) return std::nullopt;
    Wire w = std::move(queue.front());
    queue.pop_front();
    if (dead_.count(to)) return std::nullopt;  // the transport drops it
    std::optional<std::string> error;
    if (auto* note = std::get_if<ClockNote>(&w)) {
      error = nodes_[to]->workerClock(note->worker, note->clock);
    } else {
      error = nodes_[to]->receive(from, std::move(std::get<RelocationBody>(w)));
    }
    if (error) errors_.push_back(*error);
    collect();
    return error;
  }
  // Delivers one message of a link drawn at random among the non-empty ones.
  bool deliverRandom(std::mt19937_64& rng) {
    collect();
    std::vector<std::pair<NodeId, NodeId>> busy;
    for (const auto& [link, queue] : links_) {
      if (!queue.empty()) busy.push_back(link);
    }
    if (busy.empty()) return false;
    const auto [from, to] = busy[rng() % busy.size()];
    deliver(from, to);
    return true;
  }
  // Delivers until nothing is in flight, in link order.
  void deliverAll() {
    collect();
    for (bool any = true; any;) {
      any = false;
      for (auto& [link, queue] : links_) {
        if (queue.empty()) continue;
        deliver(link.first, link.second);
        any = true;
        break;
      }
    }
  }
  // `node` stops: what it sent and what was on its way to it is gone, and so is all it would
  // send from now on.
  void kill(NodeId node) {
    collect();
    dead_.insert(node);
    dropLinksOf(node);
  }
  bool dead(NodeId node) const { return dead_.count(node) > 0; }
  void dropLinksOf(NodeId node) {
    for (auto& [link, queue] : links_) {
      if (link.first == node || link.second == node) queue.clear();
    }
  }

  std::vector<Completion>& completions(NodeId n) {
    collect();
    return completions_[n];
  }
  // The completion of operation `op` at node `n`, taken out; nullopt while it has not come.
  std::optional<Completion> take(NodeId n, uint64_t op) {
    collect();
    auto& list = completions_[n];
    auto it =
        std::find_if(list.begin(), list.end(), [&](const Completion& c) { return c.op == op; });
    if (it == list.end()) return std::nullopt;
    Completion c = std::move(*it);
    list.erase(it);
    return c;
  }
  const std::vector<std::string>& errors() const { return errors_; }

  // The one node holding `key`, or nullopt (with a test failure) when none or several do.
  std::optional<NodeId> holder(Key key) {
    std::optional<NodeId> found;
    for (NodeId n = 0; n < nodes_.size(); ++n) {
      if (!nodes_[n]->holds(key)) continue;
      EXPECT_FALSE(found) << "key " << key << " held by node " << *found << " and node " << n;
      found = n;
    }
    EXPECT_TRUE(found) << "key " << key << " is held nowhere";
    return found;
  }

 private:
  KeySpace space_;
  std::optional<ShardMap> map_;
  std::vector<std::unique_ptr<Relocation>> nodes_;
  std::map<std::pair<NodeId, NodeId>, std::deque<Wire>> links_;
  std::vector<std::vector<Completion>> completions_;
  std::vector<std::string> errors_;
  std::set<NodeId> dead_;
};

KeySpace smallSpace(size_t keys, size_t row_floats) {
  KeySpace space;
  space.addTable("entity", keys, row_floats);
  return space;
}

std::shared_ptr<const UpdatePolicy> counting() {
  return std::make_shared<CountingPolicy>();
}

// The index-th key (0: the first) whose home is `home`.
Key keyHomedAt(const Cluster& c, NodeId home, size_t index = 0) {
  for (Key k : c.space().allKeys()) {
    if (c.map().home(k) == home && index-- == 0) return k;
  }
  ADD_FAILURE() << "too few keys homed at node " << home;
  return 0;
}

std::string kindOf(const Wire& w) {
  return relocationKindName(std::get<RelocationBody>(w));
}

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
  const KeyEntry before = *c.node(old_owner).store().find(key);
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
  const KeyEntry& after = *c.node(requester).store().find(key);
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
  EXPECT_EQ(c.node(requester).store().find(key)->values, reference.find(key)->values);
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
  EXPECT_EQ(c.node(requester).store().find(key)->values, (std::vector<float>{3, 0, 100}));
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
  EXPECT_EQ(c.node(second).store().find(key)->values, (std::vector<float>{0, 5, 0}));
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
  EXPECT_EQ(c.node(home).store().find(key)->values, (std::vector<float>{3, 3}));
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
  EXPECT_EQ(c.node(home).store().find(stays)->values, (std::vector<float>{1, 1}));

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
  EXPECT_EQ(c.node(home).store().find(stays)->values, (std::vector<float>{3, 3}));
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

// --- The property: random delivery orders, concurrent localizes, pushes and pulls ----------

struct SimulationConfig {
  uint64_t seed = 0;
  size_t nodes = 3;
  size_t keys = 12;
  size_t hot = 3;  // most operations and localizes go to these keys: they move all the time
  Clock phases = 3;
  Clock clocks_per_phase = 2;
  int ops_per_clock = 4;
  std::optional<Clock> staleness;  // nullopt: no bound
  size_t cache_capacity = 64;
  unsigned deliver_weight = 2;  // a link is this many times as likely to go next as a worker
  // Kill a random node at a random point of the first two phases; the others learn of it at
  // random later points.
  bool kill = false;
};

// One worker per node (worker id = node id), each pushing into its own columns of every row:
// column w * T + c holds worker w's pushes of clock c (T clocks in all), so a read tells
// exactly which clocks of which worker it includes. Deltas are small integers and the policy
// adds them, so every sum is exact in floats.
class Simulation {
 public:
  explicit Simulation(SimulationConfig config)
      : config_(config),
        clocks_(config.phases * config.clocks_per_phase),
        rng_(config.seed),
        c_(config.nodes, smallSpace(config.keys, config.nodes * clocks_), counting(),
           /*gate_reads=*/true, config.cache_capacity),
        workers_(config.nodes),
        issued_(config.nodes * config.keys * clocks_, 0),
        applied_own_(config.nodes * config.keys * clocks_, 0),
        pushes_(config.keys, 0) {
    if (config_.kill) {
      victim_ = static_cast<NodeId>(rng_() % config_.nodes);
      kill_at_ = 1 + rng_() % (config_.nodes * config_.clocks_per_phase * 2 *
                               (config_.ops_per_clock + 1) * 4);
    }
  }

  void run() {
    for (Clock phase = 0; phase < config_.phases && !::testing::Test::HasFailure(); ++phase) {
      const Clock target = (phase + 1) * config_.clocks_per_phase;
      while (step(target)) {
        if (::testing::Test::HasFailure()) return;
      }
      checkQuiescent(target);
    }
  }

  RelocationStats totals() {
    RelocationStats t;
    for (NodeId n = 0; n < c_.size(); ++n) {
      const RelocationStats& s = c_.node(n).stats();
      t.transfers_in += s.transfers_in;
      t.queued += s.queued;
      t.passed_through += s.passed_through;
      t.cache_hits += s.cache_hits;
      t.passed_on += s.passed_on;
      t.sent += s.sent;
    }
    return t;
  }
  // Did the victim die before the run ended? How many operations failed?
  bool died() { return victim_ && c_.dead(*victim_); }
  uint64_t failedOps() const { return failed_ops_; }
  // Reads that had to include other workers' pushes (a min_clock above 0).
  uint64_t boundedReads() const { return bounded_reads_; }

 private:
  struct Op {
    Completion::Kind kind = Completion::Kind::kPush;
    Key key = 0;
    Clock clock = 0;
    int64_t delta = 0;
    Clock min_clock = 0;
    std::vector<int64_t> own_applied;  // a pull's: this worker's applied pushes per clock
  };
  struct Worker {
    Clock clock = 0;
    int ops = 0;  // done in this clock
    std::map<uint64_t, Op> pending;
    size_t unanswered = 0;  // pushes and pulls pending (localizes need not finish)
  };

  size_t at(WorkerId w, Key k, Clock clock) const {
    return (w * config_.keys + k) * clocks_ + clock;
  }
  Key pickKey() {
    if (rng_() % 10 < 7) return rng_() % config_.hot;
    return rng_() % config_.keys;
  }

  // One event: a message delivered or a worker's action. False when the phase is over.
  bool step(Clock target) {
    if (victim_ && ++events_ == kill_at_) {
      c_.kill(*victim_);
      for (NodeId n = 0; n < c_.size(); ++n) {
        if (n != *victim_) unaware_.push_back(n);
      }
    }
    std::vector<WorkerId> ready;
    for (WorkerId w = 0; w < workers_.size(); ++w) {
      const Worker& worker = workers_[w];
      if (worker.clock == target || c_.dead(w)) continue;
      if (worker.ops < config_.ops_per_clock || worker.unanswered == 0) ready.push_back(w);
    }
    const size_t links = c_.messagesInFlight() > 0 ? config_.deliver_weight : 0;
    if (ready.empty() && links == 0 && unaware_.empty()) {
      for (WorkerId w = 0; w < workers_.size(); ++w) {
        if (c_.dead(w)) continue;
        EXPECT_EQ(workers_[w].clock, target) << "stuck: worker " << w << " waits, nothing moves";
        EXPECT_EQ(workers_[w].unanswered, 0u) << "worker " << w;
      }
      return false;
    }
    const size_t pick = rng_() % (ready.size() + links + unaware_.size());
    if (pick < ready.size()) {
      act(ready[pick]);
    } else if (pick < ready.size() + links) {
      c_.deliverRandom(rng_);
    } else {
      // A survivor's runtime reports the victim down (after everything the victim's link
      // delivered): it stops waiting for the victim's clock and rows.
      const size_t i = pick - ready.size() - links;
      const NodeId n = unaware_[i];
      unaware_.erase(unaware_.begin() + static_cast<std::ptrdiff_t>(i));
      c_.node(n).peerDown(*victim_);
      c_.node(n).excludeWorker(*victim_);
      c_.collect();
    }
    settle();
    return true;
  }

  void act(WorkerId w) {
    Worker& worker = workers_[w];
    Relocation& node = c_.node(w);
    if (worker.ops == config_.ops_per_clock) {
      // Every push of this clock was applied: announce the next one (the core's contract).
      ++worker.clock;
      worker.ops = 0;
      c_.announce(w, worker.clock);
      return;
    }
    ++worker.ops;
    Op op;
    op.key = pickKey();
    op.clock = worker.clock;
    const unsigned what = rng_() % 10;
    uint64_t id = 0;
    if (what < 3) {
      op.kind = Completion::Kind::kLocalize;
      id = node.localize(op.key);
    } else if (what < 7) {
      op.kind = Completion::Kind::kPush;
      op.delta = 1 + static_cast<int64_t>(rng_() % 3);
      std::vector<float> grad(config_.nodes * clocks_, 0.0f);
      grad[w * clocks_ + op.clock] = static_cast<float>(op.delta);
      issued_[at(w, op.key, op.clock)] += op.delta;
      ++pushes_[op.key];
      id = node.push(op.key, grad, op.clock);
      ++worker.unanswered;
    } else {
      op.kind = Completion::Kind::kPull;
      op.min_clock = config_.staleness ? std::max<Clock>(op.clock - *config_.staleness, 0) : 0;
      for (Clock clock = 0; clock < clocks_; ++clock)
        op.own_applied.push_back(applied_own_[at(w, op.key, clock)]);
      id = node.pull(op.key, op.min_clock);
      ++worker.unanswered;
    }
    worker.pending.emplace(id, std::move(op));
  }

  // Takes every completion out and checks it.
  void settle() {
    for (WorkerId w = 0; w < workers_.size(); ++w) {
      if (c_.dead(w)) continue;
      std::vector<Completion>& list = c_.completions(w);
      std::vector<Completion> done = std::exchange(list, {});
      for (Completion& completion : done)
        finish(w, completion);
    }
  }

  void finish(WorkerId w, const Completion& completion) {
    Worker& worker = workers_[w];
    auto it = worker.pending.find(completion.op);
    ASSERT_NE(it, worker.pending.end())
        << (completion.error ? *completion.error : "ok") << " operation " << completion.op
        << " of node " << w << " completed twice or was never issued";
    const Op op = std::move(it->second);
    worker.pending.erase(it);
    if (completion.error) {
      // Only a node's death fails an operation, and the reason names the node.
      EXPECT_TRUE(victim_ && c_.dead(*victim_)) << "node " << w << ": " << *completion.error;
      if (victim_) {
        EXPECT_NE(completion.error->find("node " + std::to_string(*victim_)), std::string::npos)
            << *completion.error;
      }
      if (op.kind != Completion::Kind::kLocalize) --worker.unanswered;
      ++failed_ops_;
      return;  // a failed push may or may not have been applied: only the bounds hold for it
    }
    EXPECT_EQ(completion.key, op.key);
    EXPECT_EQ(completion.kind, op.kind);
    if (op.kind == Completion::Kind::kLocalize) return;
    --worker.unanswered;
    if (op.kind == Completion::Kind::kPush) {
      applied_own_[at(w, op.key, op.clock)] += op.delta;
      return;
    }
    if (op.min_clock > 0) ++bounded_reads_;
    checkRead(w, op, completion.values);
  }

  // SSP, exactly: every push of every worker at clocks below the read's min_clock, every push
  // of the reader that completed before the read, and nothing that was never pushed.
  void checkRead(WorkerId reader, const Op& op, const std::vector<float>& values) {
    ASSERT_EQ(values.size(), config_.nodes * clocks_);
    for (WorkerId w = 0; w < workers_.size(); ++w) {
      for (Clock clock = 0; clock < clocks_; ++clock) {
        const float value = values[w * clocks_ + clock];
        const int64_t issued = issued_[at(w, op.key, clock)];
        const auto got = static_cast<int64_t>(value);
        ASSERT_EQ(static_cast<float>(got), value);
        // Worker w announced min_clock after every push of its earlier clocks completed, so
        // those that succeeded are in the row (with no failure: all of them). A dead worker's
        // clock may have been given up on instead.
        if (clock < op.min_clock && !(victim_ && w == *victim_)) {
          EXPECT_GE(got, applied_own_[at(w, op.key, clock)])
              << "node " << reader << " read key " << op.key << " at min clock " << op.min_clock
              << " without all of worker " << w << "'s pushes of clock " << clock;
          if (!victim_) EXPECT_EQ(got, issued);
        }
        if (w == reader) {
          EXPECT_GE(got, op.own_applied[clock])
              << "node " << reader << " did not read its own push of key " << op.key;
        }
        EXPECT_LE(got, issued) << "a push read that was never made";
        EXPECT_GE(got, 0);
      }
    }
  }

  // Nothing in flight, nothing waiting: each key has one owner, the one its home names, and
  // its row holds every push exactly once, with the optimizer state that counted them.
  void checkQuiescent(Clock target) {
    SCOPED_TRACE("quiescent point at clock " + std::to_string(target));
    ASSERT_EQ(c_.messagesInFlight(), 0u);
    EXPECT_TRUE(c_.errors().empty()) << c_.errors().front();
    if (victim_ && c_.dead(*victim_)) {
      checkQuiescentAfterDeath();
      return;
    }
    for (NodeId n = 0; n < c_.size(); ++n) {
      EXPECT_TRUE(c_.node(n).idle()) << "node " << n;
      EXPECT_TRUE(workers_[n].pending.empty())
          << "node " << n << " has operations that never completed";
    }
    for (Key k = 0; k < config_.keys; ++k) {
      const std::optional<NodeId> holder = c_.holder(k);
      if (!holder) continue;
      const NodeId home = c_.map().home(k);
      EXPECT_EQ(c_.node(home).directoryOwner(k), holder) << "key " << k;
      EXPECT_EQ(c_.node(*holder).heldVersion(k), c_.node(home).directoryVersion(k)) << "key " << k;
      const KeyEntry& row = *c_.node(*holder).store().find(k);
      for (WorkerId w = 0; w < workers_.size(); ++w) {
        for (Clock clock = 0; clock < clocks_; ++clock) {
          EXPECT_EQ(static_cast<int64_t>(row.values[w * clocks_ + clock]), issued_[at(w, k, clock)])
              << "key " << k << ", worker " << w << ", clock " << clock;
        }
      }
      EXPECT_EQ(row.updates, pushes_[k]) << "key " << k;
      EXPECT_EQ(row.state, std::vector<float>{static_cast<float>(pushes_[k])}) << "key " << k;
    }
  }

  // After the victim died: every key is held by at most one live node, which is the one its
  // (live) home names, or its home counts it lost; nobody waits for anything; every row holds
  // every push that succeeded and none that was never made, with its state.
  void checkQuiescentAfterDeath() {
    const NodeId victim = *victim_;
    for (NodeId n = 0; n < c_.size(); ++n) {
      if (n == victim) continue;
      EXPECT_TRUE(c_.node(n).idle())
          << "node " << n << " still waits after node " << victim << " died";
      EXPECT_TRUE(workers_[n].pending.empty()) << "node " << n;
    }
    for (Key k = 0; k < config_.keys; ++k) {
      std::optional<NodeId> holder;
      for (NodeId n = 0; n < c_.size(); ++n) {
        if (n == victim || !c_.node(n).holds(k)) continue;
        EXPECT_FALSE(holder) << "key " << k << " held by node " << *holder << " and " << n;
        holder = n;
      }
      const NodeId home = c_.map().home(k);
      if (home != victim) {
        EXPECT_EQ(c_.node(home).lost(k), !holder) << "key " << k;
        if (holder) EXPECT_EQ(c_.node(home).directoryOwner(k), holder) << "key " << k;
      }
      if (!holder) continue;
      const KeyEntry& row = *c_.node(*holder).store().find(k);
      for (WorkerId w = 0; w < workers_.size(); ++w) {
        for (Clock clock = 0; clock < clocks_; ++clock) {
          const auto got = static_cast<int64_t>(row.values[w * clocks_ + clock]);
          if (w != victim) EXPECT_GE(got, applied_own_[at(w, k, clock)]) << "key " << k;
          EXPECT_LE(got, issued_[at(w, k, clock)]) << "key " << k;
        }
      }
      EXPECT_EQ(row.state, std::vector<float>{static_cast<float>(row.updates)}) << "key " << k;
    }
  }

  SimulationConfig config_;
  Clock clocks_;
  std::mt19937_64 rng_;
  Cluster c_;
  std::vector<Worker> workers_;
  std::vector<int64_t> issued_;       // per (worker, key, clock): deltas pushed
  std::vector<int64_t> applied_own_;  // ... of which the pusher saw complete
  std::vector<uint64_t> pushes_;      // per key
  uint64_t bounded_reads_ = 0;
  uint64_t failed_ops_ = 0;
  std::optional<NodeId> victim_;
  uint64_t kill_at_ = 0;
  uint64_t events_ = 0;
  std::vector<NodeId> unaware_;  // survivors that have not been told of the death yet
};

TEST(RelocationProperty, EveryKeyHasOneOwnerNoPushIsLostOrDoubledAndReadsObeySsp) {
  RelocationStats totals;
  uint64_t bounded = 0;
  const std::optional<Clock> bounds[] = {Clock{0}, Clock{1}, Clock{2}, std::nullopt};
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    SimulationConfig config;
    config.seed = seed;
    config.nodes = 2 + seed % 4;
    config.ops_per_clock = 1 + static_cast<int>(seed % 6);
    config.staleness = bounds[(seed / 4) % 4];
    config.cache_capacity = seed % 5 == 0 ? 2 : 64;  // tiny caches evict all the time
    config.deliver_weight = 1 + seed % 3;
    SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(config.nodes) + " nodes");
    Simulation simulation(config);
    simulation.run();
    if (::testing::Test::HasFailure()) break;
    const RelocationStats s = simulation.totals();
    totals.transfers_in += s.transfers_in;
    totals.queued += s.queued;
    totals.passed_through += s.passed_through;
    totals.cache_hits += s.cache_hits;
    totals.passed_on += s.passed_on;
    bounded += simulation.boundedReads();
  }
  // The runs went through every path of the protocol, many times.
  EXPECT_GT(totals.transfers_in, 1000u);
  EXPECT_GT(totals.queued, 100u);
  EXPECT_GT(totals.passed_through, 10u);
  EXPECT_GT(totals.cache_hits, 100u);
  EXPECT_GT(totals.passed_on, 100u);
  EXPECT_GT(bounded, 100u);
  std::printf(
      "400 runs: %llu transfers, %llu operations queued for a transfer, %llu rows "
      "passed on at once, %llu cache hits, %llu operations sent on\n",
      static_cast<unsigned long long>(totals.transfers_in),
      static_cast<unsigned long long>(totals.queued),
      static_cast<unsigned long long>(totals.passed_through),
      static_cast<unsigned long long>(totals.cache_hits),
      static_cast<unsigned long long>(totals.passed_on));
}

TEST(RelocationProperty, WhenANodeDiesNobodyWaitsAndWhatSurvivesIsConsistent) {
  uint64_t deaths = 0, failed = 0;
  const std::optional<Clock> bounds[] = {Clock{0}, Clock{2}, std::nullopt};
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    SimulationConfig config;
    config.seed = seed;
    config.nodes = 3 + seed % 3;
    config.ops_per_clock = 2 + static_cast<int>(seed % 4);
    config.staleness = bounds[seed % 3];
    config.kill = true;
    SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(config.nodes) + " nodes");
    Simulation simulation(config);
    simulation.run();
    if (::testing::Test::HasFailure()) break;
    deaths += simulation.died() ? 1 : 0;
    failed += simulation.failedOps();
  }
  EXPECT_GT(deaths, 250u);  // the death comes during the run, not after it
  EXPECT_GT(failed, 300u);
  std::printf("300 runs: %llu with a death during the run, %llu operations failed\n",
              static_cast<unsigned long long>(deaths), static_cast<unsigned long long>(failed));
}

}  // namespace
}  // namespace chorus::ps
