#include "node/send_when_connected.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <utility>

namespace chorus::node {

SendWhenConnected::SendWhenConnected(Node& node) : node_(node) {}

SendWhenConnected::~SendWhenConnected() {
  for (auto& [peer, queue] : held_) {
    for (Held& held : queue) {
      if (held.done) {
        held.done(peer, Status(ErrorCode::kShutdown,
                               fmt::format("a frame held for node {} until its connection came "
                                           "up was not sent: the sender stopped",
                                           peer)));
      }
    }
  }
}

void SendWhenConnected::sendFromLoop(const std::vector<NodeId>& to, const SharedFrame& frame,
                                     const SendCallback& done) {
  const Held held{frame, done};
  for (NodeId peer : to) {
    auto waiting = held_.find(peer);
    if (waiting != held_.end()) {
      waiting->second.push_back(held);  // behind the frames that wait already
      continue;
    }
    if (!sendNowFromLoop(peer, held)) {
      held_[peer].push_back(held);
      node_.logger().debug("node {} is not connected yet; its frames wait until it is", peer);
    }
  }
}

bool SendWhenConnected::sendNowFromLoop(NodeId to, const Held& held) {
  // A send to a peer whose connection is not up fails at once, inside send() (the loop thread's
  // sends are checked there): that failure means "hold it", and the caller's callback does not
  // see it. Every later outcome is the caller's. The callback holds no `this`: a send may
  // complete after this object is gone.
  auto not_up = std::make_shared<bool>(false);
  auto in_call = std::make_shared<bool>(true);
  node_.send(to, held.frame,
             [done = held.done, not_up, in_call](NodeId peer, const Status& status) {
               if (*in_call && status.code() == ErrorCode::kNotConnected) {
                 *not_up = true;
                 return;
               }
               if (done) done(peer, status);
             });
  *in_call = false;
  return !*not_up;
}

void SendWhenConnected::peerUpFromLoop(NodeId peer) {
  auto it = held_.find(peer);
  if (it == held_.end()) return;
  std::deque<Held>& queue = it->second;
  while (!queue.empty()) {
    if (!sendNowFromLoop(peer, queue.front())) return;
    queue.pop_front();
  }
  held_.erase(it);
}

void SendWhenConnected::dropFromLoop(NodeId peer, const std::string& why) {
  auto it = held_.find(peer);
  if (it == held_.end()) return;
  std::deque<Held> queue = std::move(it->second);
  held_.erase(it);
  for (Held& held : queue) {
    if (held.done) {
      held.done(peer, Status(ErrorCode::kNotConnected,
                             fmt::format("a frame held for node {} until its connection came up "
                                         "was dropped: {}",
                                         peer, why)));
    }
  }
}

size_t SendWhenConnected::heldFrames(NodeId peer) const {
  auto it = held_.find(peer);
  return it == held_.end() ? 0 : it->second.size();
}

}  // namespace chorus::node
