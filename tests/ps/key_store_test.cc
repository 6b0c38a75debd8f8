// The owner's key store: what it accepts, what it refuses (with a reason), and that pushes go
// through the owner optimizer scaled per push.
#include "ps/key_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

namespace chorus::ps {
namespace {

struct StoreFixture {
  ChunkLayout layout{10, 4};  // keys 0 [0,4), 1 [4,8), 2 [8,10)
  ShardMap map{{0, 1}};
  std::vector<float> initial = std::vector<float>(10);
  StoreFixture() { std::iota(initial.begin(), initial.end(), 0.0f); }
  NodeId ownerOfSomeKey() const { return map.home(0); }
};

TEST(KeyStore, HoldsExactlyTheKeysItsNodeOwnsWithTheirInitialValues) {
  StoreFixture f;
  size_t total = 0;
  for (NodeId self : {0u, 1u}) {
    KeyStore store(f.layout, f.map, self, f.initial, OwnerOptimizer{});
    for (Key k : store.ownedKeys()) {
      EXPECT_EQ(f.map.home(k), self);
      const std::optional<KeyEntry> entry = store.copyRow(k);
      ASSERT_TRUE(entry);
      EXPECT_EQ(entry->technique, KeyTechnique::kHome);
      ASSERT_EQ(entry->values.size(), f.layout.length(k));
      EXPECT_EQ(entry->values[0], static_cast<float>(f.layout.offset(k)));
      ++total;
    }
  }
  EXPECT_EQ(total, f.layout.numKeys());
}

TEST(KeyStore, RefusesBadRequestsWithAReason) {
  StoreFixture f;
  const NodeId self = f.ownerOfSomeKey();
  KeyStore store(f.layout, f.map, self, f.initial, OwnerOptimizer{});
  const std::vector<Key> owned = store.ownedKeys();
  ASSERT_FALSE(owned.empty());
  std::optional<Key> foreign;
  for (Key k = 0; k < f.layout.numKeys(); ++k) {
    if (f.map.home(k) != self) foreign = k;
  }

  EXPECT_EQ(store.check(owned, std::nullopt), std::nullopt);
  EXPECT_EQ(store.check(owned, store.floatsOf(owned)), std::nullopt);
  const std::vector<Key> unknown{99};
  EXPECT_NE(store.check(unknown, std::nullopt)->find("unknown key 99"), std::string::npos);
  const std::vector<Key> twice{owned[0], owned[0]};
  EXPECT_NE(store.check(twice, std::nullopt)->find("sorted and unique"), std::string::npos);
  EXPECT_NE(store.check(owned, store.floatsOf(owned) + 1)->find("wrong length"), std::string::npos);
  if (foreign) {
    const std::vector<Key> other{*foreign};
    const auto error = store.check(other, std::nullopt);
    ASSERT_TRUE(error);
    EXPECT_NE(error->find("not owned here"), std::string::npos) << *error;
  }
}

// The rate is the schedule's at the clock the push belongs to, not at the order pushes arrive
// in: a late push from clock 0 gets clock 0's rate after a push from clock 5.
TEST(KeyStore, TheRateFollowsTheScheduleOverThePushesClock) {
  StoreFixture f;
  const NodeId self = f.ownerOfSomeKey();
  OwnerOptimizer optimizer;
  optimizer.sgd.momentum = 0;
  optimizer.schedule.kind = ml::LrSchedule::Kind::kStep;
  optimizer.schedule.baseLr = 0.5;
  optimizer.schedule.stepEvery = 4;
  optimizer.schedule.gamma = 0.1;
  KeyStore store(f.layout, f.map, self, f.initial, optimizer);
  const std::vector<Key> keys{store.ownedKeys()[0]};
  std::vector<float> grads(store.floatsOf(keys), 1.0f);
  store.apply(keys, grads, /*clock=*/5);  // rate 0.05
  store.apply(keys, grads, /*clock=*/0);  // rate 0.5
  std::vector<float> out;
  store.read(keys, out);
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_FLOAT_EQ(out[i], f.initial[f.layout.offset(keys[0]) + i] - 0.05f - 0.5f);
  }
}

// Per-clock momentum: an owner receiving N pushes per clock moves a key the way one node with
// momentum moves it under the averaged gradient, also after the gradient stops (the memory
// decays by mu per clock). Per-push momentum reaches the same steady state but forgets N times
// faster, which this test also shows so that it can tell the two apart.
TEST(KeyStore, PerClockMomentumMovesAKeyLikeOneNodeWithMomentum) {
  constexpr int kWorkers = 4, kClocks = 60;
  constexpr double kMu = 0.9, kLr = 0.1;
  // One node: v = mu v + g; w -= lr v, with g = 1 for 30 steps and 0 after.
  std::vector<double> single;
  double v = 0;
  for (int c = 0; c < kClocks; ++c) {
    v = kMu * v + (c < 30 ? 1.0 : 0.0);
    single.push_back(kLr * v);
  }
  auto owner = [&](OwnerOptimizer::Momentum mode) {
    StoreFixture f;
    OwnerOptimizer optimizer;
    optimizer.sgd.momentum = kMu;
    optimizer.schedule.baseLr = kLr;
    optimizer.push_scale = 1.0 / kWorkers;
    optimizer.momentum_mode = mode;
    const NodeId self = f.ownerOfSomeKey();
    KeyStore store(f.layout, f.map, self, f.initial, optimizer);
    const std::vector<Key> keys{store.ownedKeys()[0]};
    std::vector<double> moved;
    std::vector<float> before, after;
    for (int c = 0; c < kClocks; ++c) {
      store.read(keys, before);
      const std::vector<float> grads(store.floatsOf(keys), c < 30 ? 1.0f : 0.0f);
      for (int w = 0; w < kWorkers; ++w)
        store.apply(keys, grads, c);
      after.clear();
      store.read(keys, after);
      moved.push_back(static_cast<double>(before[0] - after[0]));
      before.clear();
    }
    return moved;
  };
  auto worstGap = [&](const std::vector<double>& moved) {
    double gap = 0;
    for (int c = 0; c < kClocks; ++c)
      gap = std::max(gap, std::abs(moved[c] - single[c]));
    return gap / *std::max_element(single.begin(), single.end());
  };
  EXPECT_LT(worstGap(owner(OwnerOptimizer::Momentum::kPerClock)), 0.06);
  EXPECT_GT(worstGap(owner(OwnerOptimizer::Momentum::kPerPush)), 0.3);
}

TEST(KeyStore, OwnerMomentumParsesItsTwoNamesAndRefusesOthers) {
  EXPECT_EQ(OwnerOptimizer::parseMomentum("clock"), OwnerOptimizer::Momentum::kPerClock);
  EXPECT_EQ(OwnerOptimizer::parseMomentum("push"), OwnerOptimizer::Momentum::kPerPush);
  EXPECT_THROW(OwnerOptimizer::parseMomentum("sideways"), std::invalid_argument);
}

TEST(KeyStore, AppliesEachPushWithTheScaledLearningRate) {
  StoreFixture f;
  const NodeId self = f.ownerOfSomeKey();
  OwnerOptimizer optimizer;
  optimizer.sgd.momentum = 0;
  optimizer.schedule.baseLr = 0.5;
  optimizer.push_scale = 0.25;  // four workers
  KeyStore store(f.layout, f.map, self, f.initial, optimizer);
  const std::vector<Key> keys{store.ownedKeys()[0]};
  std::vector<float> grads(store.floatsOf(keys), 2.0f);
  store.apply(keys, grads, /*clock=*/0);
  std::vector<float> out;
  store.read(keys, out);
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_FLOAT_EQ(out[i], f.initial[f.layout.offset(keys[0]) + i] - 0.5f * 0.25f * 2.0f);
  }
  EXPECT_EQ(store.copyRow(keys[0])->updates, 1u);
  EXPECT_EQ(store.updatesApplied(), 1u);
}

