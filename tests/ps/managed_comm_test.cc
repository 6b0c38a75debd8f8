// Managed communication's cores (ps/managed_comm.h): the token bucket, Bösen's relative
// magnitude and the choice of keys; and a property test of the whole protocol on the cores
// (no sockets): an owner that pushes its most-changed rows under a budget into the workers'
// caches, workers that read from the cache when the SSP rule allows and pull otherwise, over
// FIFO channels in random schedules. No read may miss an update from a clock <= c - s - 1, no
// read may hold an update twice, and the owner ends with every update exactly once.
#include "ps/managed_comm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ps/ssp.h"

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;
using TimePoint = TokenBucket::TimePoint;

TEST(TokenBucket, StartsFullRefillsAtItsRateAndNeverPastTheBurst) {
  const TimePoint t0{};
  TokenBucket bucket(1000, 500, t0);  // 1000 bytes/s, burst 500
  EXPECT_DOUBLE_EQ(bucket.tokens(), 500);
  EXPECT_TRUE(bucket.canSend());
  bucket.chargeQueued(800);
  EXPECT_DOUBLE_EQ(bucket.tokens(), -300);
  EXPECT_FALSE(bucket.canSend());
  // 301 bytes at 1000 bytes/s: a little past 0.3 s.
  EXPECT_GE(bucket.untilPositive(), 300ms);
  EXPECT_LE(bucket.untilPositive(), 302ms);
  bucket.refill(t0 + 200ms);
  EXPECT_NEAR(bucket.tokens(), -100, 1e-6);
  bucket.refill(t0 + 10s);
  EXPECT_DOUBLE_EQ(bucket.tokens(), 500);
  EXPECT_EQ(bucket.untilPositive(), 0ns);
  // Time going backwards adds nothing.
  bucket.chargeQueued(500);
  bucket.refill(t0 + 5s);
  EXPECT_DOUBLE_EQ(bucket.tokens(), 0);
  EXPECT_FALSE(bucket.canSend());
}

TEST(TokenBucket, ChargesWhatTheNodesCounterShowsBeyondTheQueuedFramesOnce) {
  TokenBucket bucket(1e6, 1e6, TimePoint{});
  bucket.observeSent(0);
  bucket.chargeQueued(100);  // a managed frame, not yet written
  bucket.observeSent(60);    // the counter has not caught up: nothing more
  EXPECT_EQ(bucket.otherBytes(), 0u);
  bucket.observeSent(100);  // the frame went out: still nothing more
  EXPECT_EQ(bucket.otherBytes(), 0u);
  bucket.observeSent(350);  // 250 bytes of pulls, pushes and clocks
  EXPECT_EQ(bucket.otherBytes(), 250u);
  EXPECT_EQ(bucket.managedBytes(), 100u);
  EXPECT_DOUBLE_EQ(bucket.tokens(), 1e6 - 350);
  bucket.observeSent(350);  // seen already
  EXPECT_DOUBLE_EQ(bucket.tokens(), 1e6 - 350);
}

TEST(TokenBucket, RefusesABudgetThatIsNotPositive) {
  EXPECT_THROW(TokenBucket(0, 10, TimePoint{}), std::invalid_argument);
  EXPECT_THROW(TokenBucket(-1, 10, TimePoint{}), std::invalid_argument);
  EXPECT_THROW(TokenBucket(10, 0, TimePoint{}), std::invalid_argument);
}

TEST(RelativeChange, SumsDeltaOverValueAndTheDeltaWhereTheValueWasZero) {
  const std::vector<float> before{2, -4, 0, 1};
  const std::vector<float> now{3, -5, 0.5f, 1};
  // |1/2| + |-1/-4| + |0.5| (value 0) + 0
  EXPECT_DOUBLE_EQ(relativeChange(now, before), 0.5 + 0.25 + 0.5);
  EXPECT_DOUBLE_EQ(relativeChange(before, before), 0);
}

