#include "ps/sparse_managed_shell.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "node/node.h"
#include "ps/kv_server.h"
#include "ps/ps_service.h"

namespace chorus::ps {

SparseManagedComm::SparseManagedComm(node::Node& node, KvServer& server, const KeySpace& space,
                                     ManagedRowCache::OwnerOf owner, std::vector<NodeId> members,
                                     std::vector<float> model, Staleness staleness,
                                     ManagedCommOptions options)
    : node_(node),
      server_(server),
      self_(node.id()),
      options_(options),
      cache_(space, std::move(owner), std::move(model), staleness) {
  validateBandwidth(options_.bandwidth_mbps);
  if (options_.bandwidth_mbps <= 0) {
    throw std::invalid_argument("managed communication needs a bandwidth budget above 0");
  }
  std::sort(members.begin(), members.end());
  for (NodeId m : members) {
    if (m != self_) others_.push_back(m);
  }
  node_.setHandler(
      messageType(wire::Body::PsRowPush),
      [this](NodeId from, const node::InboundFrame& frame) { onRowPush(from, frame); });
}

SparseManagedComm::~SparseManagedComm() {
  stop();
}

void SparseManagedComm::start() {
  std::lock_guard lock(mu_);
  if (timer_ != 0) return;
  timer_ = node_.startTimer(options_.period, [this] { pump(); });
}

void SparseManagedComm::stop() {
  uint64_t timer = 0;
  {
    std::lock_guard lock(mu_);
    timer = timer_;
    timer_ = 0;
  }
  if (timer != 0) node_.stopTimer(timer);
}

size_t SparseManagedComm::read(std::span<const Key> keys, Clock clock, std::span<float> out,
                               std::vector<size_t>& missing) {
  std::lock_guard lock(mu_);
  const size_t before = missing.size();
  const size_t served = cache_.read(keys, clock, out, missing);
  stats_.cache_hits += served;
  stats_.cache_misses += missing.size() - before;
  return served;
}

SparseManagedStats SparseManagedComm::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void SparseManagedComm::send(const RowFrame& frame, Clock min_clock) {
  if (!others_.empty()) {
    const node::SharedFrame encoded =
        encode(node_, rowPush(frame.min_clock, frame.keys, frame.values));
    node_.broadcast(others_, encoded);
    bucket_->chargeQueued(encoded->size() * others_.size());
  }
  std::lock_guard lock(mu_);
  if (!others_.empty()) {
    stats_.comm.frames_sent += others_.size();
    if (frame.min_clock != RowFrame::kAnnouncement) {
      stats_.comm.rows_sent += frame.keys.size() * others_.size();
    }
  }
  // This node's own worker reads its home rows through the same copy: the same frame, no bytes.
  if (auto error = cache_.offer(self_, frame.min_clock, frame.keys, frame.values)) {
    node_.logger().error("managed communication: own rows refused at clock {}: {}", min_clock,
                         *error);
  }
}

void SparseManagedComm::pump() {
  const KeyStore& store = server_.store();
  const auto rowOf = [&store](Key key) { return store.valuesOf(key); };
  const auto now = std::chrono::steady_clock::now();
  if (!bucket_) {
    // Built on the first tick: the store holds the initial model, which every copy starts from.
    bucket_.emplace(ownerBudget(options_.bandwidth_mbps, options_.burst_s, options_.message_bytes,
                                others_.size(), now));
    bucket_->observeSent(node_.totals().bytes_out);
    pusher_.emplace(store.ownedKeys(), rowOf);
  }
  bucket_->refill(now);
  bucket_->observeSent(node_.totals().bytes_out);
  const uint64_t pushes = server_.summary().pushes;
  const Clock min_clock = server_.minClock();
  if (!pacer_.due(pushes, min_clock)) return;
  // No live worker: nobody reads.
  if (min_clock >= Staleness::kInfinite) return;
  const bool done = pusher_->pass(
      min_clock, rowOf, options_.message_bytes, [this] { return bucket_->canSend(); },
      [this, min_clock](const RowFrame& frame) { send(frame, min_clock); });
  if (done) pacer_.settled(pushes, min_clock);
  std::lock_guard lock(mu_);
  stats_.comm.managed_bytes = bucket_->managedBytes();
  stats_.comm.other_bytes = bucket_->otherBytes();
}

void SparseManagedComm::onRowPush(NodeId from, const node::InboundFrame& frame) {
  const wire::PsRowPush& push = *messageOf(frame).body_as_PsRowPush();
  std::optional<std::string> error;
  if (push.keys() == nullptr) {
    error = "a PsRowPush without keys";
  } else {
    const std::span<const Key> keys(push.keys()->data(), push.keys()->size());
    const std::span<const float> values =
        push.values() ? std::span<const float>(push.values()->data(), push.values()->size())
                      : std::span<const float>();
    std::lock_guard lock(mu_);
    error = cache_.offer(from, push.min_clock(), keys, values);
    if (!error && push.min_clock() != RowFrame::kAnnouncement) {
      stats_.comm.rows_received += keys.size();
    }
    if (error) ++stats_.comm.refused;
  }
  if (!error) return;
  if (refusals_.count(from)) {
    node_.logger().warn(
        "managed communication: refused node {}'s pushed rows: {} (its rows are pulled "
        "instead; {} refused from it so far)",
        from, *error, refusals_.countOf(from));
  }
}

}  // namespace chorus::ps
