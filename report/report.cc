#include "report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <system_error>

#include "ml/metrics.h"
#include "report/conclusion.h"
#include "report/json_line.h"
#include "report/sparse_table.h"
#include "report/text_format.h"

namespace chorus::report {
namespace fs = std::filesystem;
namespace {

constexpr const char* kManifest = "runs.jsonl";

void appendLine(const fs::path& path, const std::string& line, bool truncate) {
  std::ofstream out(path, truncate ? std::ios::trunc : std::ios::app);
  out << line << '\n';
  out.flush();
  if (!out) throw ReportError(fmt::format("{}: cannot write", path.string()));
}

// Writes `text` to PATH.tmp and renames it over PATH, so a reader never sees half a file.
void writeFileAtomically(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    out << text;
    out.flush();
    if (!out) throw ReportError(fmt::format("{}: cannot write", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw ReportError(fmt::format("{}: cannot write: {}", path.string(), ec.message()));
}

std::optional<double> median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::optional<double> medianOfOptionals(const std::vector<std::optional<double>>& values) {
  std::vector<double> present;
  for (const auto& v : values) {
    if (v) present.push_back(*v);
  }
  return median(std::move(present));
}

// The runs whose reference node is not node 0 (its metrics file was missing).
std::vector<const RunSummary*> runsWithoutNodeZero(const Report& report) {
  std::vector<const RunSummary*> runs;
  for (const auto& run : report.runs) {
    if (run.ok() && run.nodes > 0 && run.reference_node != 0) runs.push_back(&run);
  }
  return runs;
}

bool hasNodeFiles(const fs::path& folder) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("node-") && name.ends_with(".jsonl")) return true;
  }
  return false;
}

std::string csvField(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out.push_back('"');
    out.push_back(c == '\n' ? ' ' : c);
  }
  out.push_back('"');
  return out;
}

// summary.csv numbers. Counts (bytes, steps) as whole numbers: "663774208", never "6.63774e+08",
// which a script reads back rounded to 6 digits. Other numbers with 15 significant digits: a
// value the metrics files hold (at most 15 digits) comes back exactly as written there, and the
// noise of arithmetic on it (0.15000000000000002) does not show.
std::string csvInteger(double value) {
  return fmt::format("{}", std::llround(value));
}
std::string csvNumber(double value) {
  return fmt::format("{:.15g}", value);
}
std::string optionalNumber(const std::optional<double>& value) {
  return value ? csvNumber(*value) : std::string();
}

}  // namespace

bool isSparseReport(const Report& report) {
  // A sparse model's target says so even when every run failed.
  if (report.input.quality_target) return true;
  return std::any_of(report.runs.begin(), report.runs.end(),
                     [](const RunSummary& run) { return run.sparse; });
}

bool hasTarget(const Report& report) {
  if (report.input.quality_target) return true;
  if (report.input.target_acc) return *report.input.target_acc > 0;
  return std::any_of(report.runs.begin(), report.runs.end(),
                     [](const RunSummary& run) { return run.time_to_target.has_value(); });
}

std::string targetName(const Report& report) {
  if (const auto& quality = report.input.quality_target) return qualityTargetName(*quality);
  const auto& target = report.input.target_acc;
  return target && *target > 0 ? percent(*target, 1) : std::string("target");
}

std::string referenceNodeName(const Report& report) {
  return runsWithoutNodeZero(report).empty() ? "node 0" : "reference node";
}

CompareManifest CompareManifest::create(const fs::path& folder, const std::string& command,
                                        double target_acc, const std::vector<std::string>& variants,
                                        const std::optional<QualityTarget>& quality_target) {
  std::string list;
  for (const auto& v : variants) {
    if (!list.empty()) list += ",";
    list += v;
  }
  appendLine(folder / kManifest,
             fmt::format("{{\"event\":\"compare\",\"command\":{},\"target_acc\":{},{}"
                         "\"variants\":{}}}",
                         ml::jsonString(command), target_acc,
                         quality_target ? fmt::format("\"target_metric\":{},\"target\":{},",
                                                      ml::jsonString(quality_target->metric),
                                                      quality_target->value)
                                        : std::string(),
                         ml::jsonString(list)),
             true);
  CompareManifest manifest;
  manifest.folder_ = folder;
  return manifest;
}