TEST(ChangeTracker, PicksTheMostChangedKeysFirstUpToTheMessageSize) {
  std::map<Key, std::vector<float>> store{{0, {1, 1}}, {1, {1, 1}}, {2, {1, 1}}, {3, {1, 1}}};
  const auto rows = [&store](Key key) { return std::span<const float>(store.at(key)); };
  ChangeTracker tracker({0, 1, 2, 3}, rows);
  EXPECT_TRUE(tracker.pick(rows, 1 << 20).empty());  // nothing moved
  store[1] = {1.5f, 1};                              // 0.5
  store[2] = {3, 1};                                 // 2
  store[3] = {1, 2};                                 // 1
  EXPECT_EQ(tracker.pick(rows, 1 << 20), (std::vector<Key>{2, 3, 1}));
  // Two keys of 8 bytes fit in 16 bytes.
  EXPECT_EQ(tracker.pick(rows, 16), (std::vector<Key>{2, 3}));
  // One key always goes, even when it is larger than the message.
  EXPECT_EQ(tracker.pick(rows, 1), (std::vector<Key>{2}));
  tracker.sent(2, store[2]);
  tracker.sent(3, store[3]);
  EXPECT_EQ(tracker.pick(rows, 1 << 20), (std::vector<Key>{1}));
  // Equal changes: the lower key first.
  store[0] = {2, 1};
  store[1] = {2, 1};
  tracker.sent(1, std::vector<float>{1, 1});
  EXPECT_EQ(tracker.pick(rows, 1 << 20), (std::vector<Key>{0, 1}));
  EXPECT_THROW(tracker.sent(9, store[0]), std::invalid_argument);
  EXPECT_THROW(tracker.sent(0, std::vector<float>{1}), std::invalid_argument);
}

// ---- The protocol on the cores, in random schedules ----

// A row as the simulation carries it: its floats (what the tracker ranks) and the ids of the
// updates in it (what the checks read).
struct Row {
  std::vector<float> values;
  std::vector<int> updates;
};

struct Update {
  int id;
  WorkerId worker;
  Clock clock;
};

// Worker -> owner, FIFO.
struct ToOwner {
  enum Kind { kPush, kClock, kPull } kind;
  Key key = 0;
  Update update{};
  float delta = 0;
  Clock clock = 0;  // kClock: the new clock; kPull: the reader's clock
  std::vector<Key> keys;
};
// Owner -> worker, FIFO: pushed rows or a pull's answer, both stamped.
struct ToWorker {
  bool answer = false;
  Clock stamp = 0;
  std::vector<Key> keys;
  std::vector<Row> rows;
};

struct CachedRow {
  Clock stamp = 0;
  Row row;
};

struct SimWorker {
  WorkerId id = 0;
  Clock clock = 0;
  bool waiting = false;  // a pull is out
  std::map<Key, CachedRow> cache;
  std::deque<ToOwner> out;
  std::deque<ToWorker> in;
};

struct SimResult {
  uint64_t violations = 0;  // reads that missed an update or held one twice, and lost updates
  std::string first;        // the first violation, with its seed
  uint64_t reads = 0;
  uint64_t rows_from_cache = 0;
  uint64_t rows_pulled = 0;
  uint64_t rows_pushed = 0;
};

