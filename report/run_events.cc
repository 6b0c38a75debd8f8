#include "report/run_events.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

namespace chorus::report {
namespace {

// A training step is a "step" in every mode's events (run::kStepName): the metrics of consensus
// and single runs said "round" and PS runs "clock" before, and the report reads those files too,
// but says "step" whatever wrote them.
constexpr std::string_view kStepWord = "step";

// When the reference node's first life reached `step` (its first step line at or after it):
// the plot's clock. Later lives restart their clock at 0, so they cannot place anything.
std::optional<double> referenceTimeAt(const NodeMetrics& ref, int64_t step) {
  for (const StepPoint& p : ref.steps) {
    if (p.life != 0) break;
    if (p.step >= step) return p.time;
  }
  return std::nullopt;
}

std::string plural(uint64_t n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

// The crash or stop that ends a life without a `final` line, and the rejoin that begins a
// later life.
void lifeEvents(const NodeMetrics& node, const NodeMetrics& ref, std::vector<RunEvent>& events) {
  const std::string_view word = kStepWord;
  for (int life = 0; life < node.lives; ++life) {
    const NodeLife info =
        static_cast<size_t>(life) < node.life_info.size() ? node.life_info[life] : NodeLife{};
    int64_t count = 0, last = -1;
    double last_time = 0;
    for (const StepPoint& p : node.steps) {
      if (p.life != life) continue;
      ++count;
      last = p.step;
      last_time = p.time;
    }
    if (life > 0) {
      RunEvent e;
      e.kind = RunEvent::Kind::kRejoin;
      e.node = node.node;
      e.step = info.first_step;
      e.time = referenceTimeAt(ref, info.first_step);
      e.text = fmt::format("node {} rejoined at {} {}", node.node, word, info.first_step);
      e.label = fmt::format("node {} rejoined ({} {})", node.node, word, info.first_step);
      events.push_back(std::move(e));
    }
    if (info.has_final) continue;
    RunEvent e;
    e.node = node.node;
    e.step = last;
    e.crash_term = info.crash_step;
    // An injected crash ends the process right after its step S, before the line of that step
    // is written: exactly S - 1 step lines. Anything else is no proof the term fired.
    const bool injected = info.crash_step && count == *info.crash_step - 1;
    e.kind = injected ? RunEvent::Kind::kCrash : RunEvent::Kind::kStopped;
    // The first life's clock is the plot's (all nodes start when the cluster connects); a later
    // one is placed where the reference node was at that step.
    if (count > 0)
      e.time = life == 0 ? std::optional<double>(last_time) : referenceTimeAt(ref, last);
    // The plot's label names the last step written, where the node's line ends.
    const std::string at = count == 0 ? "" : fmt::format(" ({} {})", word, last);
    const std::string when = count == 0 ? fmt::format("before its first {}", word)
                             : life == 0
                                 ? fmt::format("after {} {}, at {:.1f} s", word, last, last_time)
                                 : fmt::format("after {} {}", word, last);
    if (injected) {
      e.text = fmt::format("node {} crashed {} (injected: crash:{}@{})", node.node, when, node.node,
                           *info.crash_step);
      e.label = fmt::format("node {} crashed{}", node.node, at);
    } else {
      e.text = fmt::format("node {} stopped {}{} with no final line (killed, or crashed{})",
                           node.node, when, count > 0 && life == 0 ? "," : "",
                           info.crash_step ? fmt::format("; not at its crash:{}@{} step", node.node,
                                                         *info.crash_step)
                                           : std::string());
      e.label = fmt::format("node {} stopped{}", node.node, at);
    }
    events.push_back(std::move(e));
  }
}

}  // namespace

std::vector<RunEvent> runEvents(const RunMetrics& metrics) {
  std::vector<RunEvent> events;
  if (metrics.nodes.empty()) return events;
  const NodeMetrics& ref = metrics.nodes.front();
  for (const NodeMetrics& node : metrics.nodes)
    lifeEvents(node, ref, events);
  std::set<uint32_t> ended;  // nodes whose files show how they went down
  for (const RunEvent& e : events) {
    if (e.kind == RunEvent::Kind::kCrash || e.kind == RunEvent::Kind::kStopped)
      ended.insert(e.node);
  }

  // What the owners (PS) and neighbors say in their `final` lines.
  std::map<uint32_t, std::pair<int64_t, int64_t>> dropped;  // worker -> first clock lost, range
  std::set<std::tuple<uint32_t, int64_t, int64_t>> gaps;
  std::set<uint32_t> departed;
  uint64_t failed_pushes = 0, failed_pulls = 0;
  for (const NodeMetrics& node : metrics.nodes) {
    for (const LostUpdates& lost : node.lost_updates) {
      if (lost.to_clock) {
        gaps.emplace(lost.node, lost.from_clock, *lost.to_clock);
        continue;
      }
      auto [it, inserted] = dropped.emplace(lost.node, std::pair{lost.from_clock, lost.from_clock});
      it->second.first = std::min(it->second.first, lost.from_clock);
      it->second.second = std::max(it->second.second, lost.from_clock);
    }
    departed.insert(node.departed_peers.begin(), node.departed_peers.end());
    if (node.failed_pushes && *node.failed_pushes > 0)
      failed_pushes += static_cast<uint64_t>(*node.failed_pushes);
    if (node.failed_pulls && *node.failed_pulls > 0)
      failed_pulls += static_cast<uint64_t>(*node.failed_pulls);
  }
  for (const auto& [worker, range] : dropped) {
    RunEvent e;
    e.kind = RunEvent::Kind::kDropped;
    e.node = worker;
    e.step = range.first;
    e.to_step = range.second;
    // Its crash, when the files show one, is the mark on the plot already.
    if (!ended.contains(worker)) e.time = referenceTimeAt(ref, range.first);
    e.text = range.first == range.second
                 ? fmt::format(
                       "PS owners dropped node {} at step {}: its updates from step {} "
                       "on are lost",
                       worker, range.first, range.first)
                 : fmt::format(
                       "PS owners dropped node {} at steps {}-{}: its updates from then "
                       "on are lost",
                       worker, range.first, range.second);
    e.label = fmt::format("node {} dropped (step {})", worker, range.first);
    events.push_back(std::move(e));
  }
  for (const auto& [worker, from, to] : gaps) {
    RunEvent e;
    e.kind = RunEvent::Kind::kLostClocks;
    e.node = worker;
    e.step = from;
    e.to_step = to;
    e.text = fmt::format("node {}'s updates of steps {}-{} are lost (it rejoined at step {})",
                         worker, from, to - 1, to);
    e.label = fmt::format("node {} lost steps", worker);
    events.push_back(std::move(e));
  }
  std::stable_sort(events.begin(), events.end(), [](const RunEvent& a, const RunEvent& b) {
    return std::tie(a.step, a.node) < std::tie(b.step, b.node);
  });
  for (uint32_t node : departed) {
    if (dropped.contains(node)) continue;  // "its updates are lost" says more
    RunEvent e;
    e.kind = RunEvent::Kind::kDeparted;
    e.node = node;
    e.text = fmt::format("the others went on without node {} (it left before the end)", node);
    e.label = fmt::format("node {} departed", node);
    events.push_back(std::move(e));
  }
  if (failed_pushes + failed_pulls > 0) {
    RunEvent e;
    e.kind = RunEvent::Kind::kFailedOps;
    e.failed_pushes = failed_pushes;
    e.failed_pulls = failed_pulls;
    const std::string pushes = plural(failed_pushes, "push", "pushes");
    const std::string reads = plural(failed_pulls, "read", "reads");
    e.text = failed_pulls == 0 ? fmt::format(
                                     "{} failed while an owner was down: their updates "
                                     "are lost",
                                     pushes)
             : failed_pushes == 0
                 ? fmt::format(
                       "{} failed while an owner was down (training went on with the "
                       "values read before)",
                       reads)
                 : fmt::format("{} (their updates lost) and {} failed while an owner was down",
                               pushes, reads);
    e.label = "failed pushes";
    events.push_back(std::move(e));
  }
  return events;
}

void countEvents(const std::vector<RunEvent>& events, EventCounts& counts) {
  for (const RunEvent& e : events) {
    switch (e.kind) {
      case RunEvent::Kind::kCrash:
      case RunEvent::Kind::kStopped:
        ++counts.crashes;
        break;
      case RunEvent::Kind::kRejoin:
        ++counts.rejoins;
        break;
      case RunEvent::Kind::kDropped:
      case RunEvent::Kind::kDeparted:
        ++counts.dropped;
        break;
      case RunEvent::Kind::kLostClocks:
        break;  // follows from a rejoin, counted there
      case RunEvent::Kind::kFailedOps:
        counts.failed_pushes += e.failed_pushes;
        counts.failed_pulls += e.failed_pulls;
        break;
    }
  }
}

std::string eventCountsText(const EventCounts& counts) {
  std::vector<std::string> parts;
  if (counts.crashes > 0) parts.push_back(plural(counts.crashes, "crash", "crashes"));
  if (counts.rejoins > 0) parts.push_back(plural(counts.rejoins, "rejoin", "rejoins"));
  if (counts.dropped > 0) parts.push_back(fmt::format("{} dropped", counts.dropped));
  if (counts.failed_pushes > 0)
    parts.push_back(plural(counts.failed_pushes, "failed push", "failed pushes"));
  if (counts.failed_pulls > 0)
    parts.push_back(plural(counts.failed_pulls, "failed read", "failed reads"));
  return parts.empty() ? "—" : fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace chorus::report
