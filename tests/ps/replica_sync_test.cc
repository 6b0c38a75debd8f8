// The replica sync as a property, over a deterministic simulator: N ReplicaNodes (N = 1..9, not
// only powers of two) whose messages travel on per-link FIFO queues (as TCP gives) and are
// delivered in a seeded random order, with random pushes on random nodes interleaved with sync
// timers, and nodes killed mid-sync (a killed node's links lose a random tail of what it sent,
// and each survivor hears of the death after the rest, as from a closed connection). Deltas are
// whole numbers (SGD with rate 1), so every float sum is exact and replicas are compared
// exactly. Checked after every event, on every live node:
// - its replicas are exactly the initial values plus its own pushes plus the deltas of the
//   others that the rounds it finished hold (the contributors each round names);
// - no node lags: the newest round any node started is at most two past the last one it
//   finished (a replica misses at most the pushes since the start of the last round it
//   finished: one sync interval and one round's duration);
// - every node that finished a round got the same sums from the same contributors;
// - a surviving node's delta is never lost, and the round names every member it saw live whose
//   delta is missing;
// and at the end, with pushes stopped and a few more rounds, every replica equals the sum of
// all pushes (of the survivors, and of the dead as far as their rounds got out).
#include "ps/replica_sync.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "ps/replica_node.h"

namespace chorus::ps {
namespace {

// Hot keys of rows of 1, 2 and 3 floats in three tables.
KeySpace hotSpace() {
  KeySpace space;
  space.addTable("a", 0, 8, 1);
  space.addTable("b", 20, 6, 2);
  space.addTable("c", 40, 4, 3);
  return space;
}

std::shared_ptr<const UpdatePolicy> unitSgd() {
  OwnerOptimizer optimizer;
  optimizer.sgd.momentum = 0.0;
  optimizer.schedule.baseLr = 1.0;  // w -= g: integer gradients give integer changes
  return std::make_shared<SgdPolicy>(optimizer);
}

// Node ids are not 0..N-1, so that nothing confuses ids with member indices.
NodeId idOf(size_t m) {
  return static_cast<NodeId>(3 * m + 5);
}

struct Event {
  bool down = false;  // the sender died: nothing more comes on this link
  ReplicaSyncMessage message;
};

struct RoundRecord {
  std::vector<std::vector<NodeId>> contributors;
  SparseRows sum;
};

class Cluster {
 public:
  // With `policy` other than unitSgd() the changes are not whole numbers: pass exact = false,
  // and only agreement is checked (and AdaGrad's accumulators, which stay whole).
  Cluster(size_t n, uint64_t seed, const std::shared_ptr<const UpdatePolicy>& policy = unitSgd(),
          bool exact = true)
      : n_(n), rng_(seed), exact_(exact) {
    std::vector<NodeId> ids;
    for (size_t m = 0; m < n; ++m)
      ids.push_back(idOf(m));
    layout_ = std::make_shared<const ReplicaLayout>(hotSpace(), hotSpace().allKeys(), ShardMap(ids),
                                                    policy.get());
    const size_t width = layout_->totalWidth();
    initial_.resize(layout_->totalLength());
    for (size_t j = 0; j < initial_.size(); ++j)
      initial_[j] = static_cast<float>(static_cast<int>(j % 7) - 3);
    for (size_t m = 0; m < n; ++m)
      nodes_.push_back(std::make_unique<ReplicaNode>(layout_, idOf(m), initial_, policy));
    alive_.assign(n, true);
    links_.assign(n, std::vector<std::deque<Event>>(n));
    pending_.assign(n, std::vector<double>(width, 0.0));
    own_.assign(n, std::vector<double>(width, 0.0));
    others_.assign(n, std::vector<double>(width, 0.0));
    squares_.assign(width, 0.0);
    taken_.resize(n);
    started_.assign(n, 0);
    finished_.assign(n, 0);
    view_dead_.assign(n, {});
  }