// One owner of `keys` keys, `workers` workers, `clocks` clocks each, bound `s`, a budget of
// `rate` bytes per simulated second. Every violation names the seed. `stamp_error` is added to
// the stamp of pushed rows: a wrong stamp (1) must be caught by the checks.
SimResult simulate(uint64_t seed, int workers, int keys, Clock clocks, Staleness s, double rate,
                   Clock stamp_error = 0) {
  std::mt19937_64 rng(seed);
  const auto chance = [&rng](double p) { return std::bernoulli_distribution(p)(rng); };
  std::vector<WorkerId> ids;
  for (int w = 0; w < workers; ++w)
    ids.push_back(static_cast<WorkerId>(w));
  WorkerClocks gate(ids, s);
  const RowCacheRule fresh(s);
  std::map<Key, Row> store;
  std::vector<Key> all_keys;
  for (int k = 0; k < keys; ++k) {
    all_keys.push_back(static_cast<Key>(k));
    store[k].values = {1.0f, -1.0f};
  }
  const auto rows = [&store](Key key) { return std::span<const float>(store.at(key).values); };
  ChangeTracker tracker(all_keys, rows);
  TimePoint now{};
  TokenBucket bucket(rate, 64, now);  // a burst of 4 rows
  std::vector<SimWorker> sim(workers);
  for (int w = 0; w < workers; ++w)
    sim[w].id = ids[w];
  std::map<Key, std::vector<Update>> log;  // every update made, per key
  int next_update = 0;
  SimResult result;

  const auto violation = [&](const std::string& what) {
    if (result.violations++ == 0) result.first = "seed " + std::to_string(seed) + ": " + what;
  };
  const auto check_read = [&](const SimWorker& w, Key key, const Row& row) {
    std::set<int> seen;
    for (int id : row.updates) {
      if (!seen.insert(id).second) {
        violation("worker " + std::to_string(w.id) + " read update " + std::to_string(id) +
                  " of key " + std::to_string(key) + " twice at clock " + std::to_string(w.clock));
      }
    }
    for (const Update& u : log[key]) {
      if (u.clock <= s.requiredMinStep(w.clock) - 1 && seen.count(u.id) == 0) {
        violation("worker " + std::to_string(w.id) + " at clock " + std::to_string(w.clock) +
                  " (s " + s.toString() + ") read key " + std::to_string(key) + " without update " +
                  std::to_string(u.id) + " of worker " + std::to_string(u.worker) + " from clock " +
                  std::to_string(u.clock));
      }
    }
  };
  // The read of every key is served: check it, push updates of a few keys, end the clock.
  const auto finish_clock = [&](SimWorker& w) {
    ++result.reads;
    for (Key key : all_keys)
      check_read(w, key, w.cache.at(key).row);
    for (Key key : all_keys) {
      if (!chance(0.6)) continue;
      const Update u{next_update++, w.id, w.clock};
      log[key].push_back(u);
      const float delta = std::uniform_real_distribution<float>(-1, 1)(rng);
      w.out.push_back({ToOwner::kPush, key, u, delta, w.clock, {}});
      // The worker keeps its cached row (KvWorker applies its own push to it with plain SGD;
      // with momentum it drops it, which only sends the next read to the owner).
    }
    ++w.clock;
    w.out.push_back({ToOwner::kClock, 0, {}, 0, w.clock, {}});
  };
  const auto start_clock = [&](SimWorker& w) {
    std::vector<Key> missing;
    for (Key key : all_keys) {
      auto it = w.cache.find(key);
      if (it != w.cache.end() && fresh.fresh(it->second.stamp, w.clock)) {
        ++result.rows_from_cache;
      } else {
        missing.push_back(key);
      }
    }
    if (missing.empty()) {
      finish_clock(w);
      return;
    }
    result.rows_pulled += missing.size();
    w.waiting = true;
    w.out.push_back({ToOwner::kPull, 0, {}, 0, w.clock, missing});
  };
  const auto owner_receive = [&](SimWorker& w) {
    ToOwner m = std::move(w.out.front());
    w.out.pop_front();
    switch (m.kind) {
      case ToOwner::kPush: {
        Row& row = store[m.key];
        row.values[m.update.id % 2] += m.delta;
        row.updates.push_back(m.update.id);
        break;
      }
      case ToOwner::kClock:
        ASSERT_FALSE(gate.advance(w.id, m.clock).has_value());
        break;
      case ToOwner::kPull: {
        SimWorker* reader = &w;
        gate.whenReady(m.clock, [&, reader, keys = m.keys] {
          ToWorker answer{true, gate.minClock(), keys, {}};
          for (Key key : keys)
            answer.rows.push_back(store[key]);
          reader->in.push_back(std::move(answer));
        });
        break;
      }
    }
  };
  const auto owner_pump = [&] {
    bucket.refill(now);
    while (bucket.canSend()) {
      const std::vector<Key> picked = tracker.pick(rows, 16);  // two rows of 8 bytes
      if (picked.empty()) break;
      ToWorker push{false, gate.minClock() + stamp_error, picked, {}};
      for (Key key : picked) {
        push.rows.push_back(store[key]);
        tracker.sent(key, store[key].values);
      }
      for (SimWorker& w : sim)
        w.in.push_back(push);
      result.rows_pushed += picked.size() * sim.size();
      bucket.chargeQueued(picked.size() * 8 * sim.size());
    }
  };
  const auto worker_receive = [&](SimWorker& w) {
    ToWorker m = std::move(w.in.front());
    w.in.pop_front();
    // Pushed rows and answers alike replace the cached rows: from one owner over one FIFO
    // connection, the newest arrival is the freshest.
    for (size_t i = 0; i < m.keys.size(); ++i)
      w.cache[m.keys[i]] = CachedRow{m.stamp, m.rows[i]};
    if (m.answer) {
      w.waiting = false;
      finish_clock(w);
    }
  };

  for (int step = 0; step < 200000; ++step) {
    bool done = true;
    for (const SimWorker& w : sim) {
      if (w.clock < clocks || w.waiting || !w.out.empty() || !w.in.empty()) done = false;
    }
    if (done) break;
    const int action = std::uniform_int_distribution<int>(0, 9)(rng);
    SimWorker& w = sim[std::uniform_int_distribution<int>(0, workers - 1)(rng)];
    if (action < 3) {
      if (!w.waiting && w.clock < clocks) start_clock(w);
    } else if (action < 6) {
      if (!w.out.empty()) owner_receive(w);
    } else if (action < 8) {
      if (!w.in.empty()) worker_receive(w);
    } else {
      now += std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 20)(rng));
      owner_pump();
    }
    if (::testing::Test::HasFatalFailure()) return result;
  }
  for (const SimWorker& w : sim) {
    if (w.clock != clocks) violation("worker " + std::to_string(w.id) + " did not finish");
  }
  // Every update is in the owner's row exactly once.
  for (Key key : all_keys) {
    std::vector<int> expected;
    for (const Update& u : log[key])
      expected.push_back(u.id);
    std::vector<int> got = store[key].updates;
    std::sort(expected.begin(), expected.end());
    std::sort(got.begin(), got.end());
    if (got != expected) violation("the owner's key " + std::to_string(key) + " lost or doubled");
  }
  return result;
}

