// The paragraph `chorus compare` and `chorus report` print after the table: which variant reached
// the target first and why, in the terms of the PS experiment's regime map
// (docs/ps-experiment.md): time to target is the pace (steps per second, which the waiting share
// eats) times the steps needed (updates to target, which staleness raises). Pure functions of a
// Report; unit-tested on synthetic metrics (tests/report/test_report_conclusion.cc).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "report/run_metrics.h"

namespace chorus::report {

struct Report;

// What the conclusion compares of one variant: medians over its finished runs.
struct VariantEvidence {
  std::string variant;
  int ok_runs = 0;
  int reached = 0;
  // Median time to target over the finished runs, a run that missed it counting as slower than
  // any that reached it (as bench/ps_runs.py does); nullopt when half of them or more missed.
  std::optional<double> time_to_target;
  std::optional<double> fastest, slowest;  // over the runs that reached it
  // Updates to the target: the training steps of all nodes (one gradient each) done by the time
  // node 0 reached it, median over the runs that reached it. Dense runs count their step lines;
  // a sparse run logs steps only every --log-every, so there it is nodes x rate x time
  // (`updates_estimated`).
  std::optional<double> updates_to_target;
  bool updates_estimated = false;
  double steps_per_s = 0;  // per node
  double wait_share = 0;
  // Bytes a node sent until node 0 reached the target (dense runs; mean over nodes, median
  // over runs), else over the whole run (`bytes_whole_run`).
  double bytes_per_node = 0;
  bool bytes_whole_run = false;
  // "0" (BSP), "3", "inf" (async) for PS variants; "" for others.
  std::string staleness_bound;
  std::optional<double> mean_staleness;  // consensus: of the models mixed in
};

// The evidence of every variant of `report`, in table order.
std::vector<VariantEvidence> gatherEvidence(const Report& report);

// The steps of all nodes (their first lives) done up to `seconds` into the run, and the bytes
// they sent meanwhile, mean per node: what a run spent to reach its target. Zero for a run
// without step lines (sparse models).
struct SpentToTarget {
  double updates = 0;
  double bytes_per_node = 0;
};
SpentToTarget spentUntil(const RunMetrics& metrics, double seconds);

// The conclusion as one short paragraph ("" when the comparison has no target or no finished
// run). `target` names the target as the table does ("97.0%", "RMSE 0.900").
std::string conclusionText(const std::vector<VariantEvidence>& variants, const std::string& target);

// conclusionText(gatherEvidence(report), targetName(report)), or "" without a target.
std::string conclusion(const Report& report);

}  // namespace chorus::report