  size_t size() const { return n_; }
  bool alive(size_t m) const { return alive_[m]; }
  size_t liveCount() const {
    return static_cast<size_t>(std::count(alive_.begin(), alive_.end(), true));
  }
  ReplicaNode& node(size_t m) { return *nodes_[m]; }
  const ReplicaLayout& layout() const { return *layout_; }
  uint64_t totalMessages() const { return messages_; }
  // Payload bytes of every message sent, as the finished rounds report them.
  uint64_t totalBytes() const { return bytes_; }
  std::mt19937_64& rng() { return rng_; }

  // Node m pushes integer gradients to a few random hot keys (all of them with `all`).
  void push(size_t m, bool all = false) {
    std::set<size_t> rows;
    const size_t count = all ? layout_->size() : 1 + rng_() % 3;
    while (rows.size() < count)
      rows.insert(all ? rows.size() : rng_() % layout_->size());
    std::vector<Key> keys;
    std::vector<float> grads;
    for (size_t i : rows) {
      keys.push_back(layout_->keys()[i]);
      for (size_t j = 0; j < layout_->length(i); ++j) {
        const auto g = static_cast<int>(rng_() % 7) - 3;
        grads.push_back(static_cast<float>(g));
        pending_[m][layout_->offset(i) + j] -= g;
        own_[m][layout_->offset(i) + j] -= g;
        if (layout_->syncsState())
          squares_[layout_->offset(i) + layout_->length(i) + j] += static_cast<double>(g * g);
      }
    }
    nodes_[m]->replicas().push(keys, grads, 0);
    after(m, ReplicaSyncStep{});
  }

  void tick(size_t m) { after(m, nodes_[m]->tick()); }

  // Delivers the head of link from -> to.
  void deliver(size_t from, size_t to) {
    Event event = std::move(links_[from][to].front());
    links_[from][to].pop_front();
    if (event.down) {
      view_dead_[to].insert(idOf(from));
      after(to, nodes_[to]->memberDown(idOf(from)));
    } else {
      after(to, nodes_[to]->deliver(idOf(from), event.message));
    }
  }

  // Delivers one message on a random non-empty link; false when there is none.
  bool deliverRandom() {
    std::vector<std::pair<size_t, size_t>> ready;
    for (size_t f = 0; f < n_; ++f)
      for (size_t t = 0; t < n_; ++t)
        if (!links_[f][t].empty()) ready.emplace_back(f, t);
    if (ready.empty()) return false;
    auto [f, t] = ready[rng_() % ready.size()];
    deliver(f, t);
    return true;
  }

  // Kills node d: what it sent loses a random tail (or keeps keep[t] messages on the link to
  // t), then each survivor hears of the death after the rest.
  void kill(size_t d, const std::vector<size_t>* keep = nullptr) {
    alive_[d] = false;
    for (size_t f = 0; f < n_; ++f)
      links_[f][d].clear();
    for (size_t t = 0; t < n_; ++t) {
      if (t == d || !alive_[t]) continue;
      auto& link = links_[d][t];
      const size_t kept = keep ? std::min((*keep)[t], link.size()) : rng_() % (link.size() + 1);
      link.resize(kept);
      link.push_back(Event{true, {}});
    }
  }

  size_t inFlight(size_t from, size_t to) const { return links_[from][to].size(); }

  // Drops everything node d sent that is still in flight (a death before anything got out).
  void dropSent(size_t d) {
    for (size_t t = 0; t < n_; ++t)
      links_[d][t].clear();
  }

  bool quiet() const {
    for (const auto& from : links_)
      for (const auto& link : from)
        if (!link.empty()) return false;
    return true;
  }

  // Stops pushing and syncs until every live replica is idle with nothing pending.
  void settle() {
    for (int rounds = 0; rounds < 8; ++rounds) {
      while (deliverRandom()) {
      }
      bool done = true;
      for (size_t m = 0; m < n_; ++m) {
        if (alive_[m] && (nodes_[m]->sync().inRound() || nodes_[m]->replicas().pendingRows() > 0))
          done = false;
      }
      if (done) return;
      for (size_t m = 0; m < n_; ++m)
        if (alive_[m] && !nodes_[m]->sync().inRound()) tick(m);
    }
    ADD_FAILURE() << "the replicas did not settle";
  }

