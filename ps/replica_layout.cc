#include "ps/replica_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace chorus::ps {

ReplicaLayout::ReplicaLayout(const KeySpace& space, std::vector<Key> keys, const ShardMap& members,
                             const UpdatePolicy* policy)
    : keys_(std::move(keys)),
      members_(members.nodes()),
      syncs_state_(policy != nullptr && policy->stateAddsUp()) {
  std::sort(keys_.begin(), keys_.end());
  keys_.erase(std::unique(keys_.begin(), keys_.end()), keys_.end());
  offset_.reserve(keys_.size() + 1);
  offset_.push_back(0);
  length_.reserve(keys_.size());
  part_.reserve(keys_.size());
  for (Key key : keys_) {
    const size_t length = space.length(key);
    if (length == 0) {
      throw std::invalid_argument(
          fmt::format("hot key {} is not in the key space (keys end at {})", key, space.keyEnd()));
    }
    const size_t state = syncs_state_ ? policy->stateFloats(length) : 0;
    length_.push_back(length);
    total_length_ += length;
    offset_.push_back(offset_.back() + length + state);
    part_.push_back(*memberIndex(members.home(key)));
  }
}

std::optional<size_t> ReplicaLayout::indexFrom(Key key, size_t from) const {
  // Gallop from `from`, then search the bracket found: O(log distance).
  size_t lo = std::min(from, keys_.size()), hi = lo, step = 1;
  while (hi < keys_.size() && keys_[hi] < key) {
    lo = hi + 1;
    hi += step;
    step *= 2;
  }
  const auto end = keys_.begin() + static_cast<std::ptrdiff_t>(std::min(hi + 1, keys_.size()));
  const auto it = std::lower_bound(keys_.begin() + static_cast<std::ptrdiff_t>(lo), end, key);
  if (it == end || *it != key) return std::nullopt;
  return static_cast<size_t>(it - keys_.begin());
}

std::optional<size_t> ReplicaLayout::memberIndex(NodeId node) const {
  auto it = std::lower_bound(members_.begin(), members_.end(), node);
  if (it == members_.end() || *it != node) return std::nullopt;
  return static_cast<size_t>(it - members_.begin());
}

size_t ReplicaLayout::widthOf(std::span<const Key> keys) const {
  size_t floats = 0;
  for (Key key : keys)
    floats += width(*indexOf(key));
  return floats;
}

std::optional<std::string> ReplicaLayout::check(const SparseRows& rows,
                                                std::optional<size_t> part) const {
  size_t floats = 0, hint = 0;
  for (size_t j = 0; j < rows.keys.size(); ++j) {
    const Key key = rows.keys[j];
    if (j > 0 && key <= rows.keys[j - 1]) {
      return fmt::format("keys must be sorted and unique (key {} after {})", key, rows.keys[j - 1]);
    }
    const std::optional<size_t> i = indexFrom(key, hint);
    if (!i) return fmt::format("key {} is not a replicated key", key);
    if (part && part_[*i] != *part) {
      return fmt::format("key {} belongs to the part of node {}, not node {}", key,
                         members_[part_[*i]], members_[*part]);
    }
    floats += width(*i);
    hint = *i + 1;
  }
  if (rows.values.size() != floats) {
    return fmt::format("{} rows hold {} floats, not {}: wrong length", rows.keys.size(),
                       rows.values.size(), floats);
  }
  return std::nullopt;
}

void addRows(const ReplicaLayout& layout, SparseRows& acc, const SparseRows& add) {
  if (add.empty()) return;
  if (acc.empty()) {
    acc = add;
    return;
  }
  SparseRows out;
  out.keys.reserve(acc.keys.size() + add.keys.size());
  out.values.reserve(acc.values.size() + add.values.size());
  size_t a = 0, b = 0, av = 0, bv = 0, hint = 0;
  // Rows come out in key order: each key's position is searched from the last one's.
  auto widthOf = [&](Key key) {
    hint = *layout.indexFrom(key, hint);
    return layout.width(hint);
  };
  auto copy = [&](const SparseRows& from, size_t& row, size_t& at) {
    const size_t w = widthOf(from.keys[row]);
    out.keys.push_back(from.keys[row]);
    out.values.insert(out.values.end(), from.values.begin() + static_cast<std::ptrdiff_t>(at),
                      from.values.begin() + static_cast<std::ptrdiff_t>(at + w));
    ++row;
    at += w;
  };
  while (a < acc.keys.size() && b < add.keys.size()) {
    if (acc.keys[a] < add.keys[b]) {
      copy(acc, a, av);
    } else if (add.keys[b] < acc.keys[a]) {
      copy(add, b, bv);
    } else {
      const size_t w = widthOf(acc.keys[a]);
      out.keys.push_back(acc.keys[a]);
      for (size_t j = 0; j < w; ++j)
        out.values.push_back(acc.values[av + j] + add.values[bv + j]);
      ++a, ++b;
      av += w, bv += w;
    }
  }
  while (a < acc.keys.size())
    copy(acc, a, av);
  while (b < add.keys.size())
    copy(add, b, bv);
  acc = std::move(out);
}

}  // namespace chorus::ps
