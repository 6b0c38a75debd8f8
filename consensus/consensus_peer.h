// Consensus mode over the peer runtime: the glue between node::Node (loop thread: ModelShare
// chunks -> ModelAssembler -> RoundBoard, peer events -> the board's wait set) and the trainer
// thread running the rounds (local step, straggler wait, broadcast, wait plan, gather, mix, log).
// The protocol, its options and its metrics are described in docs/consensus.md.
#pragma once

#include <spdlog/common.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "consensus/backup_rule.h"
#include "consensus/consensus_service.h"
#include "consensus/membership_messages.h"
#include "consensus/mixing.h"
#include "consensus/partial_sum.h"
#include "consensus/round_board.h"
#include "consensus/spanning_tree.h"
#include "node/refusal_log.h"
#include "node/send_policy.h"
#include "run/membership.h"
#include "run/staleness_bound.h"
#include "run/training_loop.h"
#include "run/training_run.h"

namespace CLI {
class App;
}
namespace chorus::node {
class Node;
struct PeerEvent;
}  // namespace chorus::node

namespace chorus::consensus {

// The protocol's knobs; tests shrink the timings.
struct ConsensusOptions {
  BackupRuleSpec backup;           // --backup, read where the flag is (default: dynamic)
  std::string mixing = "uniform";  // uniform | metropolis
  // tau (Hop's iteration gap), --staleness (registered with run::addStalenessOption, one flag
  // for both modes); finite, at most kMaxStaleness.
  run::StalenessBound staleness = run::kDefaultStaleness;
  size_t chunk_floats = 256 * 1024;
  size_t lag_window = 32;
  std::chrono::milliseconds stall_timeout{10000};
  std::chrono::milliseconds round_timeout{300000};
  std::chrono::milliseconds report_every{5000};
  // Longest the end-of-run barrier waits for the other nodes' TrainingDone (and final models).
  std::chrono::milliseconds finish_timeout{120000};
  // A restarted node: before its first round it asks a live neighbor for its current model
  // (ModelRequest), takes it and joins the rounds after that neighbor's last finished round.
  bool rejoin = false;
  // Iteration skipping (Hop): a node whose every live neighbor is at least skip_gap rounds
  // ahead of the round it is about to send (they are all waiting for it, or past it) mixes in
  // their newest models and continues at the lowest of their rounds, so that a persistently
  // slow node does not hold the cluster to its pace. 0: never skip. With tau = 0 no neighbor
  // can be ahead, so synchronous D-PSGD never skips.
  int64_t skip_gap = 1;
  // Longest a rejoining node waits for one neighbor's answer before it asks the next one.
  std::chrono::milliseconds catchup_timeout{30000};
  // Tests: called on the trainer thread when a round waits longer than report_every, with the
  // neighbors still missing (also logged as "waiting for node J").
  std::function<void(Round, const std::vector<NodeId>&)> on_waiting;
  // Tests: called on the trainer thread after each round's mixing step.
  std::function<void(Round)> on_round_end;
  // Tests: called on the loop thread when a partial sum of the final models has fully arrived,
  // with its sender and the node that summed it.
  std::function<void(NodeId from, NodeId owner)> on_partial_sum;
  // Tests: called on the trainer thread at the end of the run, just before this node first sends
  // its partial sum up the tree (node 0: before it averages).
  std::function<void()> before_partial_sum;
};

// The largest tau: a bound beyond any run's rounds.
inline constexpr int64_t kMaxStaleness = 1'000'000;

// The send policy of gossip (node/send_policy.h): chunk i of a round's model supersedes chunk i
// of older rounds still queued to a neighbor that cannot keep up (kinds kGossipChunkKind + i,
// modulo kGossipChunkKinds, apart from every body type), so the newest share gets through and a
// chunk never pushes out another chunk of its own model. Other shares (catch-up, partial sums)
// must all arrive and keep the refusing default.
inline constexpr uint32_t kGossipChunkKind = 1u << 20;
inline constexpr uint32_t kGossipChunkKinds = 1u << 20;
node::SendOptions gossipSendOptions(size_t chunk_index);

// Registers --backup, --mixing, --chunk-floats, --skip-gap and --rejoin (--staleness is both
// modes': run::addStalenessOption).
void addConsensusOptions(CLI::App& cmd, ConsensusOptions& options);
// Throws std::invalid_argument with the parsers' messages for a bad rule or mixing kind.
void validateConsensusOptions(const ConsensusOptions& options);
// Throws std::invalid_argument when a model chunk of `options` makes frames larger than
// `max_frame_bytes` (every node refuses those, so each round would close every connection).
void validateChunkFitsFrames(const ConsensusOptions& options, uint32_t max_frame_bytes);

// Who this node talks to: gossip with `neighbors` (from the topology); the end of the run with
// its neighbors and its links in the spanning tree of `graph` rooted at node 0 (the final
// models' convergecast), so that a node needs connections to its neighbors only.
struct PeerLayout {
  NodeId self = 0;
  std::vector<NodeId> neighbors;
  std::vector<NodeId> members;       // every id of the cluster, self included
  std::map<NodeId, size_t> degrees;  // every member's topology degree (Metropolis weights)
  // Every member's topology neighbors (the tree is computed from it). Empty: node 0 collects
  // every member's final model directly (a star, which needs a full mesh of connections).
  std::map<NodeId, std::vector<NodeId>> graph;
};

// What a run achieved: what every mode reports (run::LoopReport: stopped, seconds, wait time,
// final evaluation, time to target, who finished or left), and consensus mode's own.
struct ConsensusReport : run::LoopReport {
  int64_t first_round = 0;    // 0, or where a rejoining node took up the rounds
  int64_t rounds_done = 0;    // the last round finished + 1
  int64_t max_staleness = 0;  // of every neighbor model mixed in
  double final_loss = 0;      // of final (the final test evaluation)
  double final_accuracy = 0;
  // Node 0 only: the accuracy of the average of the final models that reached it over the
  // spanning tree (its own included), how many they were, and the average itself.
  std::optional<double> average_accuracy;
  size_t averaged_models = 0;
  std::vector<float> average_model;
  // The members whose final models are not in node 0's average (down, or cut off with their
  // subtree); known at node 0 and at every node the summary reached.
  std::vector<NodeId> missing_models;
  // Set when this node could not reach node 0 at the end of the run (every tree neighbor closer
  // to node 0 down; the graph split, or the node is stranded): why, naming the nodes down. Its
  // model (and its subtree's) is not in the average; `chorus node` exits 1 with this message.
  std::optional<std::string> cut_off;
  std::vector<float> final_model;
  std::vector<size_t> backups;  // b_i of every round run
  int64_t skips = 0;            // how often this node jumped ahead (iteration skipping)
  // Gossip chunks dropped from slow neighbors' queues for a newer round's (gossipSendOptions),
  // as the node counted them when the rounds ended.
  uint64_t shares_superseded = 0;
  int64_t skipped_rounds = 0;  // rounds it jumped over
};

// What peers' models hold in this node's memory (docs/consensus.md, "What a peer can make a
// node hold"); any thread.
struct HeldModels {
  uint64_t bytes = 0;       // partial and complete models of peers held now
  uint64_t peak_bytes = 0;  // the most held after any chunk
  uint64_t chunks = 0;      // ModelShare frames handled
  uint64_t refused = 0;     // of them refused (logged, rate-limited per peer)
};

// The rounds themselves run in run::runTrainingLoop; this class is its consensus strategy (send,
// gather, mix after the local step) and the end-of-run exchange.
class ConsensusPeer : private run::TrainingStrategy {
 public:
  // Installs the ModelShare / ModelRequest / TrainingDone handlers and the event handler on
  // `node`. The node must be shut down before this object is destroyed (the handlers point at
  // it). Throws std::invalid_argument for bad options.
  ConsensusPeer(node::Node& node, run::NodeJob job, PeerLayout layout, ConsensusOptions options);
  ConsensusPeer(const ConsensusPeer&) = delete;
  ConsensusPeer& operator=(const ConsensusPeer&) = delete;

