#include "ps/replica_shell.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <stdexcept>
#include <utility>

#include "node/node.h"
#include "ps/replica_codec.h"

namespace chorus::ps {

namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::milliseconds;

// The timer's period for `rate` rounds a second (libuv counts whole milliseconds).
milliseconds periodOf(double rate) {
  return milliseconds(std::max<int64_t>(1, std::llround(1000.0 / rate)));
}

}  // namespace

ReplicaShell::ReplicaShell(node::Node& node, std::shared_ptr<const ReplicaLayout> layout,
                           std::span<const float> initial,
                           std::shared_ptr<const UpdatePolicy> policy, ReplicaShellOptions options)
    : node_(node),
      layout_(layout),
      options_(options),
      self_(node.id()),
      core_(std::move(layout), node.id(), initial, std::move(policy)),
      outbox_(node) {
  if (!(options_.syncs_per_second >= 0) || !std::isfinite(options_.syncs_per_second)) {
    throw std::invalid_argument(fmt::format("replica syncs per second must be 0 or more, not {}",
                                            options_.syncs_per_second));
  }
  counters_.live_members = core_.sync().liveMembers();
  node_.setHandler(
      node::messageType(replica_wire::Body::ReplicaSync),
      [this](NodeId from, const node::InboundFrame& frame) { onSyncFrameFromLoop(from, frame); });
  node_.setHandler(
      node::messageType(replica_wire::Body::ReplicaDrain),
      [this](NodeId from, const node::InboundFrame& frame) { onDrainFrameFromLoop(from, frame); });
}

ReplicaShell::~ReplicaShell() {
  if (timer_ != 0) node_.stopTimer(timer_);
  node_.setHandler(node::messageType(replica_wire::Body::ReplicaSync), {});
  node_.setHandler(node::messageType(replica_wire::Body::ReplicaDrain), {});
  // What was posted before (syncNow, drain) runs before this closure does.
  std::promise<void> flushed;
  if (node_.post([&flushed] { flushed.set_value(); })) flushed.get_future().wait();
}

void ReplicaShell::start() {
  if (options_.syncs_per_second == 0 || timer_ != 0) return;
  timer_ = node_.startTimer(periodOf(options_.syncs_per_second), [this] { tickFromLoop(); });
  if (timer_ == 0) {
    node_.logger().warn("replica sync: the node does not run, so the sync timer did not start");
  }
}

bool ReplicaShell::onLoop(std::function<void()> fn) {
  if (node_.onLoopThread()) {
    fn();
    return true;
  }
  return node_.post(std::move(fn));
}

// ---- trainer side ----

bool ReplicaShell::isReplicated(Key key) const {
  return layout_->indexOf(key).has_value();  // the layout is immutable: no lock
}

void ReplicaShell::pull(std::span<const Key> keys, std::vector<float>& out) const {
  std::lock_guard lock(mu_);
  if (std::optional<std::string> error = core_.replicas().check(keys, std::nullopt)) {
    throw std::invalid_argument("replica pull: " + *error);
  }
  core_.replicas().read(keys, out);
}

void ReplicaShell::push(std::span<const Key> keys, std::span<const float> grads, int64_t clock) {
  std::lock_guard lock(mu_);
  if (final_round_) {
    throw std::logic_error("replica push after drain(): the drain promised no more pushes");
  }
  if (std::optional<std::string> error = core_.replicas().check(keys, grads.size())) {
    throw std::invalid_argument("replica push: " + *error);
  }
  core_.replicas().push(keys, grads, clock);
  ++counters_.pushes;
}

std::vector<float> ReplicaShell::values(Key key) const {
  std::lock_guard lock(mu_);
  if (!isReplicated(key)) throw std::invalid_argument(fmt::format("key {} is not replicated", key));
  const std::span<const float> v = core_.replicas().values(key);
  return {v.begin(), v.end()};
}

std::vector<float> ReplicaShell::state(Key key) const {
  std::lock_guard lock(mu_);
  if (!isReplicated(key)) throw std::invalid_argument(fmt::format("key {} is not replicated", key));
  const std::span<const float> v = core_.replicas().state(key);
  return {v.begin(), v.end()};
}

void ReplicaShell::syncNow() {
  onLoop([this] { tickFromLoop(); });
}

