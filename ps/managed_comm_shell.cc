#include "ps/managed_comm_shell.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "chorus/chorus_generated.h"
#include "node/node.h"
#include "ps/kv_server.h"
#include "ps/kv_worker.h"
#include "ps/ps_service.h"

namespace chorus::ps {

using SteadyClock = std::chrono::steady_clock;

PsMessage rowPush(Clock min_clock, std::span<const Key> keys, std::span<const float> values) {
  return {wire::Body::PsRowPush,
          [=](flatbuffers::FlatBufferBuilder& b) {
            auto k = b.CreateVector(keys.data(), keys.size());
            auto v = b.CreateVector(values.data(), values.size());
            return wire::CreatePsRowPush(b, min_clock, k, v).Union();
          },
          values.size() * sizeof(float) + keys.size() * sizeof(Key) + 256,
          {}};
}

void validateBandwidth(double mbps) {
  // A budget below 0.01 Mbit/s (1.25 kB/s) could not carry one row of a real model per clock.
  if (!std::isfinite(mbps) || mbps < 0 || (mbps > 0 && mbps < 0.01) || mbps > 1e6) {
    throw std::invalid_argument(fmt::format(
        "--bandwidth {}: the budget is in Mbit/s, 0 (off) or from 0.01 to 1000000", mbps));
  }
}

ManagedComm::ManagedComm(node::Node& node, KvServer& server, KvWorker& worker,
                         std::vector<NodeId> workers, ManagedCommOptions options)
    : node_(node), server_(server), worker_(worker), self_(node.id()), options_(options) {
  validateBandwidth(options_.bandwidth_mbps);
  if (options_.bandwidth_mbps <= 0) {
    throw std::invalid_argument("managed communication needs a bandwidth budget above 0");
  }
  std::sort(workers.begin(), workers.end());
  for (NodeId w : workers) {
    if (w != self_) others_.push_back(w);
  }
  node_.setHandler(
      messageType(wire::Body::PsRowPush),
      [this](NodeId from, const node::InboundFrame& frame) { onRowPush(from, frame); });
}

ManagedComm::~ManagedComm() {
  stop();
}

void ManagedComm::start() {
  std::lock_guard lock(mu_);
  if (timer_ != 0) return;
  timer_ = node_.startTimer(options_.period, [this] { pump(); });
}

void ManagedComm::stop() {
  uint64_t timer = 0;
  {
    std::lock_guard lock(mu_);
    timer = timer_;
    timer_ = 0;
  }
  if (timer != 0) node_.stopTimer(timer);
}

ManagedCommStats ManagedComm::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void ManagedComm::pump() {
  const KeyStore& store = server_.store();
  const auto rowOf = [&store](Key key) { return store.valuesOf(key); };
  const SteadyClock::time_point now = SteadyClock::now();
  if (!bucket_) {
    // Built on the first tick: the store holds the initial model, which every worker starts
    // from, so nothing is owed before the first push.
    bucket_.emplace(ownerBudget(options_.bandwidth_mbps, options_.burst_s, options_.message_bytes,
                                others_.size(), now));
    bucket_->observeSent(node_.totals().bytes_out);
    tracker_.emplace(store.ownedKeys(), rowOf);
  }
  bucket_->refill(now);
  bucket_->observeSent(node_.totals().bytes_out);
  const uint64_t pushes = server_.summary().pushes;
  const Clock min_clock = server_.minClock();
  // Nothing applied and no clock passed since the last pump that found nothing to send: skip
  // the pass over the rows.
  if (!pacer_.due(pushes, min_clock)) return;
  // No live worker: nobody reads.
  if (min_clock >= Staleness::kInfinite) return;
  bool sent_any = false;
  while (bucket_->canSend()) {
    // The priority picks which keys go in this message; on the wire they go sorted, as every
    // request names its keys.
    std::vector<Key> keys = tracker_->pick(rowOf, options_.message_bytes);
    if (keys.empty()) break;
    std::sort(keys.begin(), keys.end());
    // The store hands out runs of adjacent rows, not rows: copy them in key order.
    std::vector<float> values;
    store.read(keys, values);
    if (!others_.empty()) {
      const node::SharedFrame frame = encode(node_, rowPush(min_clock, keys, values));
      node_.broadcast(others_, frame);
      const uint64_t bytes = frame->size() * others_.size();
      bucket_->chargeQueued(bytes);
      std::lock_guard lock(mu_);
      stats_.frames_sent += others_.size();
      stats_.rows_sent += keys.size() * others_.size();
    }
    // This node's own worker reads these keys from its own server: the same rows, no bytes.
    if (auto error = worker_.offerRows(self_, min_clock, keys, values)) {
      node_.logger().error("managed communication: own rows refused: {}", *error);
    }
    for (Key key : keys)
      tracker_->sent(key, store.valuesOf(key));
    sent_any = true;
  }
  if (!sent_any && bucket_->canSend()) {
    // Everything sent is current: the next pass waits for a push or a clock.
    pacer_.settled(pushes, min_clock);
  }
  std::lock_guard lock(mu_);
  stats_.managed_bytes = bucket_->managedBytes();
  stats_.other_bytes = bucket_->otherBytes();
}

void ManagedComm::onRowPush(NodeId from, const node::InboundFrame& frame) {
  const wire::PsRowPush& push = *messageOf(frame).body_as_PsRowPush();
  std::optional<std::string> error;
  if (push.keys() == nullptr || push.values() == nullptr) {
    error = "a PsRowPush without keys or values";
  } else {
    const std::span<const Key> keys(push.keys()->data(), push.keys()->size());
    const std::span<const float> values(push.values()->data(), push.values()->size());
    error = worker_.offerRows(from, push.min_clock(), keys, values);
    if (!error) {
      std::lock_guard lock(mu_);
      stats_.rows_received += keys.size();
    }
  }
  if (!error) return;
  {
    std::lock_guard lock(mu_);
    ++stats_.refused;
  }
  if (refusals_.count(from)) {
    node_.logger().warn(
        "managed communication: refused node {}'s pushed rows: {} (its reads are pulled "
        "instead; {} refused from it so far)",
        from, *error, refusals_.countOf(from));
  }
}

}  // namespace chorus::ps