  // Trainer thread: runs every round, then the end-of-run exchange (final model to node 0,
  // TrainingDone to everyone, wait for the others). Call once, after the cluster is ready.
  ConsensusReport run();
  // Any thread: the running round and the end-of-run wait return at once.
  void stop();
  // Any thread: what peers' models hold here.
  HeldModels held() const;

 private:
  // The trainer thread's state across rounds: the backup rule's estimates and what the round
  // just run mixed in (for its event and a divergence message).
  struct RoundState {
    Round first_round = 0;
    std::vector<float> previous_grad;
    double grad_norm_ema = 0, noise_ema = 0, compute_ema = 0;
    bool have_noise = false;
    // The dynamic rule's late credit: per backup worker, how much of a model still got mixed in
    // (late ones within tau, weighted 1 / (1 + staleness)); EMA, weight 0.1.
    double late_credit = 0;
    bool have_late_credit = false;
    // Per backup worker, its models mixed in anyway and their staleness sum (same EMA): the
    // dynamic rule's staleness cost of backups.
    double backup_used = 0, backup_staleness = 0;
    WaitPlan plan;
    int64_t skipped = 0;
    std::vector<NodeId> last_mixed;  // the nodes whose models were mixed in last
    size_t live_neighbors = 0;
    bool timed_out = false;
    double distance = 0, staleness_sum = 0;
    int64_t staleness_max = 0;
    uint64_t superseded_seen = 0, refused_seen = 0;  // the node's totals at the last round line
  };

