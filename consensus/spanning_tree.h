// The spanning tree of the neighbor graph that the end-of-run convergecast travels on: BFS from
// the root (node 0), each node's parent the lowest-id neighbor one hop closer to the root. Every
// node computes the same tree from the topology alone, so no message is needed to agree on it.
// Pure: no networking (docs/consensus.md, "End of a run").
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
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

// ---- Repairing the tree when nodes die (docs/consensus.md, "When a tree node dies") ----
// Every rule below is computed by one node from the topology and the set of nodes it knows are
// down; a node only ever moves to a neighbor strictly closer to the root in the BFS of the whole
// graph, so parent pointers can never form a cycle, whatever each node knows.

// Hops from `root` in the BFS of `graph`; unreachable ids are absent.
std::map<NodeId, int64_t> depthsFrom(const std::map<NodeId, std::vector<NodeId>>& graph,
                                     NodeId root);
// `self`'s parent while `down` are known down: its lowest-id neighbor one hop closer to the
// root that is not in `down` (with `down` empty: spanningTreeLinks' parent). None for the root,
// an unreachable node, or when every closer neighbor is down.
std::optional<NodeId> repairedParent(const std::map<NodeId, std::vector<NodeId>>& graph,
                                     const std::map<NodeId, int64_t>& depths, NodeId self,
                                     const std::set<NodeId>& down);
// The neighbors that may name `self` as their parent: those one hop further from the root.
std::vector<NodeId> possibleChildren(const std::map<NodeId, std::vector<NodeId>>& graph,
                                     const std::map<NodeId, int64_t>& depths, NodeId self);
// Whether a path from `self` to `root` avoids every node of `down` (false: `self` is cut off).
bool reachesRoot(const std::map<NodeId, std::vector<NodeId>>& graph, NodeId root, NodeId self,
                 const std::set<NodeId>& down);

}  // namespace chorus::consensus
