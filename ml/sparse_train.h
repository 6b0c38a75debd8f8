// The single-node training driver of sparse workloads (knowledge-graph embeddings, matrix
// factorization): a workload owns its tables and computes sparse gradients for a batch of data
// points; the driver shuffles, batches, applies the sparse optimizer to each table, evaluates,
// writes metrics and checkpoints. `chorus train` uses it for --model complex|distmult (and mf).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ml/metrics.h"
#include "ml/rng.h"
#include "ml/sparse_table.h"

namespace chorus::ml {

// One named quality number ("mrr", "hits@10", "rmse", ...).
struct NamedMetric {
  std::string name;
  double value = 0.0;
};

// "mrr 0.3412 hits@10 0.5120": a split's metrics for a log line.
std::string formatMetrics(const std::vector<NamedMetric>& metrics);
// Adds each metric to `event` as prefix + name (the metrics file's "valid_mrr").
void addMetrics(MetricsEvent& event, const std::string& prefix,
                const std::vector<NamedMetric>& metrics);

// What a workload must provide to be trained by trainSparse(). One thread at a time.
class SparseWorkload {
 public:
  virtual ~SparseWorkload() = default;
  // The model and its sizes in one line; checkpoints store it and refuse another.
  virtual std::string spec() const = 0;
  // The parameter tables, in a fixed order (gradients, optimizer state and checkpoints follow
  // it). The pointers stay valid for the workload's life.
  virtual std::vector<SparseTable*> tables() = 0;
  // Data points in one epoch (a point is a triple, a rating, ...).
  virtual size_t trainPoints() const = 0;
  // Computes the mean loss of the training points `points` (indices below trainPoints()) and
  // accumulates its gradient into one accumulator per table (tables() order). Draws whatever it
  // samples from `rng`.
  virtual double computeGradients(std::span<const size_t> points, Rng& rng,
                                  std::span<SparseGradAccumulator> grads) = 0;
  // The same step in two halves, for a trainer that must fetch the rows a step touches before
  // computing it (sparse PS mode): drawStep() takes the step's random draws (negative samples)
  // from `rng`, stepRows() names the rows the drawn step reads and writes, and
  // computeDrawnGradients() computes it: with the same rng, the same step as computeGradients().
  // The defaults keep `points` and `rng` for computeDrawnGradients() (rng must outlive it) and
  // name every row: correct for any workload, sparse only for those that override them.
  virtual void drawStep(std::span<const size_t> points, Rng& rng) {
    drawnPoints_.assign(points.begin(), points.end());
    drawnRng_ = &rng;
  }
  // Appends to rows[t] (one list per table, tables() order) the keys of table t that the drawn
  // step reads; unsorted, may repeat. Rows it writes are among them.
  virtual void stepRows(std::span<std::vector<RowKey>> rows) {
    const std::vector<SparseTable*> all = tables();
    for (size_t t = 0; t < all.size() && t < rows.size(); ++t) {
      for (RowKey key = 0; key < all[t]->rows(); ++key)
        rows[t].push_back(key);
    }
  }
  // The gradient of the step drawStep() drew, as computeGradients().
  virtual double computeDrawnGradients(std::span<SparseGradAccumulator> grads) {
    return computeGradients(drawnPoints_, *drawnRng_, grads);
  }

  // The rows a step samples (KGE's negatives), for a trainer that draws them itself (sparse PS
  // mode's sampling primitives, docs/sampling.md): the table whose rows are sampled, uniformly
  // over its rows; nullopt when the workload samples no rows (the defaults below then apply).
  virtual std::optional<size_t> sampledTable() const { return std::nullopt; }
  // How many rows of sampledTable() a step of `points` points samples.
  virtual size_t sampledRowsPerStep(size_t /*points*/) const { return 0; }
  // drawStep() with the sampled rows given (sampledRowsPerStep(points.size()) rows of
  // sampledTable(), in the order drawStep() would draw them) instead of drawn from an rng.
  // std::invalid_argument for another count; std::logic_error without sampledTable().
  virtual void drawStepWith(std::span<const size_t> /*points*/,
                            std::span<const RowKey> /*sampled*/) {
    throw std::logic_error("this workload samples no rows");
  }
  // stepRows() without the sampled rows (the trainer reads those with the sample); a sampled
  // row that the step also touches otherwise is still named.
  virtual void stepRowsUnsampled(std::span<std::vector<RowKey>> rows) { stepRows(rows); }
  // Appends to rows[t] (tables() order) the rows the training points `points` name themselves,
  // without any draw (KGE: heads and tails; MF: rows and columns): what a trainer that
  // moves rows to where they are used (sparse PS mode, --technique lapse) localizes ahead of the
  // step. Unsorted, may repeat. The default names none.
  virtual void pointRows(std::span<const size_t> /*points*/,
                         std::span<std::vector<RowKey>> /*rows*/) const {}
  // The evaluation splits it has, in order ("valid", "test"); the last one is the final one.
  virtual std::vector<std::string> evalSplits() const = 0;
  // Evaluates the current parameters on `split`; the first metric is the headline one.
  virtual std::vector<NamedMetric> evaluate(const std::string& split) = 0;
  // Whether a larger headline metric is better (MRR) or a smaller one (RMSE).
  virtual bool higherIsBetter() const = 0;

