// Managed communication for sparse rows (ps/sparse_managed.h): the worker's copy, the owner's
// pusher, and a property test of the protocol on the real cores (no sockets): owners that push
// announcements and their most-changed rows under a budget, workers that read sparse subsets of
// the rows from their copies when the owners vouched for them recently enough and pull the rest,
// over FIFO channels in random schedules. No read may miss an update from a clock <= c - s - 1
// or hold one twice, and the owners end with every update exactly once.
#include "ps/sparse_managed.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ps/managed_comm.h"
#include "ps/ssp.h"

namespace chorus::ps {
namespace {

KeySpace twoTables() {
  KeySpace space;
  space.addTable("users", 4, 2);  // keys 0-3
  space.addTable("items", 3, 3);  // keys 4-6
  return space;
}

// Even keys are node 0's, odd ones node 1's.
NodeId ownerOf(Key key) {
  return static_cast<NodeId>(key % 2);
}

TEST(ManagedRowCache, ServesTheModelUntilAnOwnerAnnouncesAChangeAndThenItsValue) {
  const KeySpace space = twoTables();
  std::vector<float> model(space.total());
  for (size_t i = 0; i < model.size(); ++i)
    model[i] = static_cast<float>(i);
  ManagedRowCache cache(space, ownerOf, model, Staleness{1});
  const std::vector<Key> keys{0, 1, 4};
  std::vector<float> out(space.floatsOf(keys));
  std::vector<size_t> missing;
  // Clock 1 needs stamps >= 0: the model holds every update from clocks below 0.
  EXPECT_EQ(cache.read(keys, 1, out, missing), 3u);
  EXPECT_EQ(out, (std::vector<float>{0, 1, 2, 3, 8, 9, 10}));
  // Clock 2 needs stamp 1 from both owners.
  missing.clear();
  EXPECT_EQ(cache.read(keys, 2, out, missing), 0u);
  EXPECT_EQ(missing, (std::vector<size_t>{0, 1, 2}));
  // Node 0 announces key 4 and vouches for its rows at 1: key 0 is served at clock 2, key 4
  // stays at the stamp it had when announced (0), enough for clock 1 only.
  ASSERT_FALSE(cache.offer(0, RowFrame::kAnnouncement, std::vector<Key>{4}, {}));
  ASSERT_FALSE(cache.offer(0, 1, std::vector<Key>{}, {}));
  missing.clear();
  EXPECT_EQ(cache.read(keys, 2, out, missing), 1u);
  EXPECT_EQ(missing, (std::vector<size_t>{1, 2}));
  missing.clear();
  EXPECT_EQ(cache.read(std::vector<Key>{4}, 1, std::span<float>(out).first(3), missing), 1u);
  // A second announcement does not move the frozen stamp up.
  ASSERT_FALSE(cache.offer(0, 3, std::vector<Key>{}, {}));
  ASSERT_FALSE(cache.offer(0, RowFrame::kAnnouncement, std::vector<Key>{4}, {}));
  missing.clear();
  EXPECT_EQ(cache.read(std::vector<Key>{4}, 2, std::span<float>(out).first(3), missing), 0u);
  // Key 4's value comes: served, with the new floats.
  ASSERT_FALSE(cache.offer(0, 3, std::vector<Key>{4}, std::vector<float>{7, 7, 7}));
  ASSERT_FALSE(cache.offer(1, 2, std::vector<Key>{}, {}));
  missing.clear();
  EXPECT_EQ(cache.read(keys, 2, out, missing), 3u);
  EXPECT_EQ(out, (std::vector<float>{0, 1, 2, 3, 7, 7, 7}));
  EXPECT_EQ(cache.stampOf(1), 2);
  EXPECT_EQ(cache.stampOf(5), 0);
}

TEST(ManagedRowCache, RefusesFramesItCannotTrustAndKeepsWhatItHad) {
  const KeySpace space = twoTables();
  ManagedRowCache cache(space, ownerOf, std::vector<float>(space.total(), 1.0f), Staleness{0});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Another owner's key, unsorted keys, a key outside the space, a short row, a NaN, values in
  // an announcement, a stamp below -1.
  EXPECT_TRUE(cache.offer(1, 3, std::vector<Key>{0}, std::vector<float>{2, 2}));
  EXPECT_TRUE(cache.offer(0, 3, std::vector<Key>{2, 0}, std::vector<float>(4, 2)));
  EXPECT_TRUE(cache.offer(0, 3, std::vector<Key>{8}, std::vector<float>(3, 2)));
  EXPECT_TRUE(cache.offer(0, 3, std::vector<Key>{0}, std::vector<float>{2}));
  EXPECT_TRUE(cache.offer(0, 3, std::vector<Key>{0}, std::vector<float>{2, nan}));
  EXPECT_TRUE(cache.offer(0, RowFrame::kAnnouncement, std::vector<Key>{0}, std::vector<float>{2}));
  EXPECT_TRUE(cache.offer(0, -2, std::vector<Key>{}, {}));
  EXPECT_EQ(cache.stampOf(0), 0);
  std::vector<float> out(2);
  std::vector<size_t> missing;
  EXPECT_EQ(cache.read(std::vector<Key>{0}, 0, out, missing), 1u);
  EXPECT_EQ(out, (std::vector<float>{1, 1}));
  EXPECT_THROW(ManagedRowCache(space, ownerOf, std::vector<float>(3), Staleness{0}),
               std::invalid_argument);
}

TEST(SparseRowPusher, AnnouncesFirstThenSendsTheMostChangedAndVouchesWhenNothingChanged) {
  std::map<Key, std::vector<float>> store{{0, {1, 1}}, {2, {1, 1}}, {4, {1, 1}}};
  const auto rows = [&store](Key key) { return std::span<const float>(store.at(key)); };
  SparseRowPusher pusher({0, 2, 4}, rows);
  std::vector<RowFrame> sent;
  const auto send = [&sent](const RowFrame& frame) { sent.push_back(frame); };
  const auto always = [] { return true; };
  // Nothing changed and the clock is the model's: nothing to send.
  EXPECT_TRUE(pusher.pass(0, rows, 1 << 20, always, send));
  EXPECT_TRUE(sent.empty());
  store[4] = {3, 1};  // changed by 2
  store[0] = {1, 2};  // changed by 1
  // A budget for one frame: the announcement alone.
  int budget = 1;
  const auto limited = [&budget] { return budget-- > 0; };
  EXPECT_FALSE(pusher.pass(1, rows, 8, limited, send));
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].min_clock, RowFrame::kAnnouncement);
  EXPECT_EQ(sent[0].keys, (std::vector<Key>{0, 4}));
  // Then the values, the most changed first, one row (8 bytes) a frame, each stamped.
  sent.clear();
  EXPECT_TRUE(pusher.pass(1, rows, 8, always, send));
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].min_clock, 1);
  EXPECT_EQ(sent[0].keys, (std::vector<Key>{4}));
  EXPECT_EQ(sent[0].values, (std::vector<float>{3, 1}));
  EXPECT_EQ(sent[1].keys, (std::vector<Key>{0}));
  // Nothing changed since, the clock moved: one empty frame vouches at the new stamp.
  sent.clear();
  EXPECT_TRUE(pusher.pass(3, rows, 8, always, send));
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].min_clock, 3);
  EXPECT_TRUE(sent[0].keys.empty());
}

