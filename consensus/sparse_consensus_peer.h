// Consensus mode for sparse models over the peer runtime (docs/sparse-consensus.md): every node
// keeps a whole replica of a sparse workload's tables (knowledge-graph embeddings, matrix
// factorization) and takes local steps on its shard of the training points; each round it sends
// each neighbor the rows that changed since they last went there (consensus/sparse_gossip.h
// decides which) and mixes the rows its neighbors sent, row by row. The round board and the
// backup rules are dense consensus's (consensus/round_board.h, consensus/backup_rule.h): a
// neighbor's round-k "model" is its complete round-k RowShare, however few rows it holds.
// Loop thread: RowShare parts -> assembled shares -> the inbox and the board; peer events ->
// the board's wait set. Trainer thread: the rounds, node 0's evaluations, the end of the run.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "consensus/backup_rule.h"
#include "consensus/consensus_service.h"
#include "consensus/membership_messages.h"
#include "consensus/mixing.h"
#include "consensus/round_board.h"
#include "consensus/sparse_gossip.h"
#include "ml/sparse_train.h"
#include "node/repeated_log.h"
#include "run/cut_plan.h"
#include "run/membership.h"
#include "run/staleness_bound.h"

namespace CLI {
class App;
}
namespace chorus::node {
class Node;
struct PeerEvent;
}  // namespace chorus::node

