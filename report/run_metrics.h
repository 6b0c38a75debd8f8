// Reads the metrics folder of one run (DIR/node-<id>.jsonl, written by consensus or PS nodes;
// fields in docs/consensus.md "Metrics" and docs/compare.md) and condenses it into the numbers
// a comparison needs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace chorus::report {

// A folder or file that cannot be used for a report; the message names it and what to do.
class ReportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One `round` (consensus) or `clock` (PS) event.
struct StepPoint {
  int64_t step = 0;  // round or clock number
  double time = 0;   // seconds since this life of the node began (its `start` event)
  int life = 0;      // which life of the node: 0, or 1.. after each rejoin
  std::optional<double> test_accuracy;
  double wait_s = 0;
  double bytes_sent = 0;
  std::optional<double> backups;         // consensus: b_i
  std::optional<double> staleness_mean;  // consensus: of the models mixed in
  std::optional<double> used;            // consensus: how many models were mixed in
};

// One life of a node: from a `start` line to its `final` line, or to where its file stops (a
// crash or a kill leaves no `final` line).
struct NodeLife {
  int64_t first_step = 0;             // the round or clock it took up the run at (0: first life)
  std::optional<int64_t> crash_step;  // S of this node's crash:NODE@S term in its start line
  bool has_final = false;
};

// Updates of a PS worker that an owner gave up on, from a `final` line's `lost_updates`.
struct LostUpdates {
  uint32_t node = 0;                // the worker
  int64_t from_clock = 0;           // its updates from this clock on ...
  std::optional<int64_t> to_clock;  // ... up to this one, excluded (it rejoined); none: to the end
};

// One evaluation of a sparse model's first split (valid for a knowledge graph, test for matrix
// factorization) by node 0: at an evaluation epoch (an `epoch` line) or after the last step (the
// `summary` line).
struct QualityPoint {
  // Seconds of node 0's run up to this evaluation, its evaluations left out: the time since its
  // `start` line less every evaluation's `eval_seconds` so far, this one's included (evaluating
  // WN18RR's filtered ranking takes seconds, as much as an epoch of training, and is the same
  // work in every mode).
  double time = 0;
  int64_t epoch = 0;
  double value = 0;              // the headline metric: MRR or RMSE
  std::optional<double> hits10;  // knowledge graphs: Hits@10
};

// What the metrics of a sparse model (complex, distmult, mf) say beyond the step lines: the
// sparse trainer's `epoch` and `summary` lines (docs/sparse-ps.md and docs/sparse-consensus.md,
// "Metrics"). Only node 0 evaluates.
struct SparseMetrics {
  std::string metric;                 // the headline: "mrr" or "rmse" ("": never evaluated)
  std::string split;                  // the split of `quality`: "valid" or "test"
  std::vector<QualityPoint> quality;  // in file order
  double eval_seconds = 0;            // node 0's evaluations so far, summed
  // Node 0's evaluations between epochs (its `epoch` lines' eval_seconds), the last one after
  // the summary left out: the time the other nodes of a bounded run spent held up by them.
  double training_eval_seconds = 0;
  // After the run, on the last split (test): the `summary` line's.
  std::optional<double> final_value, final_hits10;
  std::string final_split;
  bool has_summary = false;
  double steps = 0;  // the summary's steps (PS clocks or consensus rounds)
  double train_seconds = 0, wait_seconds = 0, bytes_out = 0;
  std::optional<double> local_share;     // PS: share of row reads and writes served here
  std::optional<double> rows_per_round;  // consensus: rows sent per round, all neighbors
  std::optional<double> max_staleness;   // consensus: the largest staleness of a share mixed in
  std::string technique;                 // PS: classic, lapse, ...
  std::string staleness;                 // the bound as the start line gives it ("2", "inf")
};

