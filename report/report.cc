#include "report/report.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>

#include "ml/metrics.h"
#include "report/json_line.h"

extern char** environ;

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

// Whose accuracy the plots show.
std::string referenceText(const Report& report) {
  return runsWithoutNodeZero(report).empty() ? "node 0" : "reference node";
}

bool hasNodeFiles(const fs::path& folder) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("node-") && name.ends_with(".jsonl")) return true;
  }
  return false;
}

std::string percent(double fraction, int decimals) {
  return fmt::format("{:.{}f}%", 100 * fraction, decimals);
}

// Seconds and rates: two decimals below 10, one above, so small numbers keep their digits.
std::string shortNumber(double value) {
  return std::fabs(value) < 10 ? fmt::format("{:.2f}", value) : fmt::format("{:.1f}", value);
}

std::string bytesText(double bytes) {
  if (bytes <= 0) return "0";
  if (bytes < 1e6) return fmt::format("{:.1f} kB", bytes / 1e3);
  if (bytes < 1e9) return fmt::format("{:.1f} MB", bytes / 1e6);
  return fmt::format("{:.2f} GB", bytes / 1e9);
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

std::string optionalNumber(const std::optional<double>& value) {
  return value ? fmt::format("{:.6g}", *value) : std::string();
}

std::string targetText(const ReportInput& input) {
  return input.target_acc && *input.target_acc > 0 ? percent(*input.target_acc, 1)
                                                   : std::string("target");
}

// A string inside a gnuplot script (double quotes; gnuplot reads backslash escapes there).
std::string gnuplotString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c == '\n' ? ' ' : c);
  }
  out.push_back('"');
  return out;
}

// A file name inside a gnuplot script: single quotes, where only '' needs escaping.
std::string gnuplotPath(const fs::path& path) {
  std::string out = "'";
  for (char c : path.string()) {
    if (c == '\'') out.push_back('\'');
    out.push_back(c);
  }
  out.push_back('\'');
  return out;
}

std::string scriptHeader(const fs::path& png, std::string_view title) {
  return fmt::format(
      "# Drawn by chorus report; run `gnuplot {}` to redraw.\n"
      "set terminal pngcairo size 1000,600 noenhanced font \",11\"\n"
      "set output {}\n"
      "set title {}\n"
      "set grid\n",
      png.stem().string() + ".gp", gnuplotPath(png), gnuplotString(title));
}

void runGnuplot(const std::string& gnuplot, const fs::path& script) {
  fs::path log = script;
  log.replace_extension(".log");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::string script_arg = script.string();
  std::vector<char*> argv = {const_cast<char*>(gnuplot.c_str()), script_arg.data(), nullptr};
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, gnuplot.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc == ENOENT) {
    throw ReportError(
        fmt::format("'{}' not found on PATH: install gnuplot (apt-get install gnuplot-nox; "
                    "scripts/setup.sh does) to draw the plots",
                    gnuplot));
  }
  if (rc != 0) {
    throw ReportError(fmt::format("cannot start '{}': {}", gnuplot,
                                  std::error_code(rc, std::generic_category()).message()));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR)
      throw ReportError(fmt::format("waiting for gnuplot: {}",
                                    std::error_code(errno, std::generic_category()).message()));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    std::error_code ec;
    fs::remove(log, ec);  // only a failure's log is worth keeping
    return;
  }
  std::ifstream in(log);
  std::string line, first;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t^") == std::string::npos) continue;
    if (first.empty() || line.find("error") != std::string::npos) {
      first = line;
      if (line.find("error") != std::string::npos) break;
    }
  }
  throw ReportError(
      fmt::format("gnuplot failed on {} ({}): {}", script.string(),
                  WIFEXITED(status) ? fmt::format("status {}", WEXITSTATUS(status)) : "killed",
                  first.empty() ? "no output" : first));
}

void writeScript(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.flush();
  if (!out) throw ReportError(fmt::format("{}: cannot write", path.string()));
}

// Eight colors that stay apart on white (gnuplot's own cycle has a pale yellow); every run of one
// variant gets the variant's color.
constexpr uint32_t kColors[] = {0x1f77b4, 0xd62728, 0x2ca02c, 0xff7f0e,
                                0x9467bd, 0x8c564b, 0xe377c2, 0x17becf};
