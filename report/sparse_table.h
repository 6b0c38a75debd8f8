// The report of a sparse model's runs (complex, distmult, mf): its table (MRR and Hits@10, or
// RMSE, instead of accuracy; PS's local accesses and consensus's rows per round) and how to read
// it. docs/compare.md "Sparse models" describes every column.
#pragma once

#include <string>

#include "report/run_metrics.h"

namespace chorus::report {

struct Report;

// "MRR 0.300", "RMSE 0.900", "accuracy 84.0%".
std::string qualityTargetName(const QualityTarget& target);
// The headline metric as a column names it: "MRR", "RMSE".
std::string qualityName(const std::string& metric);

// The Markdown table: one row per variant.
std::string sparseMarkdownTable(const Report& report);
// The bullet list under it, one line per column.
std::string sparseReadingNotes(const Report& report);

}  // namespace chorus::report