// Everything one node's metrics file says. A node that rejoined appended a new life to its file:
// each life opens with a `start` event and its clock (`time`, `seconds`) restarts at 0. The
// time the node was down is in no file, so only the first life's times count from the run's
// start; the `final` fields and the rate are the last life's.
struct NodeMetrics {
  uint32_t node = 0;
  std::string file;
  std::string mode;              // "consensus", "ps", or "" when the file has no start event
  std::string backup;            // consensus: the rule
  std::string staleness;         // ps: the bound as written ("0", "3", "inf"), "" if not given
  std::optional<uint64_t> seed;  // the run's --seed, from the start event
  std::vector<StepPoint> steps;  // of every life, in file order
  int lives = 1;                 // 1 + the rejoins
  // The round or clock the last life's steps began at: 0 for a node that started with the run,
  // else the clock of its `rejoin` event (PS) or its first step.
  int64_t last_life_first_step = 0;
  // Time to target, seconds since the run's start: from a `target` event or the `final` line of
  // the first life (when it did not itself rejoin a running job).
  std::optional<double> target_seconds;  // from the `target` event
  double time_to_target = -1;            // from the `final` line; -1: not reached
  bool target_after_rejoin = false;      // reached in a rejoined life only: since when unknown
  // The last life's `final` line.
  bool has_final = false;
  double final_accuracy = 0;
  double final_steps = 0;  // rounds or clocks
  double final_seconds = 0;
  double final_wait_s = 0;
  std::optional<double> model_accuracy;  // node 0: average (consensus) or owner (ps) model
  std::vector<NodeLife> life_info;       // one per life, in file order (lives entries)
  // From the last life's `final` line: the peers that left before the end, and (PS) what was
  // lost while an owner or worker was down. Absent in files written before these fields.
  std::vector<uint32_t> departed_peers;
  std::vector<LostUpdates> lost_updates;
  std::optional<double> failed_pushes, failed_pulls;
  // A sparse model's run (its start line is the sparse trainer's); nullopt for image models.
  std::optional<SparseMetrics> sparse;
};

// A run folder as read. `warnings` lists lines that were skipped ("node-2.jsonl:17: ..."),
// e.g. the last line of a node that was killed while writing it, and nodes that rejoined.
struct RunMetrics {
  std::string dir;
  std::vector<NodeMetrics> nodes;  // sorted by node id
  std::vector<std::string> warnings;
};

// Reads every node-<id>.jsonl in `dir`. Throws ReportError when the folder does not exist or
// holds no node files. Unparseable lines are skipped with a warning; a file with no usable line
// is a node with no steps.
RunMetrics readRunFolder(const std::filesystem::path& dir);

// The numbers of one run, as summary.csv holds them.
struct RunSummary {
  std::string variant;
  uint64_t seed = 0;
  std::string error;  // empty: the run finished; otherwise why it failed
  int nodes = 0;
  uint32_t reference_node = 0;           // the node whose accuracy is reported (lowest id)
  std::optional<double> time_to_target;  // seconds, reference node; nullopt: not reached
  std::optional<double> final_accuracy;  // reference node's final test accuracy
  std::optional<double> model_accuracy;  // of the average (consensus) / owners' model (ps)
  double steps = 0;                      // rounds or clocks of the reference node's last life
  double seconds = 0;                    // run time of the reference node's last life
  double steps_per_s = 0;                // mean over nodes of steps / run time (last lives)
  double wait_share = 0;                 // mean over nodes of waiting time / run time (same)
  double bytes_sent_per_node = 0;        // mean over nodes of all bytes sent
  std::optional<double> mean_backups;    // consensus: mean b_i over all rounds and nodes
  std::optional<double> mean_staleness;  // consensus: mean staleness of every mixed-in model
  std::string staleness_bound;           // ps: "0", "N" or "inf"
  // Sparse models: the headline metric ("mrr" or "rmse"), node 0's final value on the last
  // split (test) and Hits@10, PS's share of local row accesses and consensus's rows per round
  // (means over nodes), the PS technique, consensus's largest staleness.
  bool sparse = false;
  std::string quality_metric;
  std::optional<double> final_quality, final_hits10;
  std::optional<double> local_share, rows_per_round, max_staleness;
  std::string technique;
  bool ok() const { return error.empty(); }
};

// Whether `value` can be a round or clock number: within [0, 2^53), where a double holds every
// integer and the conversion to int64 is defined.
inline bool isStepNumber(double value) {
  return value >= 0 && value < 9007199254740992.0;
}

// Condenses a run. A node without a `final` event (killed) is summarized from its last step.
RunSummary summarizeRun(const RunMetrics& metrics);

// A quality a run may reach: test accuracy (image models), MRR (knowledge graphs: higher is
// better) or RMSE (matrix factorization: lower is better).
struct QualityTarget {
  std::string metric;  // "accuracy", "mrr" or "rmse"
  double value = 0;
  bool higherIsBetter() const { return metric != "rmse"; }
  bool reachedBy(double quality) const {
    return higherIsBetter() ? quality >= value : quality <= value;
  }
};

// Seconds from node 0's start to its first evaluation of a sparse model that reached `target`
// (its `epoch` lines at the evaluation epochs, its `summary` line after the last step); nullopt
// when none did or the metrics are not `target`'s. Its resolution is --eval-every-epochs.
std::optional<double> sparseTimeToTarget(const SparseMetrics& metrics, const QualityTarget& target);

// "consensus:dynamic", "ps:ssp:3", ... from node 0's start event; "run" when it says nothing.
std::string variantNameOf(const RunMetrics& metrics);

}  // namespace chorus::report
