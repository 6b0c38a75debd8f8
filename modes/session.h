// What a mode's registry entry builds: a session on a started node, and the typed settings and
// context it is built from. It lives in modes/ (not cli/) so that an entry can name its factory:
// modes/ sits below cli/ and cannot see NodeArgs; the CLI fills ModeSettings from NodeArgs once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "consensus/consensus_peer.h"
#include "node/node.h"
#include "ping/ping_exchange.h"
#include "ps/ps_peer.h"
#include "topology/topology.h"

namespace chorus::modes {

// The settings of a mode that travel typed from the flags (or a run spec) to its entry.
struct ModeSettings {
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
