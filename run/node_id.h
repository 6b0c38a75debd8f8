// The node id as run/ names it: node::NodeId, defined once in node/protocol.h (header only,
// through chorus_node_limits: run/ does not link the runtime).
#pragma once

#include "node/protocol.h"

namespace chorus::run {

using NodeId = node::NodeId;

}  // namespace chorus::run