void CompareManifest::append(const RunRecord& run) const {
  std::error_code ec;
  fs::path relative = fs::relative(run.dir, folder_, ec);
  if (ec || relative.empty()) relative = run.dir;
  appendLine(
      folder_ / kManifest,
      fmt::format("{{\"event\":\"run\",\"variant\":{},\"seed\":{},\"dir\":{},"
                  "\"status\":{},\"error\":{}}}",
                  ml::jsonString(run.variant), run.seed, ml::jsonString(relative.string()),
                  ml::jsonString(run.error.empty() ? "ok" : "failed"), ml::jsonString(run.error)),
      false);
}

ReportInput loadReportInput(const fs::path& folder) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) {
    throw ReportError(
        fmt::format("{}: no such folder (give a `chorus compare --out` folder or "
                    "the --out folder of a `chorus launch`)",
                    folder.string()));
  }
  ReportInput input;
  input.folder = folder;
  const fs::path manifest = folder / kManifest;
  if (!fs::exists(manifest, ec)) {
    if (!hasNodeFiles(folder)) {
      throw ReportError(fmt::format(
          "{}: neither a compare folder (no {}) nor a run folder (no node-<id>.jsonl files)",
          folder.string(), kManifest));
    }
    RunMetrics metrics = readRunFolder(folder);
    RunRecord run;
    run.variant = variantNameOf(metrics);
    // A launch folder has no manifest: its seed is the one the nodes started with.
    if (!metrics.nodes.empty() && metrics.nodes.front().seed)
      run.seed = *metrics.nodes.front().seed;
    run.dir = folder;
    input.variants.push_back(run.variant);
    input.runs.push_back(run);
    return input;
  }
  std::ifstream in(manifest);
  if (!in) throw ReportError(fmt::format("{}: cannot open for reading", manifest.string()));
  std::string line;
  size_t number = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    const std::string where = fmt::format("{}:{}", manifest.string(), number);
    JsonObject object;
    try {
      object = JsonObject::parse(line);
    } catch (const JsonError& e) {
      // Only the last line can be cut short by an interrupted compare; skip it there.
      if (in.peek() == EOF) break;
      throw ReportError(fmt::format("{}: not a JSON object ({})", where, e.what()));
    }
    const std::string event = object.string("event").value_or("");
    if (event == "compare") {
      header = true;
      input.command = object.string("command").value_or("");
      input.target_acc = object.number("target_acc");
      // A sparse model's target (written since compare took --target-mrr / --target-rmse).
      const auto metric = object.string("target_metric");
      const auto target = object.number("target");
      if (metric && target && (*metric == "mrr" || *metric == "rmse")) {
        input.quality_target = QualityTarget{*metric, *target};
      }
      const std::string list = object.string("variants").value_or("");
      size_t start = 0;
      while (start < list.size()) {
        size_t comma = std::min(list.find(',', start), list.size());
        if (comma > start) input.variants.push_back(list.substr(start, comma - start));
        start = comma + 1;
      }
    } else if (event == "run") {
      RunRecord run;
      auto variant = object.string("variant");
      auto seed = object.number("seed");
      auto dir = object.string("dir");
      if (!variant || !seed || !dir || *seed < 0) {
        throw ReportError(fmt::format("{}: a run line needs variant, seed and dir", where));
      }
      run.variant = *variant;
      run.seed = static_cast<uint64_t>(*seed);
      run.dir = fs::path(*dir).is_absolute() ? fs::path(*dir) : folder / *dir;
      if (object.string("status").value_or("ok") != "ok") {
        run.error = object.string("error").value_or("failed");
        if (run.error.empty()) run.error = "failed";
      }
      if (std::find(input.variants.begin(), input.variants.end(), run.variant) ==
          input.variants.end()) {
        input.variants.push_back(run.variant);
      }
      input.runs.push_back(std::move(run));
    } else {
      throw ReportError(fmt::format("{}: unknown event '{}'", where, event));
    }
  }
  if (!header) {
    throw ReportError(
        fmt::format("{}: no header line (was it written by chorus compare?)", manifest.string()));
  }
  return input;
}

