// Consensus mode as a training run on a node (run/training_session.h): the ConsensusPeer, and
// the lines its report adds to the node's result (the average's accuracy). Its registry entry
// (modes/registry.cc) builds it.
#pragma once

#include <memory>

#include "consensus/consensus_peer.h"
#include "run/training_session.h"

namespace chorus::consensus {

// The ConsensusPeer of `job` on `node` (installs its handlers: call before the node listens).
// Its run throws when this node's model never reached node 0's average (a failed run, exit 1).
// Throws std::invalid_argument for bad options.
std::unique_ptr<run::TrainingRun> makeConsensusRun(node::Node& node, run::NodeJob job,
                                                   const PeerLayout& layout,
                                                   const ConsensusOptions& options);

}  // namespace chorus::consensus