// Relocation moves a row with its optimizer state: a row extracted from one store and inserted
// into another goes on exactly as if it had stayed.
TEST(KeyStore, ARowMovesWithItsOptimizerState) {
  StoreFixture f;
  OwnerOptimizer optimizer;
  optimizer.sgd.momentum = 0.9;
  optimizer.schedule.baseLr = 0.1;
  const NodeId self = f.ownerOfSomeKey();
  KeyStore from(f.layout, f.map, self, f.initial, optimizer);
  KeyStore stayed(f.layout, f.map, self, f.initial, optimizer);
  KeyStore to(KeySpace(f.layout), std::make_shared<SgdPolicy>(optimizer));
  const Key key = from.ownedKeys()[0];
  const std::vector<Key> keys{key};
  const std::vector<float> grads(from.floatsOf(keys), 1.0f);
  for (KeyStore* store : {&from, &stayed})
    store->apply(keys, grads, 0);

  std::optional<KeyEntry> row = from.extract(key);
  ASSERT_TRUE(row);
  EXPECT_FALSE(from.contains(key));
  EXPECT_FALSE(from.extract(key));
  EXPECT_NE(from.check(keys, std::nullopt)->find("not owned here"), std::string::npos);
  EXPECT_EQ(row->state.size(), row->values.size());
  ASSERT_EQ(to.insert(key, std::move(*row)), std::nullopt);
  EXPECT_EQ(to.ownedKeys(), keys);

  for (KeyStore* store : {&to, &stayed})
    store->apply(keys, grads, 1);
  EXPECT_EQ(to.copyRow(key)->values, stayed.copyRow(key)->values);
  EXPECT_EQ(to.copyRow(key)->state, stayed.copyRow(key)->state);
  EXPECT_EQ(to.copyRow(key)->updates, 2u);
}

