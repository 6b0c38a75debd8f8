// What the two halves of `chorus node` share: node_flags.cc registers the command and turns
// flags or a run spec into NodeArgs once; node_cmd.cc runs a node from NodeArgs (the session).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "cli/run_spec.h"

namespace CLI {
class App;
}

namespace chorus::cli {

// Registers `chorus node` on `app`; `action` runs with the settings, from the flags or from
// --spec FILE (with the id of --id), parsed once.
void registerNodeCommand(CLI::App& app, std::function<void(const NodeArgs&)> action);
// Runs one node to the end (node_cmd.cc): throws CommandFailure with its exit status.
void runNode(const NodeArgs& args);
// `chorus launch`'s check, for each of `ids`: everything runNode does before it reads data,
// binds a port or starts a thread, and nothing after (node_cmd.cc).
void checkNodes(NodeArgs args, const std::vector<uint32_t>& ids);

}  // namespace chorus::cli
