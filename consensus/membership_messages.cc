#include "consensus/membership_messages.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "node/node.h"

namespace chorus::consensus {

MembershipMessages::MembershipMessages(run::Membership& membership, std::vector<NodeId> neighbors)
    : membership_(membership), neighbors_(std::move(neighbors)) {
  std::sort(neighbors_.begin(), neighbors_.end());
}

bool MembershipMessages::isNeighbor(NodeId id) const {
  return std::binary_search(neighbors_.begin(), neighbors_.end(), id);
}

void MembershipMessages::install(node::Node& node, DoneHook on_done,
                                 bool done_from_neighbors_only) {
  node.setHandler(messageType(wire::Body::TrainingDone),
                  [this, &node, on_done = std::move(on_done), done_from_neighbors_only](
                      NodeId from, const node::InboundFrame& frame) {
                    if (done_from_neighbors_only && !isNeighbor(from)) {
                      node.logger().warn(
                          "TrainingDone from node {}, which is not a neighbor: ignored", from);
                      return;
                    }
                    if (on_done) on_done(from, messageOf(frame).body_as_TrainingDone());
                    membership_.finished(from);
                  });
  node.setHandler(
      messageType(wire::Body::ModelRequest), [this, &node](NodeId from, const node::InboundFrame&) {
        if (!isNeighbor(from)) {
          node.logger().warn("model request from node {}, which is not a neighbor: ignored", from);
          return;
        }
        {
          auto lock = membership_.lock();
          requests_.insert(from);
        }
        membership_.notify();
      });
}

std::vector<NodeId> MembershipMessages::takeRequests() {
  auto lock = membership_.lock();
  std::vector<NodeId> out(requests_.begin(), requests_.end());
  requests_.clear();
  return out;
}

}  // namespace chorus::consensus
