#include "consensus/spanning_tree.h"

#include <algorithm>
#include <deque>

namespace chorus::consensus {

TreeLinks spanningTreeLinks(const std::map<NodeId, std::vector<NodeId>>& graph, NodeId root,
                            NodeId self) {
  std::map<NodeId, int64_t> depth{{root, 0}};
  std::deque<NodeId> queue{root};
  while (!queue.empty()) {
    const NodeId at = queue.front();
    queue.pop_front();
    auto it = graph.find(at);
    if (it == graph.end()) continue;
    for (NodeId next : it->second) {
      if (depth.emplace(next, depth[at] + 1).second) queue.push_back(next);
    }
  }
  TreeLinks links;
  auto mine = depth.find(self);
  if (mine == depth.end()) return links;
  links.depth = mine->second;
  // The parent of a node: its lowest-id neighbor one hop closer to the root.
  auto parentOf = [&](NodeId id) -> std::optional<NodeId> {
    auto d = depth.find(id);
    auto it = graph.find(id);
    if (d == depth.end() || d->second == 0 || it == graph.end()) return std::nullopt;
    std::optional<NodeId> best;
    for (NodeId n : it->second) {
      auto dn = depth.find(n);
      if (dn != depth.end() && dn->second == d->second - 1 && (!best || n < *best)) best = n;
    }
    return best;
  };
  links.parent = parentOf(self);
  if (auto it = graph.find(self); it != graph.end()) {
    for (NodeId n : it->second) {
      if (parentOf(n) == self) links.children.push_back(n);
    }
  }
  std::sort(links.children.begin(), links.children.end());
  links.children.erase(std::unique(links.children.begin(), links.children.end()),
                       links.children.end());
  return links;
}

}  // namespace chorus::consensus