Report buildReport(ReportInput input) {
  Report report;
  for (const auto& run : input.runs) {
    RunMetrics metrics;
    RunSummary summary;
    try {
      metrics = readRunFolder(run.dir);
      summary = summarizeRun(metrics);
      for (const auto& w : metrics.warnings)
        report.warnings.push_back(w);
      summary.error = run.error;
    } catch (const ReportError& e) {
      summary.error = run.error.empty() ? std::string(e.what()) : run.error;
    }
    summary.variant = run.variant;
    summary.seed = run.seed;
    // A sparse model's nodes do not know the target: it is found in node 0's evaluations.
    if (input.quality_target && !metrics.nodes.empty() && metrics.nodes.front().sparse) {
      summary.time_to_target =
          sparseTimeToTarget(*metrics.nodes.front().sparse, *input.quality_target);
    }
    report.events.push_back(runEvents(metrics));
    report.runs.push_back(std::move(summary));
    report.metrics.push_back(std::move(metrics));
  }
  for (const auto& name : input.variants) {
    VariantSummary v;
    v.variant = name;
    std::vector<double> ttt, rates, waits, sent;
    std::vector<std::optional<double>> finals, models, backups, staleness;
    std::vector<std::optional<double>> qualities, hits, locals, rows, max_stale;
    for (size_t r = 0; r < report.runs.size(); ++r) {
      const RunSummary& run = report.runs[r];
      if (run.variant != name) continue;
      ++v.runs;
      if (!run.ok()) continue;
      ++v.ok_runs;
      countEvents(report.events[r], v.events);
      if (run.time_to_target) {
        ++v.reached;
        ttt.push_back(*run.time_to_target);
      }
      finals.push_back(run.final_accuracy);
      models.push_back(run.model_accuracy);
      rates.push_back(run.steps_per_s);
      waits.push_back(run.wait_share);
      sent.push_back(run.bytes_sent_per_node);
      backups.push_back(run.mean_backups);
      staleness.push_back(run.mean_staleness);
      if (v.staleness_bound.empty()) v.staleness_bound = run.staleness_bound;
      if (run.sparse) {
        v.sparse = true;
        if (v.quality_metric.empty()) v.quality_metric = run.quality_metric;
        qualities.push_back(run.final_quality);
        hits.push_back(run.final_hits10);
        locals.push_back(run.local_share);
        rows.push_back(run.rows_per_round);
        max_stale.push_back(run.max_staleness);
      }
    }
    v.final_quality = medianOfOptionals(qualities);
    v.final_hits10 = medianOfOptionals(hits);
    v.local_share = medianOfOptionals(locals);
    v.rows_per_round = medianOfOptionals(rows);
    v.max_staleness = medianOfOptionals(max_stale);
    if (!ttt.empty()) {
      v.ttt_median = median(ttt);
      v.ttt_min = *std::min_element(ttt.begin(), ttt.end());
      v.ttt_max = *std::max_element(ttt.begin(), ttt.end());
    }
    v.final_accuracy = medianOfOptionals(finals);
    v.model_accuracy = medianOfOptionals(models);
    v.steps_per_s = median(rates).value_or(0);
    v.wait_share = median(waits).value_or(0);
    v.bytes_sent_per_node = median(sent).value_or(0);
    v.mean_backups = medianOfOptionals(backups);
    v.mean_staleness = medianOfOptionals(staleness);
    report.variants.push_back(std::move(v));
  }
  report.input = std::move(input);
  return report;
}

std::string summaryCsv(const Report& report) {
  std::string out =
      "variant,seed,status,error,nodes,reached_target,time_to_target_s,final_accuracy,"
      "model_accuracy,steps,seconds,steps_per_s,wait_share,bytes_sent_per_node,mean_backups,"
      "mean_staleness,staleness_bound,crashes,rejoins,dropped,failed_pushes,failed_pulls,events";
  // A sparse model's runs add their own columns after the image models' (which stay as they were
  // for the scripts that read them).
  const bool sparse = isSparseReport(report);
  out += sparse ? ",quality_metric,final_quality,final_hits10,local_share,rows_per_round\n" : "\n";
  const bool target = hasTarget(report);
  for (size_t i = 0; i < report.runs.size(); ++i) {
    const RunSummary& r = report.runs[i];
    const std::vector<RunEvent>& events = report.events[i];
    EventCounts counts;
    countEvents(events, counts);
    // PS nodes count failed pushes and reads in their final line; other runs (and files written
    // before these counts) have none, which is not zero.
    const auto& nodes = report.metrics[i].nodes;
    const bool ps = std::any_of(nodes.begin(), nodes.end(), [](const NodeMetrics& node) {
      return node.failed_pushes.has_value() || node.failed_pulls.has_value();
    });
    std::vector<std::string> texts;
    texts.reserve(events.size());
    for (const RunEvent& e : events)
      texts.push_back(e.text);
    out += fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}", csvField(r.variant),
        r.seed, r.ok() ? "ok" : "failed", csvField(r.error), r.nodes,
        target ? (r.time_to_target ? "1" : "0") : "", optionalNumber(r.time_to_target),
        optionalNumber(r.final_accuracy), optionalNumber(r.model_accuracy), csvInteger(r.steps),
        csvNumber(r.seconds), csvNumber(r.steps_per_s), csvNumber(r.wait_share),
        csvInteger(r.bytes_sent_per_node), optionalNumber(r.mean_backups),
        optionalNumber(r.mean_staleness), csvField(r.staleness_bound), counts.crashes,
        counts.rejoins, counts.dropped, ps ? fmt::format("{}", counts.failed_pushes) : "",
        ps ? fmt::format("{}", counts.failed_pulls) : "",
        csvField(fmt::format("{}", fmt::join(texts, "; "))));
    if (sparse) {
      out += fmt::format(",{},{},{},{},{}", csvField(r.quality_metric),
                         optionalNumber(r.final_quality), optionalNumber(r.final_hits10),
                         optionalNumber(r.local_share), optionalNumber(r.rows_per_round));
    }
    out += "\n";
  }
  return out;
}

