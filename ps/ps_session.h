// PS mode as a training run on a node (run/training_session.h): the PsPeer, and the lines its
// report adds to the node's result (a rejoin, the owners' accuracy, lost updates, failed
// reads). Its registry entry (modes/registry.cc) builds it.
#pragma once

#include <memory>
#include <vector>

#include "ps/ps_peer.h"
#include "run/training_session.h"

namespace chorus::ps {

// The PsPeer of `job` on `node` among `members` (every id): installs its handlers, so call it
// before the node listens. Throws std::invalid_argument for bad options.
std::unique_ptr<run::TrainingRun> makePsRun(node::Node& node, run::NodeJob job,
                                            std::vector<NodeId> members, const PsOptions& options);

}  // namespace chorus::ps