TEST(KeyStore, InsertRefusesWhatDoesNotFit) {
  KeySpace space;
  space.addTable("entity", 5, 3);
  space.addTable("relation", 2, 6);
  AdagradConfig config;
  KeyStore store(space, std::make_shared<AdagradPolicy>(config));
  EXPECT_NE(store.insert(7, KeyEntry{.values = std::vector<float>(3), .state = {}})
                ->find("not in the key space"),
            std::string::npos);
  EXPECT_NE(store.insert(1, KeyEntry{.values = std::vector<float>(6), .state = {}})
                ->find("holds 3 floats"),
            std::string::npos);
  EXPECT_NE(
      store.insert(1, KeyEntry{.values = std::vector<float>(3), .state = std::vector<float>(2)})
          ->find("optimizer state"),
      std::string::npos);
  ASSERT_EQ(store.insert(1, KeyEntry{.values = std::vector<float>(3), .state = {}}), std::nullopt);
  EXPECT_NE(store.insert(1, KeyEntry{.values = std::vector<float>(3), .state = {}})
                ->find("held here already"),
            std::string::npos);
  EXPECT_EQ(store.copyRow(1)->state, std::vector<float>(3, 0.0f));  // a fresh AdaGrad state
  EXPECT_EQ(store.size(), 1u);
}

