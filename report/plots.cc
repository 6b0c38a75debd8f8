#include "report/plots.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "report/report.h"
#include "report/sparse_table.h"

extern char** environ;

namespace chorus::report {
namespace fs = std::filesystem;
namespace {

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

// Writes the script and draws it.
void draw(const std::string& gnuplot, const fs::path& gp, const std::string& script,
          const fs::path& png, PlotSet& plots) {
  writeScript(gp, script);
  runGnuplot(gnuplot, gp);
  plots.pngs.push_back(png);
}

std::string colorSpec(uint32_t rgb) {
  return fmt::format("rgb \"#{:06x}\"", rgb);
}

// 64-bit FNV-1a: a hash that is the same on every machine and in every build (std::hash is not).
uint64_t stableHash(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// The number after `prefix` in `name` ("ps:ssp:3" -> 3), or nullopt.
std::optional<uint64_t> numberAfter(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return std::nullopt;
  std::string_view digits = name.substr(prefix.size());
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) {
    return std::nullopt;
  }
  return n;
}

// Ten colors that stay apart on white (gnuplot's own cycle has a pale yellow).
constexpr uint32_t kPalette[] = {0x1f77b4, 0xd62728, 0x2ca02c, 0xff7f0e, 0x9467bd,
                                 0x8c564b, 0xe377c2, 0x17becf, 0xbcbd22, 0x7f7f7f};
constexpr int kOtherPoints[] = {4, 6, 8, 10, 12, 14};

// The reference node's test accuracy (%) against its first life's clock, as the accuracy plot
// draws it. A rejoined life's clock restarts at 0, and how long the node was down is in no file.
// A sparse model's curve is node 0's evaluations of the first split (MRR or RMSE as they are).
std::vector<std::pair<double, double>> accuracyCurve(const NodeMetrics& node) {
  std::vector<std::pair<double, double>> curve;
  if (node.sparse) {
    for (const QualityPoint& p : node.sparse->quality)
      curve.emplace_back(p.time, p.value);
    return curve;
  }
  for (const auto& p : node.steps) {
    if (p.life == 0 && p.test_accuracy) curve.emplace_back(p.time, 100 * *p.test_accuracy);
  }
  if (node.has_final && node.lives == 1) {
    curve.emplace_back(node.final_seconds, 100 * node.final_accuracy);
  }
  return curve;
}

// The curve's height at `x`: linear between its points, flat beyond its ends.
double heightAt(const std::vector<std::pair<double, double>>& curve, double x) {
  if (x <= curve.front().first) return curve.front().second;
  for (size_t i = 1; i < curve.size(); ++i) {
    const auto& [x1, y1] = curve[i];
    if (x <= x1) {
      const auto& [x0, y0] = curve[i - 1];
      return x1 > x0 ? y0 + (y1 - y0) * (x - x0) / (x1 - x0) : y1;
    }
  }
  return curve.back().second;
}

// The point type of an event mark; the key explains each.
int eventPoint(RunEvent::Kind kind) {
  switch (kind) {
    case RunEvent::Kind::kRejoin:
      return 6;  // open circle
    case RunEvent::Kind::kDropped:
      return 12;  // open diamond
    default:
      return 2;  // cross: the node's metrics stop
  }
}

std::string eventKey(int point) {
  switch (point) {
    case 6:
      return "node rejoined";
    case 12:
      return "PS dropped a node (its updates lost)";
    default:
      return "node crashed or stopped (its metrics end)";
  }
}

// An event drawn on the accuracy plot.
struct EventMark {
  double x = 0;
  uint32_t rgb = 0;
  std::string label;
};
// The rows of event labels, in graph coordinates: the top 20% that `set offsets` keeps free.
constexpr double kLabelTop = 0.965;
constexpr double kLabelStep = 0.045;
constexpr size_t kLabelRows = 4;

// What the quality plot shows: test accuracy (image models) or the first split's MRR or RMSE
// (sparse models; their evaluations, at --eval-every-epochs).
struct QualityAxis {
  std::string file;    // "accuracy-vs-time"
  std::string title;   // "Test accuracy"
  std::string ylabel;  // "test accuracy (%)"
  std::string key;     // where the key goes
  std::string xlabel;
};

QualityAxis qualityAxis(const Report& report) {
  if (!isSparseReport(report)) {
    return {"accuracy-vs-time", "Test accuracy", "test accuracy (%)", "bottom right",
            "seconds since the node started training"};
  }
  std::string split = "valid", metric;
  for (const auto& run : report.metrics) {
    if (!run.nodes.empty() && run.nodes.front().sparse &&
        !run.nodes.front().sparse->metric.empty()) {
      split = run.nodes.front().sparse->split;
      metric = run.nodes.front().sparse->metric;
      break;
    }
  }
  const std::string name = fmt::format("{} {}", split, qualityName(metric));
  std::string title = name;
  title[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(title[0])));
  return {"quality-vs-time", title, name, metric == "rmse" ? "top right" : "bottom right",
          "seconds of node 0's training (its evaluations left out)"};
}

void accuracyPlot(const Report& report, const fs::path& dir, const std::string& gnuplot,
                  PlotSet& plots) {
  const QualityAxis axis = qualityAxis(report);
  const fs::path png = dir / (axis.file + ".png");
  std::string script = scriptHeader(
      png, fmt::format("{} ({}) against wall time", axis.title, referenceNodeName(report)));
  script += fmt::format("set xlabel {}\nset ylabel {}\nset key {}\n", gnuplotString(axis.xlabel),
                        gnuplotString(axis.ylabel), axis.key);
  script +=
      // Event labels on a white box, so that a curve running through one does not hide it.
      "set style textbox opaque noborder\n";
  std::vector<std::string> curves;
  std::vector<std::string> titled;
  std::set<int> kinds_marked;  // the point types of the marks drawn, for the key
  std::vector<EventMark> marks;
  double x_max = 0;                  // the curves' last time
  std::map<std::string, int> seeds;  // runs per variant
  for (const RunSummary& run : report.runs)
    ++seeds[run.variant];
  for (size_t r = 0; r < report.runs.size(); ++r) {
    if (!report.runs[r].ok() || report.metrics[r].nodes.empty()) continue;
    const auto curve = accuracyCurve(report.metrics[r].nodes.front());
    if (curve.empty()) continue;
    for (const auto& point : curve)
      x_max = std::max(x_max, point.first);
    const std::string& name = report.runs[r].variant;
    const VariantStyle style = variantStyle(name);
    std::string data;
    for (const auto& [x, y] : curve)
      data += fmt::format("{:.6g} {:.6g}\n", x, y);
    script += fmt::format("$run{} << EOD\n{}EOD\n", r, data);
    const bool first = std::find(titled.begin(), titled.end(), name) == titled.end();
    curves.push_back(fmt::format("$run{} using 1:2 with linespoints lc {} pt {} ps 0.6 {}", r,
                                 colorSpec(style.rgb), style.point_type,
                                 first ? "title " + gnuplotString(name) : std::string("notitle")));
    if (first) titled.push_back(name);

    // The run's crashes, rejoins and drops: a mark on the curve in the variant's color; the
    // dashed line and the label come after the loop, when every run's marks are known.
    std::string events;
    for (const RunEvent& e : report.events[r]) {
      if (!e.marked()) continue;
      const double x = *e.time, y = heightAt(curve, x);
      const int point = eventPoint(e.kind);
      kinds_marked.insert(point);
      events += fmt::format("{:.6g} {:.6g} {}\n", x, y, point);
      // With several seeds of the variant, the label says which run it was.
      marks.push_back(EventMark{
          x, style.rgb,
          seeds[name] > 1 ? fmt::format("seed {}: {}", report.runs[r].seed, e.label) : e.label});
    }
    if (!events.empty()) {
      script += fmt::format("$events{} << EOD\n{}EOD\n", r, events);
      curves.push_back(
          fmt::format("$events{} using 1:2:3 with points pt variable ps 2.5 lw 2 lc {} notitle", r,
                      colorSpec(style.rgb)));
    }
  }
  // Labels go in rows above the data (the y range gets that much headroom), each at the top of
  // its dashed line: marks next to each other in time get different rows, so the labels of
  // several runs that crashed at about the same time stay readable.
  std::sort(marks.begin(), marks.end(),
            [](const EventMark& a, const EventMark& b) { return a.x < b.x; });
  for (size_t k = 0; k < marks.size(); ++k) {
    const double row = kLabelTop - kLabelStep * static_cast<double>(k % kLabelRows);
    // Right of the middle a label reads leftwards from its line, so the image's edge cannot cut
    // it off.
    const bool right = marks[k].x > 0.6 * x_max;
    script += fmt::format(
        "set arrow from first {0:.6g}, graph 0 to first {0:.6g}, graph {1:.3g} nohead dt 2 lw 1.5 "
        "lc {2}\n"
        "set label {3} at first {0:.6g}, graph {1:.3g} offset char {4}, char 0 {5} tc {2} boxed "
        "front\n",
        marks[k].x, row, colorSpec(marks[k].rgb), gnuplotString(marks[k].label),
        right ? "-0.5" : "0.5", right ? "right" : "left");
  }
  if (!marks.empty()) script += "set offsets 0, 0, graph 0.25, 0\n";
  for (int point : kinds_marked) {
    curves.push_back(fmt::format("NaN with points pt {} ps 2 lw 2 lc rgb \"black\" title {}", point,
                                 gnuplotString(eventKey(point))));
  }
  if (!curves.empty() && report.input.quality_target) {
    curves.push_back(fmt::format("{:.6g} with lines dt 2 lc rgb \"black\" title {}",
                                 report.input.quality_target->value,
                                 gnuplotString(targetName(report))));
  } else if (!curves.empty() && hasTarget(report) && report.input.target_acc) {
    curves.push_back(fmt::format("{:.6g} with lines dt 2 lc rgb \"black\" title {}",
                                 100 * *report.input.target_acc,
                                 gnuplotString(targetName(report))));
  }
  if (curves.empty()) {
    plots.skipped.push_back(fmt::format("{}.png: no run has a {}", axis.file, axis.ylabel));
    return;
  }
  script += "plot " + fmt::format("{}", fmt::join(curves, ", \\\n     ")) + "\n";
  draw(gnuplot, dir / (axis.file + ".gp"), script, png, plots);
}

// Median bars with the spread over seeds; drawn only when the compare had a target.
void timeToTargetPlot(const Report& report, const fs::path& dir, const std::string& gnuplot,
                      PlotSet& plots) {
  const auto& variants = report.variants;
  const fs::path png = dir / "time-to-target.png";
  std::string script = scriptHeader(
      png, fmt::format("Time to {}{} ({}): median, min and max over seeds", targetName(report),
                       isSparseReport(report) ? "" : " test accuracy", referenceNodeName(report)));
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
      data += fmt::format("{} {:.6g} {:.6g} {:.6g} {}\n", i, *v.ttt_median, *v.ttt_min, *v.ttt_max,
                          variantStyle(v.variant).rgb);
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
  draw(gnuplot, dir / "time-to-target.gp", script, png, plots);
}

// Backup workers per round of the consensus variants, mean over nodes and seeds: the raw series
// is noisy (b_i jumps between neighbors from round to round), so a moving average carries the
// trend and the raw series stays behind it, thin and light.
void backupsPlot(const Report& report, const fs::path& dir, const std::string& gnuplot,
                 PlotSet& plots) {
  const auto& variants = report.variants;
  const fs::path png = dir / "backups-per-round.png";
  std::string script = scriptHeader(
      png,
      "Backup workers b_i per round: the neighbors node i did not wait for (consensus variants; "
      "mean over nodes and seeds)");
  script += fmt::format(
      "set xlabel \"round\"\nset ylabel \"backup workers per round (neighbors not waited for)\"\n"
      "set key top right\nset yrange [-0.05:*]\nset offsets 0, 0, 0.3, 0\n");
  std::vector<std::string> curves;
  for (size_t i = 0; i < variants.size(); ++i) {
    std::map<int64_t, std::pair<double, int>> sums;
    for (size_t r = 0; r < report.runs.size(); ++r) {
      if (report.runs[r].variant != variants[i].variant || !report.runs[r].ok()) continue;
      if (report.metrics[r].nodes.empty() || report.metrics[r].nodes.front().mode != "consensus" ||
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
    std::vector<double> means;
    means.reserve(sums.size());
    for (const auto& [step, sc] : sums)
      means.push_back(sc.first / sc.second);
    const std::vector<double> smooth = movingAverage(means, kBackupsWindow);
    std::string data;
    size_t k = 0;
    for (const auto& [step, sc] : sums) {
      data += fmt::format("{} {:.6g} {:.6g}\n", step, means[k], smooth[k]);
      ++k;
    }
    const uint32_t rgb = variantStyle(variants[i].variant).rgb;
    script += fmt::format("$b{} << EOD\n{}EOD\n", i, data);
    // "#AARRGGBB": AA is the transparency, so the raw series shows as a light shade of the color.
    curves.push_back(
        fmt::format("$b{} using 1:2 with lines lw 1 lc rgb \"#80{:06x}\" notitle", i, rgb));
    curves.push_back(fmt::format("$b{} using 1:3 with lines lw 3 lc {} title {}", i, colorSpec(rgb),
                                 gnuplotString(variants[i].variant)));
  }
  if (curves.empty()) {
    plots.skipped.push_back("backups-per-round.png: no consensus run with neighbors");
    return;
  }
  curves.push_back(
      "NaN with lines lw 1 lc rgb \"#80000000\" title \"thin: each round (mean over nodes)\"");
  curves.push_back(fmt::format(
      "NaN with lines lw 3 lc rgb \"black\" title \"thick: moving average over {} rounds\"",
      kBackupsWindow));
  script += "plot " + fmt::format("{}", fmt::join(curves, ", \\\n     ")) + "\n";
  draw(gnuplot, dir / "backups-per-round.gp", script, png, plots);
}

}  // namespace

VariantStyle variantStyle(std::string_view variant) {
  if (variant == "single") return {0x1f77b4, 7};
  if (variant == "ps:bsp") return {0xd62728, 5};
  if (variant == "ps:async") return {0xe377c2, 11};
  if (auto n = numberAfter(variant, "ps:ssp:")) {
    // ps:ssp:2, the one the demo runs, gets the family's plain green.
    constexpr uint32_t kGreens[] = {0x41ab5d, 0x006d2c, 0x2ca02c};
    return {kGreens[*n % std::size(kGreens)], 9};
  }
  // The sparse PS techniques (ps:TECHNIQUE[:BOUND]): a color per technique, a shade per bound.
  constexpr std::pair<std::string_view, uint32_t> kTechniques[] = {{"ps:classic", 0xd62728},
                                                                   {"ps:lapse", 0x17becf},
                                                                   {"ps:nups", 0x8c564b},
                                                                   {"ps:auto", 0xbcbd22}};
  for (const auto& [prefix, rgb] : kTechniques) {
    if (variant == prefix) return {rgb, 5};
    if (variant.starts_with(prefix) && variant.size() > prefix.size() &&
        variant[prefix.size()] == ':') {
      // A bound darkens the technique's color by a step the name picks.
      const uint32_t step = 1 + static_cast<uint32_t>(stableHash(variant) % 3);
      const uint32_t base = rgb;  // clang 14 cannot capture a structured binding
      const auto shade = [base, step](int shift) {
        const uint32_t c = (base >> shift) & 0xff;
        return (c * (5 - step) / 5) << shift;
      };
      return {shade(16) | shade(8) | shade(0), 9};
    }
  }
  if (variant == "consensus:wait-all") return {0xff7f0e, 13};
  if (variant == "consensus:dynamic") return {0x9467bd, 7};
  if (variant.starts_with("consensus:dynamic:")) {
    constexpr uint32_t kPurples[] = {0x6a3d9a, 0xb07cc6};
    return {kPurples[stableHash(variant) % std::size(kPurples)], 7};
  }
  if (auto b = numberAfter(variant, "consensus:static:")) {
    constexpr uint32_t kStatic[] = {0x8c564b, 0x17becf, 0x393b79};
    return {kStatic[*b % std::size(kStatic)], 5};
  }
  if (variant.starts_with("consensus:deadline:")) {
    constexpr uint32_t kDeadline[] = {0xbcbd22, 0x7f7f7f};
    return {kDeadline[stableHash(variant) % std::size(kDeadline)], 9};
  }
  const uint64_t h = stableHash(variant);
  return {kPalette[h % std::size(kPalette)],
          kOtherPoints[(h / std::size(kPalette)) % std::size(kOtherPoints)]};
}

std::vector<double> movingAverage(const std::vector<double>& values, int window) {
  const size_t n = values.size();
  const size_t half = static_cast<size_t>(std::max(window, 1) / 2);
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i)
    prefix[i + 1] = prefix[i] + values[i];
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t lo = i >= half ? i - half : 0;
    const size_t hi = std::min(n, i + half + 1);
    out[i] = (prefix[hi] - prefix[lo]) / static_cast<double>(hi - lo);
  }
  return out;
}

PlotSet writePlots(const Report& report, const fs::path& folder, const std::string& gnuplot) {
  PlotSet plots;
  const fs::path dir = folder / "plots";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw ReportError(fmt::format("{}: cannot create: {}", dir.string(), ec.message()));
  accuracyPlot(report, dir, gnuplot, plots);
  if (hasTarget(report)) {
    timeToTargetPlot(report, dir, gnuplot, plots);
  } else {
    // A plot of a target nobody set says nothing: none, and no stale one from an earlier report.
    fs::remove(dir / "time-to-target.png", ec);
    fs::remove(dir / "time-to-target.gp", ec);
  }
  backupsPlot(report, dir, gnuplot, plots);
  return plots;
}

}  // namespace chorus::report
