// The membership messages of a consensus node, dense or sparse: TrainingDone (a peer finished
// its rounds) and ModelRequest (a restarted neighbor asks for a catch-up model, --rejoin). Both
// modes take them the same way: a TrainingDone marks its sender finished in the node's
// run::Membership, a neighbor's ModelRequest waits in a set of requests that the trainer thread
// answers after its current round (or in its end-of-run wait). One lock guards it all: the
// membership's (run/membership.h), so that one condition wakes every wait.
#pragma once

#include <functional>
#include <set>
#include <vector>

#include "consensus/consensus_service.h"
#include "node/protocol.h"
#include "run/membership.h"

namespace chorus::node {
class Node;
}

namespace chorus::consensus {

using NodeId = node::NodeId;  // defined once, in node/protocol.h

class MembershipMessages {
 public:
  // Loop thread: what a mode adds to a TrainingDone before its sender is marked finished (dense
  // consensus: the end-of-run tree's parent and summary); `done` is null for an empty message.
  using DoneHook = std::function<void(NodeId from, const wire::TrainingDone* done)>;

  // `membership` is the node's (it outlives this); `neighbors` whose requests are taken.
  MembershipMessages(run::Membership& membership, std::vector<NodeId> neighbors);
  MembershipMessages(const MembershipMessages&) = delete;
  MembershipMessages& operator=(const MembershipMessages&) = delete;

  // Installs the TrainingDone and ModelRequest handlers on `node` (before it starts). With
  // `done_from_neighbors_only`, a TrainingDone from a member that is not a neighbor is logged
  // and ignored (sparse consensus waits for its neighbors only; dense consensus also hears from
  // its end-of-run tree links). A ModelRequest from a non-neighbor is always ignored.
  void install(node::Node& node, DoneHook on_done, bool done_from_neighbors_only);
  // Any thread: whether `id` is a neighbor.
  bool isNeighbor(NodeId id) const;
  // Any thread: the neighbors waiting for a catch-up model, sorted; they are forgotten.
  std::vector<NodeId> takeRequests();
  // With the membership's lock held: whether a neighbor is waiting for a catch-up model.
  bool hasRequestsLocked() const { return !requests_.empty(); }

 private:
  run::Membership& membership_;
  std::vector<NodeId> neighbors_;  // sorted
  std::set<NodeId> requests_;      // under membership_.lock()
};

}  // namespace chorus::consensus