// ---- The protocol on the cores, in random schedules ----

// A row's float u counts how often update u of that key is in it: a read holds update u when
// it is 1, twice when it is 2. (The floats are also what the tracker ranks.)
constexpr size_t kRowFloats = 64;

struct Update {
  int index;  // the float it adds to
  WorkerId worker;
  Clock clock;
};

// Worker -> owner, FIFO.
struct ToOwner {
  enum Kind { kPush, kClock, kPull } kind;
  std::vector<Key> keys;
  std::vector<int> indices;  // kPush: one update index per key
  Clock clock = 0;           // kClock: the new clock; kPull: the reader's clock
};
// Owner -> worker, FIFO: frames of the owner's push, or a pull's answer.
struct ToWorker {
  bool answer = false;
  RowFrame frame;  // answer: the keys and their values
};

struct SimWorker {
  WorkerId id = 0;
  Clock clock = 0;
  int waiting = 0;  // answers still out
  std::vector<Key> reading;
  std::map<Key, std::vector<float>> got;  // this clock's read
  std::unique_ptr<ManagedRowCache> cache;
};

struct SimOwner {
  std::unique_ptr<WorkerClocks> gate;
  std::map<Key, std::vector<float>> store;
  std::unique_ptr<SparseRowPusher> pusher;
  std::unique_ptr<TokenBucket> bucket;
};

