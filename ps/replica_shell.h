// The network shell of NuPS replication (docs/ps-replication.md, "The shell"): one node's
// replicas of the hot keys and their background sync, over the node's existing connections. A
// thin layer around ReplicaNode (ps/replica_node.h, the protocol without networking): a libuv
// timer on the loop thread starts rounds at `syncs_per_second`, replica frames (service
// "ps-replica", ps/replica.fbs) are verified by the runtime, decoded (ps/replica_codec.h) and
// delivered, the owner's peer events declare members down, and what every call returns is
// encoded, sent, counted and logged. A sparse PS peer reads and pushes hot keys here instead of
// sending them to an owner: pull(), push(), isReplicated(); drain() at the end of its run.
//
// Threads (docs/threading.md):
// - Loop thread: the timer, the frame handlers, onPeerEvent(); every call into the core that
//   sends (tick, deliver, memberDown) runs here, so frames leave in the order the core made
//   them. The drain's bookkeeping (who announced its final round) is loop-thread state.
// - Trainer thread (any thread, one or several): pull(), push(), isReplicated(), drain(),
//   syncNow(), counters(), values().
// - One mutex, mu_, guards the ReplicaNode (replicas and protocol state), the counters and the
//   drain's progress; it is never held while sending or logging. The loop thread holds it for
//   one core call; the trainer for one read or push of its rows.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "node/frame.h"
#include "node/repeated_log.h"
#include "node/send_when_connected.h"
#include "node/status.h"
#include "ps/replica_node.h"

namespace chorus::node {
class Node;
struct PeerEvent;
}  // namespace chorus::node

namespace chorus::ps {

struct ReplicaShellOptions {
  // Rounds started by this node's timer per second (NuPS's default 25; it studied 0.2-125). A
  // round any member starts pulls the others in, so the cluster syncs at about the fastest
  // node's rate; a timer firing during a round does nothing. 0: no timer (rounds start only
  // from syncNow(), drain() or another member).
  double syncs_per_second = 25;
};

// What the shell did so far; any thread (counters()).
struct ReplicaShellCounters {
  uint64_t rounds = 0;              // rounds finished here
  uint64_t messages_sent = 0;       // replica frames sent (per destination)
  uint64_t payload_bytes_sent = 0;  // the core's payload bytes of those (keys, floats, headers)
  uint64_t wire_bytes_sent = 0;     // the frames' bytes on the wire (envelope and attachment)
  uint64_t messages_received = 0;   // replica frames delivered to the core
  uint64_t lost_deltas = 0;         // (round, member) whose delta is missing from some part
  uint64_t refused_messages = 0;    // malformed or meaningless messages from peers, dropped
  // Deltas dropped for a round because they held NaN or infinity: peers' contributions to a
  // part (each one message) and this node's own deltas (ReplicaNode::droppedOwnDeltas).
  uint64_t dropped_non_finite = 0;
  uint64_t send_failures = 0;  // frames the runtime could not send (peer down, overload)
  uint64_t pushes = 0;         // push() calls
  // Age of what the replicas hold: time since this node started the last round it finished (a
  // replica holds every other node's changes made before that node started that round, and the
  // others started it at most this long before: the round that pulled this one in). Unset
  // before the first round.
  std::optional<std::chrono::microseconds> staleness;
  // Duration of the last finished round here (start to finish).
  std::chrono::microseconds last_round{0};
  // The last finished round's number, and the members still in the sync (this node included).
  uint64_t round = 0;
  std::vector<NodeId> live_members;
};

class ReplicaShell {
 public:
  // Replicas of `layout`'s keys on `node` (a member of the layout), starting from `initial` (the
  // same on every node: ReplicaSet), updated with `policy`. Registers the replica service's
  // handlers on `node`; the sync starts with start(). Throws std::invalid_argument when the node
  // is no member or `initial` has the wrong length. The node must outlive the shell.
  ReplicaShell(node::Node& node, std::shared_ptr<const ReplicaLayout> layout,
               std::span<const float> initial, std::shared_ptr<const UpdatePolicy> policy,
               ReplicaShellOptions options = {});
  // Stops the timer and removes the handlers; anything posted to the loop before has run when
  // this returns. Never on the loop thread.
  ~ReplicaShell();
  ReplicaShell(const ReplicaShell&) = delete;
  ReplicaShell& operator=(const ReplicaShell&) = delete;

  // Any thread, once the node listens: starts the sync timer (nothing with syncs_per_second 0).
  void start();
  // Loop thread: the node's peer events, which the owner of the node's event handler forwards
  // (Node has one event handler: a PS peer composes its parts' handlers, as PsRunBarrier does).
  // kDown and kLeft of a member are final: it leaves the sync for good (the core's contract); a
  // member that comes back up later is logged and stays out.
  void onPeerEvent(const node::PeerEvent& event);
  // Any thread: the member `node` is gone for the sync (what onPeerEvent does for kDown/kLeft).
  void memberDown(NodeId node, const std::string& reason);