  // Every live replica's values equal the others' bit for bit, and its optimizer state holds
  // exactly every squared gradient pushed (AdaGrad from 0; no deaths).
  void expectAgreedWithEverySquaredGradient() {
    std::optional<size_t> first;
    for (size_t m = 0; m < n_; ++m) {
      if (!alive_[m]) continue;
      for (size_t i = 0; i < layout_->size(); ++i) {
        const std::span<const float> state = nodes_[m]->replicas().state(layout_->keys()[i]);
        for (size_t j = 0; j < state.size(); ++j)
          EXPECT_EQ(state[j], squares_[layout_->offset(i) + layout_->length(i) + j])
              << "node " << idOf(m) << " key " << layout_->keys()[i];
      }
      if (first) {
        EXPECT_EQ(valuesOf(m), valuesOf(*first)) << "node " << idOf(m);
      } else {
        first = m;
      }
    }
  }

  // Every live replica equals the others and the sum of every push that got out.
  void expectConverged() {
    std::vector<double> expected(initial_.begin(), initial_.end());
    for (size_t m = 0; m < n_; ++m) {
      if (alive_[m]) {
        for (size_t j = 0; j < expected.size(); ++j)
          expected[j] += own_[m][j];
      }
    }
    // The dead's deltas as far as the rounds hold them (the records every finisher agreed on).
    for (const auto& [round, record] : records()) {
      for (size_t p = 0; p < record.contributors.size(); ++p) {
        for (NodeId c : record.contributors[p]) {
          const size_t m = (c - 5) / 3;
          if (alive_[m]) continue;
          addPart(expected, m, round, p);
        }
      }
    }
    std::optional<size_t> first;
    for (size_t m = 0; m < n_; ++m) {
      if (!alive_[m]) continue;
      const std::vector<double> values = valuesOf(m);
      EXPECT_EQ(values, expected) << "node " << idOf(m);
      if (first) {
        EXPECT_EQ(values, valuesOf(*first));
      } else {
        first = m;
      }
    }
  }

  // The record of every round some live node finished (they all agree).
  std::map<uint64_t, RoundRecord> records() const {
    std::map<uint64_t, RoundRecord> out;
    for (const auto& [round, byNode] : results_) {
      for (const auto& [m, record] : byNode) {
        if (alive_[m]) {
          out.emplace(round, record);
          break;
        }
      }
    }
    return out;
  }
  const std::vector<std::vector<NodeId>>& lostBy(size_t m, uint64_t round) {
    return lost_[{m, round}];
  }

 private:
  // Every float of node m's replicas, in layout order (value floats only: no state here).
  std::vector<double> valuesOf(size_t m) {
    std::vector<double> out;
    for (Key key : layout_->keys())
      for (float v : nodes_[m]->replicas().values(key))
        out.push_back(v);
    return out;
  }

  // Adds node m's delta of `round`, part p, to `into`.
  void addPart(std::vector<double>& into, size_t m, uint64_t round, size_t p) {
    auto it = taken_[m].find(round);
    if (it == taken_[m].end()) return;
    for (size_t i = 0; i < layout_->size(); ++i) {
      if (layout_->part(i) != p) continue;
      for (size_t j = layout_->offset(i); j < layout_->offset(i) + layout_->width(i); ++j)
        into[j] += it->second[j];
    }
  }

