// Lapse-style relocation (ps/relocation.h) as a property: hundreds of seeded runs in which the
// simulated network (relocation_cluster.h) delivers messages in a random order (per-link FIFO,
// any order across links: what random delays produce), several workers localize the same keys
// while they push and pull, and, in the second test, one node dies at a random moment. At every
// quiescent point each key has exactly one owner (the one its home names), every push was
// applied exactly once with its optimizer state, nobody waits, and every read obeyed SSP.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ps/relocation.h"
#include "tests/ps/relocation_cluster.h"

namespace chorus::ps {
namespace {

using namespace chorus::ps::testing;  // NOLINT(google-build-using-namespace)

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
          if (!victim_) {
            EXPECT_EQ(got, issued);
          }
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
      const KeyEntry row = *c_.node(*holder).store().copyRow(k);
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
        if (holder) {
          EXPECT_EQ(c_.node(home).directoryOwner(k), holder) << "key " << k;
        }
      }
      if (!holder) continue;
      const KeyEntry row = *c_.node(*holder).store().copyRow(k);
      for (WorkerId w = 0; w < workers_.size(); ++w) {
        for (Clock clock = 0; clock < clocks_; ++clock) {
          const auto got = static_cast<int64_t>(row.values[w * clocks_ + clock]);
          if (w != victim) {
            EXPECT_GE(got, applied_own_[at(w, k, clock)]) << "key " << k;
          }
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