namespace chorus::consensus {

// The sparse gossip flags (--cold-every, --round-bytes, --hot-bytes, --relay-hops,
// --dense-exchange), as chorus node takes them.
struct SparseGossipFlags {
  int64_t cold_every = 8;
  uint64_t round_bytes = 0;
  uint64_t hot_bytes = 256 * 1024;  // per table: the hot rows' budget (chooseHotSet)
  int64_t relay_hops = 0;           // 0: the diameter of the topology
  bool dense_exchange = false;
};

// Registers the flags of `flags` on `cmd` (chorus node; launch and compare pass them on).
void addSparseGossipOptions(CLI::App& cmd, SparseGossipFlags& flags);
// Throws std::invalid_argument naming the flag for a value out of range.
void validateSparseGossipFlags(const SparseGossipFlags& flags);

struct SparseConsensusOptions {
  // --backup, --mixing, --staleness as dense consensus takes them (consensus_peer.h).
  BackupRuleSpec backup;
  std::string mixing = "uniform";
  run::StalenessBound staleness = run::kDefaultStaleness;
  // Row values per RowShare frame: a share travels in parts of at most this many floats (and
  // at least one row).
  size_t chunk_floats = 256 * 1024;
  SparseGossipFlags gossip;
  // Per table, its hot keys (sampling/access_stats.h's chooseHotSet over the workload's
  // expected accesses; the CLI computes them from the data, the same on every node).
  std::vector<std::vector<RowKey>> hot;
  // The training settings of the single-node run: epochs, batch, optimizer, seed, evaluation
  // and log intervals, metrics file, the start event's fields. keepBest, timeLimitSeconds,
  // savePath and resumePath are not supported.
  ml::SparseTrainOptions train;
  size_t lag_window = 32;
  std::chrono::milliseconds stall_timeout{10000};
  std::chrono::milliseconds round_timeout{300000};
  std::chrono::milliseconds report_every{5000};
  std::chrono::milliseconds finish_timeout{120000};
  // --rejoin: a restarted node first asks a live neighbor for its whole tables (ModelRequest,
  // answered with a catch-up RowShare after the neighbor's current round) and runs the rounds
  // after that neighbor's; catchup_timeout per neighbor asked.
  bool rejoin = false;
  std::chrono::milliseconds catchup_timeout{30000};
  // Whole-cluster checkpoints (--checkpoint-every N epochs, --checkpoint-dir, --resume DIR;
  // docs/checkpoints.md, "Sparse runs"): where the cuts go, every how many epochs, and the cut
  // this node resumes from (run::planCuts). A cut is an epoch's end: the tables after its last
  // round's mixing, their optimizer state and the gossip's send state. Not with rejoin.
  run::CutPlan cuts;
  // Tests: called on the trainer thread after each round's mixing step.
  std::function<void(Round)> on_round_end;
  // Tests, --rejoin: called on the trainer thread once the node took a neighbor's tables and
  // optimizer state, with the first round it runs.
  std::function<void(Round)> on_caught_up;
};

// Throws std::invalid_argument naming the flag for an option sparse consensus cannot use.
void validateSparseConsensusOptions(const SparseConsensusOptions& options);

// Who this node gossips with, and the graph (Metropolis degrees, the default relay hops).
struct SparseLayout {
  NodeId self = 0;
  std::vector<NodeId> neighbors;
  std::vector<NodeId> members;                  // every id, self included
  std::map<NodeId, size_t> degrees;             // every member's topology degree
  std::map<NodeId, std::vector<NodeId>> graph;  // empty: a complete graph of members
};

// The longest shortest path of `graph` (0 for one node; the member count when it is not
// connected, so that a relay reaches what it can).
int graphDiameter(const std::map<NodeId, std::vector<NodeId>>& graph);

struct SparseConsensusReport {
  bool stopped = false;
  int64_t epochs_done = 0;
  int64_t rounds_done = 0;
  int64_t first_round = 0;  // 0, or where a rejoining node took up the rounds
  int64_t rounds_per_epoch = 0;
  double train_seconds = 0;  // the rounds (node 0's evaluations not counted)
  double wait_seconds = 0;   // of which in the round board's gather
  double points_per_second = 0;
  std::vector<double> epoch_losses;
  // Node 0: every split's metrics of its replica after the last round (evalSplits order).
  std::vector<std::pair<std::string, std::vector<ml::NamedMetric>>> final;
  // Every node: its own replica's metrics on the final split (evalSplits().back()) after the
  // last round (node 0: final's last entry). Empty when stopped.
  std::vector<ml::NamedMetric> replica;
  size_t parameters = 0;
  std::string spec;
  uint64_t rows_sent = 0;    // over every round and neighbor
  uint64_t share_bytes = 0;  // the rows' payload (key, hop count, values) of those
  uint64_t rows_mixed = 0;
  uint64_t bytes_out = 0;  // the runtime's counters, all peers
  uint64_t bytes_in = 0;
  uint64_t shares_refused = 0;  // RowShare frames from peers refused (logged per peer)
  uint64_t parts_lost = 0;      // RowShare parts of this node's that were not sent
  int64_t max_staleness = 0;
  std::vector<uint32_t> finished_peers;
  std::vector<uint32_t> departed_peers;
};

class SparseConsensusPeer {
 public:
  // Installs the RowShare / TrainingDone handlers and the event handler on `node` (shut it
  // down before destroying this). `workload`: this node's replica, initialized alike on every
  // node (same seed). `shard`: its training points. Throws std::invalid_argument for bad
  // options.
  SparseConsensusPeer(node::Node& node, ml::SparseWorkload& workload, std::vector<size_t> shard,
                      SparseLayout layout, SparseConsensusOptions options);
  SparseConsensusPeer(const SparseConsensusPeer&) = delete;
  SparseConsensusPeer& operator=(const SparseConsensusPeer&) = delete;

  // Trainer thread: every round, node 0's evaluations, the end-of-run barrier. Throws
  // std::runtime_error for a diverged run or an unwritable metrics file.
  SparseConsensusReport run();
  // Any thread: the rounds and the barrier end at once.
  void stop();
  // The relay limit in use (--relay-hops, or the graph's diameter).
  int relayHops() const { return relay_hops_; }
  // Trainer thread (or after run()): table t's optimizer state (AdaGrad's sums; empty for SGD).
  std::span<const float> optimizerState(size_t table) const { return optimizers_[table].state(); }

 private:
  // A neighbor's share being assembled from its parts (loop thread).
  struct Partial {
    Round round = -1;
    uint32_t parts = 0;
    uint32_t next = 0;
    RowShare share;
    size_t rows = 0;
  };