  // Books what node m's call did, sends its messages, and checks the properties.
  void after(size_t m, ReplicaSyncStep step) {
    EXPECT_TRUE(step.errors.empty()) << step.errors.front();
    // A round started: it took everything pending (later starts of this call took nothing).
    const uint64_t round = nodes_[m]->sync().round();
    for (uint64_t r = started_[m] + 1; r <= round; ++r) {
      taken_[m][r] = r == started_[m] + 1 ? pending_[m] : std::vector<double>(pending_[m].size());
      started_view_[{m, r}] = view_dead_[m];
    }
    if (round > started_[m]) std::fill(pending_[m].begin(), pending_[m].end(), 0.0);
    started_[m] = std::max(started_[m], round);
    max_started_ = std::max(max_started_, round);

    for (ReplicaSyncSend& send : step.send) {
      const size_t to = (send.to - 5) / 3;
      ASSERT_LT(to, n_);
      ASSERT_NE(to, m);
      ++messages_;
      if (alive_[to]) links_[m][to].push_back(Event{false, std::move(send.message)});
    }
    for (const ReplicaRoundResult& result : step.finished) {
      EXPECT_EQ(result.round, finished_[m] + 1) << "rounds finish in order";
      bytes_ += result.bytes_sent;
      finished_[m] = result.round;
      // Every live node that finished the round got the same sums (a node that died may have
      // seen another: nothing of it reaches the living).
      for (const auto& [q, record] : results_[result.round]) {
        if (!alive_[q]) continue;
        EXPECT_EQ(record.contributors, result.contributors) << "round " << result.round;
        EXPECT_EQ(record.sum.keys, result.sum.keys) << "round " << result.round;
        EXPECT_EQ(record.sum.values, result.sum.values) << "round " << result.round;
      }
      results_[result.round][m] = RoundRecord{result.contributors, result.sum};
      // The others' deltas this round brings to m.
      for (size_t p = 0; p < result.contributors.size(); ++p)
        for (NodeId c : result.contributors[p])
          if (c != idOf(m)) addPart(others_[m], (c - 5) / 3, result.round, p);
      // Lost: every member m saw live at its start whose delta misses from a part is named.
      const std::set<NodeId>& deadAtStart = started_view_[{m, result.round}];
      for (size_t q = 0; q < n_; ++q) {
        if (deadAtStart.count(idOf(q))) continue;
        bool missing = false;
        for (const auto& c : result.contributors)
          missing = missing || !std::binary_search(c.begin(), c.end(), idOf(q));
        const bool named = std::binary_search(result.lost.begin(), result.lost.end(), idOf(q));
        EXPECT_EQ(missing, named) << "node " << idOf(m) << " round " << result.round << " member "
                                  << idOf(q);
      }
      lost_[{m, result.round}].push_back(result.lost);
    }
    // Survivors' deltas are never lost: a live node is a contributor of every part of every
    // round it started, wherever the round finished.
    for (const auto& [r, record] : records()) {
      for (size_t q = 0; q < n_; ++q) {
        if (!alive_[q] || started_[q] < r) continue;
        for (const auto& c : record.contributors)
          EXPECT_TRUE(std::binary_search(c.begin(), c.end(), idOf(q)))
              << "round " << r << " lost the delta of live node " << idOf(q);
      }
    }
    check();
  }

  void check() {
    for (size_t m = 0; m < n_; ++m) {
      if (!alive_[m]) continue;
      EXPECT_LE(max_started_, finished_[m] + 2) << "node " << idOf(m) << " lags";
      if (!exact_) continue;
      std::vector<double> expected(initial_.begin(), initial_.end());
      for (size_t j = 0; j < expected.size(); ++j)
        expected[j] += own_[m][j] + others_[m][j];
      ASSERT_EQ(valuesOf(m), expected) << "node " << idOf(m) << " after round " << finished_[m];
    }
  }