node::Status ReplicaShell::drain(milliseconds timeout) {
  // It waits for rounds that only the loop thread can run.
  if (node_.onLoopThread()) throw std::logic_error("ReplicaShell::drain() on the loop thread");
  const auto deadline = SteadyClock::now() + timeout;
  const bool posted = onLoop([this] {
    std::vector<NodeId> to;
    uint64_t final_round = 0;
    {
      std::lock_guard lock(mu_);
      if (final_round_) return;
      // Every push so far is in a delta already taken (rounds up to round()) or in the next one.
      final_round = core_.sync().round() + 1;
      final_round_ = final_round;
      final_rounds_[self_] = final_round;
      for (NodeId member : core_.sync().liveMembers()) {
        if (member != self_) to.push_back(member);
      }
    }
    changed_.notify_all();
    if (!to.empty()) {
      ReplicaFrameParts parts = replicaDrainFrame(final_round);
      const node::SharedFrame frame =
          node::encodeMessage(node_, parts.type, std::move(parts.write), parts.size_hint);
      node_.broadcast(to, frame, [node = &node_](NodeId peer, const node::Status& status) {
        if (!status.ok()) {
          node->logger().debug("replica drain announcement to node {} not sent: {}", peer,
                               status.toString());
        }
      });
      std::lock_guard lock(mu_);
      counters_.messages_sent += to.size();
      counters_.wire_bytes_sent += frame->size() * to.size();
    }
    node_.logger().debug("replica sync: drained; every push of this node is in round {} or before",
                         final_round);
    tickFromLoop();
  });
  if (!posted) return {node::ErrorCode::kShutdown, "replica drain: the node does not run"};
  std::unique_lock lock(mu_);
  while (!drainDoneLocked()) {
    // Woken by every finished round, announcement and death; the short wait notices a node
    // that stopped running (its loop posts nothing any more).
    if (changed_.wait_until(lock, std::min(deadline, SteadyClock::now() + milliseconds(200))) ==
            std::cv_status::timeout &&
        SteadyClock::now() >= deadline) {
      if (drainDoneLocked()) break;
      std::vector<NodeId> silent;
      for (NodeId member : core_.sync().liveMembers()) {
        if (!final_rounds_.count(member)) silent.push_back(member);
      }
      return {node::ErrorCode::kTimeout,
              fmt::format("replica drain did not finish within {} ms: at round {} of {}{}",
                          timeout.count(), counters_.round, drainTargetLocked(),
                          silent.empty() ? std::string()
                                         : fmt::format("; nodes {} have not drained yet",
                                                       fmt::join(silent, ", ")))};
    }
    if (!node_.post([] {})) {
      return {node::ErrorCode::kShutdown, "replica drain: the node stopped running"};
    }
  }
  return {};
}

bool ReplicaShell::waitRound(uint64_t round, milliseconds timeout) const {
  if (node_.onLoopThread()) throw std::logic_error("ReplicaShell::waitRound() on the loop thread");
  std::unique_lock lock(mu_);
  return changed_.wait_for(lock, timeout, [&] { return counters_.round >= round; });
}

ReplicaShellCounters ReplicaShell::counters() const {
  std::lock_guard lock(mu_);
  ReplicaShellCounters out = counters_;
  out.send_failures = send_failures_->load();
  if (last_finished_start_) {
    out.staleness = duration_cast<microseconds>(SteadyClock::now() - *last_finished_start_);
  }
  return out;
}

uint64_t ReplicaShell::drainTargetLocked() const {
  uint64_t target = 0;
  for (NodeId member : core_.sync().liveMembers()) {
    auto it = final_rounds_.find(member);
    if (it != final_rounds_.end()) target = std::max(target, it->second);
  }
  return target;
}

bool ReplicaShell::allAnnouncedLocked() const {
  for (NodeId member : core_.sync().liveMembers()) {
    if (!final_rounds_.count(member)) return false;
  }
  return true;
}

bool ReplicaShell::drainDoneLocked() const {
  return final_round_ && allAnnouncedLocked() && counters_.round >= drainTargetLocked();
}

bool ReplicaShell::drainWaitsForRoundsLocked() const {
  return final_round_ && !core_.sync().inRound() && allAnnouncedLocked() &&
         counters_.round < drainTargetLocked();
}

// ---- loop thread ----

template <class CoreCall>
void ReplicaShell::stepFromLoop(CoreCall&& call) {
  ReplicaSyncStep step;
  std::vector<std::string> warnings;
  bool again = false;
  {
    std::lock_guard lock(mu_);
    step = call(core_);
    accountLocked(step, warnings);
    // A drain that waits for rounds only (everyone announced) runs them back to back.
    again = drainWaitsForRoundsLocked();
  }
  if (!step.finished.empty()) changed_.notify_all();
  for (const std::string& error : step.errors)
    node_.logger().warn("{}", error);
  for (const std::string& warning : warnings)
    node_.logger().warn("{}", warning);
  sendFromLoop(step.send);
  if (again) tickFromLoop();
}