// Rows of different tables (different lengths) in one store, updated by AdaGrad with their own
// accumulators; a key the push does not name is not touched.
TEST(KeyStore, RowsOfSeveralTablesUpdateWithTheirOwnAccumulators) {
  KeySpace space;
  space.addTable("entity", 100, 2);
  space.addTable("relation", 1000, 3, 5);
  AdagradConfig config;
  config.schedule.baseLr = 1.0;
  KeyStore store(space, std::make_shared<AdagradPolicy>(config));
  for (Key key : {Key{4}, Key{50}, Key{1001}})
    ASSERT_EQ(store.insert(key, KeyEntry{.values = std::vector<float>(space.length(key), 1.0f),
                                         .state = {}}),
              std::nullopt);
  const std::vector<Key> keys{4, 1001};
  const std::vector<float> grads{2, 2, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  ASSERT_EQ(store.check(keys, grads.size()), std::nullopt);
  store.apply(keys, grads, 0);
  store.apply(keys, grads, 1);
  // AdaGrad's first step moves every float by lr (g / |g|); the second by lr / sqrt(2).
  const float moved = 1.0f + 1.0f / std::sqrt(2.0f);
  for (Key key : keys) {
    const std::optional<KeyEntry> row = store.copyRow(key);
    for (float v : row->values)
      EXPECT_NEAR(v, 1.0f - moved, 1e-6f) << "key " << key;
  }
  EXPECT_EQ(store.copyRow(4)->state, std::vector<float>(2, 8.0f));
  EXPECT_EQ(store.copyRow(1001)->state, std::vector<float>(5, 0.5f));
  EXPECT_EQ(store.copyRow(50)->values, std::vector<float>(2, 1.0f));
  EXPECT_EQ(store.copyRow(50)->state, std::vector<float>(2, 0.0f));
}

// A per-row rule (not elementwise): one float of state per row that counts the updates, and
// w += g. The store must hand it one RowUpdate per row, never a run of rows.
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

// Rows taken in key order lie in key order: keys that are next to each other among the ones
// held here are one run, however many keys other nodes hold in between; a run ends where a
// table ends or where the next key's row lies elsewhere.
TEST(KeyStore, KeysNextToEachOtherHereAreOneRun) {
  KeySpace space;
  space.addTable("entity", 100, 2);
  space.addTable("relation", 10, 3);
  KeyStore store(space, std::make_shared<AdagradPolicy>(AdagradConfig{}));
  std::vector<Key> held;
  for (Key key = 0; key < space.keyEnd(); key += 3) {  // every third key: the others elsewhere
    ASSERT_EQ(store.insert(key, KeyEntry{.values = std::vector<float>(space.length(key),
                                                                      static_cast<float>(key)),
                                         .state = {}}),
              std::nullopt);
    held.push_back(key);
  }
  std::vector<KeyStore::Run> runs;
  ASSERT_EQ(store.locate(held, store.floatsOf(held), nullptr, runs), std::nullopt);
  ASSERT_EQ(runs.size(), 2u);  // one per table
  EXPECT_EQ(runs[0].rows, 34u);
  EXPECT_EQ(runs[0].floats, 68u);
  EXPECT_EQ(runs[1].rows, 3u);  // 102, 105, 108
  EXPECT_EQ(runs[1].floats, 9u);
  std::vector<std::span<const float>> pieces;
  store.rowsOf(held, pieces);
  ASSERT_EQ(pieces.size(), 2u);
  std::vector<float> read;
  store.read(held, read);
  std::vector<float> expected;
  for (Key key : held)
    expected.insert(expected.end(), space.length(key), static_cast<float>(key));
  EXPECT_EQ(read, expected);

  // A key that leaves splits the run; one that comes back takes its slot again.
  const std::vector<Key> middle{30, 33, 36};
  ASSERT_TRUE(store.extract(33));
  EXPECT_NE(store.locate(middle, std::nullopt, nullptr, runs)->find("key 33 is not owned here"),
            std::string::npos);
  EXPECT_TRUE(runs.empty());
  const std::vector<Key> around{30, 36};
  ASSERT_EQ(store.locate(around, std::nullopt, nullptr, runs), std::nullopt);
  EXPECT_EQ(runs.size(), 2u);
  ASSERT_EQ(store.insert(33, KeyEntry{.values = {7, 7}, .state = {}}), std::nullopt);
  ASSERT_EQ(store.locate(middle, std::nullopt, nullptr, runs), std::nullopt);
  EXPECT_EQ(runs.size(), 1u);
  EXPECT_EQ(store.copyRow(33)->values, (std::vector<float>{7, 7}));
}

// Rows named by slot (issue 25): the runs locate() finds, handed out as slot runs, name the same
// rows with the same floats; a slot that holds no row, a row named twice or a wrong count of
// values is refused; and the layout changes when a row leaves (its slot may hold another key
// later), not when one arrives (every other row stays where it is).
TEST(KeyStore, RowsNamedBySlotAreTheRowsOfTheirKeysUntilARowLeaves) {
  KeySpace space;
  space.addTable("entity", 100, 2);
  space.addTable("chunks", 10, 3);
  KeyStore store(space, std::make_shared<AdagradPolicy>(AdagradConfig{}));
  std::vector<Key> held;
  for (Key key = 0; key < space.keyEnd(); key += 3) {
    ASSERT_EQ(store.insert(key, KeyEntry{.values = std::vector<float>(space.length(key),
                                                                      static_cast<float>(key)),
                                         .state = {}}),
              std::nullopt);
    held.push_back(key);
  }
  std::vector<KeyStore::Run> runs, by_slot;
  ASSERT_EQ(store.locate(held, std::nullopt, nullptr, runs), std::nullopt);
  std::vector<SlotRun> slots;
  KeyStore::slotRunsOf(runs, slots);
  ASSERT_EQ(store.locateSlots(slots, store.floatsOf(held), by_slot), std::nullopt);
  ASSERT_EQ(by_slot.size(), runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(by_slot[i].slot, runs[i].slot);
    EXPECT_EQ(by_slot[i].rows, runs[i].rows);
    EXPECT_EQ(by_slot[i].floats, runs[i].floats);
  }
  std::vector<std::span<const float>> a, b;
  store.rowsOf(held, a);
  store.rowsOfRuns(by_slot, b);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i].data(), b[i].data());
  std::vector<Key> keys;
  store.keysOf(by_slot, keys);
  EXPECT_EQ(keys, held);
  EXPECT_NE(store.locateSlots(slots, store.floatsOf(held) + 1, by_slot)->find("values"),
            std::string::npos);
  const std::vector<SlotRun> twice{{.table = 0, .slot = 4, .rows = 3},
                                   {.table = 0, .slot = 2, .rows = 3}};
  EXPECT_NE(store.locateSlots(twice, std::nullopt, by_slot)->find("twice"), std::string::npos);
  const std::vector<SlotRun> outside{{.table = 0, .slot = 30, .rows = 10}};
  EXPECT_NE(store.locateSlots(outside, std::nullopt, by_slot)->find("outside"), std::string::npos);
  const std::vector<SlotRun> no_table{{.table = 5, .slot = 0, .rows = 1}};
  EXPECT_NE(store.locateSlots(no_table, std::nullopt, by_slot)->find("table 5"), std::string::npos);

  const uint64_t before = store.layout();
  ASSERT_EQ(store.insert(1, KeyEntry{.values = {1, 1}, .state = {}}), std::nullopt);
  EXPECT_EQ(store.layout(), before);
  ASSERT_TRUE(store.extract(3));  // slot 1 of the entity slab
  EXPECT_NE(store.layout(), before);
  const std::vector<SlotRun> freed{{.table = 0, .slot = 1, .rows = 1}};
  EXPECT_NE(store.locateSlots(freed, std::nullopt, by_slot)->find("holds no row"),
            std::string::npos);
  // Another store over the same keys does not take this one's slots for its own.
  KeyStore other(space, std::make_shared<AdagradPolicy>(AdagradConfig{}));
  EXPECT_NE(other.layout(), store.layout());
}