  size_t n_;
  std::mt19937_64 rng_;
  bool exact_;
  std::vector<double> squares_;  // per synced float: every squared gradient pushed to it
  std::shared_ptr<const ReplicaLayout> layout_;
  std::vector<float> initial_;
  std::vector<std::unique_ptr<ReplicaNode>> nodes_;
  std::vector<bool> alive_;
  std::vector<std::vector<std::deque<Event>>> links_;  // [from][to]
  std::vector<std::vector<double>> pending_;           // per node: its changes since its last take
  std::vector<std::vector<double>> own_;               // per node: all its changes
  std::vector<std::vector<double>> others_;            // per node: the others' changes it applied
  std::vector<std::map<uint64_t, std::vector<double>>> taken_;  // per node and round
  std::vector<uint64_t> started_, finished_;
  uint64_t max_started_ = 0;
  std::vector<std::set<NodeId>> view_dead_;  // per node: the deaths it heard of
  std::map<std::pair<size_t, uint64_t>, std::set<NodeId>> started_view_;
  std::map<uint64_t, std::map<size_t, RoundRecord>> results_;  // per round, per node
  std::map<std::pair<size_t, uint64_t>, std::vector<std::vector<NodeId>>> lost_;
  uint64_t messages_ = 0;
  uint64_t bytes_ = 0;
};

// Random pushes, timers and deliveries; with `kills`, that many nodes die at random moments
// (at least one node survives).
void runRandom(size_t n, uint64_t seed, size_t kills, int steps = 400,
               const std::shared_ptr<const UpdatePolicy>& adagrad = nullptr) {
  Cluster cluster(n, seed, adagrad ? adagrad : unitSgd(), !adagrad);
  std::mt19937_64& rng = cluster.rng();
  std::set<int> killAt;
  while (killAt.size() < kills)
    killAt.insert(static_cast<int>(rng() % static_cast<uint64_t>(steps)));
  auto randomLive = [&] {
    while (true) {
      const size_t m = rng() % n;
      if (cluster.alive(m)) return m;
    }
  };
  for (int step = 0; step < steps && !::testing::Test::HasFatalFailure(); ++step) {
    if (killAt.count(step) && cluster.liveCount() > 1) cluster.kill(randomLive());
    // 30% pushes, 8% timers, else a delivery (a timer when nothing is in flight).
    const uint64_t action = rng() % 100;
    if (action < 30) {
      cluster.push(randomLive());
    } else if (action < 38 || !cluster.deliverRandom()) {
      cluster.tick(randomLive());
    }
  }
  cluster.settle();
  if (adagrad) {
    cluster.expectAgreedWithEverySquaredGradient();
  } else {
    cluster.expectConverged();
  }
}

TEST(ReplicaSync, EveryReplicaConvergesToTheSumOfAllPushes) {
  for (size_t n = 1; n <= 9; ++n) {
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      SCOPED_TRACE(testing::Message() << n << " nodes, seed " << seed);
      runRandom(n, seed * 1000 + n, 0);
      if (HasFailure()) return;
    }
  }
}

TEST(ReplicaSync, SurvivorsFinishAgreeAndNameTheLostWhenNodesDieMidSync) {
  for (size_t n = 2; n <= 9; ++n) {
    for (uint64_t seed = 1; seed <= 30; ++seed) {
      SCOPED_TRACE(testing::Message() << n << " nodes, seed " << seed);
      runRandom(n, seed * 7919 + n, 1 + seed % (n - 1));
      if (HasFailure()) return;
    }
  }
}

TEST(ReplicaSync, AdagradReplicasAgreeBitForBitAndHoldEverySquaredGradient) {
  AdagradConfig config;
  config.schedule.baseLr = 0.1;
  auto adagrad = std::make_shared<AdagradPolicy>(config);
  for (size_t n : {1, 2, 3, 4, 6, 7}) {
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      SCOPED_TRACE(testing::Message() << n << " nodes, seed " << seed);
      runRandom(n, seed * 31 + n, 0, 400, adagrad);
      if (HasFailure()) return;
    }
  }
}

