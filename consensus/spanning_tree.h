// The spanning tree of the neighbor graph that the end-of-run convergecast travels on: BFS from
// the root (node 0), each node's parent the lowest-id neighbor one hop closer to the root. Every
// node computes the same tree from the topology alone, so no message is needed to agree on it.
// Pure: no networking (docs/consensus.md, "End of a run").
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "node/protocol.h"

namespace chorus::consensus {

using NodeId = node::NodeId;  // defined once, in node/protocol.h

// One node's links in the tree.
struct TreeLinks {
  std::optional<NodeId> parent;  // none for the root and for nodes the root cannot reach
  std::vector<NodeId> children;  // sorted
  int64_t depth = -1;            // hops from the root; -1: not reachable
};

// `graph`: every member's neighbors (symmetric; ids missing from the keys have none). Returns
// `self`'s links in the BFS tree rooted at `root`.
TreeLinks spanningTreeLinks(const std::map<NodeId, std::vector<NodeId>>& graph, NodeId root,
                            NodeId self);

}  // namespace chorus::consensus
