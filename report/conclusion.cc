#include "report/conclusion.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "report/report.h"
#include "report/text_format.h"

namespace chorus::report {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// Below this ratio two medians are called level: the seeds of one variant spread by more than
// that on a shared machine (docs/ps-experiment.md).
constexpr double kLevel = 1.05;

std::optional<double> median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// What a PS variant is, by its bound; "" for the others.
std::string kindOf(const VariantEvidence& v) {
  if (v.staleness_bound.empty()) return "";
  if (v.staleness_bound == "0") return "bsp";
  if (v.staleness_bound == "inf") return "async";
  return "ssp";
}

std::string seconds(double s) {
  return shortNumber(s) + " s";
}

std::string ratio(double r) {
  return fmt::format("{:.2f}x", r);
}

std::string updatesText(const VariantEvidence& v) {
  if (!v.updates_to_target) return "—";
  return fmt::format("{}{:.0f}", v.updates_estimated ? "about " : "", *v.updates_to_target);
}

std::string stalenessText(const VariantEvidence& v) {
  if (v.staleness_bound == "inf") return "no bound";
  if (!v.staleness_bound.empty()) return "bound " + v.staleness_bound;
  if (v.mean_staleness) return fmt::format("mean staleness {:.2f}", *v.mean_staleness);
  return "";
}

// The whole job's updates per second on the way to the target (every node's steps): the pace
// that, times what an update is worth, makes the time to target. Per-node rates alone mislead
// when the two variants run on different numbers of nodes (one node against a cluster).
std::optional<double> jobRate(const VariantEvidence& v) {
  if (!v.updates_to_target || !v.time_to_target || *v.time_to_target <= 0) return std::nullopt;
  return *v.updates_to_target / *v.time_to_target;
}

// "ran 9.71 steps/s per node against 5.65, 38.8 updates/s over all its nodes against 22.6,
// waiting 24% of its time against 52%"
std::string paceText(const VariantEvidence& w, const VariantEvidence& r) {
  std::string job;
  if (const auto wr = jobRate(w), rr = jobRate(r); wr && rr) {
    job = fmt::format(", {} updates/s over all its nodes against {}", shortNumber(*wr),
                      shortNumber(*rr));
  }
  return fmt::format("{} steps/s per node against {}{}, waiting {} of its time against {}",
                     shortNumber(w.steps_per_s), shortNumber(r.steps_per_s), job,
                     percent(w.wait_share, 0), percent(r.wait_share, 0));
}

// "3185 updates against 2403 (bound 3 against bound 0)"
std::string updatesAgainst(const VariantEvidence& w, const VariantEvidence& r) {
  std::string out = fmt::format("{} updates against {}", updatesText(w), updatesText(r));
  const std::string ws = stalenessText(w), rs = stalenessText(r);
  if (!ws.empty() && !rs.empty() && ws != rs) out += fmt::format(" ({} against {})", ws, rs);
  return out;
}

// Why `w` reached the target before `r`: its pace (steps per second, eaten by waiting) or what
// its updates were worth (how many it needed, raised by staleness).
std::string whyText(const VariantEvidence& w, const VariantEvidence& r, bool level) {
  if (level) {
    return fmt::format("{} ran {}, and needed {}.", w.variant, paceText(w, r),
                       updatesAgainst(w, r));
  }
  double pace = r.steps_per_s > 0 ? w.steps_per_s / r.steps_per_s : 1;
  if (const auto wr = jobRate(w), rr = jobRate(r); wr && rr && *rr > 0) pace = *wr / *rr;
  std::optional<double> worth;  // > 1: w needed fewer updates
  if (w.updates_to_target && r.updates_to_target && *w.updates_to_target > 0)
    worth = *r.updates_to_target / *w.updates_to_target;
  if (pace >= kLevel && worth && *worth < 1 / kLevel) {
    return fmt::format(
        "It won on pace: {} ran {}; that outweighed needing more updates to get there, {}.",
        w.variant, paceText(w, r), updatesAgainst(w, r));
  }
  if (pace >= kLevel) {
    return fmt::format("It won on pace: {} ran {}, and needed {}.", w.variant, paceText(w, r),
                       worth ? updatesAgainst(w, r) : std::string("no count of its updates"));
  }
  if (worth && *worth >= kLevel) {
    return fmt::format("It won on what an update is worth: {} needed {}, at {} pace ({}).",
                       w.variant, updatesAgainst(w, r),
                       pace <= 1 / kLevel ? "a lower" : "about the same", paceText(w, r));
  }
  return fmt::format(
      "Neither pace ({} ran {}) nor updates ({}) separate the two by more than 5%: the medians "
      "come from different seeds, rerun with more of them.",
      w.variant, paceText(w, r), worth ? updatesAgainst(w, r) : std::string("not counted"));
}

std::string bytesSentence(const VariantEvidence& w, const VariantEvidence& r) {
  if (w.bytes_per_node <= 0 && r.bytes_per_node <= 0) return "";
  return fmt::format(" A node of {} sent {} {}, against {} for {}.", w.variant,
                     bytesText(w.bytes_per_node),
                     w.bytes_whole_run ? "over the whole run" : "until node 0 reached the target",
                     bytesText(r.bytes_per_node), r.variant);
}

const VariantEvidence* fastestOfKind(const std::vector<const VariantEvidence*>& ranked,
                                     const std::string& kind) {
  for (const VariantEvidence* v : ranked) {
    if (kindOf(*v) == kind) return v;
  }
  return nullptr;
}

// The question of the regime map (docs/ps-experiment.md) asked of a PS comparison that ran BSP,
// some SSP bound and async, each of which reached the target: did bounded staleness beat both
// ends, and by how much. The why is in the sentences before it.
std::string mapSentence(const std::vector<const VariantEvidence*>& ranked) {
  const VariantEvidence* bsp = fastestOfKind(ranked, "bsp");
  const VariantEvidence* ssp = fastestOfKind(ranked, "ssp");
  const VariantEvidence* async = fastestOfKind(ranked, "async");
  if (!bsp || !ssp || !async) return "";
  const double over_bsp = *bsp->time_to_target / *ssp->time_to_target;
  const double over_async = *async->time_to_target / *ssp->time_to_target;
  std::string out;
  if (over_bsp > 1 && over_async >= kLevel) {
    out = fmt::format(
        " Bounded staleness beat both ends: {} was {} sooner than async and {} sooner "
        "than BSP",
        ssp->variant, ratio(over_async), ratio(over_bsp));
    out += over_bsp < 1.3 ? ", short of the 1.3x over BSP the regime map asks for." : ".";
  } else if (over_async >= 1 / kLevel && over_async < kLevel) {
    out = fmt::format(
        " Bounded staleness did not beat both ends: {} was level with async{}.", ssp->variant,
        over_bsp >= kLevel ? fmt::format(", {} sooner than BSP", ratio(over_bsp)) : std::string());
  } else if (over_async < 1) {
    out = fmt::format(" Bounded staleness did not beat both ends: async was {} sooner than {}{}.",
                      ratio(1 / over_async), ssp->variant,
                      over_bsp >= 1 ? fmt::format(", which was {} sooner than BSP", ratio(over_bsp))
                                    : fmt::format(", and BSP {} sooner", ratio(1 / over_bsp)));
  } else {
    out = fmt::format(" Bounded staleness did not beat both ends: BSP was {} sooner than {}.",
                      ratio(1 / over_bsp), ssp->variant);
  }
  return out + " (docs/ps-experiment.md maps where each wins on one machine.)";
}

}  // namespace