TEST(ReplicaSync, ARoundCostsTwoMessagesPerOtherMember) {
  for (size_t n : {1, 2, 3, 5, 8}) {
    Cluster cluster(n, 42);
    // Every node changes every hot row (the point of hot keys): the union U is all of them.
    for (size_t m = 0; m < n; ++m)
      cluster.push(m, /*all=*/true);
    // One node's timer starts the round; the others join on its first message.
    cluster.tick(0);
    while (cluster.deliverRandom()) {
    }
    EXPECT_EQ(cluster.totalMessages(), 2 * n * (n - 1)) << n << " nodes";
    // Rows of U go N - 1 times to their reducer and N - 1 times back: 2 (N - 1) |U| rows in
    // all, 2 (N - 1) / N |U| per node; plus a header per message and N contributors per sum.
    const ReplicaLayout& layout = cluster.layout();
    const uint64_t rowBytes = 8 * layout.size() + 4 * layout.totalWidth();
    EXPECT_EQ(cluster.totalBytes(),
              2 * (n - 1) * rowBytes + 16 * 2 * n * (n - 1) + 4 * n * n * (n - 1))
        << n << " nodes";
    for (size_t m = 0; m < n; ++m) {
      EXPECT_FALSE(cluster.node(m).sync().inRound());
      EXPECT_EQ(cluster.node(m).sync().round(), 1u);
    }
    cluster.expectConverged();
  }
}

TEST(ReplicaSync, ANodeThatDiesAtTheStartOfARoundIsNamedLost) {
  Cluster cluster(4, 7);
  for (size_t m = 0; m < 4; ++m)
    cluster.push(m);
  cluster.tick(1);
  cluster.tick(2);
  cluster.deliver(1, 0);  // nodes 0 and 3 join before they hear of node 2's death
  cluster.deliver(1, 3);
  cluster.dropSent(2);  // nothing of node 2's round got out
  cluster.kill(2);
  cluster.settle();
  for (size_t m : {0, 1, 3}) {
    const auto& lost = cluster.lostBy(m, 1);
    ASSERT_EQ(lost.size(), 1u);
    EXPECT_EQ(lost[0], std::vector<NodeId>{idOf(2)}) << "node " << idOf(m);
  }
  ReplicaRoundResult result;
  result.round = 1;
  result.contributors = {{5, 8, 14}, {5, 8, 14}, {5, 8, 14}, {5, 8, 11, 14}};
  result.lost = {11};
  EXPECT_EQ(describeLoss(result),
            "replica sync round 1: the delta of node 11 is lost in 3 of 4 parts (it died "
            "mid-sync)");
  result.lost.clear();
  EXPECT_EQ(describeLoss(result), "");
  cluster.expectConverged();
}

TEST(ReplicaSync, AReducerThatDiesAfterSendingItsSumToSomeLeavesTheSurvivorsAgreeing) {
  // Node 2 reduces its part and sends the sum, but only node 0 gets it before node 2 dies:
  // node 1 reports to the part's next reducer, node 0, which answers with that same sum, so
  // both apply node 2's delta.
  Cluster cluster(3, 11);
  for (size_t m = 0; m < 3; ++m)
    cluster.push(m);
  cluster.tick(0);        // contributions 0 -> 1, 0 -> 2
  cluster.deliver(0, 1);  // node 1 joins: 1 -> 0, 1 -> 2
  cluster.deliver(0, 2);  // node 2 joins: 2 -> 0, 2 -> 1
  ASSERT_EQ(cluster.inFlight(1, 2), 1u);
  cluster.deliver(1, 2);  // node 2 has every contribution to its part: sums to 0 and 1
  ASSERT_EQ(cluster.inFlight(2, 0), 2u);
  ASSERT_EQ(cluster.inFlight(2, 1), 2u);
  const std::vector<size_t> keep{2, 1, 0};  // node 1 does not get the sum
  cluster.kill(2, &keep);
  cluster.settle();
  cluster.expectConverged();
  const std::map<uint64_t, RoundRecord> records = cluster.records();
  ASSERT_TRUE(records.count(1));
  for (const auto& c : records.at(1).contributors)
    EXPECT_EQ(c, (std::vector<NodeId>{idOf(0), idOf(1), idOf(2)}));
  for (size_t m : {0, 1})
    EXPECT_TRUE(cluster.lostBy(m, 1).at(0).empty());
}