struct SimResult {
  uint64_t violations = 0;
  std::string first;
  uint64_t rows_read = 0;
  uint64_t rows_from_copy = 0;
  uint64_t rows_pulled = 0;
};

struct SimFaults {
  Clock stamp_error = 0;            // added to every value frame's stamp
  bool drop_announcements = false;  // an owner that never announces
};

// `owners` owners of `keys` keys (key k is owner k % owners'), `workers` workers, `clocks`
// clocks each, bound `s`, budgets of `rate` bytes per simulated second.
SimResult simulate(uint64_t seed, int owners, int workers, int keys, Clock clocks, Staleness s,
                   double rate, SimFaults faults = {}) {
  std::mt19937_64 rng(seed);
  const auto chance = [&rng](double p) { return std::bernoulli_distribution(p)(rng); };
  KeySpace space;
  space.addTable("rows", static_cast<size_t>(keys), kRowFloats);
  const auto owner_of = [owners](Key key) { return static_cast<NodeId>(key % owners); };
  std::vector<WorkerId> ids;
  for (int w = 0; w < workers; ++w)
    ids.push_back(static_cast<WorkerId>(w));
  std::vector<SimOwner> own(owners);
  std::vector<SimWorker> sim(workers);
  // channels[w][o]: worker w -> owner o and back.
  std::vector<std::vector<std::deque<ToOwner>>> up(workers,
                                                   std::vector<std::deque<ToOwner>>(owners));
  std::vector<std::vector<std::deque<ToWorker>>> down(workers,
                                                      std::vector<std::deque<ToWorker>>(owners));
  TokenBucket::TimePoint now{};
  for (int o = 0; o < owners; ++o) {
    own[o].gate = std::make_unique<WorkerClocks>(ids, s);
    std::vector<Key> mine;
    for (Key k = 0; k < static_cast<Key>(keys); ++k) {
      if (owner_of(k) != static_cast<NodeId>(o)) continue;
      mine.push_back(k);
      own[o].store[k].assign(kRowFloats, 0.0f);
    }
    SimOwner& owner = own[o];
    own[o].pusher = std::make_unique<SparseRowPusher>(
        mine, [&owner](Key key) { return std::span<const float>(owner.store.at(key)); });
    own[o].bucket = std::make_unique<TokenBucket>(rate, 600, now);
  }
  for (int w = 0; w < workers; ++w) {
    sim[w].id = ids[w];
    sim[w].cache = std::make_unique<ManagedRowCache>(space, owner_of,
                                                     std::vector<float>(space.total(), 0.0f), s);
  }
  std::map<Key, std::vector<Update>> log;
  std::vector<int> next_index(keys, 0);
  SimResult result;
  const auto violation = [&](const std::string& what) {
    if (result.violations++ == 0) result.first = "seed " + std::to_string(seed) + ": " + what;
  };
  const auto finish_clock = [&](SimWorker& w) {
    for (const auto& [key, row] : w.got) {
      ++result.rows_read;
      for (size_t u = 0; u < kRowFloats; ++u) {
        if (row[u] > 1.5f) violation("a read holds an update twice");
      }
      for (const Update& u : log[key]) {
        if (u.clock <= s.requiredMinStep(w.clock) - 1 && row[u.index] < 0.5f) {
          violation("worker " + std::to_string(w.id) + " at clock " + std::to_string(w.clock) +
                    " (s " + s.toString() + ") read key " + std::to_string(key) +
                    " without worker " + std::to_string(u.worker) + "'s update of clock " +
                    std::to_string(u.clock));
        }
      }
    }
    // Push an update of some of the rows read, per owner one message, then the clock.
    std::vector<ToOwner> pushes(owners);
    for (const auto& [key, row] : w.got) {
      if (!chance(0.7) || next_index[key] >= static_cast<int>(kRowFloats)) continue;
      const int index = next_index[key]++;
      log[key].push_back({index, w.id, w.clock});
      ToOwner& p = pushes[owner_of(key)];
      p.kind = ToOwner::kPush;
      p.keys.push_back(key);
      p.indices.push_back(index);
    }
    ++w.clock;
    for (int o = 0; o < owners; ++o) {
      if (!pushes[o].keys.empty()) up[w.id][o].push_back(pushes[o]);
      up[w.id][o].push_back({ToOwner::kClock, {}, {}, w.clock});
    }
    w.got.clear();
  };
  const auto start_clock = [&](SimWorker& w) {
    w.reading.clear();
    for (Key k = 0; k < static_cast<Key>(keys); ++k) {
      if (chance(0.5)) w.reading.push_back(k);
    }
    if (w.reading.empty()) w.reading.push_back(0);
    std::vector<float> out(space.floatsOf(w.reading));
    std::vector<size_t> missing;
    result.rows_from_copy += w.cache->read(w.reading, w.clock, out, missing);
    size_t at = 0;
    size_t next = 0;
    std::vector<std::vector<Key>> pulls(owners);
    for (size_t i = 0; i < w.reading.size(); ++i) {
      if (next < missing.size() && missing[next] == i) {
        pulls[owner_of(w.reading[i])].push_back(w.reading[i]);
        ++next;
      } else {
        w.got[w.reading[i]].assign(out.begin() + at, out.begin() + at + kRowFloats);
      }
      at += kRowFloats;
    }
    for (int o = 0; o < owners; ++o) {
      if (pulls[o].empty()) continue;
      result.rows_pulled += pulls[o].size();
      ++w.waiting;
      up[w.id][o].push_back({ToOwner::kPull, pulls[o], {}, w.clock});
    }
    if (w.waiting == 0) finish_clock(w);
  };
  const auto owner_receive = [&](int w, int o) {
    ToOwner m = std::move(up[w][o].front());
    up[w][o].pop_front();
    SimOwner& owner = own[o];
    switch (m.kind) {
      case ToOwner::kPush:
        for (size_t i = 0; i < m.keys.size(); ++i)
          owner.store[m.keys[i]][m.indices[i]] += 1.0f;
        break;
      case ToOwner::kClock:
        ASSERT_FALSE(owner.gate->advance(static_cast<WorkerId>(w), m.clock).has_value());
        break;
      case ToOwner::kPull:
        owner.gate->whenReady(m.clock, [&, w, o, keys = m.keys] {
          ToWorker answer;
          answer.answer = true;
          answer.frame.keys = keys;
          for (Key key : keys) {
            const std::vector<float>& row = own[o].store[key];
            answer.frame.values.insert(answer.frame.values.end(), row.begin(), row.end());
          }
          down[w][o].push_back(std::move(answer));
        });
        break;
    }
  };
  const auto owner_pump = [&](int o) {
    SimOwner& owner = own[o];
    owner.bucket->refill(now);
    const Clock min_clock = owner.gate->minClock();
    if (min_clock >= Staleness::kInfinite) return;
    owner.pusher->pass(
        min_clock, [&owner](Key key) { return std::span<const float>(owner.store.at(key)); }, 128,
        [&owner] { return owner.bucket->canSend(); },
        [&](const RowFrame& frame) {
          RowFrame sent = frame;
          if (sent.min_clock != RowFrame::kAnnouncement) sent.min_clock += faults.stamp_error;
          owner.bucket->chargeQueued((16 + 8 * frame.keys.size() + 4 * frame.values.size()) *
                                     static_cast<size_t>(workers));
          if (faults.drop_announcements && sent.min_clock == RowFrame::kAnnouncement) return;
          for (int w = 0; w < workers; ++w)
            down[w][o].push_back({false, sent});
        });
  };
  const auto worker_receive = [&](int w, int o) {
    ToWorker m = std::move(down[w][o].front());
    down[w][o].pop_front();
    SimWorker& worker = sim[w];
    if (!m.answer) {
      if (auto error = worker.cache->offer(static_cast<NodeId>(o), m.frame.min_clock, m.frame.keys,
                                           m.frame.values)) {
        violation("a frame was refused: " + *error);
      }
      return;
    }
    for (size_t i = 0; i < m.frame.keys.size(); ++i) {
      worker.got[m.frame.keys[i]].assign(m.frame.values.begin() + i * kRowFloats,
                                         m.frame.values.begin() + (i + 1) * kRowFloats);
    }
    if (--worker.waiting == 0) finish_clock(worker);
  };

  for (int step = 0; step < 400000; ++step) {
    bool done = true;
    for (int w = 0; w < workers; ++w) {
      if (sim[w].clock < clocks || sim[w].waiting > 0) done = false;
      for (int o = 0; o < owners; ++o) {
        if (!up[w][o].empty() || !down[w][o].empty()) done = false;
      }
    }
    if (done) break;
    const int action = std::uniform_int_distribution<int>(0, 9)(rng);
    const int w = std::uniform_int_distribution<int>(0, workers - 1)(rng);
    const int o = std::uniform_int_distribution<int>(0, owners - 1)(rng);
    if (action < 3) {
      if (sim[w].waiting == 0 && sim[w].clock < clocks) start_clock(sim[w]);
    } else if (action < 6) {
      if (!up[w][o].empty()) owner_receive(w, o);
    } else if (action < 8) {
      if (!down[w][o].empty()) worker_receive(w, o);
    } else {
      now += std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 20)(rng));
      owner_pump(o);
    }
    if (::testing::Test::HasFatalFailure()) return result;
  }
  for (const SimWorker& w : sim) {
    if (w.clock != clocks) violation("worker " + std::to_string(w.id) + " did not finish");
  }
  for (Key k = 0; k < static_cast<Key>(keys); ++k) {
    const std::vector<float>& row = own[owner_of(k)].store[k];
    for (size_t u = 0; u < kRowFloats; ++u) {
      const float expected = static_cast<int>(u) < next_index[k] ? 1.0f : 0.0f;
      if (row[u] != expected)
        violation("the owner's key " + std::to_string(k) + " lost or doubled");
    }
  }
  return result;
}

