#include "ps/replica_node.h"

#include <utility>

#include "node/finite.h"

namespace chorus::ps {

ReplicaNode::ReplicaNode(std::shared_ptr<const ReplicaLayout> layout, NodeId self,
                         std::span<const float> initial, std::shared_ptr<const UpdatePolicy> policy)
    : replicas_(layout, initial, std::move(policy)), sync_(std::move(layout), self) {}

ReplicaSyncStep ReplicaNode::tick() {
  ReplicaSyncStep step;
  if (sync_.inRound()) return step;
  step = sync_.start(ownDelta());
  settle(step);
  return step;
}

ReplicaSyncStep ReplicaNode::deliver(NodeId from, const ReplicaSyncMessage& message) {
  ReplicaSyncStep step = sync_.receive(from, message);
  settle(step);
  return step;
}

ReplicaSyncStep ReplicaNode::memberDown(NodeId node) {
  ReplicaSyncStep step = sync_.memberDown(node);
  settle(step);
  return step;
}

SparseRows ReplicaNode::ownDelta() {
  SparseRows delta = replicas_.takeDelta();
  if (!node::firstNonFinite(delta.values)) return delta;
  ++dropped_own_;
  return SparseRows{};
}

void ReplicaNode::settle(ReplicaSyncStep& step) {
  size_t applied = 0;
  while (true) {
    for (; applied < step.finished.size(); ++applied)
      replicas_.applySum(step.finished[applied].sum);
    if (!step.start_next || sync_.inRound()) break;
    step.start_next = false;
    ReplicaSyncStep next = sync_.start(ownDelta());
    for (ReplicaSyncSend& send : next.send)
      step.send.push_back(std::move(send));
    for (ReplicaRoundResult& result : next.finished)
      step.finished.push_back(std::move(result));
    step.start_next = next.start_next;
  }
  step.start_next = false;
}

}  // namespace chorus::ps