// The lapse shell moves rows in and out of the store at any time: under random inserts,
// extracts and pushes (AdaGrad, two tables of different lengths, a chunked last row), the
// store holds exactly what a map of rows updated one by one holds, and runs of rows updated
// together give the same bits as rows updated one at a time.
TEST(KeyStore, GainsAndLosesRowsLikeAMapOfRows) {
  for (const bool huge : {false, true}) {  // a space too large for the key index: a hash map
    KeySpace space;
    const Key base = huge ? (Key{1} << 40) : 0;
    space.addTable("entity", base, 40, 3);
    space.addTable("relation", base + 50, 20, 5);
    AdagradConfig config;
    config.schedule.baseLr = 0.1;
    config.initial_accumulator = 0.1;
    const auto policy = std::make_shared<AdagradPolicy>(config);
    KeyStore store(space, policy);
    std::map<Key, KeyEntry> reference;
    std::mt19937_64 rng(huge ? 11 : 7);
    const std::vector<Key> all = space.allKeys();
    for (int step = 0; step < 3000; ++step) {
      const Key key = all[rng() % all.size()];
      const int action = static_cast<int>(rng() % 3);
      if (action == 0) {
        KeyEntry row;
        row.values.assign(space.length(key), static_cast<float>(rng() % 100));
        if (rng() % 2) {
          row.state.assign(space.length(key), 0.5f);
          row.updates = rng() % 10;
        }
        const bool fresh = !reference.count(key);
        ASSERT_EQ(store.insert(key, row).has_value(), !fresh) << "key " << key;
        if (fresh) {
          if (row.state.empty()) row.state.assign(space.length(key), 0.1f);
          reference[key] = row;
        }
      } else if (action == 1) {
        const std::optional<KeyEntry> out = store.extract(key);
        auto it = reference.find(key);
        ASSERT_EQ(out.has_value(), it != reference.end()) << "key " << key;
        if (out) {
          EXPECT_EQ(out->values, it->second.values) << "key " << key;
          EXPECT_EQ(out->state, it->second.state) << "key " << key;
          EXPECT_EQ(out->updates, it->second.updates) << "key " << key;
          reference.erase(it);
        }
      } else {
        // A push to a random subset of the held keys, through locate + applyRuns.
        std::vector<Key> keys;
        std::vector<float> grads;
        for (const auto& [k, row] : reference) {
          if (rng() % 2) continue;
          keys.push_back(k);
          for (size_t i = 0; i < row.values.size(); ++i)
            grads.push_back(static_cast<float>(static_cast<int>(rng() % 7) - 3));
        }
        std::vector<KeyStore::Run> runs;
        ASSERT_EQ(store.locate(keys, grads.size(), nullptr, runs), std::nullopt);
        store.applyRuns(runs, grads, step);
        size_t at = 0;
        for (Key k : keys) {
          KeyEntry& row = reference[k];
          const RowUpdate update{row.values, row.state,
                                 std::span<const float>(grads).subspan(at, row.values.size())};
          policy->applyPush(step, std::span<const RowUpdate>(&update, 1));
          ++row.updates;
          at += row.values.size();
        }
      }
      ASSERT_EQ(store.size(), reference.size());
    }
    std::vector<Key> held;
    for (const auto& [key, row] : reference) {
      held.push_back(key);
      const std::optional<KeyEntry> got = store.copyRow(key);
      ASSERT_TRUE(got) << "key " << key;
      EXPECT_EQ(got->values, row.values) << "key " << key;  // bit for bit
      EXPECT_EQ(got->state, row.state) << "key " << key;
      EXPECT_EQ(got->updates, row.updates) << "key " << key;
      const std::span<const float> values = store.valuesOf(key);
      EXPECT_TRUE(std::equal(values.begin(), values.end(), row.values.begin(), row.values.end()));
    }
    EXPECT_EQ(store.ownedKeys(), held);
    for (Key key : all) {
      EXPECT_EQ(store.contains(key), reference.count(key) == 1) << "key " << key;
    }
  }
}