uint32_t colorOf(size_t variant_index) {
  return kColors[variant_index % std::size(kColors)];
}
std::string colorSpec(size_t variant_index) {
  return fmt::format("rgb \"#{:06x}\"", colorOf(variant_index));
}

}  // namespace

CompareManifest CompareManifest::create(const fs::path& folder, const std::string& command,
                                        double target_acc,
                                        const std::vector<std::string>& variants) {
  std::string list;
  for (const auto& v : variants) {
    if (!list.empty()) list += ",";
    list += v;
  }
  appendLine(folder / kManifest,
             fmt::format("{{\"event\":\"compare\",\"command\":{},\"target_acc\":{},"
                         "\"variants\":{}}}",
                         ml::jsonString(command), target_acc, ml::jsonString(list)),
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
    report.runs.push_back(std::move(summary));
    report.metrics.push_back(std::move(metrics));
  }
  for (const auto& name : input.variants) {
    VariantSummary v;
    v.variant = name;
    std::vector<double> ttt, rates, waits, sent;
    std::vector<std::optional<double>> finals, models, backups, staleness;
    for (const auto& run : report.runs) {
      if (run.variant != name) continue;
      ++v.runs;
      if (!run.ok()) continue;
      ++v.ok_runs;
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
    }
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
      "mean_staleness,staleness_bound\n";
  for (const auto& r : report.runs) {
    out += fmt::format("{},{},{},{},{},{},{},{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{},{},{}\n",
                       csvField(r.variant), r.seed, r.ok() ? "ok" : "failed", csvField(r.error),
                       r.nodes, r.time_to_target ? 1 : 0, optionalNumber(r.time_to_target),
                       optionalNumber(r.final_accuracy), optionalNumber(r.model_accuracy), r.steps,
                       r.seconds, r.steps_per_s, r.wait_share, r.bytes_sent_per_node,
                       optionalNumber(r.mean_backups), optionalNumber(r.mean_staleness),
                       csvField(r.staleness_bound));
  }
  return out;
}

std::string markdownTable(const Report& report) {
  const std::string target = targetText(report.input);
  std::string out = fmt::format(
      "| variant | runs ok | reached {0} | time to {0} (s), median [min, max] | final accuracy "
      "| model accuracy | rounds or clocks / s | waiting share | sent per node | mean backups "
      "| staleness |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
      target);
  const std::string dash = "—";
  for (const auto& v : report.variants) {
    std::string ttt = dash;
    if (v.ttt_median) {
      ttt = v.reached > 1 ? fmt::format("{} [{}, {}]", shortNumber(*v.ttt_median),
                                        shortNumber(*v.ttt_min), shortNumber(*v.ttt_max))
                          : shortNumber(*v.ttt_median);
    } else if (v.ok_runs > 0) {
      ttt = "not reached";
    }
    std::string staleness = dash;
    if (v.mean_staleness) {
      staleness = fmt::format("{:.2f} (mean)", *v.mean_staleness);
    } else if (!v.staleness_bound.empty()) {
      staleness = v.staleness_bound == "inf" ? "bound ∞" : "bound " + v.staleness_bound;
    }
    const bool any = v.ok_runs > 0;
    out += fmt::format(
        "| {} | {}/{} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} |\n", v.variant, v.ok_runs,
        v.runs, v.reached, v.ok_runs, ttt, v.final_accuracy ? percent(*v.final_accuracy, 2) : dash,
        v.model_accuracy ? percent(*v.model_accuracy, 2) : dash,
        any ? shortNumber(v.steps_per_s) : dash, any ? percent(v.wait_share, 0) : dash,
        any ? bytesText(v.bytes_sent_per_node) : dash,
        v.mean_backups ? fmt::format("{:.2f}", *v.mean_backups) : dash, staleness);
  }
  return out;
}

PlotSet writePlots(const Report& report, const fs::path& folder, const std::string& gnuplot) {
  PlotSet plots;
  const fs::path dir = folder / "plots";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw ReportError(fmt::format("{}: cannot create: {}", dir.string(), ec.message()));
  const auto& variants = report.variants;
  const auto variantIndex = [&](const std::string& name) {
    for (size_t i = 0; i < variants.size(); ++i) {
      if (variants[i].variant == name) return i;
    }
    return size_t{0};
  };
  const std::string target = targetText(report.input);

  // Test accuracy of each run's reference node against its wall time.
  {
    const fs::path png = dir / "accuracy-vs-time.png";
    std::string script = scriptHeader(
        png, fmt::format("Test accuracy ({}) against wall time", referenceText(report)));
    script +=
        "set xlabel \"seconds since the node started training\"\n"
        "set ylabel \"test accuracy (%)\"\nset key bottom right\n";
    std::vector<std::string> curves;
    std::vector<bool> titled(variants.size(), false);
    for (size_t r = 0; r < report.runs.size(); ++r) {
      if (!report.runs[r].ok() || report.metrics[r].nodes.empty()) continue;
      const NodeMetrics& node = report.metrics[r].nodes.front();
      // The first life only: a rejoined life's clock restarts at 0, and how long the node was
      // down is in no file.
      std::string data;
      for (const auto& p : node.steps) {
        if (p.life == 0 && p.test_accuracy) {
          data += fmt::format("{:.6g} {:.6g}\n", p.time, 100 * *p.test_accuracy);
        }
      }
      if (node.has_final && node.lives == 1) {
        data += fmt::format("{:.6g} {:.6g}\n", node.final_seconds, 100 * node.final_accuracy);
      }
      if (data.empty()) continue;
      const size_t v = variantIndex(report.runs[r].variant);
      const std::string block = fmt::format("$run{}", r);
      script += fmt::format("{} << EOD\n{}EOD\n", block, data);
      curves.push_back(fmt::format(
          "{} using 1:2 with linespoints lc {} pt 7 ps 0.5 {}", block, colorSpec(v),
          titled[v] ? std::string("notitle") : "title " + gnuplotString(variants[v].variant)));
      titled[v] = true;
    }
    if (!curves.empty() && report.input.target_acc && *report.input.target_acc > 0) {
      curves.push_back(fmt::format("{:.6g} with lines dt 2 lc rgb \"black\" title {}",
                                   100 * *report.input.target_acc, gnuplotString(target)));
    }
    if (curves.empty()) {
      plots.skipped.push_back("accuracy-vs-time.png: no run has a test accuracy");
    } else {
      script += "plot " + fmt::format("{}", fmt::join(curves, ", \\\n     ")) + "\n";
      const fs::path gp = dir / "accuracy-vs-time.gp";
      writeScript(gp, script);
      runGnuplot(gnuplot, gp);
      plots.pngs.push_back(png);
    }
  }

  // Time to target: median bars with the spread over seeds.
  {
    const fs::path png = dir / "time-to-target.png";
    std::string script = scriptHeader(
        png, fmt::format("Time to {} test accuracy ({}): median, min and max over seeds", target,
                         referenceText(report)));
    script += fmt::format(
        "set ylabel \"seconds\"\nset style fill solid 0.5\nset boxwidth 0.6\n"
        "set xrange [-0.5:{}]\nset key top left\n",
        static_cast<double>(variants.size()) - 0.5);
    std::vector<std::string> tics;
    std::string data;
    for (size_t i = 0; i < variants.size(); ++i) {
      const auto& v = variants[i];
      tics.push_back(fmt::format("{} {}", gnuplotString(v.variant), i));
      if (v.ttt_median) {
        data += fmt::format("{} {:.6g} {:.6g} {:.6g} {}\n", i, *v.ttt_median, *v.ttt_min,
                            *v.ttt_max, colorOf(i));
      }
      if (v.reached < v.runs) {
        std::string label = v.ok_runs == 0   ? "failed"
                            : v.reached == 0 ? "not reached"
                                             : fmt::format("{}/{} reached", v.reached, v.runs);
        script += fmt::format("set label {} at {}, graph 0.04 center\n", gnuplotString(label), i);
      }
    }
    script += fmt::format("set xtics ({})\n", fmt::join(tics, ", "));
    if (data.empty()) {
      script += "set yrange [0:1]\nplot NaN notitle\n";
    } else {
      script += fmt::format(
          "set yrange [0:*]\nset offsets 0, 0, graph 0.12, 0\n$ttt << EOD\n{}EOD\n"
          "plot $ttt using 1:2:(0.6):5 with boxes lc rgb variable notitle, \\\n"
          "     $ttt using 1:2:3:4 with yerrorbars lc rgb \"black\" pt 0 "
          "title \"min and max over seeds\"\n",
          data);
    }
    const fs::path gp = dir / "time-to-target.gp";
    writeScript(gp, script);
    runGnuplot(gnuplot, gp);
    plots.pngs.push_back(png);
  }

  // Backup workers per round of the consensus variants: mean over nodes and seeds.
  {
    const fs::path png = dir / "backups-per-round.png";
    std::string script = scriptHeader(
        png, "Backup workers per round (consensus variants; mean over nodes and seeds)");
    script +=
        "set xlabel \"round\"\nset ylabel \"backup workers b_i\"\nset key top right\n"
        "set yrange [-0.05:*]\nset offsets 0, 0, 0.3, 0\n";
    std::vector<std::string> curves;
    for (size_t i = 0; i < variants.size(); ++i) {
      std::map<int64_t, std::pair<double, int>> sums;
      for (size_t r = 0; r < report.runs.size(); ++r) {
        if (report.runs[r].variant != variants[i].variant || !report.runs[r].ok()) continue;
        if (report.metrics[r].nodes.empty() ||
            report.metrics[r].nodes.front().mode != "consensus" ||
            report.metrics[r].nodes.size() < 2) {
          continue;
        }
        for (const auto& node : report.metrics[r].nodes) {
          for (const auto& p : node.steps) {
            if (!p.backups) continue;
            auto& [sum, count] = sums[p.step];
            sum += *p.backups;
            ++count;
          }
        }
      }
      if (sums.empty()) continue;
      std::string data;
      for (const auto& [step, sc] : sums) {
        data += fmt::format("{} {:.6g}\n", step, sc.first / sc.second);
      }
      script += fmt::format("$b{} << EOD\n{}EOD\n", i, data);
      curves.push_back(fmt::format("$b{} using 1:2 with lines lw 2 lc {} title {}", i, colorSpec(i),
                                   gnuplotString(variants[i].variant)));
    }
    if (curves.empty()) {
      plots.skipped.push_back("backups-per-round.png: no consensus run with neighbors");
    } else {
      script += "plot " + fmt::format("{}", fmt::join(curves, ", \\\n     ")) + "\n";
      const fs::path gp = dir / "backups-per-round.gp";
      writeScript(gp, script);
      runGnuplot(gnuplot, gp);
      plots.pngs.push_back(png);
    }
  }
  return plots;
}

std::string reportMarkdown(const Report& report, const PlotSet& plots) {
  const std::string target = targetText(report.input);
  std::string out =
      fmt::format("# Comparison: {}\n\n",
                  fs::absolute(report.input.folder).lexically_normal().filename().string());
  if (!report.input.command.empty()) {
    out += fmt::format("Made by:\n\n```\n{}\n```\n\n", report.input.command);
  }
  out += markdownTable(report);
  out += fmt::format(
      "\nHow to read it (medians over the seeds that finished; summary.csv has every run):\n\n"
      "- **time to {0}**: seconds from when node 0 started training (its metrics file opened, the "
      "cluster connected) to the first evaluation at which its test accuracy was at least {0}; "
      "its resolution is --eval-every rounds.\n"
      "- **final accuracy**: node 0's test accuracy at the end; **model accuracy**: that of the "
      "average of all final models (consensus) or of the model as the owners hold it (PS).\n"
      "- **rounds or clocks / s**: per node; the single variant runs as many rounds as all nodes "
      "together, so its rate is per step of the whole job.\n"
      "- **waiting share**: time a node spent waiting for others / its run time, mean over nodes.\n"
      "- **sent per node**: bytes each node sent to all peers over the run, mean over nodes.\n"
      "- **mean backups**: consensus b_i (neighbors not waited for) over all rounds and nodes; "
      "**staleness**: consensus: mean staleness (rounds) of the models mixed in; PS: the bound.\n",
      target);
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
    if (line.find("\"round\"") == std::string::npos && line.find("\"clock\"") == std::string::npos)
      continue;
    try {
      JsonObject object = JsonObject::parse(line);
      const std::string event = object.string("event").value_or("");
      if (event != "round" && event != "clock") continue;
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
