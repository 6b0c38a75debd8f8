// The results of a comparison: which runs a folder holds (a `chorus compare --out` folder or the
// --out folder of one `chorus launch`), their summary.csv, the Markdown table of report.md and
// the gnuplot plots (report/plots.h). docs/compare.md describes the folder and every column.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "report/plots.h"
#include "report/run_events.h"
#include "report/run_metrics.h"

namespace chorus::report {

// One run of a comparison.
struct RunRecord {
  std::string variant;
  uint64_t seed = 0;
  std::filesystem::path dir;  // its metrics folder
  std::string error;          // empty: finished cleanly; otherwise why it failed
};

// What a report is made from.
struct ReportInput {
  std::filesystem::path folder;
  std::string command;               // the command that made the folder ("" when unknown)
  std::optional<double> target_acc;  // --target-acc (0: none), when known
  // A sparse model's target (--target-mrr, --target-rmse), when the compare had one.
  std::optional<QualityTarget> quality_target;
  std::vector<std::string> variants;  // in table order
  std::vector<RunRecord> runs;
};

// The manifest of a compare folder, FOLDER/runs.jsonl: a header line, then one line per run as
// it ends, so that an interrupted compare can still be reported.
class CompareManifest {
 public:
  // Creates FOLDER/runs.jsonl with the header (a sparse model's target as target_metric and
  // target). Throws ReportError when it cannot be written.
  static CompareManifest create(const std::filesystem::path& folder, const std::string& command,
                                double target_acc, const std::vector<std::string>& variants,
                                const std::optional<QualityTarget>& quality_target = std::nullopt);
  // Appends one finished (or failed) run; `run.dir` is stored relative to the folder.
  void append(const RunRecord& run) const;

 private:
  std::filesystem::path folder_;
};

// Reads FOLDER/runs.jsonl (a compare folder) or, when FOLDER holds node-<id>.jsonl files, makes
// it one run named after its mode. Throws ReportError naming the folder or manifest line.
ReportInput loadReportInput(const std::filesystem::path& folder);

// One variant's runs, condensed: medians over its finished runs (seeds).
struct VariantSummary {
  std::string variant;
  int runs = 0;
  int ok_runs = 0;
  int reached = 0;                                     // finished runs that reached the target
  std::optional<double> ttt_median, ttt_min, ttt_max;  // over the runs that reached it
  std::optional<double> final_accuracy;
  std::optional<double> model_accuracy;
  double steps_per_s = 0;
  double wait_share = 0;
  double bytes_sent_per_node = 0;
  std::optional<double> mean_backups;
  std::optional<double> mean_staleness;
  std::string staleness_bound;
  EventCounts events;  // over its finished runs
  // Sparse models (RunSummary's fields), medians over its finished runs.
  bool sparse = false;
  std::string quality_metric;
  std::optional<double> final_quality, final_hits10, local_share, rows_per_round, max_staleness;
};

// Everything a report shows.
struct Report {
  ReportInput input;
  std::vector<RunSummary> runs;               // parallel to input.runs
  std::vector<RunMetrics> metrics;            // parallel to input.runs (no nodes when unreadable)
  std::vector<std::vector<RunEvent>> events;  // parallel to input.runs
  std::vector<VariantSummary> variants;
  std::vector<std::string> warnings;  // skipped metrics lines, unreadable run folders
};

// Reads every run's metrics and condenses them. A run folder that cannot be read turns its run
// into a failed one (with the reason); it never aborts the report.
Report buildReport(ReportInput input);

// Whether the comparison had a target: --target-acc > 0 or a sparse model's target in the
// manifest; for a launch folder, which records no target, whether some run reached one.
bool hasTarget(const Report& report);
// The target as the table and plots name it: "85.0%", "MRR 0.300", "RMSE 0.900", or "target"
// when its value is unknown.
std::string targetName(const Report& report);
// Whether the runs trained a sparse model (complex, distmult, mf; or the compare had an MRR or
// RMSE target): the table shows MRR and Hits@10 or RMSE instead of accuracy
// (report/sparse_table.h).
bool isSparseReport(const Report& report);
// Whose accuracy the table and plots show: "node 0", or "reference node" when some run lacks
// node 0's metrics file.
std::string referenceNodeName(const Report& report);

// summary.csv: a header and one row per run (variant and seed).
std::string summaryCsv(const Report& report);

// The two target cells of a variant's row in either table (this one's and the sparse models'):
// " reached/finished | median [min, max] |", the time "not reached" when no run reached it,
// "—" when no run finished; the range only when more than one run reached it.
std::string targetCell(const VariantSummary& v);

// The Markdown table: one row per variant.
std::string markdownTable(const Report& report);

// report.md: the table, how to read it, the runs' events, the plots and the failed runs.
std::string reportMarkdown(const Report& report, const PlotSet& plots);

// Writes summary.csv, report.md and the plots into FOLDER (atomically replaced files).
// Returns the plots.
PlotSet writeReportFiles(const Report& report, const std::filesystem::path& folder,
                         const std::string& gnuplot = "gnuplot");

// The last round / clock and test accuracy seen in one node's metrics file, for progress
// lines while a run is going. Nullopt when the file does not exist yet or has no step.
struct Progress {
  int64_t step = 0;
  double time = 0;
  std::optional<double> test_accuracy;
};
// Reads `node_file` as it is being written; a partly written last line is ignored.
std::optional<Progress> readProgress(const std::filesystem::path& node_file);

}  // namespace chorus::report
