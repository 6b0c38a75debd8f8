// Which keys get a replica on every node (NuPS's hot set): the keys most accessed, by the skew
// layer's expected access counts (sampling/access_stats.h: a pre-scan of the data plus what
// sampling adds), either as many as fit a memory budget or the top N (`--replicate N`). Keys of
// every table compete, most expected accesses first (ties by the lower key, so that every node
// picks the same set). Free of any networking.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ps/key_space.h"

namespace chorus::ps {

// The expected accesses of one table's rows (index = row, key = table.first + row); empty: the
// table takes no part (none of its keys is replicated).
using TableAccesses = std::vector<double>;

struct ReplicaChoice {
  std::vector<Key> keys;  // sorted
  uint64_t bytes = 0;     // their replicas' memory on each node
  double share = 0.0;     // their share of all expected accesses, in [0, 1]
};

// The most accessed keys of `space` whose replicas (`bytesPerFloat` bytes per value float:
// ReplicaSet::bytesPerRow(1, policy)) fit `budgetBytes` on each node. `accesses` has one entry
// per table of `space`, each empty or one count per row (std::invalid_argument otherwise).
// Keys never accessed are not chosen.
ReplicaChoice chooseReplicas(const KeySpace& space, std::span<const TableAccesses> accesses,
                             uint64_t bytesPerFloat, uint64_t budgetBytes);

// The `count` most accessed keys (`--replicate N`), whatever their memory (fewer when fewer
// keys are accessed at all).
ReplicaChoice chooseTopReplicas(const KeySpace& space, std::span<const TableAccesses> accesses,
                                uint64_t bytesPerFloat, size_t count);

// One log line: "replicating 900 hot keys (1.2 MiB per node), 41.3% of expected accesses".
std::string formatReplicaChoice(const ReplicaChoice& choice);

}  // namespace chorus::ps
