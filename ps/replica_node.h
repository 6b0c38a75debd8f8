// One node's replicas of the hot keys together with their sync: what the network shell drives.
// The shell calls tick() from a timer (--replica-syncs-per-s), deliver() for each replica sync
// message from a peer, and memberDown() when the runtime declares a peer dead; it sends what
// each call returns and logs the finished rounds' lost deltas and the errors. Finished rounds
// are applied to the replicas here, and a round another member started is joined here, so the
// shell holds no protocol state. Free of any networking; single-threaded (the loop thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "ps/replica_set.h"
#include "ps/replica_sync.h"

namespace chorus::ps {

class ReplicaNode {
 public:
  // Member `self`'s replicas of `layout`'s keys, from `initial` (as ReplicaSet), updated with
  // `policy`.
  ReplicaNode(std::shared_ptr<const ReplicaLayout> layout, NodeId self,
              std::span<const float> initial, std::shared_ptr<const UpdatePolicy> policy);

  // The replicas: read and push them directly (pushes join the next round's delta).
  ReplicaSet& replicas() { return replicas_; }
  const ReplicaSet& replicas() const { return replicas_; }
  // The protocol's state (round, live members).
  const ReplicaSync& sync() const { return sync_; }

  // The sync timer fired: starts a round with the delta since the last one, unless a round is
  // still running (then nothing: the next tick tries again). Returns what to send.
  ReplicaSyncStep tick();
  // A replica sync message from member `from`.
  ReplicaSyncStep deliver(NodeId from, const ReplicaSyncMessage& message);
  // Rounds this node started with an empty delta because its own was not all finite (its
  // pushes since the last round held NaN or infinity: they are dropped, and nothing non-finite
  // enters a sum this node reduces or a contribution it sends).
  uint64_t droppedOwnDeltas() const { return dropped_own_; }
  // The runtime declared `node` dead (after the last message it delivered from it).
  ReplicaSyncStep memberDown(NodeId node);

 private:
  // Applies the rounds `step` finished and starts the round a member asked for, until neither
  // is left; appends what that sends.
  void settle(ReplicaSyncStep& step);
  // The delta since the last round (ReplicaSet::takeDelta), or nothing when it is not finite.
  SparseRows ownDelta();

  ReplicaSet replicas_;
  ReplicaSync sync_;
  uint64_t dropped_own_ = 0;
};

}  // namespace chorus::ps
