// Consensus mode above the frame layer: a fuzzed, authenticated peer after its handshake. Each
// record of the input is one frame from one member (neighbor or not) or a stranger, read by the
// real FrameDecoder with consensus's service (the Verifier the node runs) and handed to a real
// ConsensusPeer's handlers (ModelShare of every purpose, ModelRequest, TrainingDone) through
// Node::deliverForTesting, on a node that never opens a socket and whose rounds never start.
// Checked after every input: what peers' models hold in the node's memory stays within what
// docs/consensus.md ("What a peer can make a node hold") promises (hole 2 of issue 27: one-float
// chunks of many rounds once allocated a model each). libFuzzer's -malloc_limit_mb catches an
// allocation a peer's numbers size.
//
// The cluster: members 0..3, graph 0-1, 0-2, 1-2, 1-3 (the end-of-run tree rooted at node 0).
// Input: 1 byte of options (bit 0: this node is 1 instead of 0; bits 1-2: tau 0..3), then
// records: control byte (bits 0-2: the sender, 0..3 members, 4..7 strangers), 2 bytes
// little-endian length, then that many bytes of the frame stream.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

#include "consensus/consensus_peer.h"
#include "consensus/consensus_service.h"
#include "ml/model.h"
#include "node/frame.h"
#include "node/node.h"
#include "run/training_run.h"
#include "tests/fuzz/fake_peers.h"

namespace {

using namespace chorus;

// The shape every seed uses (tests/fuzz/make_seeds.cc): 15 parameters in chunks of 4.
constexpr size_t kChunkFloats = 4;

[[noreturn]] void fail(const char* what, unsigned long long a, unsigned long long b) {
  std::fprintf(stderr, "fuzz_consensus_messages: %s (%llu, %llu)\n", what, a, b);
  std::abort();
}

std::unique_ptr<ml::Model> smallModel() {
  ml::ModelSpec spec;
  spec.name = "softmax";
  spec.input = {1, 2, 2};
  spec.classes = 3;
  return ml::Model::create(spec, 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t options_byte = data[0];
  ++data;
  --size;

  const node::NodeId self = options_byte & 1;
  const auto layout = fuzz::fourMemberLayout<consensus::PeerLayout>(self);
  const std::unique_ptr<node::Node> offline = fuzz::offlineNode(self, layout.members);
  node::Node& node = *offline;

  run::NodeJob job;
  job.node_id = self;
  job.model = smallModel();
  job.rounds = 20;
  const size_t model_bytes = job.model->size() * sizeof(float);
  consensus::ConsensusOptions options;
  options.staleness = run::StalenessBound{(options_byte >> 1) & 3};
  options.chunk_floats = kChunkFloats;
  const int64_t tau = options.staleness.bound;
  consensus::ConsensusPeer peer(node, std::move(job), layout, options);

  fuzz::Records records({data, size});
  uint8_t control = 0;
  std::span<const uint8_t> frame;
  while (records.control(control) && records.frameBytes(frame)) {
    fuzz::deliverFrames(node, control & 7, consensus::kConsensusServiceId,
                        consensus::kConsensusService, frame);
  }

  // docs/consensus.md: per neighbor 2 tau + 2 models on the board and one partial one; per
  // member at most a partial and a complete partial sum (two vectors' worth each) and, at node 0,
  // a Final model. Generously: members x (2 tau + 3 + 5) models.
  const consensus::HeldModels held = peer.held();
  const uint64_t bound = layout.members.size() * static_cast<uint64_t>(2 * tau + 8) * model_bytes;
  if (held.peak_bytes > bound)
    fail("peers' models held beyond the documented bound", held.peak_bytes, bound);
  node.shutdown(std::chrono::milliseconds(0));
  return 0;
}