TEST(ManagedCommProperty, NoReadMissesAnUpdateOlderThanTheBoundWhateverTheBudget) {
  SimResult total;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    std::mt19937_64 pick(seed * 7919);
    const int workers = std::uniform_int_distribution<int>(1, 4)(pick);
    const int keys = std::uniform_int_distribution<int>(1, 6)(pick);
    const Staleness s{std::uniform_int_distribution<int64_t>(0, 4)(pick)};
    // From a budget that pushes almost nothing to one that pushes every change.
    const double rate = std::vector<double>{1, 100, 1000, 1e6}[seed % 4];
    const SimResult r = simulate(seed, workers, keys, 12, s, rate);
    ASSERT_EQ(r.violations, 0u) << r.first;
    total.reads += r.reads;
    total.rows_from_cache += r.rows_from_cache;
    total.rows_pulled += r.rows_pulled;
    total.rows_pushed += r.rows_pushed;
  }
  // The schedules exercised both paths: rows served from pushed rows and rows pulled.
  EXPECT_GT(total.rows_from_cache, total.reads / 10);
  EXPECT_GT(total.rows_pulled, 0u);
  EXPECT_GT(total.rows_pushed, 0u);
}

// The checks can fail: rows stamped one clock fresher than the owner's minimum clock (the
// stamp the SSP rule trusts) let reads miss updates in some schedules.
TEST(ManagedCommProperty, AStampOneClockTooFreshIsCaught) {
  uint64_t violations = 0;
  for (uint64_t seed = 1; seed <= 100; ++seed)
    violations += simulate(seed, 3, 3, 12, Staleness{1}, 1e6, 1).violations;
  EXPECT_GT(violations, 0u);
}

// Rows are served from the cache only because they were pushed: with no budget to speak of,
// almost every read is pulled, and with a large one most are served locally.
TEST(ManagedCommProperty, ABudgetTurnsPullsIntoCachedReads) {
  uint64_t cached_small = 0, cached_large = 0, pulled_small = 0, pulled_large = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const SimResult small = simulate(seed, 3, 4, 20, Staleness{2}, 1);
    const SimResult large = simulate(seed, 3, 4, 20, Staleness{2}, 1e9);
    cached_small += small.rows_from_cache;
    pulled_small += small.rows_pulled;
    cached_large += large.rows_from_cache;
    pulled_large += large.rows_pulled;
  }
  EXPECT_GT(cached_large, cached_small);
  EXPECT_LT(pulled_large, pulled_small);
}

}  // namespace
}  // namespace chorus::ps
