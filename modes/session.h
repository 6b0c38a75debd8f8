// What a mode's registry entry builds: a session on a started node (a mode that does not train),
// or a training plan in two steps (a mode that trains), and the typed settings and context they
// are built from. It lives in modes/ (not cli/) so that an entry can name its factories: modes/
// sits below cli/ and cannot see NodeArgs; the CLI fills ModeSettings from NodeArgs once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "consensus/consensus_peer.h"
#include "node/node.h"
#include "ping/ping_exchange.h"
#include "ps/ps_peer.h"
#include "run/training_run.h"
#include "run/training_session.h"
#include "topology/topology.h"

namespace chorus::modes {

// The settings of a mode that travel typed from the flags (or a run spec) to its entry.
struct ModeSettings {
  run::RunOptions run;  // what every training mode trains with
  ping::PingOptions ping;
  consensus::ConsensusOptions consensus;  // with the shared --staleness in place
  ps::PsOptions ps;                       // with the shared --staleness and --rejoin in place
  size_t max_frame_bytes = 0;             // the runtime's frame limit (--max-frame-mib)
};

// Where a session runs: the node (not yet listening), its topology, its own entry and the ids
// of the peers it connects to. Everything referenced outlives the session.
struct SessionContext {
  node::Node& node;
  const topology::Topology& topology;
  const topology::NodeSpec& self;
  std::vector<node::NodeId> peers;
};

// A mode's run on a started node, as `chorus node` drives it: built before the node listens
// (its handlers in place), run on the caller's thread once every peer is connected, stopped
// from any thread (a signal).
class Session {
 public:
  virtual ~Session() = default;
  // The line the node prints once its `peers` are connected, `ready_ms` after it started.
  virtual std::string connectedLine(int64_t ready_ms) const = 0;
  // Runs the mode and prints its outcome. Throws SessionFailure for a failure with the mode's
  // own exit status; any other exception ends the node with status 1.
  virtual void run() = 0;
  // Any thread: ends run() early.
  virtual void stop() = 0;
};

// Where a training mode's plan is made: the topology and this node's entry in it (both outlive
// the plan), and the settings.
struct TrainingContext {
  const topology::Topology& topology;
  const topology::NodeSpec& self;
  const ModeSettings& settings;
};

// A training mode's plan for this node, step 1 of its factory, made before the node exists
// (the node's data is loaded by then: once the node listens its peers may send models or
// requests). Step 2, `start`, builds the run on the node before it listens (its handlers in
// place); the CLI calls it once.
struct TrainingPlan {
  std::vector<node::NodeId> peers;  // whom this node connects to (neighbors, everyone, nobody)
  std::string doing;                // the end of the connected line: "training with neighbors [1]"
  std::string model_spec;           // the model's spec, for --save's checkpoint
  std::function<std::unique_ptr<run::TrainingRun>(node::Node&)> start;
};

// This node's job of an image (dense) model among the topology's nodes, for a dense plan's step
// 1: its shard only (run::loadNodeProcessJob), with its own straggler attribute. Its errors are
// loadNodeProcessJob()'s: kInvalidArgument for unusable options (exit 2), kIo for unreadable data.
node::Result<run::NodeJob> loadDenseJob(const TrainingContext& context);

// How a mode trains the sparse models (complex, distmult, mf). Their data and sessions live in
// cli/sparse_node.cc (they read the sparse flags, which modes/ cannot see), so the entry names
// the session cli/sparse_node.cc's sparseSession() builds; kNone refuses the sparse models (exit
// 2, naming the modes that train them). A mode that gains sparse models adds its value here and
// its case there.
enum class SparseTraining { kNone, kPs, kConsensus };

// A session's failure with its mode's exit status (docs/errors.md).
class SessionFailure : public std::runtime_error {
 public:
  SessionFailure(int exit_code, const std::string& message)
      : std::runtime_error(message), exit_code_(exit_code) {}
  int exitCode() const { return exit_code_; }

 private:
  int exit_code_;
};

}  // namespace chorus::modes
