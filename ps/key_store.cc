#include "ps/key_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <stdexcept>

namespace chorus::ps {

const char* keyTechniqueName(KeyTechnique technique) {
  switch (technique) {
    case KeyTechnique::kHome:
      return "home";
  }
  return "unknown";
}

KeyStore::KeyStore(KeySpace space, std::shared_ptr<const UpdatePolicy> policy)
    : space_(std::move(space)), layout_(std::random_device{}() * uint64_t{0x9E3779B97F4A7C15}) {
  if (!policy) throw std::invalid_argument("a key store needs an update policy");
  policies_.fill(std::move(policy));
  for (const KeyTable& table : space_.tables()) {
    Slab slab;
    slab.first = table.first;
    slab.end = table.end();
    slab.row_floats = table.row_floats;
    slabs_.push_back(std::move(slab));
  }
  fitStateStrides();
  if (space_.keyEnd() <= kIndexedKeys) index_.assign(space_.keyEnd(), 0);
}

KeyStore::KeyStore(const KeySpace& space, const ShardMap& map, NodeId self,
                   std::span<const float> initial, OwnerOptimizer optimizer)
    : KeyStore(space, std::make_shared<SgdPolicy>(optimizer)) {
  if (initial.size() != space_.total()) {
    throw std::invalid_argument(fmt::format("initial model has {} floats, the key layout {}",
                                            initial.size(), space_.total()));
  }
  for (const KeyTable& table : space_.tables()) {
    for (Key key = table.first; key < table.end(); ++key) {
      if (map.home(key) != self) continue;
      KeyEntry row;
      const auto slice = initial.subspan(space_.offset(key), table.length(key));
      row.values.assign(slice.begin(), slice.end());
      insert(key, std::move(row));  // in key order: the rows lie in key order
    }
  }
}

void KeyStore::fitStateStrides() {
  for (size_t t = 0; t < slabs_.size(); ++t) {
    Slab& s = slabs_[t];
    const KeyTable& table = space_.tables()[t];
    const size_t last = table.length(table.end() - 1);
    size_t stride = 0;
    for (const auto& policy : policies_)
      stride = std::max({stride, policy->stateFloats(s.row_floats), policy->stateFloats(last)});
    if (stride <= s.state_stride) continue;
    std::vector<float> state(s.keys.size() * stride, 0.0f);
    for (size_t slot = 0; slot < s.keys.size(); ++slot) {
      std::copy_n(s.state.begin() + static_cast<std::ptrdiff_t>(slot * s.state_stride),
                  s.state_stride, state.begin() + static_cast<std::ptrdiff_t>(slot * stride));
    }
    s.state = std::move(state);
    s.state_stride = stride;
  }
}

uint32_t KeyStore::tableOf(Key key) const {
  if (slabs_.size() == 1) return 0;
  return static_cast<uint32_t>(space_.tableOf(key) - space_.tables().data());
}

bool KeyStore::contains(Key key) const {
  return space_.contains(key) && slotOf(key) != kNoSlot;
}

void KeyStore::setSlot(Key key, uint32_t slot) {
  if (!index_.empty()) {
    index_[key] = slot == kNoSlot ? 0 : slot + 1;
  } else if (slot == kNoSlot) {
    slots_.erase(key);
  } else {
    slots_[key] = slot;
  }
}

uint32_t KeyStore::takeSlot(uint32_t t, Key key) {
  Slab& s = slabs_[t];
  // After the slot of the key before, when that is free: rows that arrive in key order (a
  // relocated block) lie in key order again.
  if (key > s.first) {
    const uint32_t before = slotOf(key - 1);
    if (before != kNoSlot && before + 1 < s.keys.size() && s.keys[before + 1] == kFreeKey) {
      return before + 1;
    }
  }
  while (!s.free.empty()) {
    const uint32_t slot = s.free.back();
    s.free.pop_back();
    if (s.keys[slot] == kFreeKey) return slot;
  }
  if (s.keys.size() >= kNoSlot) throw std::length_error("a key store slab is full (2^32 rows)");
  const auto slot = static_cast<uint32_t>(s.keys.size());
  s.keys.push_back(kFreeKey);
  s.techniques.push_back(KeyTechnique::kHome);
  s.updates.push_back(0);
  s.values.resize(s.values.size() + s.row_floats);
  s.state.resize(s.state.size() + s.state_stride);
  return slot;
}

std::optional<std::string> KeyStore::insert(Key key, KeyEntry row) {
  const size_t len = space_.length(key);
  if (len == 0) return fmt::format("key {} is not in the key space", key);
  if (contains(key)) return fmt::format("key {} is held here already", key);
  if (row.values.size() != len) {
    return fmt::format("key {} holds {} floats, not {}", key, len, row.values.size());
  }
  const UpdatePolicy& rule = policy(row.technique);
  const size_t state = rule.stateFloats(len);
  if (row.state.empty() && state > 0) {
    row.state.resize(state);
    rule.initState(row.state);
  } else if (row.state.size() != state) {
    return fmt::format("key {}: {} floats of optimizer state, but {} keeps {}", key,
                       row.state.size(), rule.name(), state);
  }
  const uint32_t t = tableOf(key);
  const uint32_t slot = takeSlot(t, key);
  Slab& s = slabs_[t];
  s.keys[slot] = key;
  s.techniques[slot] = row.technique;
  s.updates[slot] = row.updates;
  std::copy(row.values.begin(), row.values.end(), valuesAt(s, slot, len).begin());
  const std::span<float> held_state = stateAt(s, slot, s.state_stride);
  std::fill(held_state.begin(), held_state.end(), 0.0f);
  std::copy(row.state.begin(), row.state.end(), held_state.begin());
  setSlot(key, slot);
  ++held_;
  ++s.held;
  return std::nullopt;
}

std::optional<KeyEntry> KeyStore::copyRow(Key key) const {
  if (!space_.contains(key)) return std::nullopt;
  const uint32_t t = tableOf(key);
  const uint32_t slot = slotOf(key);
  if (slot == kNoSlot) return std::nullopt;
  const Slab& s = slabs_[t];
  const size_t len = lengthIn(s, key);
  KeyEntry row;
  row.technique = s.techniques[slot];
  row.updates = s.updates[slot];
  const float* values = s.values.data() + slot * s.row_floats;
  row.values.assign(values, values + len);
  const float* state = s.state.data() + slot * s.state_stride;
  row.state.assign(state, state + stateOf(row.technique, len));
  return row;
}

std::span<const float> KeyStore::valuesOf(Key key) const {
  if (!space_.contains(key)) return {};
  const uint32_t t = tableOf(key);
  const uint32_t slot = slotOf(key);
  if (slot == kNoSlot) return {};
  const Slab& s = slabs_[t];
  return {s.values.data() + slot * s.row_floats, lengthIn(s, key)};
}

std::optional<KeyEntry> KeyStore::extract(Key key) {
  std::optional<KeyEntry> row = copyRow(key);
  if (!row) return std::nullopt;
  const uint32_t t = tableOf(key);
  Slab& s = slabs_[t];
  const uint32_t slot = slotOf(key);
  s.keys[slot] = kFreeKey;
  s.free.push_back(slot);
  setSlot(key, kNoSlot);
  --held_;
  --s.held;
  ++layout_;  // the slot may hold another key later: slots handed out before no longer hold
  // Slots taken after their predecessor's stay in the free list until popped: drop them when
  // the list holds more entries than free slots, so that it stays bounded.
  if (s.free.size() > 2 * (s.keys.size() - held_) + 16) {
    std::erase_if(s.free, [&](uint32_t f) { return s.keys[f] != kFreeKey; });
    std::sort(s.free.begin(), s.free.end(), std::greater<>());
    s.free.erase(std::unique(s.free.begin(), s.free.end()), s.free.end());
  }
  return row;
}

void KeyStore::setPolicy(KeyTechnique technique, std::shared_ptr<const UpdatePolicy> policy) {
  if (!policy) throw std::invalid_argument("a technique needs an update policy");
  policies_[static_cast<size_t>(technique)] = std::move(policy);
  fitStateStrides();
}

template <bool kHeld, typename Fn>
bool KeyStore::forEachRun(std::span<const uint64_t> keys, Fn&& fn) const {
  Run run;
  bool open = false;
  uint32_t t = 0;
  for (Key key : keys) {
    if (slabs_.size() > 1 && (key < slabs_[t].first || key >= slabs_[t].end)) t = tableOf(key);
    const Slab& s = slabs_[t];
    const uint32_t slot = slotOf(key);
    if (!kHeld && slot == kNoSlot) return false;
    const size_t len = lengthIn(s, key);
    const KeyTechnique technique = s.techniques[slot];
    if (open && run.table == t && run.slot + run.rows == slot && run.technique == technique) {
      ++run.rows;
      run.floats += len;
      continue;
    }
    if (open) fn(run);
    run = Run{.table = t, .slot = slot, .rows = 1, .technique = technique, .floats = len};
    open = true;
  }
  if (open) fn(run);
  return true;
}

std::optional<std::string> KeyStore::check(std::span<const uint64_t> keys,
                                           std::optional<size_t> values,
                                           const KeyDirectory* directory) const {
  if (auto error = space_.check(keys, values)) return error;
  for (Key key : keys) {
    if (slotOf(key) != kNoSlot) continue;
    if (directory) {
      return fmt::format("key {} is not owned here (its owner is node {})", key,
                         directory->owner(key));
    }
    return fmt::format("key {} is not owned here", key);
  }
  return std::nullopt;
}

void KeyStore::read(std::span<const uint64_t> keys, std::vector<float>& out) const {
  const size_t at = out.size();
  out.resize(at + floatsOf(keys));
  copyTo(keys, out.data() + at);
}

void KeyStore::copyTo(std::span<const uint64_t> keys, float* out) const {
  forEachRun<true>(keys, [&](const Run& run) {
    const Slab& s = slabs_[run.table];
    out = std::copy_n(s.values.data() + run.slot * s.row_floats, run.floats, out);
  });
}

void KeyStore::rowsOf(std::span<const uint64_t> keys,
                      std::vector<std::span<const float>>& out) const {
  out.clear();
  forEachRun<true>(keys, [&](const Run& run) {
    const Slab& s = slabs_[run.table];
    out.emplace_back(s.values.data() + run.slot * s.row_floats, run.floats);
  });
}

std::optional<std::string> KeyStore::locate(std::span<const uint64_t> keys,
                                            std::optional<size_t> values,
                                            const KeyDirectory* directory,
                                            std::vector<Run>& runs) const {
  runs.clear();
  if (auto error = space_.check(keys, values)) return error;
  // One walk finds the runs; a key not held here is named by check().
  if (!forEachRun<false>(keys, [&](const Run& run) { runs.push_back(run); })) {
    runs.clear();
    return check(keys, std::nullopt, directory);
  }
  return std::nullopt;
}

std::optional<std::string> KeyStore::locateSlots(std::span<const SlotRun> named,
                                                 std::optional<size_t> values,
                                                 std::vector<Run>& runs) const {
  runs.clear();
  size_t floats = 0;
  bool ascending = true;  // runs in slab order do not overlap if each starts past the last
  for (size_t i = 0; i < named.size(); ++i) {
    const SlotRun& r = named[i];
    if (r.table >= slabs_.size()) {
      return fmt::format("slot run {} names table {}, but the key space has {}", i, r.table,
                         slabs_.size());
    }
    const Slab& s = slabs_[r.table];
    if (r.rows == 0 || size_t{r.slot} + r.rows > s.keys.size()) {
      return fmt::format("slot run {} (table {}, slots {}-{}) is outside the {} slots held", i,
                         r.table, r.slot, size_t{r.slot} + r.rows, s.keys.size());
    }
    if (i > 0) {
      const SlotRun& p = named[i - 1];
      ascending =
          ascending && (r.table > p.table || (r.table == p.table && r.slot >= p.slot + p.rows));
    }
    // Free slots or several techniques: per slot (a slab with every slot held and one
    // technique, the common case, costs nothing per row).
    const bool full = s.held == s.keys.size();
    size_t len = size_t{r.rows} * s.row_floats;
    const Key last = s.end - 1;  // a chunked table's last row may be shorter
    if (const size_t short_len = lengthIn(s, last); short_len != s.row_floats) {
      const uint32_t at = slotOf(last);
      if (at != kNoSlot && at >= r.slot && at < r.slot + r.rows) len -= s.row_floats - short_len;
    }
    if (full && kKeyTechniques == 1) {
      runs.push_back(Run{.table = r.table,
                         .slot = r.slot,
                         .rows = r.rows,
                         .technique = s.techniques[r.slot],
                         .floats = len});
    } else {
      for (uint32_t slot = r.slot; slot < r.slot + r.rows; ++slot) {
        if (s.keys[slot] == kFreeKey) {
          return fmt::format("slot run {} names slot {} of table {}, which holds no row", i, slot,
                             r.table);
        }
        const size_t row = lengthIn(s, s.keys[slot]);
        Run* open = runs.empty() ? nullptr : &runs.back();
        if (open != nullptr && open->table == r.table && open->slot + open->rows == slot &&
            open->technique == s.techniques[slot]) {
          ++open->rows;
          open->floats += row;
        } else {
          runs.push_back(Run{.table = r.table,
                             .slot = slot,
                             .rows = 1,
                             .technique = s.techniques[slot],
                             .floats = row});
        }
      }
    }
    floats += len;
  }
  if (!ascending) {
    std::vector<SlotRun> sorted(named.begin(), named.end());
    std::sort(sorted.begin(), sorted.end(), [](const SlotRun& a, const SlotRun& b) {
      return a.table != b.table ? a.table < b.table : a.slot < b.slot;
    });
    for (size_t i = 1; i < sorted.size(); ++i) {
      const SlotRun& p = sorted[i - 1];
      if (sorted[i].table == p.table && sorted[i].slot < p.slot + p.rows) {
        runs.clear();
        return fmt::format("slot runs name slot {} of table {} twice", sorted[i].slot,
                           sorted[i].table);
      }
    }
  }
  if (values && *values != floats) {
    runs.clear();
    return fmt::format("{} values for slot runs of {} floats", *values, floats);
  }
  return std::nullopt;
}

void KeyStore::slotRunsOf(std::span<const Run> runs, std::vector<SlotRun>& out) {
  out.clear();
  for (const Run& run : runs) {
    if (!out.empty() && out.back().table == run.table &&
        out.back().slot + out.back().rows == run.slot) {
      out.back().rows += run.rows;  // runs split by technique only
    } else {
      out.push_back(SlotRun{.table = run.table, .slot = run.slot, .rows = run.rows});
    }
  }
}

void KeyStore::rowsOfRuns(std::span<const Run> runs,
                          std::vector<std::span<const float>>& out) const {
  out.clear();
  for (const Run& run : runs) {
    const Slab& s = slabs_[run.table];
    out.emplace_back(s.values.data() + run.slot * s.row_floats, run.floats);
  }
}

void KeyStore::keysOf(std::span<const Run> runs, std::vector<Key>& out) const {
  for (const Run& run : runs) {
    const Slab& s = slabs_[run.table];
    out.insert(out.end(), s.keys.begin() + run.slot, s.keys.begin() + run.slot + run.rows);
  }
}

void KeyStore::applyRuns(std::span<const Run> runs, std::span<const float> grads, int64_t clock) {
  size_t offset = 0;
  for (const Run& run : runs) {
    Slab& s = slabs_[run.table];
    const UpdatePolicy& rule = policy(run.technique);
    std::vector<RowUpdate>& updates = scratch_[static_cast<size_t>(run.technique)];
    const size_t state_floats = rule.stateFloats(s.row_floats);
    if (rule.elementwise() && (state_floats == 0 || state_floats == s.row_floats) &&
        s.state_stride == state_floats) {
      // The run's values, states and gradients are each one contiguous span.
      updates.push_back(RowUpdate{valuesAt(s, run.slot, run.floats),
                                  stateAt(s, run.slot, state_floats == 0 ? 0 : run.floats),
                                  grads.subspan(offset, run.floats)});
    } else {
      size_t at = offset;
      for (uint32_t slot = run.slot; slot < run.slot + run.rows; ++slot) {
        const size_t len = std::min(s.row_floats, offset + run.floats - at);
        updates.push_back(RowUpdate{valuesAt(s, slot, len), stateAt(s, slot, rule.stateFloats(len)),
                                    grads.subspan(at, len)});
        at += len;
      }
    }
    uint64_t* counts = s.updates.data() + run.slot;
    for (uint32_t i = 0; i < run.rows; ++i)
      ++counts[i];
    offset += run.floats;
  }
  for (size_t t = 0; t < kKeyTechniques; ++t) {
    if (scratch_[t].empty()) continue;
    policies_[t]->applyPush(clock, scratch_[t]);
    scratch_[t].clear();
  }
  ++updates_;
}

void KeyStore::apply(std::span<const uint64_t> keys, std::span<const float> grads, int64_t clock) {
  located_.clear();
  forEachRun<true>(keys, [&](const Run& run) { located_.push_back(run); });
  applyRuns(located_, grads, clock);
}

void KeyStore::applyClock(std::span<const Push> pushes, int64_t clock) {
  // Per key: the sum of the clock's gradients, in one buffer over the sorted union of the
  // pushes' keys.
  std::vector<Key> keys;
  for (const Push& push : pushes)
    keys.insert(keys.end(), push.keys.begin(), push.keys.end());
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<size_t> offsets(keys.size() + 1, 0);
  for (size_t i = 0; i < keys.size(); ++i)
    offsets[i + 1] = offsets[i] + space_.length(keys[i]);
  std::vector<float> sums(offsets.back(), 0.0f);
  for (const Push& push : pushes) {
    size_t at = 0;  // the push's keys are sorted: one forward walk through the union
    size_t offset = 0;
    for (Key key : push.keys) {
      at = static_cast<size_t>(
          std::lower_bound(keys.begin() + static_cast<std::ptrdiff_t>(at), keys.end(), key) -
          keys.begin());
      const size_t len = offsets[at + 1] - offsets[at];
      for (size_t i = 0; i < len; ++i)
        sums[offsets[at] + i] += push.grads[offset + i];
      const uint32_t t = tableOf(key);
      ++slabs_[t].updates[slotOf(key)];
      offset += len;
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t t = tableOf(keys[i]);
    Slab& s = slabs_[t];
    const uint32_t slot = slotOf(keys[i]);
    const size_t len = offsets[i + 1] - offsets[i];
    const KeyTechnique technique = s.techniques[slot];
    scratch_[static_cast<size_t>(technique)].push_back(
        RowUpdate{valuesAt(s, slot, len), stateAt(s, slot, stateOf(technique, len)),
                  std::span<const float>(sums).subspan(offsets[i], len)});
  }
  for (size_t t = 0; t < kKeyTechniques; ++t) {
    if (scratch_[t].empty()) continue;
    policies_[t]->applyClockSum(clock, scratch_[t]);
    scratch_[t].clear();
  }
  ++updates_;
}

void KeyStore::restore(std::span<const uint64_t> keys, std::span<const float> values) {
  size_t offset = 0;
  for (Key key : keys) {
    const uint32_t t = tableOf(key);
    Slab& s = slabs_[t];
    const uint32_t slot = slotOf(key);
    const size_t len = lengthIn(s, key);
    const auto slice = values.subspan(offset, len);
    std::copy(slice.begin(), slice.end(), valuesAt(s, slot, len).begin());
    const KeyTechnique technique = s.techniques[slot];
    policy(technique).initState(stateAt(s, slot, stateOf(technique, len)));
    offset += len;
  }
}

std::vector<Key> KeyStore::ownedKeys() const {
  std::vector<Key> keys;
  keys.reserve(held_);
  for (const Slab& s : slabs_) {
    for (Key key : s.keys) {
      if (key != kFreeKey) keys.push_back(key);
    }
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace chorus::ps
