// The typed settings of one `chorus node` process (NodeArgs), filled once from flags at the
// edge, and the run spec file that carries them to child processes: `chorus launch` and
// `chorus compare` parse and check the flags once, write one spec per run (FlatBuffers,
// cli/run_spec.fbs) and start every node with `chorus node --spec FILE --id N`, so that no child
// parses argv again. `chorus node` with flags (nodes started by hand) builds the same NodeArgs.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cli/sparse_node.h"
#include "consensus/consensus_peer.h"
#include "faults/link_delay.h"
#include "faults/straggler.h"
#include "node/result.h"
#include "ps/ps_peer.h"
#include "run/staleness_bound.h"
#include "run/training_run.h"

namespace chorus::cli {

// Every setting of one node but its id (which each child gets on its own command line).
struct NodeArgs {
  std::string topology;
  std::optional<uint32_t> id;  // never in a spec
  std::string log_level = "info";
  // A person or a scheduler starting machines one by one needs minutes; chorus launch, which
  // starts every node at once, gives its nodes 60 s unless told otherwise.
  double ready_timeout_s = 300;
  uint32_t pings = 3;
  size_t payload_bytes = 1024;
  double ping_timeout_s = 30;
  double linger_s = 5;
  uint32_t heartbeat_ms = 500;
  uint32_t write_slice_packets = 2;
  uint32_t peer_timeout_ms = 5000;
  uint32_t max_frame_mib = 256;
  std::string secret_file;       // empty: no shared secret
  faults::LinkDelay link_delay;  // --link-delay, read where the flag is; empty: none
  faults::LinkLoss link_loss;    // --link-loss, the same
  std::string mode;              // ping | consensus | ps; empty: the topology's mode
  run::RunOptions run;
  // --staleness: one bound for both modes (psOptions() and consensusOptions() put it in place).
  run::StalenessBound staleness = run::kDefaultStaleness;
  // --rejoin: one flag for both modes (registered with consensus mode's options).
  consensus::ConsensusOptions consensus;
  ps::PsOptions ps;
  SparseNodeArgs sparse;  // --model complex | distmult | mf (cli/sparse_node.h)

  // The mode options as the modes take them, with the shared --staleness and --rejoin.
  ps::PsOptions psOptions() const;
  consensus::ConsensusOptions consensusOptions() const;
};

// The version written into every spec; a reader refuses another one (a spec written by another
// chorus build: run the launch again with this build).
// Version 4: the straggler profile, the backup rule and the link faults as typed tables.
inline constexpr uint32_t kRunSpecVersion = 4;

// `args` (its id left out) as a spec's bytes, of `version` (tests write others).
std::vector<uint8_t> encodeRunSpec(const NodeArgs& args, uint32_t version = kRunSpecVersion);
// The NodeArgs of spec `bytes` (id unset), or an error naming `source` and what to do: bytes
// that are not a spec (the FlatBuffers Verifier refuses them), a spec of another version, a spec
// without its sections, or a typed value out of its grammar's range (a damaged file).
node::Result<NodeArgs> decodeRunSpec(std::span<const uint8_t> bytes, const std::string& source);
// Writes encodeRunSpec(args) to `path` (replacing it); an error names the path.
node::Status writeRunSpec(const NodeArgs& args, const std::string& path);
// decodeRunSpec() of the file at `path`; an error names it.
node::Result<NodeArgs> readRunSpec(const std::string& path);

}  // namespace chorus::cli
