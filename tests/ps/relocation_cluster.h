// A simulated network for tests of Lapse relocation (ps/relocation.h): N nodes and the
// messages between them, one FIFO queue per directed link (the real transport is TCP), delivered
// in whatever order a test chooses; plus an update policy whose sums are exact in floats.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "ps/relocation.h"

namespace chorus::ps::testing {

// w += g, exactly in floats for small integers, and one float of state that counts the pushes
// applied: the state has to travel with the row for the count to come out right.
class CountingPolicy final : public UpdatePolicy {
 public:
  std::string_view name() const override { return "counting"; }
  size_t stateFloats(size_t) const override { return 1; }
  void initState(std::span<float> state) const override { state[0] = 0.0f; }
  void applyPush(int64_t, std::span<const RowUpdate> rows) const override {
    for (const RowUpdate& row : rows) {
      for (size_t i = 0; i < row.values.size(); ++i)
        row.values[i] += row.grad[i];
      row.state[0] += 1.0f;
    }
  }
  void applyClockSum(int64_t clock, std::span<const RowUpdate> rows) const override {
    applyPush(clock, rows);
  }
  bool stepsPerClock() const override { return false; }
};

// A worker's clock announcement, on the same links as the relocation messages.
struct ClockNote {
  WorkerId worker = 0;
  Clock clock = 0;
};
using Wire = std::variant<RelocationBody, ClockNote>;

// N nodes and the messages between them, per directed link in FIFO order.
class Cluster {
 public:
  Cluster(size_t nodes, KeySpace space, std::shared_ptr<const UpdatePolicy> policy,
          bool gate_reads = false, size_t cache_capacity = size_t{1} << 16)
      : space_(std::move(space)) {
    std::vector<NodeId> ids;
    for (NodeId n = 0; n < nodes; ++n)
      ids.push_back(n);
    map_.emplace(ids);
    std::vector<WorkerId> workers;
    if (gate_reads) workers.assign(ids.begin(), ids.end());
    for (NodeId n : ids) {
      KeyStore store(space_, policy);
      for (Key key : space_.allKeys()) {
        if (map_->home(key) != n) continue;
        KeyEntry row;
        row.values.assign(space_.length(key), 0.0f);
        EXPECT_EQ(store.insert(key, std::move(row)), std::nullopt);
      }
      nodes_.push_back(std::make_unique<Relocation>(*map_, std::move(store),
                                                    RelocationOptions{n, workers, cache_capacity}));
    }
    completions_.resize(nodes);
  }

  Relocation& node(NodeId n) { return *nodes_[n]; }
  size_t size() const { return nodes_.size(); }
  const ShardMap& map() const { return *map_; }
  const KeySpace& space() const { return space_; }

  // Moves every node's outgoing messages onto the links and its completions to completions(n).
  void collect() {
    for (NodeId n = 0; n < nodes_.size(); ++n) {
      if (dead_.count(n)) continue;
      for (Outgoing& out : nodes_[n]->takeOutgoing())
        links_[{n, out.to}].push_back(Wire(std::move(out.body)));
      for (Completion& c : nodes_[n]->takeCompletions())
        completions_[n].push_back(std::move(c));
    }
  }
  void announce(WorkerId worker, Clock clock) {
    for (NodeId n = 0; n < nodes_.size(); ++n) {
      if (n == worker) {
        EXPECT_EQ(nodes_[n]->workerClock(worker, clock), std::nullopt);
      } else {
        links_[{worker, n}].push_back(ClockNote{worker, clock});
      }
    }
    collect();
  }

