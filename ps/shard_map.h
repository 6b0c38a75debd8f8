// Who owns which parameter key in PS mode, and how a dense model's flat buffer is cut into keys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "node/protocol.h"

namespace chorus::ps {

using Key = uint64_t;
using NodeId = node::NodeId;  // defined once, in node/protocol.h

// Gives every key exactly one home node by rendezvous (highest random weight) hashing: the home
// of `key` is the node n with the largest XXH3_64bits(key, seed = n). Every node computes the
// same map from the same member list, and adding or removing a node moves only the keys that
// the change must move (about 1/N of them). Relocation (Lapse/NuPS) overrides the home through
// a directory kept elsewhere; this class is only the default placement.
class ShardMap {
 public:
  // `nodes` need not be sorted; duplicates are an error (std::invalid_argument), as is none.
  explicit ShardMap(std::vector<NodeId> nodes);

  // The home node of `key`. O(number of nodes).
  NodeId home(Key key) const;
  // The member nodes, sorted.
  const std::vector<NodeId>& nodes() const { return nodes_; }

 private:
  std::vector<NodeId> nodes_;
};

// Cuts a flat parameter vector of `total` floats into keys of `chunk` floats each (the last
// one may be shorter): key k covers [k * chunk, min((k + 1) * chunk, total)).
class ChunkLayout {
 public:
  // Throws std::invalid_argument when chunk == 0.
  ChunkLayout(size_t total, size_t chunk);

  size_t numKeys() const { return num_keys_; }
  size_t total() const { return total_; }
  size_t chunk() const { return chunk_; }
  // First float of `key` in the flat vector.
  size_t offset(Key key) const { return static_cast<size_t>(key) * chunk_; }
  // Number of floats `key` covers; 0 for a key outside the layout.
  size_t length(Key key) const;
  // The slice of `flat` that `key` covers (flat.size() must be total()).
  std::span<float> slice(std::span<float> flat, Key key) const {
    return flat.subspan(offset(key), length(key));
  }

 private:
  size_t total_;
  size_t chunk_;
  size_t num_keys_;
};

}  // namespace chorus::ps
