// Where every key lives: its owner (the one node that applies its updates and answers reads of
// it) and its replicas (nodes holding a copy, NuPS's hot keys). Every key starts at its home
// node (ShardMap, rendezvous hashing) and no replica; relocation (Lapse's localize) changes the
// owner and replication adds replicas. Each change increments the directory's version and stamps
// the key with it, so that a location cache can tell an old answer from a new one. Free of any
// networking; single-threaded (one owner thread, or a copy per thread).
//
// Invariant, kept by every operation (tests/ps/key_directory_test.cc checks it after random
// sequences): every key of the space has exactly one owner, a member node, which is not also
// one of its replicas (dmlc/ps-lite #185 lost keys in its range split).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/key_space.h"
#include "ps/shard_map.h"

namespace chorus::ps {

class KeyDirectory {
 public:
  // Every key of `space` at its home in `map`. Homes of a space of at most kHomeCacheKeys keys
  // are computed once here (a dense model's lookups then cost no hashing).
  KeyDirectory(ShardMap map, KeySpace space);

  // 4 bytes per key: 16 MiB at most (a dense model of 1-float keys hashed two XXH3s per key
  // lookup without it, issue 25).
  static constexpr size_t kHomeCacheKeys = size_t{1} << 22;

  // The node that owns `key` now (a key in the space). O(1) for a key that never moved; inline,
  // as workers ask it per key.
  NodeId owner(Key key) const {
    if (!moved_.empty()) {
      auto it = moved_.find(key);
      if (it != moved_.end()) return it->second.owner;
    }
    return home(key);
  }
  // Where `key` lives by default and where its directory entry is kept (Lapse's home node).
  NodeId home(Key key) const { return key < homes_.size() ? homes_[key] : map_.home(key); }
  // The nodes holding a replica of `key`, sorted (empty for most keys).
  std::vector<NodeId> replicas(Key key) const;
  // Is `node` the owner of `key` or one of its replicas?
  bool holds(NodeId node, Key key) const;
  // The directory version when `key` last changed (0: never).
  uint64_t keyVersion(Key key) const;
  // Changes so far; each successful operation below adds one.
  uint64_t version() const { return version_; }

  // Makes `node` the owner of `key`; a replica it held becomes the primary copy. Errors (as a
  // message, nothing changed): a key outside the space, a node that is no member. Moving a key
  // to its current owner changes nothing and returns nullopt without a new version.
  std::optional<std::string> setOwner(Key key, NodeId node);
  // Adds `node` to the replicas of `key`. Errors: as setOwner, and the owner itself (it holds
  // the primary copy). Adding a replica that exists changes nothing.
  std::optional<std::string> addReplica(Key key, NodeId node);
  // Removes `node` from the replicas of `key`. Errors: as setOwner. Removing a replica that
  // does not exist changes nothing.
  std::optional<std::string> removeReplica(Key key, NodeId node);

  // The keys `node` owns, sorted (O(keys): start-up, rejoin and tests).
  std::vector<Key> ownedBy(NodeId node) const;
  // Keys that are not at their home or have replicas (what a directory message would carry).
  size_t changedKeys() const { return moved_.size(); }
  // The members and their default placement.
  const ShardMap& shardMap() const { return map_; }
  // The keys the directory places.
  const KeySpace& space() const { return space_; }

 private:
  struct Placement {
    NodeId owner = 0;
    std::vector<NodeId> replicas;  // sorted, never the owner
    uint64_t version = 0;
  };
  std::optional<std::string> checkChange(Key key, NodeId node) const;
  // The placement of `key`, created at its home when it has none.
  Placement& placementOf(Key key);
  // Drops the entry of a key that is back at its home with no replica (the map stays sparse);
  // keeps the version stamp otherwise.
  void settle(Key key, Placement& placement);

  ShardMap map_;
  KeySpace space_;
  std::vector<NodeId> homes_;  // per key when the space is small and starts at key 0
  std::unordered_map<Key, Placement> moved_;
  // Stamps of keys whose entry was dropped (back home): a cache must still see the change.
  std::unordered_map<Key, uint64_t> stamps_;
  uint64_t version_ = 0;
};

}  // namespace chorus::ps
