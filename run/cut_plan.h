// What a node's run carries of whole-cluster checkpoints (docs/checkpoints.md): the node
// checkpoint's header and contents, and the plan of the cuts it writes and resumes from. Only
// the types, so that run/training_run.h (included nearly everywhere) does not include the
// format, the flags and the readers of run/cluster_checkpoint.h, which changes more often.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "run/node_id.h"

namespace chorus::run {

// The format this build writes and the newest it reads.
inline constexpr uint32_t kNodeCheckpointVersion = 1;

// Who wrote a node checkpoint, for what, and when.
struct NodeCheckpointHeader {
  uint32_t version = kNodeCheckpointVersion;
  std::string cluster;  // the topology's [cluster] name
  NodeId node = 0;
  uint32_t nodes = 0;        // members of the cluster
  std::string mode;          // "consensus" or "ps"
  std::string model;         // ml::ModelSpec::toString()
  uint64_t fingerprint = 0;  // modelFingerprint(model, parameters)
  int64_t cut = 0;           // the cut's id: every node had finished steps 0 .. cut-1
  uint64_t seed = 0;         // the run's --seed
  bool operator==(const NodeCheckpointHeader&) const = default;
};

// A node's part of a cut: the header and named arrays, whose meaning the mode gives (both
// modes: "optimizer", the local optimizer's state; "progress", {cut, batches drawn}).
struct NodeCheckpoint {
  NodeCheckpointHeader header;
  std::map<std::string, std::vector<float>> floats;
  std::map<std::string, std::vector<uint64_t>> words;
};

// Whole-cluster checkpoints of one node's run: where, how often, and the cut it resumes from.
struct CutPlan {
  std::string dir;  // empty: no checkpoints written
  int64_t every = 0;
  NodeCheckpointHeader header;  // this node's (cut 0): what its files say and resumes check
  std::optional<NodeCheckpoint> resumed;  // --resume DIR: this node's part of the chosen cut
  std::string resumed_path;               // its file
  std::vector<std::string> skipped;       // the newer, incomplete cuts passed over (a line each)
  // A cut is taken after step cut-1 when cut is a positive multiple of `every` below `rounds`.
  bool cutAt(int64_t cut, int64_t rounds) const {
    return every > 0 && !dir.empty() && cut > 0 && cut % every == 0 && cut < rounds;
  }
};

}  // namespace chorus::run
