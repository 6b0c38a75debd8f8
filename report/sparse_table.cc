#include "report/sparse_table.h"

#include <fmt/format.h>

#include "report/report.h"
#include "report/text_format.h"

namespace chorus::report {
namespace {

constexpr const char* kDash = "—";

// The headline metric of the report's runs ("mrr" or "rmse"; "" when no run evaluated).
std::string reportMetric(const Report& report) {
  if (report.input.quality_target) return report.input.quality_target->metric;
  for (const VariantSummary& v : report.variants) {
    if (!v.quality_metric.empty()) return v.quality_metric;
  }
  return "";
}

std::string qualityText(const std::optional<double>& value) {
  return value ? fmt::format("{:.4f}", *value) : std::string(kDash);
}

}  // namespace

std::string qualityName(const std::string& metric) {
  if (metric == "mrr") return "MRR";
  if (metric == "rmse") return "RMSE";
  return metric.empty() ? "quality" : metric;
}

std::string qualityTargetName(const QualityTarget& target) {
  if (target.metric == "accuracy") return "accuracy " + percent(target.value, 1);
  return fmt::format("{} {:.3f}", qualityName(target.metric), target.value);
}

std::string sparseMarkdownTable(const Report& report) {
  const bool target = hasTarget(report);
  const std::string name = targetName(report);
  const std::string metric = reportMetric(report);
  const bool hits = metric != "rmse";
  std::string out = "| variant | runs ok |";
  std::string rule = "| --- | ---: |";
  if (target) {
    out += fmt::format(" reached {0} | time to {0} (s), median [min, max] |", name);
    rule += " ---: | ---: |";
  }
  out += fmt::format(" test {} |", qualityName(metric));
  rule += " ---: |";
  if (hits) {
    out += " test Hits@10 |";
    rule += " ---: |";
  }
  out +=
      " steps / s | waiting share | sent per node | local accesses | rows per round | staleness | "
      "events |\n";
  rule += " ---: | ---: | ---: | ---: | ---: | ---: | --- |\n";
  out += rule;
  for (const VariantSummary& v : report.variants) {
    out += fmt::format("| {} | {}/{} |", v.variant, v.ok_runs, v.runs);
    if (target) {
      out += targetCell(v);
    }
    out += fmt::format(" {} |", qualityText(v.final_quality));
    if (hits) out += fmt::format(" {} |", qualityText(v.final_hits10));
    std::string staleness = kDash;
    if (!v.staleness_bound.empty()) {
      staleness = v.staleness_bound == "inf" ? "bound ∞" : "bound " + v.staleness_bound;
    } else if (v.max_staleness) {
      staleness = fmt::format("max {:.0f}", *v.max_staleness);
    }
    const bool any = v.ok_runs > 0;
    out += fmt::format(
        " {} | {} | {} | {} | {} | {} | {} |\n", any ? shortNumber(v.steps_per_s) : kDash,
        any ? percent(v.wait_share, 0) : kDash, any ? bytesText(v.bytes_sent_per_node) : kDash,
        v.local_share ? percent(*v.local_share, 0) : kDash,
        v.rows_per_round ? fmt::format("{:.0f}", *v.rows_per_round) : kDash, staleness,
        eventCountsText(v.events));
  }
  return out;
}

std::string sparseReadingNotes(const Report& report) {
  const std::string metric = qualityName(reportMetric(report));
  std::string out;
  if (hasTarget(report)) {
    out += fmt::format(
        "- **time to {0}**: seconds from when node 0 started training (its metrics file opened, "
        "the cluster connected) to the first evaluation of node 0's model on the first split "
        "(valid for a knowledge graph, test for ratings) that reached {0}, node 0's evaluations "
        "left out (the same work in every variant, and on WN18RR as long as an epoch); node 0 "
        "evaluates at --eval-every-epochs and after the last step, so that is its resolution.\n",
        targetName(report));
  }
  out += fmt::format(
      "- **test {0}**{1}: node 0's model after the last step, on the test split (PS: the model "
      "as the owners hold it; consensus: node 0's replica).\n"
      "- **steps / s**: training steps per second and node (a PS clock or a consensus round, "
      "each one batch per node); the single variant's steps are the whole job's.\n"
      "- **waiting share**: time a node waited for others (reads, shares) / its training time, "
      "mean over nodes; PS counts every read, local ones too (they go through the node's loop "
      "thread), and the time the other nodes spent held up by node 0's evaluations is left "
      "out of theirs.\n"
      "- **sent per node**: bytes each node's connections sent over the run, mean over nodes.\n"
      "- **local accesses**: PS: the share of row reads and writes a node served from rows it "
      "held (classic: its home rows; lapse: rows relocated to it too), mean over nodes.\n"
      "- **rows per round**: consensus: rows a node sent per round to all its neighbors (sparse "
      "gossip sends only changed rows), mean over nodes.\n"
      "- **staleness**: PS: the bound; consensus: the largest staleness (rounds) of a share "
      "mixed in.\n"
      "- **events**: over the finished runs, nodes whose metrics end without a summary line "
      "(crashes), and the others; each run's are listed under Events.\n",
      metric, metric == "MRR" ? " and **Hits@10**" : "");
  return out;
}

}  // namespace chorus::report
