#include "ps/key_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
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
    : space_(std::move(space)) {
  if (!policy) throw std::invalid_argument("a key store needs an update policy");
  policies_.fill(std::move(policy));
  if (space_.keyEnd() <= kIndexedKeys) index_.assign(space_.keyEnd(), nullptr);
}

void KeyStore::add(Key key, KeyEntry row) {
  KeyEntry& entry = rows_.emplace(key, std::move(row)).first->second;
  if (!index_.empty()) index_[key] = &entry;
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
      const auto slice = initial.subspan(space_.offset(key), table.length(key));
      KeyEntry row;
      row.values.assign(slice.begin(), slice.end());
      add(key, std::move(row));
    }
  }
  const UpdatePolicy& home = policy(KeyTechnique::kHome);
  for (auto& [key, row] : rows_) {
    row.state.resize(home.stateFloats(row.values.size()));
    home.initState(row.state);
  }
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
  add(key, std::move(row));
  return std::nullopt;
}

std::optional<KeyEntry> KeyStore::extract(Key key) {
  auto node = rows_.extract(key);
  if (node.empty()) return std::nullopt;
  if (!index_.empty()) index_[key] = nullptr;
  return std::move(node.mapped());
}

void KeyStore::setPolicy(KeyTechnique technique, std::shared_ptr<const UpdatePolicy> policy) {
  if (!policy) throw std::invalid_argument("a technique needs an update policy");
  policies_[static_cast<size_t>(technique)] = std::move(policy);
}

std::optional<std::string> KeyStore::check(std::span<const uint64_t> keys,
                                           std::optional<size_t> values,
                                           const KeyDirectory* directory) const {
  if (auto error = space_.check(keys, values)) return error;
  for (Key key : keys) {
    if (lookup(key) != nullptr) continue;
    if (directory) {
      return fmt::format("key {} is not owned here (its owner is node {})", key,
                         directory->owner(key));
    }
    return fmt::format("key {} is not owned here", key);
  }
  return std::nullopt;
}

void KeyStore::read(std::span<const uint64_t> keys, std::vector<float>& out) const {
  for (Key key : keys) {
    const KeyEntry& row = at(key);
    out.insert(out.end(), row.values.begin(), row.values.end());
  }
}

void KeyStore::copyTo(std::span<const uint64_t> keys, float* out) const {
  for (Key key : keys) {
    const KeyEntry& row = at(key);
    out = std::copy(row.values.begin(), row.values.end(), out);
  }
}

void KeyStore::rowsOf(std::span<const uint64_t> keys,
                      std::vector<std::span<const float>>& out) const {
  out.clear();
  out.reserve(keys.size());
  for (Key key : keys)
    out.emplace_back(at(key).values);
}

std::optional<std::string> KeyStore::locate(std::span<const uint64_t> keys,
                                            std::optional<size_t> values,
                                            const KeyDirectory* directory,
                                            std::vector<KeyEntry*>& rows) {
  rows.clear();
  if (auto error = space_.check(keys, values)) return error;
  rows.reserve(keys.size());
  for (Key key : keys) {
    KeyEntry* row = lookup(key);
    if (row == nullptr) return check(std::span<const uint64_t>(&key, 1), std::nullopt, directory);
    rows.push_back(row);
  }
  return std::nullopt;
}

void KeyStore::applyRows(std::span<KeyEntry* const> rows, std::span<const float> grads,
                         int64_t clock) {
  size_t offset = 0;
  for (KeyEntry* row : rows) {
    const size_t len = row->values.size();
    scratch_[static_cast<size_t>(row->technique)].push_back(
        RowUpdate{row->values, row->state, grads.subspan(offset, len)});
    ++row->updates;
    offset += len;
  }
  for (size_t t = 0; t < kKeyTechniques; ++t) {
    if (scratch_[t].empty()) continue;
    policies_[t]->applyPush(clock, scratch_[t]);
    scratch_[t].clear();
  }
  ++updates_;
}

void KeyStore::apply(std::span<const uint64_t> keys, std::span<const float> grads, int64_t clock) {
  std::vector<KeyEntry*>& rows = located_;
  rows.clear();
  rows.reserve(keys.size());
  for (Key key : keys)
    rows.push_back(&at(key));
  applyRows(rows, grads, clock);
}

void KeyStore::applyClock(std::span<const Push> pushes, int64_t clock) {
  // Per key: the sum of the clock's gradients.
  std::map<Key, std::vector<float>> sums;
  for (const Push& push : pushes) {
    size_t offset = 0;
    for (Key key : push.keys) {
      KeyEntry& row = at(key);
      const size_t len = row.values.size();
      std::vector<float>& sum = sums[key];
      if (sum.empty()) sum.assign(len, 0.0f);
      for (size_t i = 0; i < len; ++i)
        sum[i] += push.grads[offset + i];
      ++row.updates;
      offset += len;
    }
  }
  for (auto& [key, sum] : sums) {
    KeyEntry& row = at(key);
    scratch_[static_cast<size_t>(row.technique)].push_back(RowUpdate{row.values, row.state, sum});
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
    KeyEntry& row = at(key);
    const auto slice = values.subspan(offset, row.values.size());
    std::copy(slice.begin(), slice.end(), row.values.begin());
    policy(row.technique).initState(row.state);
    offset += row.values.size();
  }
}

std::vector<Key> KeyStore::ownedKeys() const {
  std::vector<Key> keys;
  keys.reserve(rows_.size());
  for (const auto& [key, row] : rows_)
    keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

const KeyEntry* KeyStore::find(Key key) const {
  return lookup(key);
}

}  // namespace chorus::ps