  // run::TrainingStrategy: the consensus round around the local step.
  std::string_view mode() const override { return "consensus"; }
  std::string_view stepName() const override { return "round"; }
  void describe(ml::MetricsEvent& start) override;
  int64_t firstStep(ml::MetricsWriter& metrics) override;
  bool finished(int64_t step) const override;
  run::StepExchange beforeGradient(int64_t step) override;
  void afterGradient(int64_t step, const ml::Model& model,
                     std::span<const int32_t> labels) override;
  std::string divergence(double loss, int64_t step) const override;
  run::StepExchange exchange(int64_t& step, double compute_s) override;
  void describeStep(ml::MetricsEvent& event) override;
  void afterStep(int64_t step, double loss, const ml::Evaluation* evaluated) override;
  // Whole-cluster checkpoints: this node's model ("params") joins the loop's part, written now.
  void cutReached(run::NodeCheckpoint& part) override;
  run::Traffic traffic() const override;
  void ended(const run::LoopReport& report) override;
  // TrainingDone to the neighbors, the convergecast of the final models up the spanning tree
  // (node 0 evaluates their average), the summary down it, the wait for the neighbors.
  void finish(int64_t rounds_done, std::vector<uint32_t>& finished,
              std::vector<uint32_t>& departed) override;
  void describeEnd(ml::MetricsEvent& last) override;

  void onModelShare(NodeId from, const node::InboundFrame& frame);
  void onPeerEvent(const node::PeerEvent& event);
  void sendModel(const std::vector<NodeId>& to, Round round, size_t backups,
                 wire::SharePurpose purpose);
  // Trainer thread: `values` to `to` in ModelShare chunks of options_.chunk_floats (one empty
  // chunk for an empty model); `models` is set on partial sums only.
  void sendChunks(const std::vector<NodeId>& to, std::span<const float> values, Round round,
                  size_t backups, wire::SharePurpose purpose, std::span<const NodeId> models,
                  std::span<const float> low = {}, int64_t owner = -1);
  // Trainer thread: answers pending ModelRequests with the current model, as of `round`.
  void answerRequests(Round round);
  // Trainer thread: takes a neighbor's current model; returns the first round to run.
  Round catchUp();
  bool isNeighbor(NodeId id) const;
  // Loop thread: why a ModelShare cannot be taken (nullopt: it can), checked before any of its
  // values is copied: the sender's role for its purpose, the round, the values' finiteness.
  std::optional<std::string> refusalOf(NodeId from, const wire::ModelShare& share,
                                       spdlog::level::level_enum* level);
  // Loop thread: recounts what is held after a chunk or a departure.
  void countHeld();
  // Trainer thread, end of run: waits until `missing()` (called under the membership lock) is
  // empty, stop() or `deadline`, answering late catch-up requests meanwhile and naming what it
  // waits for every report_every; returns whether nothing is missing.
  bool waitEndOfRun(const std::function<std::vector<NodeId>()>& missing,
                    std::chrono::steady_clock::time_point deadline, Round last_round,
                    std::string_view what);
  // Sends the sum of final models `sum` naming `models` to `to` as PartialSum chunks (a
  // double-float pair per value); `owner` >= 0 makes it travel unmerged (docs/consensus.md).
  void sendPartialSum(NodeId to, Round rounds_done, std::span<const double> sum,
                      std::span<const NodeId> models, int64_t owner);
  // Sends TrainingDone {rounds_done, finished = summary, parent} to `to`.
  void sendTrainingDone(const std::vector<NodeId>& to, Round rounds_done,
                        const std::vector<NodeId>* summary, std::optional<NodeId> parent);
  // Under the membership lock: the tree neighbors this node knows are down.
  std::set<NodeId> downLocked() const;
  // The convergecast below node 0, after this node's own sum is made: sends it (and the sums it
  // relays) to its parent, re-attaching when the parent goes down, until the summary comes.
  // Returns the summary, or none (cut off, stopped, deadline).
  std::optional<std::vector<NodeId>> sendUpTheTree(Round rounds_done, const SumLedger& own,
                                                   std::set<NodeId>& handled,
                                                   std::chrono::steady_clock::time_point deadline);

