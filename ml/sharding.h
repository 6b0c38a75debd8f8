// Splitting a data set's samples across N nodes: iid or label-skewed (Dirichlet alpha). Both
// are deterministic from a seed, so every node computes the same split and takes its own part.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace chorus::ml {

// One index list per node. The lists are disjoint and together cover 0..n-1.
using Shards = std::vector<std::vector<size_t>>;

// A random permutation cut into `nodes` parts whose sizes differ by at most one.
// nodes must be > 0.
Shards shardIid(size_t n, int nodes, uint64_t seed);

// Label-skewed split: for every class, node proportions are drawn from Dirichlet(alpha) and the
// class's samples (shuffled) are cut accordingly. Small alpha gives each node few classes; large
// alpha approaches iid. Nodes left empty by the draw get one sample from the largest shard, so
// every shard is non-empty when n >= nodes. alpha must be finite and > 0, labels in
// [0, classes).
Shards shardDirichlet(std::span<const int32_t> labels, int classes, int nodes, double alpha,
                      uint64_t seed);

// Mean total-variation distance between each shard's label distribution and the global one
// (0 = iid, near 1 = each node sees other classes). Empty shards are skipped.
double labelSkew(const Shards& shards, std::span<const int32_t> labels, int classes);

}  // namespace chorus::ml