void ReplicaShell::accountLocked(const ReplicaSyncStep& step, std::vector<std::string>& warnings) {
  const auto now = SteadyClock::now();
  counters_.refused_messages += step.errors.size();
  if (const uint64_t own = core_.droppedOwnDeltas(); own > own_dropped_seen_) {
    counters_.dropped_non_finite += own - own_dropped_seen_;
    own_dropped_seen_ = own;
    if (non_finite_log_.count(self_)) {
      warnings.push_back(fmt::format(
          "replica sync: this node's (node {}) delta of round {} holds non-finite values (its "
          "pushes since the last round): dropped, the round goes on without it ({} so far)",
          self_, core_.sync().round(), non_finite_log_.countOf(self_)));
    }
  }
  // A round started by this call: the core's current round, not seen before.
  if (core_.sync().inRound()) round_start_.try_emplace(core_.sync().round(), now);
  for (const ReplicaRoundResult& result : step.finished) {
    // A round that started and finished in one call (one member) starts now.
    const auto started = round_start_.try_emplace(result.round, now).first->second;
    last_finished_start_ = started;
    counters_.last_round = duration_cast<microseconds>(now - started);
    counters_.round = std::max(counters_.round, result.round);
    ++counters_.rounds;
    round_start_.erase(round_start_.begin(), round_start_.upper_bound(result.round));
    // A member that drained pushed nothing after its final round: its later deltas were empty,
    // and losing them loses nothing.
    ReplicaRoundResult real = result;
    std::erase_if(real.lost, [&](NodeId member) {
      auto it = final_rounds_.find(member);
      return it != final_rounds_.end() && result.round > it->second;
    });
    if (!real.lost.empty()) {
      counters_.lost_deltas += real.lost.size();
      warnings.push_back(describeLoss(real));
    }
  }
  counters_.live_members = core_.sync().liveMembers();
}

void ReplicaShell::tickFromLoop() {
  stepFromLoop([](ReplicaNode& core) { return core.tick(); });
}

void ReplicaShell::onSyncFrameFromLoop(NodeId from, const node::InboundFrame& frame) {
  const replica_wire::ReplicaSync* body = replicaMessageOf(frame).body_as_ReplicaSync();
  ReplicaSyncMessage message;
  if (std::optional<std::string> error = decodeReplicaSync(*body, frame.attachment(), message)) {
    {
      std::lock_guard lock(mu_);
      ++counters_.refused_messages;
    }
    node_.logger().warn("replica sync message from node {}: {}; dropped", from, *error);
    return;
  }
  {
    std::lock_guard lock(mu_);
    ++counters_.messages_received;
    if (message.dropped_non_finite > 0) ++counters_.dropped_non_finite;
  }
  if (message.dropped_non_finite > 0 && non_finite_log_.count(from)) {
    node_.logger().warn(
        "replica sync: node {}'s round-{} delta of part {} holds {} non-finite value(s): dropped "
        "for that round, the sync goes on without it ({} such deltas from node {} so far)",
        from, message.round, message.part, message.dropped_non_finite,
        non_finite_log_.countOf(from), from);
  }
  stepFromLoop([&](ReplicaNode& core) { return core.deliver(from, message); });
}

void ReplicaShell::onDrainFrameFromLoop(NodeId from, const node::InboundFrame& frame) {
  const uint64_t final_round = replicaMessageOf(frame).body_as_ReplicaDrain()->final_round();
  std::string refusal;
  bool again = false;
  {
    std::lock_guard lock(mu_);
    if (from == self_ || !layout_->memberIndex(from)) {
      refusal = "it is no other member of the replica group";
    } else if (down_.count(from)) {
      return;  // late: it left the sync already
    } else if (final_round == 0) {
      refusal = "its final round is 0 (rounds start at 1)";
    } else if (final_round > core_.sync().round() + 2) {
      // A member's final round is the next it starts, and no member runs more than one round
      // ahead of another.
      refusal = fmt::format("its final round {} is beyond the next round here ({})", final_round,
                            core_.sync().round() + 1);
    } else if (!final_rounds_.emplace(from, final_round).second) {
      refusal = "it drained before";
    } else {
      ++counters_.messages_received;
      again = drainWaitsForRoundsLocked();
    }
    if (!refusal.empty()) ++counters_.refused_messages;
  }
  if (!refusal.empty()) {
    node_.logger().warn("replica drain announcement from node {} (final round {}): {}; dropped",
                        from, final_round, refusal);
    return;
  }
  changed_.notify_all();
  if (again) tickFromLoop();
}

