// Sparse consensus above the frame layer (consensus/sparse_consensus_peer.h): a fuzzed,
// authenticated peer after its handshake. Each record of the input is one frame from one member
// (neighbor or not) or a stranger, read by the real FrameDecoder with consensus's service (the
// Verifier the node runs) and handed to a real SparseConsensusPeer's handlers (RowShare parts of
// any round, catch-up shares nobody asked for, ModelRequest, TrainingDone) through
// Node::deliverForTesting, on a node that never opens a socket and whose rounds never start. What
// a RowShare's parts assemble into is checked by checkRowShare (tables, keys, row widths, finite
// values) before it reaches the inbox; AddressSanitizer, UBSan and libFuzzer's -malloc_limit_mb
// catch a read past a block or an allocation a peer's numbers size.
//
// The cluster: members 0..3, graph 0-1, 0-2, 1-2, 1-3; the model: matrix factorization of 6 users
// x 5 items at rank 2 (two tables, 11 rows of 2 floats), 40 training ratings, batch 2: 5 rounds an
// epoch, 4 epochs, rounds 0..19.
// Input: 1 byte of options (bit 0: this node is 1 instead of 0; bits 1-2: tau 0..3), then
// records: control byte (bits 0-2: the sender, 0..3 members, 4..7 strangers), 2 bytes
// little-endian length, then that many bytes of the frame stream.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "consensus/consensus_service.h"
#include "consensus/sparse_consensus_peer.h"
#include "ml/mf_workload.h"
#include "node/frame.h"
#include "node/node.h"
#include "tests/fuzz/fake_peers.h"

namespace {

using namespace chorus;

// The seeds' workload (tests/fuzz/make_seeds.cc writes RowShares for these shapes).
ml::RatingsData smallRatings() {
  ml::RatingsData data;
  data.name = "fuzz";
  data.rows = 6;
  data.cols = 5;
  for (uint32_t i = 0; i < 40; ++i)
    data.train.push_back({i % 6, (i * 7) % 5, 1.0f + static_cast<float>(i % 5)});
  data.test = {{0, 1, 3.0f}, {5, 4, 2.0f}};
  return data;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t options_byte = data[0];
  ++data;
  --size;

  static const ml::RatingsData ratings = smallRatings();
  ml::MfOptions mf;
  mf.rank = 2;
  mf.seed = 3;
  ml::MfWorkload workload(ratings, mf);

  const node::NodeId self = options_byte & 1;
  const auto layout = fuzz::fourMemberLayout<consensus::SparseLayout>(self);
  const std::unique_ptr<node::Node> offline = fuzz::offlineNode(self, layout.members);
  node::Node& node = *offline;

  consensus::SparseConsensusOptions options;
  options.staleness = run::StalenessBound{(options_byte >> 1) & 3};
  options.chunk_floats = 6;  // shares of several parts
  options.train.epochs = 4;
  options.train.batchSize = 2;
  options.train.evalEvery = 0;
  options.hot = {{0, 1}, {0}};
  consensus::SparseConsensusPeer peer(node, workload, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, layout,
                                      options);

  fuzz::Records records({data, size});
  uint8_t control = 0;
  std::span<const uint8_t> frame;
  while (records.control(control) && records.frameBytes(frame)) {
    fuzz::deliverFrames(node, control & 7, consensus::kConsensusServiceId,
                        consensus::kConsensusService, frame);
  }
  node.shutdown(std::chrono::milliseconds(0));
  return 0;
}
