// Whole-cluster checkpoints (docs/checkpoints.md): every node writes its part of a cut, the
// state it holds after the cut's step, to DIR/cut-<step>/node-<id>.ckpt; a cluster restarts
// (--resume DIR) from the newest cut that every node finished. This file holds the node
// checkpoint's format (versioned, checksummed, written atomically), the cut folder's layout,
// the choice of the cut to resume from and the flags. What a mode puts in its part lives with
// the mode (consensus/consensus_peer.cc, ps/ps_peer.cc). No networking.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "run/cut_plan.h"
#include "run/node_id.h"

namespace CLI {
class App;
}

namespace chorus::run {

struct NodeJob;
struct RunOptions;

// A node checkpoint that cannot be used: names the file, what is wrong and what to do. The
// commands exit 2 with it (a bad --resume folder is refused before anything starts).
class NodeCheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How many of its newest cuts a node keeps (older files of its own are removed): a cut the
// slowest node has not finished yet still has a complete one before it.
inline constexpr int64_t kKeptCuts = 3;

// The names of the arrays every mode writes.
inline constexpr std::string_view kOptimizerSection = "optimizer";
inline constexpr std::string_view kProgressSection = "progress";  // {cut, batches drawn}

// XXH3-64 of the model's spec and parameter count: a checkpoint of another model (other
// --model, --hidden, --data) is refused by it.
uint64_t modelFingerprint(std::string_view model_spec, size_t parameters);

// The checkpoint as bytes (header, arrays, XXH3-64 over everything before it).
std::string encodeNodeCheckpoint(const NodeCheckpoint& checkpoint);
// The checkpoint in `bytes`, read from `path` (named in errors): magic, version (a newer one is
// refused), the length the header states (shorter: truncated), the checksum, then every field
// and array within bounds. Throws NodeCheckpointError.
NodeCheckpoint decodeNodeCheckpoint(std::string_view bytes, const std::string& path);
// Reads and decodes the file at `path` (a regular file). Throws NodeCheckpointError.
NodeCheckpoint loadNodeCheckpoint(const std::string& path);
// Only the header of the file at `path` (its length checked, the checksum not: the node that
// owns the file checks it), for the other nodes' files of a cut. Throws NodeCheckpointError.
NodeCheckpointHeader readNodeCheckpointHeader(const std::string& path);

// DIR/cut-<cut> and DIR/cut-<cut>/node-<node>.ckpt.
std::string cutFolder(const std::string& dir, int64_t cut);
std::string nodeCheckpointPath(const std::string& dir, int64_t cut, NodeId node);

// Writes `checkpoint` as its node's file of its cut under `dir` (atomically: temporary file,
// fsync, rename, fsync of the folder), then removes this node's files of cuts older than the
// kKeptCuts newest (`every` steps apart). Returns the path. Throws NodeCheckpointError.
std::string writeNodeCheckpoint(const std::string& dir, const NodeCheckpoint& checkpoint,
                                int64_t every);

// The cut a cluster of `nodes` nodes resumes from: the newest cut folder of `dir` that holds
// every node's file. Newer cuts that some node did not finish are skipped, each with a line in
// `skipped` naming it and the nodes missing. Throws NodeCheckpointError when `dir` holds no
// complete cut (naming the cuts it found).
struct CutChoice {
  int64_t cut = 0;
  std::vector<std::string> skipped;
};
CutChoice chooseResumeCut(const std::string& dir, uint32_t nodes);

// What a node checks a checkpoint's header against; `path` is named in errors. Throws
// NodeCheckpointError for another cluster, node, cluster size, mode, model, cut or seed, or a
// newer format.
void checkHeader(const NodeCheckpointHeader& got, const NodeCheckpointHeader& expected,
                 const std::string& path);

// Registers --checkpoint-every and --checkpoint-dir on `cmd` (chorus node, and launch through
// it).
void addCheckpointOptions(CLI::App& cmd, RunOptions& options);
// The folder checkpoints go to: --checkpoint-dir, else DIR/checkpoints under --out; empty when
// --checkpoint-every is 0. Throws std::invalid_argument naming the flags when --checkpoint-every
// is given without either folder.
std::string checkpointDir(const RunOptions& options);
// Throws std::invalid_argument naming the flags: --checkpoint-every without a folder, or
// --resume DIR with --rejoin (one node restarting into a running job).
void validateCheckpointOptions(const RunOptions& options, bool rejoin);
// Whether --resume names a folder (a whole-cluster resume) rather than a --save file.
bool resumesCluster(const RunOptions& options);

// Fills `plan` for the node `header` names (its cluster, node, nodes, mode, model, fingerprint
// and seed; its cut is ignored) in a run of `rounds` steps: the folder and period of its
// checkpoints, and with --resume DIR the cut to resume from (the newest complete one; every newer
// one skipped is named in plan.skipped) with this node's file of it loaded and checked (its header,
// its progress record and the other nodes' headers: same cluster, cut and model). What the arrays
// mean is the caller's to check. Throws NodeCheckpointError (exit 2). prepareCuts() and the sparse
// models' sessions (cli/sparse_node.cc) use it.
void planCuts(CutPlan& plan, const RunOptions& options, const NodeCheckpointHeader& header,
              int64_t rounds);

// Fills job.cuts for a node of `cluster` (of job.node_id among `nodes`) in `mode`: the folder
// and period of its checkpoints, and with --resume DIR the cut to resume from (the newest
// complete one; every newer one skipped is named in job.cuts.skipped) with this node's file of it
// loaded and checked (its header and the other nodes' headers: same cluster, cut and model), the
// model's parameters set from it when it holds them ("params"). Throws NodeCheckpointError (exit
// 2).
void prepareCuts(NodeJob& job, const RunOptions& options, const std::string& cluster,
                 std::string_view mode, uint32_t nodes);

}  // namespace chorus::run
