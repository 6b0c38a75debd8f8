#include "consensus/spanning_tree.h"

#include <algorithm>
#include <deque>

namespace chorus::consensus {

std::map<NodeId, int64_t> depthsFrom(const std::map<NodeId, std::vector<NodeId>>& graph,
                                     NodeId root) {
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
  return depth;
}

std::optional<NodeId> repairedParent(const std::map<NodeId, std::vector<NodeId>>& graph,
                                     const std::map<NodeId, int64_t>& depths, NodeId self,
                                     const std::set<NodeId>& down) {
  auto mine = depths.find(self);
  auto it = graph.find(self);
  if (mine == depths.end() || mine->second == 0 || it == graph.end()) return std::nullopt;
  std::optional<NodeId> best;
  for (NodeId n : it->second) {
    auto dn = depths.find(n);
    if (dn == depths.end() || dn->second != mine->second - 1 || down.count(n) > 0) continue;
    if (!best || n < *best) best = n;
  }
  return best;
}

std::vector<NodeId> possibleChildren(const std::map<NodeId, std::vector<NodeId>>& graph,
                                     const std::map<NodeId, int64_t>& depths, NodeId self) {
  std::vector<NodeId> out;
  auto mine = depths.find(self);
  auto it = graph.find(self);
  if (mine == depths.end() || it == graph.end()) return out;
  for (NodeId n : it->second) {
    auto dn = depths.find(n);
    if (dn != depths.end() && dn->second == mine->second + 1) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool reachesRoot(const std::map<NodeId, std::vector<NodeId>>& graph, NodeId root, NodeId self,
                 const std::set<NodeId>& down) {
  if (down.count(self) > 0 || down.count(root) > 0) return false;
  std::set<NodeId> seen{self};
  std::deque<NodeId> queue{self};
  while (!queue.empty()) {
    const NodeId at = queue.front();
    queue.pop_front();
    if (at == root) return true;
    auto it = graph.find(at);
    if (it == graph.end()) continue;
    for (NodeId next : it->second) {
      if (down.count(next) == 0 && seen.insert(next).second) queue.push_back(next);
    }
  }
  return false;
}

TreeLinks spanningTreeLinks(const std::map<NodeId, std::vector<NodeId>>& graph, NodeId root,
                            NodeId self) {
  const std::map<NodeId, int64_t> depth = depthsFrom(graph, root);
  TreeLinks links;
  auto mine = depth.find(self);
  if (mine == depth.end()) return links;
  links.depth = mine->second;
  // The parent of a node: its lowest-id neighbor one hop closer to the root (none down).
  const std::set<NodeId> none;
  links.parent = repairedParent(graph, depth, self, none);
  if (auto it = graph.find(self); it != graph.end()) {
    for (NodeId n : it->second) {
      if (repairedParent(graph, depth, n, none) == self) links.children.push_back(n);
    }
  }
  std::sort(links.children.begin(), links.children.end());
  links.children.erase(std::unique(links.children.begin(), links.children.end()),
                       links.children.end());
  return links;
}

}  // namespace chorus::consensus
