// The `chorus` command line: each command family registers itself on the root CLI11 app.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/run_spec.h"
#include "faults/link_delay.h"
#include "node/node.h"
#include "topology/topology.h"

namespace CLI {
class App;
}

namespace chorus::cli {

// Thrown by a command to end the program with a status. main() prints the message (when not
// empty) as "chorus: error: <message>" and exits with `code`.
class CommandFailure : public std::runtime_error {
 public:
  CommandFailure(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// The exit status of a failed error value (docs/errors.md, "Command line"): 2 for bad input
// refused before anything starts (kInvalidArgument), 1 for a run that failed on something
// outside the command line (a data file or checkpoint that cannot be used: kIo, and the rest).
inline int exitStatusOf(const node::Status& error) {
  return error.code() == node::ErrorCode::kInvalidArgument ? 2 : 1;
}

// `chorus topo gen|check`
void addTopoCommands(CLI::App& app);
// `chorus node`: one node of a topology file
void addNodeCommands(CLI::App& app);
// `chorus launch`: every node of a topology file as child processes of this one
void addLaunchCommand(CLI::App& app);
// Parses `chorus node --topology <topology> <node_args>` once into NodeArgs (id unset) and runs,
// for each of `ids`, what the node checks before it reads data or binds a port: throws
// CommandFailure(2, ...) naming the bad flag. So that `chorus launch` refuses a bad node option
// once, instead of every node failing with it, and hands its nodes the typed result (a run
// spec). `given`, when not null, receives the flags that were on the command line.
NodeArgs parseNodeArguments(const std::string& topology, const std::vector<uint32_t>& ids,
                            const std::vector<std::string>& node_args,
                            std::vector<std::string>* given = nullptr);
// The link faults of one node, as its flags and its topology entry give them.
struct LinkFaults {
  faults::LinkDelay delay;  // --link-delay plus the node's link_delay attribute
  faults::LinkLoss loss;    // --link-loss
  // Sets the runtime's link_delay, link_jitter, link_loss and link_rto.
  void applyTo(node::NodeOptions& options) const;
};
// The link faults of `node`: --link-delay `delay_flag` (may be empty) plus the node's own
// link_delay attribute from `topology_path`, and --link-loss `loss_flag`; refused when a
// heartbeat held back as long as they can hold a frame could come later than the peer time-out
// (the peer would be called down). Throws CommandFailure(2, ...) naming where the faults came
// from, `time_out_name` (what sets the time-out) and `remedy` (what to change). Used by
// `chorus node` and `chorus compare`.
LinkFaults nodeLinkFaults(const faults::LinkDelay& delay_flag, const faults::LinkLoss& loss_flag,
                          const topology::NodeSpec& node, const std::string& topology_path,
                          std::chrono::milliseconds heartbeat,
                          std::chrono::milliseconds peer_timeout, const std::string& time_out_name,
                          const std::string& remedy);
// Refuses (CommandFailure 2) a --stragglers profile whose slow or crash terms name a node that
// `topo` does not have: such a term would silently never act.
void checkStragglersNameMembers(const faults::StragglerProfile& stragglers,
                                const topology::Topology& topo, const std::string& topology_path);
// `chorus train` (single node)
void addTrainCommand(CLI::App& app);
// `chorus compare`: runs training variants on the same work and reports them side by side
void addCompareCommand(CLI::App& app);
// `chorus report`: rebuilds the table and plots of a compare or launch folder
void addReportCommand(CLI::App& app);

}  // namespace chorus::cli