  node::Node& node_;
  run::NodeJob job_;
  PeerLayout layout_;
  ConsensusOptions options_;
  MixingKind mixing_;
  std::unique_ptr<BackupRule> rule_;
  RoundBoard board_;
  // Loop-thread state.
  ModelAssembler gossip_;
  ModelAssembler finals_;
  ModelAssembler finals_low_;  // the low halves of partial sums, keyed like finals_
  ModelAssembler catchups_;
  node::RefusalLog refusals_;
  // The round the trainer is in (set before it sends that round's model): gossip of rounds
  // below it minus tau can no longer be mixed.
  std::atomic<Round> current_round_{0};
  std::atomic<uint64_t> held_bytes_{0};
  std::atomic<uint64_t> peak_held_bytes_{0};
  std::atomic<uint64_t> chunks_{0};
  std::atomic<uint64_t> refused_chunks_{0};
  // Who finished or left, and the end-of-run wait. Its lock also guards the state below.
  run::Membership membership_;
  // TrainingDone and ModelRequest (the neighbors waiting for a catch-up model).
  MembershipMessages messages_;
  // This node's links in the convergecast tree, and who it exchanges end-of-run messages with
  // (neighbors and tree links, sorted).
  TreeLinks tree_;
  std::vector<NodeId> end_peers_;
  // The graph the tree is drawn in (the topology, or a star around node 0 without one), its BFS
  // depths from node 0, and the neighbors that may name this node as their parent.
  std::map<NodeId, std::vector<NodeId>> tree_graph_;
  std::map<NodeId, int64_t> depths_;
  std::vector<NodeId> possible_children_;
  // A complete partial sum that arrived, keyed by the node that summed it (its owner).
  struct PartialSum {
    NodeId from = 0;     // who sent it here
    bool relay = false;  // it travels unmerged to node 0 (owner set on the wire)
    std::vector<double> values;
    std::vector<NodeId> models;  // sorted
  };
  std::map<NodeId, PartialSum> partial_sums_;
  // The models list (and owner) of the partial sum being assembled, per key.
  std::map<NodeId, std::pair<std::vector<NodeId>, bool>> partial_models_;
  // The parent each neighbor last named (TrainingDone.parent).
  std::map<NodeId, NodeId> named_parent_;
  // This node's parent now (set at the end of the run; the summary is taken from it only).
  std::optional<NodeId> parent_;
  // The summary from the parent: the members whose final models node 0 averaged.
  std::optional<std::vector<NodeId>> summary_;
  // The summary once this node sent it down: a child that re-attaches later gets it at once.
  std::optional<std::vector<NodeId>> summary_sent_;
  std::atomic<Round> rounds_done_{0};   // for that late summary (set by finish())
  std::optional<NodeId> catchup_from_;  // the neighbor asked for a catch-up model, while asked
  std::map<NodeId, ModelAssembler::Complete> catchup_models_;
  // Trainer thread, during run().
  RoundState rounds_;
  ConsensusReport report_;
};

}  // namespace chorus::consensus
