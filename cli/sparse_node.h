// `chorus node` and `chorus launch` for the sparse models (--model complex | distmult | mf): the
// sparse flags of `chorus train`, their checks for a cluster, the node's data and workload, and
// its sparse PS session (ps::SparsePsPeer). node_cmd.cc routes sparse models here and keeps the
// node's lifecycle (signals, listen, connect, leave) for every model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cli/train_sparse.h"
#include "consensus/consensus_peer.h"
#include "consensus/sparse_consensus_peer.h"
#include "modes/registry.h"
#include "ps/ps_peer.h"
#include "ps/sparse_row_access.h"
#include "run/training_run.h"
#include "sampling/sample_scheme.h"

namespace CLI {
class App;
}
namespace chorus::node {
class Node;
}

namespace chorus::cli {

// A training run on a started node, as `chorus node` drives it: built once the node exists
// (its handlers in place before the node listens), run on the trainer thread, stopped from any
// thread (a signal).
class NodeSession {
 public:
  virtual ~NodeSession() = default;
  // Trainer thread: trains, then prints this node's results.
  virtual void run() = 0;
  // Any thread: ends run() early.
  virtual void stop() = 0;
};

// The sparse flags of a node, and which of every flag were given (sparse models take their own
// defaults for --batch, --lr and --eval-every, and refuse the flags that do not apply).
// --technique auto's replicas' memory cap per node without --replica-bytes: a bound on memory,
// not a hot-set size (the rule chooses the keys; on WN18RR it takes well under 1 MiB).
inline constexpr uint64_t kAutoReplicaBytes = uint64_t{64} << 20;

struct SparseNodeArgs {
  SparseFlags flags;
  int64_t logEvery = 100;  // --log-every: a "step" metrics event every N clocks
  // --sample-scheme and --sample-reuse (KGE in PS mode; docs/sampling.md): empty and 0 when not
  // given (the workload draws its negatives, i.i.d. per step: what naive does).
  std::string sampleScheme;
  int64_t sampleReuse = 0;
  // --technique (PS mode): how the rows are managed: "auto" (each key's technique from what the
  // workers will access; ps/technique_choice.h), "classic" (at their homes), "lapse" (relocated
  // to where they are used; docs/sparse-ps.md) or "nups" (hot keys replicated, the others
  // relocated; docs/ps-replication.md).
  std::string technique = "auto";
  // --mf-schedule (PS mode, --model mf): "data-parallel" (every worker its shard, SSP),
  // "rotation" (Orion's block schedule: one row block per worker, the column blocks rotate and
  // are handed from neighbour to neighbour; docs/orion.md) or "rotation-barrier" (the same with
  // an all-worker barrier at every sub-epoch, to measure the hand-off against).
  std::string mfSchedule = "data-parallel";
  // --technique nups: --replicate N (the N most accessed keys; -1: not given, the hot set is what
  // fits --replica-bytes), --replica-bytes and --replica-syncs-per-s; auto: the last two (its
  // replicas' memory cap, kAutoReplicaBytes when not given, and the sync rate).
  int64_t replicate = -1;
  uint64_t replicaBytes = uint64_t{1} << 20;
  double replicaSyncsPerSecond = 25;
  // Consensus mode: --cold-every, --round-bytes, --hot-bytes, --relay-hops, --dense-exchange
  // (docs/sparse-consensus.md).
  consensus::SparseGossipFlags gossip;
  std::set<std::string> given;  // "--batch", ... as given on the command line
};

// complex, distmult and mf.
bool isSparseModel(const std::string& model);
// Registers the sparse flags on `node` (its own --eval-every serves them too).
void addSparseNodeOptions(CLI::App& node, SparseNodeArgs& args);
// An image model's --data is an image data set (CommandFailure 2 otherwise).
void checkImageData(const run::RunOptions& run);
// An image model refuses the sparse models' sampling flags (CommandFailure 2).
void checkImageModelFlags(const run::RunOptions& run, const SparseNodeArgs& sparse);
// The sample scheme of --sample-scheme / --sample-reuse, nullopt when neither was given.
// CommandFailure 2 for a bad value or combination.
std::optional<sampling::SampleSchemeOptions> sampleSchemeOf(const SparseNodeArgs& sparse);
// The technique of --technique. CommandFailure 2 for an unknown one, or one not built yet.
ps::SparseTechnique techniqueOf(const SparseNodeArgs& sparse);
// --technique nups's hot-set and sync settings (--replicate, --replica-bytes,
// --replica-syncs-per-s), without the expected accesses (the data's, filled in by the session);
// auto's memory cap (--replica-bytes, kAutoReplicaBytes when not given) and sync rate.
ps::ReplicationOptions replicationOf(const SparseNodeArgs& sparse);
// After parsing: records which of `node`'s flags were given.
void recordGivenFlags(const CLI::App& node, SparseNodeArgs& args);

// Every check of a sparse model's flags that needs no data and no port (CommandFailure 2): the
// flags that do not apply to the mode (one whose registry entry trains sparse models), the data
// set's name, the model's and the mode's options. `chorus launch` runs it once before any node
// starts.
void checkSparseNodeArgs(const run::RunOptions& run, const SparseNodeArgs& sparse,
                         const ps::PsOptions& ps, const consensus::ConsensusOptions& consensus,
                         const modes::Mode& mode);
// For `chorus launch`: the data set exists (a triple folder; a rating file was checked by its
// flag; generated ratings need nothing). CommandFailure 2 otherwise.
void checkSparseData(const run::RunOptions& run, const SparseNodeArgs& sparse);
// What every node of a sparse cluster must run alike, for the handshake's fingerprint.
std::vector<std::pair<std::string, std::string>> sparseFingerprint(const run::RunOptions& run,
                                                                   const SparseNodeArgs& sparse);

// This node's data and workload (the seed's model, as on every node) and its shard.
struct SparseNodeJob;
// Reads or generates the data (CommandFailure 1 for unreadable data, 2 for bad options) and
// builds the workload and node `self`'s shard among `members`.
std::shared_ptr<SparseNodeJob> loadSparseNodeJob(const run::RunOptions& run,
                                                 const SparseNodeArgs& sparse, uint32_t self,
                                                 const std::vector<uint32_t>& members);
// A sparse model's plan for this node, as modes::TrainingPlan is an image model's: step 1 (the
// data, loaded by planSparseTraining) before the node exists, step 2 (`start`) on the node
// before it listens.
struct SparsePlan {
  std::vector<node::NodeId> peers;  // whom this node connects to
  std::string doing;                // the end of the connected line
  std::function<std::unique_ptr<NodeSession>(node::Node&)> start;
};
// The plan of the sparse session `mode`'s entry names (its `sparse`; not kNone, which
// checkSparseNodeArgs refused): loads the node's data and workload (CommandFailure 1 for
// unreadable data, 2 for bad options). The one dispatch of sparse models by mode.
SparsePlan planSparseTraining(const modes::Mode& mode, const modes::TrainingContext& context,
                              const SparseNodeArgs& sparse);
// The sparse PS session of `job` on `node` (installs the PS handlers). `members`: every id.
std::unique_ptr<NodeSession> sparsePsSession(node::Node& node, std::shared_ptr<SparseNodeJob> job,
                                             const std::vector<uint32_t>& members,
                                             const ps::PsOptions& ps);

// The sparse consensus session of `job` on `node` (installs the consensus handlers): gossip
// with `layout`'s neighbors per `consensus` (--backup, --mixing, --staleness, --chunk-floats)
// and `sparse`'s gossip flags; the hot rows from the data's expected accesses.
std::unique_ptr<NodeSession> sparseConsensusSession(node::Node& node,
                                                    std::shared_ptr<SparseNodeJob> job,
                                                    const consensus::SparseLayout& layout,
                                                    const consensus::ConsensusOptions& consensus,
                                                    const SparseNodeArgs& sparse);

}  // namespace chorus::cli