  // The messages waiting on the link from -> to, oldest first.
  const std::deque<Wire>& link(NodeId from, NodeId to) {
    collect();
    return links_[{from, to}];
  }
  // Kinds of every message in flight, "from->to:kind", per link in order.
  std::vector<std::string> inFlight() {
    collect();
    std::vector<std::string> out;
    for (const auto& [link, queue] : links_) {
      for (const Wire& w : queue) {
        const char* kind = std::holds_alternative<ClockNote>(w)
                               ? "clock"
                               : relocationKindName(std::get<RelocationBody>(w));
        out.push_back(std::to_string(link.first) + "->" + std::to_string(link.second) + ":" + kind);
      }
    }
    return out;
  }
  size_t messagesInFlight() {
    collect();
    size_t n = 0;
    for (const auto& [link, queue] : links_)
      n += queue.size();
    return n;
  }
  // Delivers the oldest message of from -> to; its error, if the receiver refused it.
  std::optional<std::string> deliver(NodeId from, NodeId to) {
    collect();
    std::deque<Wire>& queue = links_[{from, to}];
    EXPECT_FALSE(queue.empty()) << from << "->" << to;
    if (queue.empty()) return std::nullopt;
    Wire w = std::move(queue.front());
    queue.pop_front();
    if (dead_.count(to)) return std::nullopt;  // the transport drops it
    std::optional<std::string> error;
    if (auto* note = std::get_if<ClockNote>(&w)) {
      error = nodes_[to]->workerClock(note->worker, note->clock);
    } else {
      error = nodes_[to]->receive(from, std::move(std::get<RelocationBody>(w)));
    }
    if (error) errors_.push_back(*error);
    collect();
    return error;
  }
  // Delivers one message of a link drawn at random among the non-empty ones.
  bool deliverRandom(std::mt19937_64& rng) {
    collect();
    std::vector<std::pair<NodeId, NodeId>> busy;
    for (const auto& [link, queue] : links_) {
      if (!queue.empty()) busy.push_back(link);
    }
    if (busy.empty()) return false;
    const auto [from, to] = busy[rng() % busy.size()];
    deliver(from, to);
    return true;
  }
  // Delivers until nothing is in flight, in link order.
  void deliverAll() {
    collect();
    for (bool any = true; any;) {
      any = false;
      for (auto& [link, queue] : links_) {
        if (queue.empty()) continue;
        deliver(link.first, link.second);
        any = true;
        break;
      }
    }
  }
  // `node` stops: what it sent and what was on its way to it is gone, and so is all it would
  // send from now on.
  void kill(NodeId node) {
    collect();
    dead_.insert(node);
    dropLinksOf(node);
  }
  bool dead(NodeId node) const { return dead_.count(node) > 0; }
  void dropLinksOf(NodeId node) {
    for (auto& [link, queue] : links_) {
      if (link.first == node || link.second == node) queue.clear();
    }
  }

  std::vector<Completion>& completions(NodeId n) {
    collect();
    return completions_[n];
  }
  // The completion of operation `op` at node `n`, taken out; nullopt while it has not come.
  std::optional<Completion> take(NodeId n, uint64_t op) {
    collect();
    auto& list = completions_[n];
    auto it =
        std::find_if(list.begin(), list.end(), [&](const Completion& c) { return c.op == op; });
    if (it == list.end()) return std::nullopt;
    Completion c = std::move(*it);
    list.erase(it);
    return c;
  }
  const std::vector<std::string>& errors() const { return errors_; }

  // The one node holding `key`, or nullopt (with a test failure) when none or several do.
  std::optional<NodeId> holder(Key key) {
    std::optional<NodeId> found;
    for (NodeId n = 0; n < nodes_.size(); ++n) {
      if (!nodes_[n]->holds(key)) continue;
      EXPECT_FALSE(found) << "key " << key << " held by node " << *found << " and node " << n;
      found = n;
    }
    EXPECT_TRUE(found) << "key " << key << " is held nowhere";
    return found;
  }

 private:
  KeySpace space_;
  std::optional<ShardMap> map_;
  std::vector<std::unique_ptr<Relocation>> nodes_;
  std::map<std::pair<NodeId, NodeId>, std::deque<Wire>> links_;
  std::vector<std::vector<Completion>> completions_;
  std::vector<std::string> errors_;
  std::set<NodeId> dead_;
};

inline KeySpace smallSpace(size_t keys, size_t row_floats) {
  KeySpace space;
  space.addTable("entity", keys, row_floats);
  return space;
}

inline std::shared_ptr<const UpdatePolicy> counting() {
  return std::make_shared<CountingPolicy>();
}

// The index-th key (0: the first) whose home is `home`.
inline Key keyHomedAt(const Cluster& c, NodeId home, size_t index = 0) {
  for (Key k : c.space().allKeys()) {
    if (c.map().home(k) == home && index-- == 0) return k;
  }
  ADD_FAILURE() << "too few keys homed at node " << home;
  return 0;
}

inline std::string kindOf(const Wire& w) {
  return relocationKindName(std::get<RelocationBody>(w));
}

}  // namespace chorus::ps::testing
