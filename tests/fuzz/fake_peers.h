// What the message fuzz targets share (fuzz_consensus_messages, fuzz_sparse_consensus_messages,
// fuzz_ps_messages, fuzz_replica_messages): a node that never opens a socket, whose handlers
// the fuzzed "peers" reach through Node::deliverForTesting on the fuzzer's thread; the input's
// records (a control byte naming the sender, then a frame's bytes with a 2-byte length); and the
// consensus targets' four-member graph. tests/fuzz/make_seeds.cc writes seeds in this format.
#pragma once

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "node/frame.h"
#include "node/node.h"

namespace chorus::fuzz {

// Node `self` of cluster "fuzz" with `members`: it never listens, so its handlers run on the
// thread that delivers, and it logs nothing (a fuzzer's inputs would flood the log).
inline std::unique_ptr<node::Node> offlineNode(node::NodeId self,
                                               std::vector<node::NodeId> members) {
  node::NodeOptions options;
  options.cluster = "fuzz";
  options.self = self;
  options.members = std::move(members);
  auto node = std::make_unique<node::Node>(options);
  node->logger().set_level(spdlog::level::off);
  return node;
}

// The consensus targets' cluster: members 0..3, graph 0-1, 0-2, 1-2, 1-3 (the end-of-run tree
// rooted at node 0).
inline const std::map<node::NodeId, std::vector<node::NodeId>>& fourMemberGraph() {
  static const std::map<node::NodeId, std::vector<node::NodeId>> graph = {
      {0, {1, 2}}, {1, {0, 2, 3}}, {2, {0, 1}}, {3, {1}}};
  return graph;
}

// A consensus layout (consensus::PeerLayout or SparseLayout) of node `self` on fourMemberGraph().
template <class Layout>
Layout fourMemberLayout(node::NodeId self) {
  const auto& graph = fourMemberGraph();
  Layout layout;
  layout.self = self;
  layout.neighbors = graph.at(self);
  layout.members = {0, 1, 2, 3};
  for (const auto& [id, links] : graph)
    layout.degrees[id] = links.size();
  layout.graph = graph;
  return layout;
}

// Reads an input's records one by one: the caller takes the control byte, then (for a frame
// record) the frame bytes.
class Records {
 public:
  explicit Records(std::span<const uint8_t> input) : rest_(input) {}
  // The next control byte; false when the input is used up.
  bool control(uint8_t& out) {
    if (rest_.empty()) return false;
    out = rest_.front();
    rest_ = rest_.subspan(1);
    return true;
  }
  // The next frame record's bytes: a 2-byte little-endian length, then up to that many bytes
  // (fewer when the input ends first); false when not even the length is left.
  bool frameBytes(std::span<const uint8_t>& out) {
    if (rest_.size() < 2) return false;
    const size_t length = std::min<size_t>(rest_[0] | (size_t{rest_[1]} << 8), rest_.size() - 2);
    out = rest_.subspan(2, length);
    rest_ = rest_.subspan(2 + length);
    return true;
  }

 private:
  std::span<const uint8_t> rest_;
};

// Reads `bytes` with a fresh FrameDecoder (a connection that sent garbage is closed; the next
// is new) that knows `service` only, as the node runs it, and hands every whole frame to the
// node's handlers as if `from` had sent it. A decoder error is its answer to bad bytes and is
// not a finding. Returns the frames delivered.
inline size_t deliverFrames(node::Node& node, node::NodeId from, node::ServiceId service_id,
                            const node::ServiceSpec& service, std::span<const uint8_t> bytes) {
  node::FrameLimits limits;
  limits.max_frame_bytes = 1u << 16;
  node::FrameDecoder decoder(limits);
  decoder.setServices([service_id, &service](node::ServiceId id) -> const node::ServiceSpec* {
    return id == service_id ? &service : nullptr;
  });
  size_t frames = 0;
  const node::Status status =
      decoder.consume(bytes.data(), bytes.size(), [&](node::InboundFrame&& frame) {
        ++frames;
        node.deliverForTesting(from, frame);
        return true;
      });
  (void)status;
  return frames;
}

}  // namespace chorus::fuzz
