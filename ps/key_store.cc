#include "ps/key_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
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

OwnerOptimizer::Momentum OwnerOptimizer::parseMomentum(std::string_view text) {
  if (text == "clock") return Momentum::kPerClock;
  if (text == "push") return Momentum::kPerPush;
  throw std::invalid_argument(
      fmt::format("--owner-momentum must be clock or push, not '{}'", text));
}

double OwnerOptimizer::pushMomentum() const {
  return spreadsMomentum() ? std::pow(sgd.momentum, push_scale) : sgd.momentum;
}

double OwnerOptimizer::pushLr(int64_t clock) const {
  const double lr = schedule.at(clock) * push_scale;
  if (!spreadsMomentum()) return lr;
  // N pushes of (1 - mu') / (1 - mu) * lr / N each add up to the single-node steady state.
  return lr * (1.0 - pushMomentum()) / (1.0 - sgd.momentum);
}

ml::SgdConfig OwnerOptimizer::pushSgd() const {
  ml::SgdConfig config = sgd;
  config.momentum = pushMomentum();
  return config;
}

KeyStore::KeyStore(const ChunkLayout& layout, const ShardMap& map, NodeId self,
                   std::span<const float> initial, OwnerOptimizer optimizer)
    : layout_(layout), map_(map), self_(self), optimizer_(optimizer) {
  if (initial.size() != layout.total()) {
    throw std::invalid_argument(fmt::format("initial model has {} floats, the key layout {}",
                                            initial.size(), layout.total()));
  }
  entries_.resize(layout.numKeys());
  for (Key key = 0; key < layout.numKeys(); ++key) {
    if (map.home(key) != self) continue;
    entries_[key] = std::make_unique<KeyEntry>();
    KeyEntry& entry = *entries_[key];
    const auto slice = initial.subspan(layout.offset(key), layout.length(key));
    entry.values.assign(slice.begin(), slice.end());
    if (optimizer_.sgd.momentum != 0.0) entry.velocity.assign(slice.size(), 0.0f);
  }
}

std::optional<std::string> KeyStore::check(std::span<const uint64_t> keys,
                                           std::optional<size_t> values) const {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0 && keys[i] <= keys[i - 1]) {
      return fmt::format("keys must be sorted and unique: key {} follows key {}", keys[i],
                         keys[i - 1]);
    }
    if (keys[i] >= layout_.numKeys()) {
      return fmt::format("unknown key {}: the model has keys 0..{}", keys[i],
                         layout_.numKeys() - 1);
    }
    if (!entries_[keys[i]]) {
      return fmt::format("key {} is not owned here (its owner is node {})", keys[i],
                         map_.home(keys[i]));
    }
  }
  if (values) {
    const size_t expected = floatsOf(keys);
    if (*values != expected) {
      return fmt::format("wrong length: {} floats for {} key(s), which hold {}", *values,
                         keys.size(), expected);
    }
  }
  return std::nullopt;
}

void KeyStore::read(std::span<const uint64_t> keys, std::vector<float>& out) const {
  for (Key key : keys) {
    const KeyEntry& entry = *entries_[key];
    out.insert(out.end(), entry.values.begin(), entry.values.end());
  }
}

void KeyStore::copyTo(std::span<const uint64_t> keys, float* out) const {
  for (Key key : keys) {
    const KeyEntry& entry = *entries_[key];
    out = std::copy(entry.values.begin(), entry.values.end(), out);
  }
}

std::vector<std::span<const float>> KeyStore::rows(std::span<const uint64_t> keys) const {
  std::vector<std::span<const float>> out;
  out.reserve(keys.size());
  for (Key key : keys)
    out.emplace_back(entries_[key]->values);
  return out;
}

void KeyStore::apply(std::span<const uint64_t> keys, std::span<const float> grads, int64_t clock) {
  const double lr = optimizer_.pushLr(clock);
  const ml::SgdConfig sgd = optimizer_.pushSgd();
  size_t offset = 0;
  for (Key key : keys) {
    KeyEntry& entry = *entries_[key];
    const size_t len = entry.values.size();
    switch (entry.technique) {
      case KeyTechnique::kHome:
        ml::sgdUpdate(sgd, lr, entry.values, grads.subspan(offset, len), entry.velocity);
        break;
    }
    ++entry.updates;
    offset += len;
  }
  ++updates_;
}

void KeyStore::applyClock(std::span<const Push> pushes, int64_t clock) {
  // Per key: the sum of the clock's gradients, then their mean.
  std::map<Key, std::vector<float>> means;
  for (const Push& push : pushes) {
    size_t offset = 0;
    for (Key key : push.keys) {
      KeyEntry& entry = *entries_[key];
      const size_t len = entry.values.size();
      std::vector<float>& sum = means[key];
      if (sum.empty()) sum.assign(len, 0.0f);
      for (size_t i = 0; i < len; ++i)
        sum[i] += push.grads[offset + i];
      ++entry.updates;
      offset += len;
    }
  }
  const double lr = optimizer_.schedule.at(clock);
  const auto scale = static_cast<float>(optimizer_.push_scale);
  for (auto& [key, mean] : means) {
    for (float& g : mean)
      g *= scale;
    KeyEntry& entry = *entries_[key];
    switch (entry.technique) {
      case KeyTechnique::kHome:
        ml::sgdUpdate(optimizer_.sgd, lr, entry.values, mean, entry.velocity);
        break;
    }
  }
  ++updates_;
}

void KeyStore::restore(std::span<const uint64_t> keys, std::span<const float> values) {
  size_t offset = 0;
  for (Key key : keys) {
    KeyEntry& entry = *entries_[key];
    const auto slice = values.subspan(offset, entry.values.size());
    std::copy(slice.begin(), slice.end(), entry.values.begin());
    std::fill(entry.velocity.begin(), entry.velocity.end(), 0.0f);
    offset += entry.values.size();
  }
}

size_t KeyStore::floatsOf(std::span<const uint64_t> keys) const {
  size_t n = 0;
  for (Key key : keys)
    n += layout_.length(key);
  return n;
}

std::vector<Key> KeyStore::ownedKeys() const {
  std::vector<Key> keys;
  for (Key key = 0; key < entries_.size(); ++key) {
    if (entries_[key]) keys.push_back(key);
  }
  return keys;
}

const KeyEntry* KeyStore::find(Key key) const {
  return key < entries_.size() ? entries_[key].get() : nullptr;
}

}  // namespace chorus::ps