  // Any thread: is `key` replicated on every node (served by pull/push here)?
  bool isReplicated(Key key) const;
  // Any thread: appends the local replica values of `keys` (sorted, unique, replicated) to
  // `out`, in key order. std::invalid_argument names what is wrong with `keys`.
  void pull(std::span<const Key> keys, std::vector<float>& out) const;
  // Any thread: applies the gradients of `keys` (sorted, unique, replicated; each key's value
  // floats, key order), made at `clock`, to the local replicas at once through the update
  // policy; the change joins the next round's delta. std::invalid_argument names what is wrong;
  // std::logic_error after drain() (the drain promised no more pushes).
  void push(std::span<const Key> keys, std::span<const float> grads, int64_t clock = 0);
  // Any thread: a copy of the local value floats of replicated `key`.
  std::vector<float> values(Key key) const;
  // Any thread: the local optimizer state of replicated `key`.
  std::vector<float> state(Key key) const;

  // Any thread: starts a round now unless one is running (what the timer does).
  void syncNow();
  // Trainer thread, after its last push: the end-of-run sync. Announces this node's final round
  // (the next it starts) to every live member, then syncs until every live member announced its
  // own and this node finished the last of those rounds: every push of every live node is then
  // in every replica here, and the replicas of all nodes that drained agree bit for bit. Members
  // that die meanwhile are not waited for. The sync keeps running after (other members may
  // still be draining) until the shell is destroyed or the node shuts down. An error when
  // `timeout` passes first or the node stops running; std::logic_error on the loop thread.
  node::Status drain(std::chrono::milliseconds timeout);
  // Any thread but the loop thread: waits until this node finished round `round` or later
  // (false after `timeout`).
  bool waitRound(uint64_t round, std::chrono::milliseconds timeout) const;

  // Any thread.
  ReplicaShellCounters counters() const;
  const ReplicaLayout& layout() const { return *layout_; }

 private:
  // Loop thread: runs one core call under mu_, then sends and logs what it returned.
  template <class CoreCall>
  void stepFromLoop(CoreCall&& call);
  void tickFromLoop();
  void onSyncFrameFromLoop(NodeId from, const node::InboundFrame& frame);
  void onDrainFrameFromLoop(NodeId from, const node::InboundFrame& frame);
  void memberDownFromLoop(NodeId node, const std::string& reason);
  // Loop thread: encodes and sends `step.send` (a sum's frame once for all its destinations),
  // logs its errors and finished rounds; mu_ not held. A member not connected yet, or with
  // frames held, gets the new ones behind them (per-link FIFO: outbox_).
  void sendFromLoop(std::vector<ReplicaSyncSend>& sends);
  // Loop thread, mu_ held: records the rounds `step` started and finished (counters, times).
  void accountLocked(const ReplicaSyncStep& step, std::vector<std::string>& warnings);
  // mu_ held: is the drain done (every live member announced, its last round finished)?
  bool drainDoneLocked() const;
  // mu_ held: has every live member announced its final round?
  bool allAnnouncedLocked() const;
  // mu_ held: the drain waits for rounds only, and none is running.
  bool drainWaitsForRoundsLocked() const;
  // mu_ held: the last final round of the live members.
  uint64_t drainTargetLocked() const;
  // Runs `fn` on the loop thread (now when on it); false when the node does not run.
  bool onLoop(std::function<void()> fn);

  node::Node& node_;
  std::shared_ptr<const ReplicaLayout> layout_;
  ReplicaShellOptions options_;
  NodeId self_;
  uint64_t timer_ = 0;

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;  // a round finished, a drain announcement, a death
  ReplicaNode core_;                         // guarded by mu_
  ReplicaShellCounters counters_;            // guarded by mu_ (staleness computed on read)
  std::map<uint64_t, std::chrono::steady_clock::time_point> round_start_;  // mu_
  std::optional<std::chrono::steady_clock::time_point> last_finished_start_;
  // The drain (mu_): this node's final round once it drained; each member's announced final
  // round; the members declared down.
  std::optional<uint64_t> final_round_;
  std::map<NodeId, uint64_t> final_rounds_;
  std::set<NodeId> down_;
  // Frames the runtime could not send; shared with the send callbacks, which may outlive this.
  std::shared_ptr<std::atomic<uint64_t>> send_failures_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  // Loop thread: which non-finite deltas are logged (the first few of each member, then one in
  // a thousand: a member whose model diverged sends one every round).
  node::RefusalLog non_finite_log_;
  uint64_t own_dropped_seen_ = 0;  // mu_: droppedOwnDeltas() already counted
  // Loop thread: frames for members not connected yet (a node joins a round that another
  // member started before all of its own connections are up), sent in order when they come up.
  // Last: its destructor completes held frames, whose callbacks count send_failures_.
  node::SendWhenConnected outbox_;
};

}  // namespace chorus::ps
