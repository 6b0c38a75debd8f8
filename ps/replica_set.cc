#include "ps/replica_set.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace chorus::ps {

ReplicaSet::ReplicaSet(std::shared_ptr<const ReplicaLayout> layout, std::span<const float> initial,
                       std::shared_ptr<const UpdatePolicy> policy)
    : layout_(std::move(layout)), policy_(std::move(policy)) {
  const ReplicaLayout& l = *layout_;
  if (initial.size() != l.totalLength()) {
    throw std::invalid_argument(fmt::format("the {} hot keys hold {} floats, not {}", l.size(),
                                            l.totalLength(), initial.size()));
  }
  row_.assign(l.totalWidth(), 0.0f);
  delta_.assign(l.totalWidth(), 0.0f);
  touched_.assign(l.size(), 0);
  own_state_offset_.assign(l.size() + 1, 0);
  if (!l.syncsState()) {
    for (size_t i = 0; i < l.size(); ++i)
      own_state_offset_[i + 1] = own_state_offset_[i] + policy_->stateFloats(l.length(i));
    own_state_.assign(own_state_offset_.back(), 0.0f);
  }
  size_t at = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    std::span<float> values = rowValues(i);
    std::copy_n(initial.begin() + static_cast<std::ptrdiff_t>(at), values.size(), values.begin());
    at += values.size();
    policy_->initState(rowState(i));
  }
  synced_ = row_;
}

ReplicaSet::StateAt ReplicaSet::stateAt(size_t i) const {
  if (layout_->syncsState()) {
    const size_t begin = layout_->offset(i) + layout_->length(i);
    return {true, begin, layout_->offset(i) + layout_->width(i) - begin};
  }
  return {false, own_state_offset_[i], own_state_offset_[i + 1] - own_state_offset_[i]};
}

std::optional<std::string> ReplicaSet::check(std::span<const Key> keys,
                                             std::optional<size_t> floats) const {
  size_t total = 0, hint = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    if (j > 0 && keys[j] <= keys[j - 1]) {
      return fmt::format("keys must be sorted and unique (key {} after {})", keys[j], keys[j - 1]);
    }
    const std::optional<size_t> i = layout_->indexFrom(keys[j], hint);
    if (!i) return fmt::format("key {} is not replicated on this node", keys[j]);
    total += layout_->length(*i);
    hint = *i + 1;
  }
  if (floats && *floats != total) {
    return fmt::format("{} keys hold {} floats, not {}: wrong length", keys.size(), total, *floats);
  }
  return std::nullopt;
}

void ReplicaSet::read(std::span<const Key> keys, std::vector<float>& out) const {
  for (Key key : keys) {
    std::span<const float> v = values(key);
    out.insert(out.end(), v.begin(), v.end());
  }
}

std::span<const float> ReplicaSet::values(Key key) const {
  const size_t i = *layout_->indexOf(key);
  return {row_.data() + layout_->offset(i), layout_->length(i)};
}

std::span<const float> ReplicaSet::state(Key key) const {
  const StateAt at = stateAt(*layout_->indexOf(key));
  return {(at.synced ? row_.data() : own_state_.data()) + at.begin, at.size};
}

void ReplicaSet::push(std::span<const Key> keys, std::span<const float> grads, int64_t clock) {
  const ReplicaLayout& l = *layout_;
  updates_.clear();
  before_.clear();
  push_rows_.clear();
  size_t at = 0, hint = 0;
  for (Key key : keys) {
    const size_t i = *l.indexFrom(key, hint);  // keys are sorted: search on from the last
    hint = i + 1;
    push_rows_.push_back(i);
    const float* row = row_.data() + l.offset(i);
    before_.insert(before_.end(), row, row + l.width(i));
    updates_.push_back(RowUpdate{rowValues(i), rowState(i), grads.subspan(at, l.length(i))});
    at += l.length(i);
  }
  policy_->applyPush(clock, updates_);
  size_t b = 0;
  for (size_t i : push_rows_) {
    float* row = row_.data() + l.offset(i);
    float* delta = delta_.data() + l.offset(i);
    for (size_t j = 0; j < l.width(i); ++j)
      delta[j] += row[j] - before_[b + j];
    b += l.width(i);
    if (!touched_[i]) {
      touched_[i] = 1;
      touched_list_.push_back(i);
    }
  }
}

SparseRows ReplicaSet::takeDelta() {
  const ReplicaLayout& l = *layout_;
  std::sort(touched_list_.begin(), touched_list_.end());
  SparseRows out;
  out.keys.reserve(touched_list_.size());
  for (size_t i : touched_list_) {
    out.keys.push_back(l.keys()[i]);
    float* delta = delta_.data() + l.offset(i);
    out.values.insert(out.values.end(), delta, delta + l.width(i));
    std::fill_n(delta, l.width(i), 0.0f);
    touched_[i] = 0;
  }
  touched_list_.clear();
  return out;
}

void ReplicaSet::applySum(const SparseRows& sum) {
  const ReplicaLayout& l = *layout_;
  size_t at = 0, hint = 0;
  for (Key key : sum.keys) {
    const size_t i = *l.indexFrom(key, hint);
    hint = i + 1;
    const size_t begin = l.offset(i);
    for (size_t j = 0; j < l.width(i); ++j) {
      synced_[begin + j] += sum.values[at + j];
      row_[begin + j] = synced_[begin + j] + delta_[begin + j];
    }
    at += l.width(i);
  }
}

uint64_t ReplicaSet::bytesPerRow(size_t row_floats, const UpdatePolicy& policy) {
  const size_t state = policy.stateFloats(row_floats);
  const size_t synced = row_floats + (policy.stateAddsUp() ? state : 0);
  // The local row and its state, the synced copy and the delta of what is synced.
  return sizeof(float) * (row_floats + state + 2 * synced);
}

}  // namespace chorus::ps