std::string targetCell(const VariantSummary& v) {
  std::string ttt = "—";
  if (v.ttt_median) {
    ttt = v.reached > 1 ? fmt::format("{} [{}, {}]", shortNumber(*v.ttt_median),
                                      shortNumber(*v.ttt_min), shortNumber(*v.ttt_max))
                        : shortNumber(*v.ttt_median);
  } else if (v.ok_runs > 0) {
    ttt = "not reached";
  }
  return fmt::format(" {}/{} | {} |", v.reached, v.ok_runs, ttt);
}

std::string markdownTable(const Report& report) {
  if (isSparseReport(report)) return sparseMarkdownTable(report);
  // Without a target there is nothing to reach: the two target columns are left out rather than
  // filled with "not reached".
  const bool target = hasTarget(report);
  const std::string name = targetName(report);
  std::string out = "| variant | runs ok |";
  std::string rule = "| --- | ---: |";
  if (target) {
    out += fmt::format(" reached {0} | time to {0} (s), median [min, max] |", name);
    rule += " ---: | ---: |";
  }
  out +=
      " final accuracy | model accuracy | rounds or clocks / s | waiting share | sent per node "
      "| mean backups | staleness | events |\n";
  rule += " ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n";
  out += rule;
  const std::string dash = "—";
  for (const auto& v : report.variants) {
    out += fmt::format("| {} | {}/{} |", v.variant, v.ok_runs, v.runs);
    if (target) {
      out += targetCell(v);
    }
    std::string staleness = dash;
    if (v.mean_staleness) {
      staleness = fmt::format("{:.2f} (mean)", *v.mean_staleness);
    } else if (!v.staleness_bound.empty()) {
      staleness = v.staleness_bound == "inf" ? "bound ∞" : "bound " + v.staleness_bound;
    }
    const bool any = v.ok_runs > 0;
    out +=
        fmt::format(" {} | {} | {} | {} | {} | {} | {} | {} |\n",
                    v.final_accuracy ? percent(*v.final_accuracy, 2) : dash,
                    v.model_accuracy ? percent(*v.model_accuracy, 2) : dash,
                    any ? shortNumber(v.steps_per_s) : dash, any ? percent(v.wait_share, 0) : dash,
                    any ? bytesText(v.bytes_sent_per_node) : dash,
                    v.mean_backups ? fmt::format("{:.2f}", *v.mean_backups) : dash, staleness,
                    eventCountsText(v.events));
  }
  return out;
}

