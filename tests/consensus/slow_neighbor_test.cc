// A neighbor that cannot keep up (issue 23, item 4): consensus gossip uses the runtime's
// send-side policy (node/send_policy.h), so a new round's share pushes the older shares still
// queued to that neighbor out instead of piling up or being refused. Two nodes on loopback; node
// 0's link holds every frame it sends for 200 ms and its queue takes two and a half models, so
// the third round in flight must supersede the oldest.
#include <gtest/gtest.h>

#include <string>

#include "consensus/consensus_peer.h"
#include "tests/consensus/neighbor_cluster.h"

namespace chorus::consensus {
namespace {

using namespace std::chrono_literals;
using namespace testing_neighbors;

TEST(SlowNeighbor, GossipToALaggingLinkDropsOlderSharesNotNewerOnes) {
  constexpr NodeId kNodes = 3;
  constexpr int64_t kRounds = 30;
  const Graph g = ring(kNodes);  // a triangle: nodes 1 and 2 keep each other going
  auto data = syntheticData();
  // One model, one chunk: a gossip frame is the model's floats plus the envelope.
  const size_t model_floats =
      run::prepareNodeJob(smallRun(kRounds, 1), data, 0, kNodes).value().model->size();
  const size_t frame_bytes = model_floats * sizeof(float) + 512;
  NeighborCluster cluster(g, allOf(kNodes), [&](node::NodeOptions& o) {
    if (o.self != 0) return;
    o.link_delay = 200ms;
    o.max_queued_bytes = frame_bytes * 5 / 2;
    o.high_watermark = frame_bytes;
    o.low_watermark = frame_bytes / 2;
  });
  for (NodeId i = 0; i < kNodes; ++i) {
    ConsensusOptions co;
    co.chunk_floats = model_floats;
    // Each node waits for one neighbor's model (1 and 2 for each other's, which come at once)
    // and the gate is far away: node 0 sends its rounds' models faster than its 200 ms link
    // delivers them.
    co.backup = chorus::consensus::BackupRuleSpec::read("static:1").value();
    co.staleness.bound = 1000;
    co.report_every = 1000ms;
    cluster.attach(i, run::prepareNodeJob(smallRun(kRounds, 500 + i), data, i, kNodes).value(), co);
  }
  cluster.connect();
  std::map<NodeId, ConsensusReport> reports = cluster.runAll();
  for (NodeId i = 0; i < kNodes; ++i) {
    EXPECT_EQ(reports[i].rounds_done, kRounds) << "node " << i;
    EXPECT_TRUE(reports[i].departed_peers.empty()) << "node " << i;
  }
  const node::PeerStats sent = cluster.node(0).totals();
  EXPECT_GT(cluster.node(0).stats(1).frames_superseded, 0u) << "the link kept up";
  EXPECT_GT(cluster.node(0).stats(2).frames_superseded, 0u) << "the link kept up";
  // The report counts what was superseded by the end of the rounds (a send still on its way to
  // the loop thread then is counted by the node only).
  EXPECT_GT(reports[0].shares_superseded, 0u);
  EXPECT_LE(reports[0].shares_superseded, sent.frames_superseded);
  // Nothing was refused: each new share made room by pushing older ones out, and the end of the
  // run (TrainingDone, the summary) still fit beside them.
  EXPECT_EQ(sent.frames_refused, 0u);
  // The end of the run got through beside the gossip: node 0 averaged every final model.
  EXPECT_EQ(reports[0].averaged_models, 3u);
  EXPECT_EQ(reports[1].shares_superseded, 0u);  // its links kept up
}

}  // namespace
}  // namespace chorus::consensus