 private:
  std::vector<size_t> drawnPoints_;  // the default drawStep()'s
  Rng* drawnRng_ = nullptr;
};

// The driver's settings (the model's own are the workload's).
struct SparseTrainOptions {
  int64_t epochs = 10;
  size_t batchSize = 512;
  SparseOptimizerConfig optimizer;
  uint64_t seed = 1;              // shuffling and the workload's sampling stream
  int64_t evalEvery = 1;          // evaluate the first split every this many epochs (0 = end)
  int64_t logEverySteps = 100;    // a "step" metrics event every this many steps
  double timeLimitSeconds = 0.0;  // stop after the epoch that passes this training time (0: no)
  // Model selection on the first split (valid): keep a copy of the tables of the epoch with the
  // best headline metric there, and evaluate every split at the end with those (--keep-best).
  // Needs evalEvery > 0 to see more than the last epoch.
  bool keepBest = false;
  std::string metricsPath;  // JSON lines (empty: none)
  std::string savePath;     // checkpoint after every epoch (empty: none)
  std::string resumePath;   // checkpoint to start from
  std::vector<std::pair<std::string, std::string>> startFields;  // added to the "start" event
};

// What a run achieved.
struct SparseTrainReport {
  int64_t epochsDone = 0;
  int64_t steps = 0;
  double trainSeconds = 0.0;  // the training loop only (no evaluation)
  double pointsPerSecond = 0.0;
  std::vector<double> epochLosses;
  // Final evaluation of every split, in evalSplits() order, of the parameters of epoch
  // `evaluatedEpoch`: the last one, or with keepBest the one best on the first split.
  std::vector<std::pair<std::string, std::vector<NamedMetric>>> final;
  int64_t evaluatedEpoch = 0;
  size_t parameters = 0;
  std::string spec;
};

// Throws std::invalid_argument naming the flag when an option is out of range.
void validateSparseTrainOptions(const SparseTrainOptions& options);

// The figures every distributed sparse run's "summary" event holds, in sparse PS mode and in
// sparse consensus mode alike (one writer, so that the report reads both the same way).
struct SparseRunSummary {
  int64_t epochs = 0;  // epochs done; also the evaluated epoch (the last: no model selection)
  int64_t steps = 0;   // PS clocks or consensus rounds done
  double train_seconds = 0;
  double wait_seconds = 0;  // of which waiting for other nodes
  double points_per_s = 0;
  uint64_t bytes_out = 0;  // the runtime's counters, all peers
  uint64_t bytes_in = 0;
  bool stopped = false;
};

// Adds epochs, evaluated_epoch, steps, train_seconds, wait_seconds, points_per_s, bytes_out,
// bytes_in and stopped to `summary`; the mode adds its own fields after them.
void addSparseRunSummary(MetricsEvent& summary, const SparseRunSummary& run);

// The end-of-run evaluation of a distributed sparse run: evaluates `workload`'s current tables
// on each of `splits`, in order, adds {split}_{metric} and {split}_eval_seconds to `summary`,
// and returns the metrics per split.
std::vector<std::pair<std::string, std::vector<NamedMetric>>> evaluateSplitsInto(
    SparseWorkload& workload, const std::vector<std::string>& splits, MetricsEvent& summary);

// Trains `workload` for options.epochs epochs (from a checkpoint's epoch with resumePath),
// evaluating, logging and checkpointing as asked, and evaluates every split at the end. Throws
// std::invalid_argument for bad options, CheckpointError for a bad --resume file,
// std::runtime_error for a diverged run (loss not finite) or an unwritable output.
SparseTrainReport trainSparse(SparseWorkload& workload, const SparseTrainOptions& options,
                              ProgressReporter& progress);

}  // namespace chorus::ml
