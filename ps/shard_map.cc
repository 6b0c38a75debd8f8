#include "ps/shard_map.h"

#include <xxhash.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace chorus::ps {

ShardMap::ShardMap(std::vector<NodeId> nodes) : nodes_(std::move(nodes)) {
  if (nodes_.empty()) throw std::invalid_argument("a shard map needs at least one node");
  std::sort(nodes_.begin(), nodes_.end());
  auto dup = std::adjacent_find(nodes_.begin(), nodes_.end());
  if (dup != nodes_.end()) {
    throw std::invalid_argument("node " + std::to_string(*dup) + " is listed twice");
  }
}

NodeId ShardMap::home(Key key) const {
  NodeId best = nodes_.front();
  uint64_t best_weight = 0;
  bool first = true;
  for (NodeId n : nodes_) {
    // The key's bytes are hashed as a little-endian uint64 on every (little-endian) host.
    uint64_t w = XXH3_64bits_withSeed(&key, sizeof(key), n);
    // Ties (astronomically rare) go to the lower id, so every node breaks them alike.
    if (first || w > best_weight) {
      best = n;
      best_weight = w;
      first = false;
    }
  }
  return best;
}

ChunkLayout::ChunkLayout(size_t total, size_t chunk) : total_(total), chunk_(chunk) {
  if (chunk == 0) throw std::invalid_argument("the chunk length must be at least 1 float");
  num_keys_ = (total + chunk - 1) / chunk;
}

size_t ChunkLayout::length(Key key) const {
  if (key >= num_keys_) return 0;
  size_t begin = offset(key);
  return std::min(chunk_, total_ - begin);
}

}  // namespace chorus::ps
