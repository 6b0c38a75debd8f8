#include "ps/key_directory.h"

#include <fmt/format.h>

#include <algorithm>

namespace chorus::ps {

KeyDirectory::KeyDirectory(ShardMap map, KeySpace space)
    : map_(std::move(map)), space_(std::move(space)) {
  if (space_.keyEnd() <= kHomeCacheKeys) {
    homes_.resize(space_.keyEnd());
    for (const KeyTable& table : space_.tables()) {
      for (Key key = table.first; key < table.end(); ++key)
        homes_[key] = map_.home(key);
    }
  }
}

std::vector<NodeId> KeyDirectory::replicas(Key key) const {
  auto it = moved_.find(key);
  return it == moved_.end() ? std::vector<NodeId>() : it->second.replicas;
}

bool KeyDirectory::holds(NodeId node, Key key) const {
  auto it = moved_.find(key);
  if (it == moved_.end()) return home(key) == node;
  const Placement& p = it->second;
  return p.owner == node || std::binary_search(p.replicas.begin(), p.replicas.end(), node);
}

uint64_t KeyDirectory::keyVersion(Key key) const {
  if (auto it = moved_.find(key); it != moved_.end()) return it->second.version;
  auto it = stamps_.find(key);
  return it == stamps_.end() ? 0 : it->second;
}

std::optional<std::string> KeyDirectory::checkChange(Key key, NodeId node) const {
  if (!space_.contains(key)) return fmt::format("key {} is not in the key space", key);
  const std::vector<NodeId>& nodes = map_.nodes();
  if (!std::binary_search(nodes.begin(), nodes.end(), node)) {
    return fmt::format("node {} is not a member", node);
  }
  return std::nullopt;
}

KeyDirectory::Placement& KeyDirectory::placementOf(Key key) {
  auto [it, inserted] = moved_.try_emplace(key);
  if (inserted) {
    it->second.owner = home(key);
    if (auto s = stamps_.find(key); s != stamps_.end()) {
      it->second.version = s->second;
      stamps_.erase(s);
    }
  }
  return it->second;
}

void KeyDirectory::settle(Key key, Placement& placement) {
  if (placement.owner != home(key) || !placement.replicas.empty()) return;
  stamps_[key] = placement.version;
  moved_.erase(key);
}

std::optional<std::string> KeyDirectory::setOwner(Key key, NodeId node) {
  if (auto error = checkChange(key, node)) return error;
  if (owner(key) == node) return std::nullopt;
  Placement& p = placementOf(key);
  p.owner = node;
  auto replica = std::lower_bound(p.replicas.begin(), p.replicas.end(), node);
  if (replica != p.replicas.end() && *replica == node) p.replicas.erase(replica);
  p.version = ++version_;
  settle(key, p);
  return std::nullopt;
}

std::optional<std::string> KeyDirectory::addReplica(Key key, NodeId node) {
  if (auto error = checkChange(key, node)) return error;
  if (owner(key) == node) {
    return fmt::format("node {} owns key {}: it holds the primary copy, not a replica", node, key);
  }
  Placement& p = placementOf(key);
  auto at = std::lower_bound(p.replicas.begin(), p.replicas.end(), node);
  if (at != p.replicas.end() && *at == node) return std::nullopt;
  p.replicas.insert(at, node);
  p.version = ++version_;
  return std::nullopt;
}

std::optional<std::string> KeyDirectory::removeReplica(Key key, NodeId node) {
  if (auto error = checkChange(key, node)) return error;
  auto it = moved_.find(key);
  if (it == moved_.end()) return std::nullopt;
  Placement& p = it->second;
  auto at = std::lower_bound(p.replicas.begin(), p.replicas.end(), node);
  if (at == p.replicas.end() || *at != node) return std::nullopt;
  p.replicas.erase(at);
  p.version = ++version_;
  settle(key, p);
  return std::nullopt;
}

std::vector<Key> KeyDirectory::ownedBy(NodeId node) const {
  std::vector<Key> keys;
  for (const KeyTable& table : space_.tables()) {
    for (Key key = table.first; key < table.end(); ++key) {
      if (owner(key) == node) keys.push_back(key);
    }
  }
  return keys;
}

}  // namespace chorus::ps