SpentToTarget spentUntil(const RunMetrics& metrics, double until) {
  SpentToTarget spent;
  double bytes = 0;
  size_t nodes = 0;
  for (const NodeMetrics& node : metrics.nodes) {
    if (node.steps.empty()) continue;
    ++nodes;
    // Only the first life's times count from the run's start (NodeMetrics).
    for (const StepPoint& p : node.steps) {
      if (p.life != 0 || p.time > until) continue;
      spent.updates += 1;
      bytes += p.bytes_sent;
    }
  }
  if (nodes > 0) spent.bytes_per_node = bytes / static_cast<double>(nodes);
  return spent;
}

std::vector<VariantEvidence> gatherEvidence(const Report& report) {
  std::vector<VariantEvidence> out;
  for (const VariantSummary& summary : report.variants) {
    VariantEvidence v;
    v.variant = summary.variant;
    v.ok_runs = summary.ok_runs;
    v.reached = summary.reached;
    v.steps_per_s = summary.steps_per_s;
    v.wait_share = summary.wait_share;
    v.staleness_bound = summary.staleness_bound;
    v.mean_staleness = summary.mean_staleness;
    v.fastest = summary.ttt_min;
    v.slowest = summary.ttt_max;
    std::vector<double> times, updates, bytes, whole_run_bytes;
    for (size_t r = 0; r < report.runs.size(); ++r) {
      const RunSummary& run = report.runs[r];
      if (run.variant != summary.variant || !run.ok()) continue;
      whole_run_bytes.push_back(run.bytes_sent_per_node);
      if (!run.time_to_target) {
        times.push_back(kInfinity);
        continue;
      }
      const double t = *run.time_to_target;
      times.push_back(t);
      const SpentToTarget spent = spentUntil(report.metrics[r], t);
      if (spent.updates > 0) {
        updates.push_back(spent.updates);
        bytes.push_back(spent.bytes_per_node);
      } else if (run.sparse && run.steps_per_s > 0) {
        updates.push_back(run.steps_per_s * run.nodes * t);
        v.updates_estimated = true;
      }
    }
    if (auto t = median(times); t && std::isfinite(*t)) v.time_to_target = t;
    v.updates_to_target = median(updates);
    if (!bytes.empty()) {
      v.bytes_per_node = *median(bytes);
    } else {
      v.bytes_per_node = median(whole_run_bytes).value_or(0);
      v.bytes_whole_run = true;
    }
    out.push_back(std::move(v));
  }
  return out;
}