void ReplicaShell::onPeerEvent(const node::PeerEvent& event) {
  switch (event.kind) {
    case node::PeerEventKind::kDown:
    case node::PeerEventKind::kLeft:
      memberDownFromLoop(event.peer, event.reason);
      break;
    case node::PeerEventKind::kUp: {
      bool was_down = false;
      {
        std::lock_guard lock(mu_);
        was_down = down_.count(event.peer) > 0;
      }
      if (!was_down) outbox_.peerUpFromLoop(event.peer);
      if (was_down) {
        node_.logger().warn(
            "node {} is connected again, but it left the replica sync when it went down: a member "
            "never rejoins (its replica messages are dropped)",
            event.peer);
      }
      break;
    }
    default:
      break;
  }
}

void ReplicaShell::memberDown(NodeId node, const std::string& reason) {
  onLoop([this, node, reason] { memberDownFromLoop(node, reason); });
}

void ReplicaShell::memberDownFromLoop(NodeId node, const std::string& reason) {
  std::optional<uint64_t> drained;
  {
    std::lock_guard lock(mu_);
    if (node == self_ || !layout_->memberIndex(node) || !down_.insert(node).second) return;
    if (auto it = final_rounds_.find(node); it != final_rounds_.end()) drained = it->second;
  }
  if (drained) {
    node_.logger().info(
        "replica sync: node {} is gone ({}) after it drained: its pushes were all in its rounds "
        "up to {}",
        node, reason, *drained);
  } else {
    node_.logger().warn(
        "replica sync: node {} is down ({}): the sync goes on among the live nodes; its pushes "
        "since it started its last round are lost",
        node, reason);
  }
  outbox_.dropFromLoop(node, "it is out of the replica sync");
  stepFromLoop([node](ReplicaNode& core) { return core.memberDown(node); });
  changed_.notify_all();
}

void ReplicaShell::sendFromLoop(std::vector<ReplicaSyncSend>& sends) {
  // Copies of one message (a sum to every member: the same rows) are one frame.
  std::vector<bool> done(sends.size(), false);
  for (size_t i = 0; i < sends.size(); ++i) {
    if (done[i]) continue;
    const ReplicaSyncMessage& message = sends[i].message;
    std::vector<NodeId> to{sends[i].to};
    for (size_t j = i + 1; j < sends.size(); ++j) {
      const ReplicaSyncMessage& other = sends[j].message;
      if (!done[j] && other.rows == message.rows && other.kind == message.kind &&
          other.round == message.round && other.part == message.part &&
          other.contributors == message.contributors) {
        to.push_back(sends[j].to);
        done[j] = true;
      }
    }
    ReplicaFrameParts parts = replicaSyncFrame(message);
    const node::SharedFrame frame = node::encodeMessage(
        node_, parts.type, std::move(parts.write), parts.size_hint, std::move(parts.attachment));
    {
      std::lock_guard lock(mu_);
      counters_.messages_sent += to.size();
      counters_.payload_bytes_sent += message.payloadBytes() * to.size();
      counters_.wire_bytes_sent += frame->size() * to.size();
    }
    // A member not connected yet gets the frame when it comes up, behind the ones that wait for
    // it already. Members start their sync at different moments (a contribution pulls a node
    // into a round before its own connections are all up), and a lost frame would stall the
    // round for good. The callback holds the rows, which the frame's attachment points into,
    // until every send of it completed; it holds no `this` (a send may complete after the shell
    // is gone; the node outlives it).
    outbox_.sendFromLoop(
        to, frame,
        [node = &node_, failures = send_failures_, rows = message.rows, round = message.round](
            NodeId peer, const node::Status& status) {
          // Not connected: dropped when the member left the sync (its down event says so).
          if (status.ok() || status.code() == node::ErrorCode::kNotConnected) return;
          failures->fetch_add(1);
          // A peer that is down gets its down event; anything else stalls the round until the
          // peer is declared down, so say so.
          node->logger().log(
              status.code() == node::ErrorCode::kOverloaded ? spdlog::level::err
                                                            : spdlog::level::debug,
              "replica sync round {}: a frame to node {} was not sent ({}); the round waits "
              "until node {} is declared down",
              round, peer, status.toString(), peer);
        });
  }
}

}  // namespace chorus::ps