  void onRowShare(NodeId from, const node::InboundFrame& frame);
  void onPeerEvent(const node::PeerEvent& event);
  // Loop thread: why a part cannot be taken (nullopt: it was).
  std::optional<std::string> takePart(NodeId from, const wire::RowShare& part);
  // Loop thread: adds `part` to `p` (a new round starts a new share) once it passed
  // checkRowSharePart against `shapes` and the share stays within `max_rows`; sets `complete`
  // when it was the last part. Why not, when it cannot be taken (nothing of it is then kept).
  std::optional<std::string> assemble(Partial& p, NodeId from, const wire::RowShare& part,
                                      std::span<const GossipTableShape> shapes, size_t max_rows,
                                      std::shared_ptr<RowShare>* complete);
  // Loop thread: a part of the catch-up share this (rejoining) node asked for.
  std::optional<std::string> takeCatchupPart(NodeId from, const wire::RowShare& part);
  // Trainer thread: `share` to `to` in parts of at most chunk_floats values.
  void sendShare(NodeId to, const RowShare& share, size_t backups, bool catchup = false);
  // Trainer thread: every row of every table, then every row of each table's optimizer state
  // (AdaGrad's sums, as tables T, T+1, ...: catchup_shapes_), as a share of round `round`.
  RowShare catchupShare(Round round) const;
  // Trainer thread: answers the pending ModelRequests with the tables as of `round`.
  void answerRequests(Round round);
  // Trainer thread, --rejoin: takes a live neighbor's tables; returns the first round to run.
  // Throws std::runtime_error when no neighbor answers.
  Round catchUp();
  // Trainer thread: the merged unmixed shares of `from` up to round `round`.
  std::optional<RowShare> takeInbox(NodeId from, Round round);
  bool isNeighbor(NodeId id) const;
  // Trainer thread, after the last round of epoch `cut`-1 (`next_round` is the next one): writes
  // this node's part of cut `cut` (sparse_consensus_cut.cc).
  void writeCut(int64_t cut, Round next_round);
  // Trainer thread, before the first round: sets the tables, the optimizer state and the
  // gossip's send state from the resumed cut; returns the first round to run. Throws
  // run::NodeCheckpointError naming the file.
  Round restoreCut();
  // Node 0's evaluation of its replica on `split`.
  std::vector<ml::NamedMetric> evaluate(const std::string& split);

  node::Node& node_;
  ml::SparseWorkload& workload_;
  std::vector<ml::SparseTable*> tables_;
  std::vector<GossipTableShape> shapes_;
  std::vector<size_t> shard_;
  SparseLayout layout_;
  SparseConsensusOptions options_;
  MixingKind mixing_;
  std::unique_ptr<BackupRule> rule_;
  RoundBoard board_;
  int relay_hops_ = 1;
  std::unique_ptr<SparseGossip> gossip_;
  int64_t rounds_per_epoch_ = 0;
  Round total_rounds_ = 0;
  size_t total_rows_ = 0;
  // The local optimizer of each table (trainer thread); its state travels to a rejoining node.
  std::vector<ml::SparseOptimizer> optimizers_;
  // A catch-up share's tables: the model's, then the state of each table whose optimizer has
  // state; catchup_rows_ their rows.
  std::vector<GossipTableShape> catchup_shapes_;
  size_t catchup_rows_ = 0;
  // Loop thread: the shares being assembled, and refusals.
  std::map<NodeId, Partial> partial_;
  std::map<NodeId, Round> last_complete_;
  node::RefusalLog refusals_;
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> parts_lost_{0};  // this node's parts the runtime did not send
  // Complete shares not mixed yet, per neighbor by round (written on the loop thread, taken on
  // the trainer thread).
  std::mutex inbox_mu_;
  std::map<NodeId, std::map<Round, std::shared_ptr<RowShare>>> inbox_;
  // --rejoin: the neighbor asked, the share being assembled (loop thread) and the complete one.
  std::mutex catchup_mu_;
  std::condition_variable catchup_cv_;
  std::optional<NodeId> catchup_from_;
  Partial catchup_partial_;
  std::shared_ptr<RowShare> catchup_;
  run::Membership membership_;
  // TrainingDone and ModelRequest (the neighbors that asked for this node's tables).
  MembershipMessages messages_;
};

}  // namespace chorus::consensus