std::string reportMarkdown(const Report& report, const PlotSet& plots) {
  std::string out =
      fmt::format("# Comparison: {}\n\n",
                  fs::absolute(report.input.folder).lexically_normal().filename().string());
  if (!report.input.command.empty()) {
    out += fmt::format("Made by:\n\n```\n{}\n```\n\n", report.input.command);
  }
  out += markdownTable(report);
  if (const std::string said = conclusion(report); !said.empty()) out += "\n" + said + "\n";
  out += "\nHow to read it (medians over the seeds that finished; summary.csv has every run):\n\n";
  if (isSparseReport(report)) {
    out += sparseReadingNotes(report);
  } else {
    if (hasTarget(report)) {
      out += fmt::format(
          "- **time to {0}**: seconds from when node 0 started training (its metrics file opened, "
          "the cluster connected) to the first evaluation at which its test accuracy was at least "
          "{0}; its resolution is --eval-every rounds.\n",
          targetName(report));
    }
    out +=
        "- **final accuracy**: node 0's test accuracy at the end; **model accuracy**: that of the "
        "average of all final models (consensus) or of the model as the owners hold it (PS).\n"
        "- **rounds or clocks / s**: training steps per second, per node (a step is a consensus "
        "round or a PS clock); the single variant runs as many steps as all nodes together, so its "
        "rate is per step of the whole job.\n"
        "- **waiting share**: time a node spent waiting for others / its run time, mean over "
        "nodes.\n"
        "- **sent per node**: bytes each node sent to all peers over the run, mean over nodes.\n"
        "- **mean backups**: consensus b_i (neighbors not waited for) over all rounds and nodes; "
        "**staleness**: consensus: mean staleness (rounds) of the models mixed in; PS: the bound.\n"
        "- **events**: over the finished runs, nodes whose metrics end without a final line "
        "(crashes), rejoins, nodes the others went on without (dropped) and PS pushes and reads "
        "that failed while an owner was down; each run's are listed under Events.\n";
  }
  if (const auto others = runsWithoutNodeZero(report); !others.empty()) {
    std::vector<std::string> named;
    named.reserve(others.size());
    for (const RunSummary* run : others) {
      named.push_back(
          fmt::format("{} seed {} uses node {}", run->variant, run->seed, run->reference_node));
    }
    out += fmt::format(
        "- **node 0** above is the reference node, node 0 of each run, except where node 0's "
        "metrics file was missing and the lowest id present stands in: {}.\n",
        fmt::join(named, "; "));
  }
  bool any_events = false;
  for (size_t r = 0; r < report.runs.size(); ++r) {
    if (report.events[r].empty()) continue;
    if (!any_events) {
      out +=
          "\n## Events\n\n"
          "What happened to each run's nodes, from their metrics files (crashes and rejoins are "
          "marked on the accuracy plot):\n\n";
    }
    any_events = true;
    std::vector<std::string> texts;
    for (const RunEvent& e : report.events[r])
      texts.push_back(e.text);
    out += fmt::format("- {} seed {}{}: {}.\n", report.runs[r].variant, report.runs[r].seed,
                       report.runs[r].ok() ? "" : " (failed run)", fmt::join(texts, "; "));
  }
  if (!plots.pngs.empty()) {
    out += "\n## Plots\n\n";
    for (const auto& png : plots.pngs) {
      out += fmt::format("![{}](plots/{})\n\n", png.stem().string(), png.filename().string());
    }
  }
  for (const auto& why : plots.skipped)
    out += fmt::format("Not drawn: {}.\n\n", why);
  bool any_failed = false;
  for (const auto& r : report.runs) {
    if (r.ok()) continue;
    if (!any_failed) out += "\n## Failed runs\n\n";
    any_failed = true;
    out += fmt::format("- {} seed {}: {}\n", r.variant, r.seed, r.error);
  }
  return out;
}

PlotSet writeReportFiles(const Report& report, const fs::path& folder, const std::string& gnuplot) {
  writeFileAtomically(folder / "summary.csv", summaryCsv(report));
  PlotSet plots = writePlots(report, folder, gnuplot);
  writeFileAtomically(folder / "report.md", reportMarkdown(report, plots));
  return plots;
}

std::optional<Progress> readProgress(const fs::path& node_file) {
  std::ifstream in(node_file, std::ios::binary);
  if (!in) return std::nullopt;
  std::optional<Progress> progress;
  std::optional<double> accuracy;
  std::string line;
  while (std::getline(in, line)) {
    // A step line: `step` (run::kStepName), or `round` / `clock` in files written before the
    // modes shared the name. A sparse model's `step` lines count the steps done: close enough
    // for a progress line.
    if (line.find("\"step\"") == std::string::npos && line.find("\"round\"") == std::string::npos &&
        line.find("\"clock\"") == std::string::npos)
      continue;
    try {
      JsonObject object = JsonObject::parse(line);
      const std::string event = object.string("event").value_or("");
      if (event != "step" && event != "round" && event != "clock") continue;
      auto step = object.number(event);
      auto time = object.number("time");
      if (!step || !time || !isStepNumber(*step)) continue;
      if (auto acc = object.number("test_accuracy")) accuracy = acc;
      progress = Progress{static_cast<int64_t>(*step), *time, accuracy};
    } catch (const JsonError&) {
      // The line being written right now may be incomplete.
    }
  }
  return progress;
}

}  // namespace chorus::report