std::string conclusionText(const std::vector<VariantEvidence>& variants,
                           const std::string& target) {
  std::vector<const VariantEvidence*> ranked, missed;
  for (const VariantEvidence& v : variants) {
    if (v.ok_runs == 0) continue;
    (v.time_to_target ? ranked : missed).push_back(&v);
  }
  if (ranked.empty() && missed.empty()) return "";
  std::vector<std::string> missed_names;
  for (const VariantEvidence* v : missed)
    missed_names.push_back(fmt::format("{} ({}/{})", v->variant, v->reached, v->ok_runs));
  if (ranked.empty()) {
    return fmt::format(
        "Conclusion: no variant reached {} in at least half of its runs ({} reached it); compare "
        "the final accuracies, or give the runs more steps.",
        target, fmt::join(missed_names, ", "));
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const VariantEvidence* a, const VariantEvidence* b) {
                     return *a->time_to_target < *b->time_to_target;
                   });
  const VariantEvidence& w = *ranked.front();
  const auto runs = [](const VariantEvidence& v) {
    return v.ok_runs == 1 ? std::string("one run") : fmt::format("median of {} runs", v.ok_runs);
  };
  std::string out;
  const std::string missed_sentence =
      missed.empty() ? ""
                     : fmt::format(" {} did not reach it in at least half of their runs.",
                                   fmt::join(missed_names, ", "));
  if (ranked.size() == 1) {
    out = fmt::format("Conclusion: {} reached {} first, in {} ({}).{}", w.variant, target,
                      seconds(*w.time_to_target), runs(w), missed_sentence);
    return out;
  }
  const VariantEvidence& r = *ranked[1];
  const double speedup = *r.time_to_target / *w.time_to_target;
  if (speedup < kLevel) {
    out = fmt::format(
        "Conclusion: {} and {} reached {} level, in {} and {} ({}): less than 5% apart, within "
        "what seeds vary by.",
        w.variant, r.variant, target, seconds(*w.time_to_target), seconds(*r.time_to_target),
        runs(w));
  } else {
    out = fmt::format("Conclusion: {} reached {} first, in {} ({}), {} sooner than {} ({})",
                      w.variant, target, seconds(*w.time_to_target), runs(w), ratio(speedup),
                      r.variant, seconds(*r.time_to_target));
    if (ranked.size() > 2) {
      const VariantEvidence& last = *ranked.back();
      out += fmt::format(" and {} sooner than {} ({})",
                         ratio(*last.time_to_target / *w.time_to_target), last.variant,
                         seconds(*last.time_to_target));
    }
    out += ".";
    // Overlapping seeds: the slowest run of the winner after the fastest of the runner-up.
    if (w.slowest && r.fastest && *w.slowest > *r.fastest) {
      out += fmt::format(" Their seeds overlap ({} took up to {}, {} as little as {}).", w.variant,
                         seconds(*w.slowest), r.variant, seconds(*r.fastest));
    }
  }
  out += missed_sentence;
  out += " " + whyText(w, r, speedup < kLevel);
  out += bytesSentence(w, r);
  out += mapSentence(ranked);
  return out;
}

std::string conclusion(const Report& report) {
  if (!hasTarget(report)) return "";
  return conclusionText(gatherEvidence(report), targetName(report));
}

}  // namespace chorus::report
