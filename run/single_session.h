// The mode with no peers as a training run on a node: a cluster of one node (the single variant
// of chorus compare) trains alone, the run of `chorus train`, with nothing to exchange.
#pragma once

#include <memory>

#include "run/training_run.h"
#include "run/training_session.h"

namespace spdlog {
class logger;
}

namespace chorus::run {

// `job` trained alone (run/single_node.h) with `options`' --save and --warmup-epochs, its
// progress lines on `log` (the node's log, as the distributed modes' are). A --resume job
// starts from the checkpoint's model at step 0, as every other mode's node does. `log` outlives
// the run.
std::unique_ptr<TrainingRun> makeSingleRun(NodeJob job, const RunOptions& options,
                                           spdlog::logger& log);

}  // namespace chorus::run
