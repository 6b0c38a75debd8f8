// Sends to peers whose connection may not be up yet. Nodes start at different moments, so a mode
// that sends as soon as it runs (a relocation's push, a replica sync's contribution) can find a
// member it must reach not connected yet; a frame lost then would stall a worker or a round for
// good. A frame for such a peer is held here, behind the frames held for it already (the order
// per peer is the caller's protocol: FIFO), and sent, in order, when the peer comes up. Used by
// ps/relocation_shell and ps/replica_shell. Loop thread only (docs/threading.md).
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "node/node.h"

namespace chorus::node {

class SendWhenConnected {
 public:
  // `node` outlives this object (and every callback handed to it).
  explicit SendWhenConnected(Node& node);
  // Completes the frames still held with kShutdown.
  ~SendWhenConnected();
  SendWhenConnected(const SendWhenConnected&) = delete;
  SendWhenConnected& operator=(const SendWhenConnected&) = delete;

  // Loop thread: sends `frame` to each of `to` now, or holds it for a peer that is not connected
  // (yet) or that has frames held already. `done` fires exactly once per peer: with the send's
  // outcome once the frame was handed to the node, or with kNotConnected when the peer was
  // dropped (dropFromLoop) or with kShutdown when this object ended while the frame was held.
  // It must not hold the caller (a send may complete after the caller is gone); it keeps
  // whatever the frame's attachment points into alive until it fires.
  void sendFromLoop(const std::vector<NodeId>& to, const SharedFrame& frame,
                    const SendCallback& done = {});
  // Loop thread: `peer` came up: sends the frames held for it, in order; a frame that finds it
  // not connected again stays first, with the rest behind.
  void peerUpFromLoop(NodeId peer);
  // Loop thread: `peer` is gone for good: its held frames complete with kNotConnected, naming
  // `why`, and are not sent.
  void dropFromLoop(NodeId peer, const std::string& why);
  // Loop thread: frames held for `peer` now.
  size_t heldFrames(NodeId peer) const;

 private:
  struct Held {
    SharedFrame frame;
    SendCallback done;
  };
  // Hands `held` to the node for `to`; false (nothing fired) when `to` is not connected.
  bool sendNowFromLoop(NodeId to, const Held& held);

  Node& node_;
  std::map<NodeId, std::deque<Held>> held_;  // never an empty queue
};

}  // namespace chorus::node