TEST(SparseManagedProperty, NoReadMissesAnUpdateOlderThanTheBoundWhateverTheBudget) {
  SimResult total;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    std::mt19937_64 pick(seed * 7919);
    const int owners = std::uniform_int_distribution<int>(1, 3)(pick);
    const int workers = std::uniform_int_distribution<int>(1, 4)(pick);
    const int keys = std::uniform_int_distribution<int>(1, 8)(pick);
    const Staleness s{std::uniform_int_distribution<int64_t>(0, 4)(pick)};
    // From a budget that pushes almost nothing to one that pushes every change.
    const double rate = std::vector<double>{1, 1000, 20000, 1e9}[seed % 4];
    const SimResult r = simulate(seed, owners, workers, keys, 12, s, rate);
    ASSERT_EQ(r.violations, 0u) << r.first;
    total.rows_read += r.rows_read;
    total.rows_from_copy += r.rows_from_copy;
    total.rows_pulled += r.rows_pulled;
  }
  // Both paths ran: rows served by the copy and rows pulled.
  EXPECT_GT(total.rows_from_copy, total.rows_read / 10);
  EXPECT_GT(total.rows_pulled, total.rows_read / 10);
}

// The checks can fail: a stamp one clock too fresh, or an owner that sends values without
// announcing what changed first, lets reads miss updates in some schedules.
TEST(SparseManagedProperty, AStampTooFreshOrAMissingAnnouncementIsCaught) {
  uint64_t stamp = 0;
  uint64_t unannounced = 0;
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    stamp += simulate(seed, 2, 3, 6, 12, Staleness{1}, 1e9, {1, false}).violations;
    // A budget too small to send the values soon: the copy would serve what changed.
    unannounced += simulate(seed, 2, 3, 6, 12, Staleness{1}, 3000, {0, true}).violations;
  }
  EXPECT_GT(stamp, 0u);
  EXPECT_GT(unannounced, 0u);
}

// Rows are served by the copy because the owners vouched for them: with no budget to speak of
// nearly every read past the first clocks is pulled, with a large one most are served.
TEST(SparseManagedProperty, ABudgetTurnsPullsIntoServedReads) {
  uint64_t served_small = 0, served_large = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    served_small += simulate(seed, 2, 3, 6, 20, Staleness{2}, 1).rows_from_copy;
    served_large += simulate(seed, 2, 3, 6, 20, Staleness{2}, 1e9).rows_from_copy;
  }
  EXPECT_GT(served_large, 2 * served_small);
}

}  // namespace
}  // namespace chorus::ps
