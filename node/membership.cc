#include "node/membership.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace chorus::node {

Membership::Membership(const NodeOptions& options, spdlog::logger& log)
    : options_(options), log_(log) {
  for (NodeId id : options_.members) {
    if (id != options_.self) counters_.emplace(id, std::make_unique<PeerCounters>());
  }
}

PeerCounters* Membership::counters(NodeId id) const {
  auto it = counters_.find(id);
  return it == counters_.end() ? nullptr : it->second.get();
}

void Membership::expect(const std::vector<NodeId>& peers) {
  std::lock_guard lock(mutex_);
  expected_.insert(peers.begin(), peers.end());
}

Status Membership::waitReady(std::chrono::milliseconds timeout, const std::atomic<bool>& running) {
  std::unique_lock lock(mutex_);
  const auto missing = [this] {
    std::vector<NodeId> out;
    for (NodeId id : expected_) {
      if (!connected_.contains(id)) out.push_back(id);
    }
    return out;
  };
  const auto describe = [&](const std::vector<NodeId>& ids) {
    std::string list;
    for (NodeId id : ids) {
      auto reason = last_reason_.find(id);
      // The lower id dials: a lower peer not heard from has not reached this node.
      const char* none = id < options_.self ? "it dials this node and has not yet: not started?"
                                            : "no attempt seen yet";
      list += fmt::format("{}peer {} ({})", list.empty() ? "" : ", ", id,
                          reason == last_reason_.end() ? none : reason->second);
    }
    return list;
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto done = [&] { return missing().empty() || !running.load() || !fatal_.empty(); };
  // Wait in slices, saying every slice whom we still wait for: a person starting machines by
  // hand sees what is missing and why, instead of silence until the time-out.
  while (!done()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    const auto slice = options_.ready_progress_interval.count() > 0
                           ? std::min<std::chrono::steady_clock::duration>(
                                 deadline - now, options_.ready_progress_interval)
                           : deadline - now;
    if (changed_.wait_for(lock, slice, done)) break;
    if (std::chrono::steady_clock::now() < deadline) {
      const auto still = missing();
      log_.info("still waiting for {} of {} peers: {}", still.size(), expected_.size(),
                describe(still));
    }
  }
  if (!fatal_.empty()) return {ErrorCode::kRefused, fatal_};
  const auto still = missing();
  if (still.empty()) return {};
  return {ErrorCode::kTimeout,
          fmt::format("cluster \"{}\" not ready after {} ms: {} of {} peers missing: {}",
                      options_.cluster, timeout.count(), still.size(), expected_.size(),
                      describe(still))};
}

PeerStats Membership::stats(NodeId peer) const {
  PeerStats out;
  const PeerCounters* c = counters(peer);
  if (c == nullptr) return out;
  out.connected = c->connected.load();
  out.slow = c->slow.load();
  out.bytes_in = c->bytes_in.load();
  out.bytes_out = c->bytes_out.load();
  out.frames_in = c->frames_in.load();
  out.frames_out = c->frames_out.load();
  out.queued_bytes = c->queued_bytes.load();
  out.times_up = c->times_up.load();
  out.frames_lost = c->frames_lost.load();
  out.frames_superseded = c->frames_superseded.load();
  out.frames_refused = c->frames_refused.load();
  return out;
}

PeerStats Membership::totals() const {
  PeerStats out;
  for (const auto& [peer, c] : counters_) {
    out.bytes_in += c->bytes_in.load();
    out.bytes_out += c->bytes_out.load();
    out.frames_in += c->frames_in.load();
    out.frames_out += c->frames_out.load();
    out.queued_bytes += c->queued_bytes.load();
    out.times_up += c->times_up.load();
    out.frames_lost += c->frames_lost.load();
    out.frames_superseded += c->frames_superseded.load();
    out.frames_refused += c->frames_refused.load();
  }
  return out;
}

std::vector<NodeId> Membership::connected() const {
  std::lock_guard lock(mutex_);
  return {connected_.begin(), connected_.end()};
}

void Membership::waitNoConnections(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [this] { return open_connections_ == 0; });
}

void Membership::setUpFromLoop(NodeId peer) {
  PeerCounters& c = *counters_.at(peer);
  c.connected = true;
  c.times_up += 1;
  {
    std::lock_guard lock(mutex_);
    connected_.insert(peer);
    last_reason_.erase(peer);
  }
  changed_.notify_all();
}

void Membership::setDownFromLoop(NodeId peer, const std::string& reason) {
  PeerCounters& c = *counters_.at(peer);
  c.connected = false;
  c.queued_bytes = 0;
  c.slow = false;
  {
    std::lock_guard lock(mutex_);
    connected_.erase(peer);
    last_reason_[peer] = reason;
  }
  changed_.notify_all();
}

void Membership::noteFromLoop(NodeId peer, const std::string& reason) {
  std::lock_guard lock(mutex_);
  last_reason_[peer] = reason;
}

void Membership::failFromLoop(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    if (fatal_.empty()) fatal_ = reason;
  }
  changed_.notify_all();
}

void Membership::setOpenConnectionsFromLoop(size_t open) {
  {
    std::lock_guard lock(mutex_);
    open_connections_ = open;
  }
  changed_.notify_all();
}

}  // namespace chorus::node