// A rule that is not elementwise gets one update per row even where the rows form one run;
// a chunked table's shorter last row keeps its own length.
TEST(KeyStore, APerRowPolicyUpdatesEachRowOfARun) {
  const ChunkLayout layout(10, 4);  // keys 0 [0,4), 1 [4,8), 2 [8,10)
  KeyStore store(KeySpace(layout), std::make_shared<CountingPolicy>());
  for (Key key = 0; key < 3; ++key) {
    ASSERT_EQ(store.insert(key, KeyEntry{.values = std::vector<float>(layout.length(key), 1.0f),
                                         .state = {}}),
              std::nullopt);
  }
  const std::vector<Key> keys{0, 1, 2};
  const std::vector<float> grads(10, 2.0f);
  store.apply(keys, grads, 0);
  store.apply(keys, grads, 1);
  for (Key key = 0; key < 3; ++key) {
    const std::optional<KeyEntry> row = store.copyRow(key);
    ASSERT_TRUE(row);
    EXPECT_EQ(row->values, std::vector<float>(layout.length(key), 5.0f)) << "key " << key;
    EXPECT_EQ(row->state, std::vector<float>{2.0f}) << "key " << key;
    EXPECT_EQ(row->updates, 2u);
  }
}

// A policy whose state is larger than the one the store was sized for: the states held move
// to the wider stride and keep their values.
TEST(KeyStore, ANewPolicyWithMoreStateKeepsTheStatesHeld) {
  const ChunkLayout layout(6, 2);
  OwnerOptimizer plain;  // no momentum: no state
  plain.schedule.baseLr = 1.0;
  KeyStore store(KeySpace(layout), std::make_shared<SgdPolicy>(plain));
  for (Key key = 0; key < 3; ++key) {
    ASSERT_EQ(store.insert(key, KeyEntry{.values = {1, 1}, .state = {}}), std::nullopt);
  }
  AdagradConfig config;
  config.initial_accumulator = 0.25;
  store.setPolicy(KeyTechnique::kHome, std::make_shared<AdagradPolicy>(config));
  const std::vector<Key> keys{0, 1, 2};
  store.restore(keys, std::vector<float>(6, 3.0f));  // resets the states with the new policy
  for (Key key = 0; key < 3; ++key) {
    EXPECT_EQ(store.copyRow(key)->state, (std::vector<float>{0.25f, 0.25f}));
    EXPECT_EQ(store.copyRow(key)->values, (std::vector<float>{3, 3}));
  }
}

}  // namespace
}  // namespace chorus::ps