// A peer's bad message is dropped with an error that names it; nothing is asserted on.
TEST(ReplicaSync, RefusesBadMessagesWithAReason) {
  auto layout =
      std::make_shared<const ReplicaLayout>(hotSpace(), hotSpace().allKeys(), ShardMap({5, 8, 11}));
  ReplicaSync sync(layout, 5);
  // A key of node 8's part, and one of another part.
  std::optional<Key> inPart, outside;
  for (size_t i = 0; i < layout->size(); ++i) {
    if (layout->members()[layout->part(i)] == 8) {
      if (!inPart) inPart = layout->keys()[i];
    } else if (!outside) {
      outside = layout->keys()[i];
    }
  }
  ASSERT_TRUE(inPart && outside);
  auto rowsOf = [&](std::vector<Key> keys, int extra = 0) {
    auto rows = std::make_shared<SparseRows>();
    rows->keys = keys;
    rows->values.resize(layout->widthOf(keys) + static_cast<size_t>(extra));
    return rows;
  };
  auto message = [&](ReplicaSyncKind kind, uint64_t round, NodeId part,
                     std::shared_ptr<SparseRows> rows) {
    ReplicaSyncMessage m;
    m.kind = kind;
    m.round = round;
    m.part = part;
    m.rows = std::move(rows);
    if (kind == ReplicaSyncKind::kSum) m.contributors = {5, 8, 11};
    return m;
  };
  auto expectError = [&](NodeId from, const ReplicaSyncMessage& m, const std::string& what) {
    const ReplicaSyncStep step = sync.receive(from, m);
    ASSERT_EQ(step.errors.size(), 1u) << what;
    EXPECT_NE(step.errors[0].find(what), std::string::npos) << step.errors[0];
    EXPECT_TRUE(step.send.empty());
    EXPECT_TRUE(step.finished.empty());
  };
  const auto contribution = ReplicaSyncKind::kContribution;
  expectError(99, message(contribution, 1, 5, rowsOf({})), "node 99, which is no other member");
  expectError(5, message(contribution, 1, 5, rowsOf({})), "node 5, which is no other member");
  expectError(8, message(contribution, 1, 6, rowsOf({})), "node 6 is no member");
  expectError(8, message(contribution, 1, 8, nullptr), "no rows");
  expectError(8, message(contribution, 1, 8, rowsOf({*outside})), "belongs to the part");
  expectError(8, message(contribution, 1, 8, rowsOf({*inPart}, 1)), "wrong length");
  auto unknown = std::make_shared<SparseRows>(SparseRows{{1000}, {1.0f}});
  expectError(8, message(contribution, 1, 8, unknown), "not a replicated key");
  expectError(8, message(contribution, 0, 8, rowsOf({})), "round 0");
  expectError(8, message(contribution, 3, 8, rowsOf({})), "more than one round ahead");
  expectError(8, message(ReplicaSyncKind::kSum, 1, 8, rowsOf({})), "before this node");
  ReplicaSyncMessage unsorted = message(ReplicaSyncKind::kSum, 1, 8, rowsOf({}));
  unsorted.contributors = {8, 5};
  expectError(8, unsorted, "sorted and unique");
  ReplicaSyncMessage strange = message(contribution, 1, 8, rowsOf({}));
  strange.kind = static_cast<ReplicaSyncKind>(7);
  expectError(8, strange, "unknown kind 7");
  EXPECT_FALSE(sync.inRound());

  // A good contribution of the next round asks this idle node to start.
  const ReplicaSyncStep join = sync.receive(8, message(contribution, 1, 8, rowsOf({*inPart})));
  EXPECT_TRUE(join.errors.empty());
  EXPECT_TRUE(join.start_next);
  EXPECT_THROW(ReplicaSync(layout, 6), std::invalid_argument);
  EXPECT_THROW(sync.start(SparseRows{{1000}, {1}}), std::invalid_argument);
  sync.start({});
  EXPECT_THROW(sync.start({}), std::logic_error);
  // A dead member's messages are dropped quietly.
  sync.memberDown(11);
  EXPECT_TRUE(sync.receive(11, message(contribution, 1, 11, rowsOf({}))).errors.empty());
  EXPECT_EQ(sync.droppedLate(), 1u);
  EXPECT_EQ(sync.liveMembers(), (std::vector<NodeId>{5, 8}));
}

}  // namespace
}  // namespace chorus::ps
