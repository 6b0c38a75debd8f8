// The replicated (hot) keys of a job and how their rows are laid out for synchronization: every
// node holds a replica of each (NuPS), and a sync sums the nodes' changes of them. Per hot key:
// its synced width (its value floats, then the optimizer-state floats that are summed with them
// when the state adds up, ps/update_policy.h), its place in flat per-node arrays, and its part:
// the member that reduces it in a sync (its home in the members' ShardMap, so a hot key is
// reduced where it would be owned). Built once at start-up, identical on every node, immutable
// after; free of any networking.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ps/key_space.h"
#include "ps/shard_map.h"
#include "ps/update_policy.h"

namespace chorus::ps {

// Rows of some hot keys: keys sorted and unique, their floats one row after another (each row
// as wide as ReplicaLayout::width says).
struct SparseRows {
  std::vector<Key> keys;
  std::vector<float> values;

  bool empty() const { return keys.empty(); }
};

class ReplicaLayout {
 public:
  // `keys` (any order; duplicates count once) of `space`, synced among `members`; with `policy`
  // given and its state adding up, each row also carries its state. Throws
  // std::invalid_argument for a key outside the space (a start-up error).
  ReplicaLayout(const KeySpace& space, std::vector<Key> keys, const ShardMap& members,
                const UpdatePolicy* policy = nullptr);

  // Number of hot keys.
  size_t size() const { return keys_.size(); }
  // The hot keys, sorted.
  const std::vector<Key>& keys() const { return keys_; }
  // The position of `key` among the hot keys, or nullopt when it is not hot. O(log size).
  std::optional<size_t> indexOf(Key key) const { return indexFrom(key, 0); }
  // indexOf, searching from position `from` on: walking sorted keys with the last position as
  // `from` costs about O(1) per key when they are dense among the hot keys.
  std::optional<size_t> indexFrom(Key key, size_t from) const;
  // Value floats of hot key number `i`.
  size_t length(size_t i) const { return length_[i]; }
  // Synced floats of hot key number `i`: its value floats, then its summed state floats.
  size_t width(size_t i) const { return offset_[i + 1] - offset_[i]; }
  // Where row `i` starts in a flat array of every hot row's synced floats.
  size_t offset(size_t i) const { return offset_[i]; }
  // Synced floats of every hot row together.
  size_t totalWidth() const { return offset_.back(); }
  // Value floats of every hot row together (the size of ReplicaSet's initial values).
  size_t totalLength() const { return total_length_; }
  // Whether rows carry their optimizer state after their values.
  bool syncsState() const { return syncs_state_; }
  // The part of hot key number `i`: the index in members() of the node that reduces it.
  size_t part(size_t i) const { return part_[i]; }
  // The nodes that sync, sorted; a part is an index into them.
  const std::vector<NodeId>& members() const { return members_; }
  // The index of `node` in members(), or nullopt.
  std::optional<size_t> memberIndex(NodeId node) const;

  // Synced floats of checked rows `keys`.
  size_t widthOf(std::span<const Key> keys) const;
  // Why `rows` are not hot rows of this layout (of part `part`, when given), or nullopt: keys
  // sorted, unique and hot, each in the part, and exactly their synced floats.
  std::optional<std::string> check(const SparseRows& rows,
                                   std::optional<size_t> part = std::nullopt) const;

 private:
  std::vector<Key> keys_;
  std::vector<size_t> offset_;  // size() + 1 entries
  std::vector<size_t> length_;
  std::vector<size_t> part_;
  std::vector<NodeId> members_;
  size_t total_length_ = 0;
  bool syncs_state_ = false;
};

// Adds `add` to `acc` row by row (both checked rows of `layout`): keys of both end up in `acc`,
// sorted; a key in both gets the sum. O(rows of both).
void addRows(const ReplicaLayout& layout, SparseRows& acc, const SparseRows& add);

}  // namespace chorus::ps
