#include "report/run_metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include "faults/straggler.h"
#include "report/json_line.h"
#include "run/staleness_bound.h"

namespace chorus::report {
namespace fs = std::filesystem;
namespace {

// Lines longer than this are not metrics (a round line is a few hundred bytes): skipped.
constexpr size_t kMaxLine = 1 << 20;
// A folder with more warnings than this only says how many more there were.
constexpr size_t kMaxWarnings = 20;

std::optional<uint32_t> nodeIdOf(const std::string& filename) {
  constexpr std::string_view kPrefix = "node-";
  constexpr std::string_view kSuffix = ".jsonl";
  if (filename.size() <= kPrefix.size() + kSuffix.size() || !filename.starts_with(kPrefix) ||
      !filename.ends_with(kSuffix)) {
    return std::nullopt;
  }
  std::string_view digits(filename.data() + kPrefix.size(),
                          filename.size() - kPrefix.size() - kSuffix.size());
  uint32_t id = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), id);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return id;
}

// The PS staleness bound as written: a number, "inf", or a negative number for "no bound".
std::string stalenessText(const JsonValue* value) {
  if (value == nullptr) return "";
  if (value->kind == JsonValue::Kind::kString) return value->text;
  if (value->kind == JsonValue::Kind::kNumber) {
    if (value->number < 0) return "inf";
    // Converted only where int64 holds it exactly; a larger bound is printed as written.
    if (isStepNumber(value->number)) return fmt::format("{}", static_cast<int64_t>(value->number));
    return fmt::format("{}", value->number);
  }
  return "";
}

// S of node `id`'s crash:NODE@S term in a start line's profile. A profile this build cannot
// read (a newer grammar) names no crash: the report then says the node stopped, not why.
std::optional<int64_t> crashStepOf(const std::string& stragglers, uint32_t id) {
  const auto profile = faults::StragglerProfile::read(stragglers);
  if (!profile.ok()) return std::nullopt;
  for (const auto& term : profile->terms) {
    if (auto it = term.crash_steps.find(id); it != term.crash_steps.end()) return it->second;
  }
  return std::nullopt;
}

// The node ids of a `final` line's id array (departed_peers); other items are ignored.
std::vector<uint32_t> nodeIds(const JsonObject& object, std::string_view key) {
  std::vector<uint32_t> ids;
  for (const JsonValue& item : object.array(key).value_or(std::vector<JsonValue>{})) {
    if (item.kind == JsonValue::Kind::kNumber && item.number >= 0 && item.number <= UINT32_MAX &&
        item.number == std::floor(item.number)) {
      ids.push_back(static_cast<uint32_t>(item.number));
    }
  }
  return ids;
}

// An array item as a warning quotes it.
std::string itemText(const JsonValue& item) {
  switch (item.kind) {
    case JsonValue::Kind::kNested:
      return item.text;
    case JsonValue::Kind::kNumber:
      return fmt::format("{}", item.number);
    case JsonValue::Kind::kString:
      return "\"" + item.text + "\"";
    case JsonValue::Kind::kBool:
      return item.number != 0 ? "true" : "false";
    case JsonValue::Kind::kNull:
      break;
  }
  return "null";
}

// A PS `final` line's lost_updates: [{"node":N,"from_clock":C[,"to_clock":D]}, ...]. Items
// that do not have that shape are skipped with a warning.
std::vector<LostUpdates> lostUpdatesOf(const JsonObject& object, const std::string& where,
                                       std::vector<std::string>& problems) {
  std::vector<LostUpdates> lost;
  for (const JsonValue& item : object.array("lost_updates").value_or(std::vector<JsonValue>{})) {
    std::optional<LostUpdates> entry;
    if (item.kind == JsonValue::Kind::kNested) {
      try {
        const JsonObject fields = JsonObject::parse(item.text);
        const auto node = fields.number("node");
        const auto from = fields.number("from_clock");
        const auto to = fields.number("to_clock");
        if (node && *node >= 0 && *node <= UINT32_MAX && from && isStepNumber(*from) &&
            (!to || isStepNumber(*to))) {
          entry =
              LostUpdates{static_cast<uint32_t>(*node), static_cast<int64_t>(*from),
                          to ? std::optional<int64_t>(static_cast<int64_t>(*to)) : std::nullopt};
        }
      } catch (const JsonError&) {
        // an array item, not an object: reported below
      }
    }
    if (entry) {
      lost.push_back(*entry);
    } else {
      problems.push_back(
          fmt::format("{}: a lost_updates item without node and from_clock ({}), skipped", where,
                      itemText(item)));
    }
  }
  return lost;
}

// The first split's headline metric in an `epoch` or `summary` line of a sparse model: the
// first of valid_mrr, test_mrr, valid_rmse, test_rmse that a file holds fixes the metric and the
// split for the rest of it. Nullopt when the line holds none (not an evaluation epoch).
std::optional<QualityPoint> qualityPoint(const JsonObject& object, SparseMetrics& m, bool summary) {
  if (m.metric.empty()) {
    for (const char* metric : {"mrr", "rmse"}) {
      for (const char* split : {"valid", "test"}) {
        if (object.number(fmt::format("{}_{}", split, metric))) {
          m.metric = metric;
          m.split = split;
          break;
        }
      }
      if (!m.metric.empty()) break;
    }
    if (m.metric.empty()) return std::nullopt;
  }
  // The line is written after the evaluation it reports: its time includes it. A summary line
  // holds every split's evaluation (valid_eval_seconds, test_eval_seconds).
  if (summary) {
    for (const char* split : {"valid", "test"}) {
      m.eval_seconds += object.number(fmt::format("{}_eval_seconds", split)).value_or(0);
    }
  } else {
    const double seconds = object.number("eval_seconds").value_or(0);
    m.eval_seconds += seconds;
    m.training_eval_seconds += seconds;
  }
  const auto value = object.number(fmt::format("{}_{}", m.split, m.metric));
  const auto time = object.number("time");
  if (!value || !time) return std::nullopt;
  QualityPoint point;
  point.time = std::max(0.0, *time - m.eval_seconds);
  point.value = *value;
  point.hits10 = object.number(fmt::format("{}_hits@10", m.split));
  const auto epoch = object.number(summary ? "evaluated_epoch" : "epoch");
  if (epoch && isStepNumber(*epoch)) point.epoch = static_cast<int64_t>(*epoch);
  return point;
}

void addWarning(RunMetrics& run, size_t& dropped, std::string text) {
  if (run.warnings.size() < kMaxWarnings) {
    run.warnings.push_back(std::move(text));
  } else {
    ++dropped;
  }
}

NodeMetrics readNodeFile(const fs::path& path, uint32_t id, RunMetrics& run, size_t& dropped) {
  NodeMetrics node;
  node.node = id;
  node.file = path.filename().string();
  node.life_info.emplace_back();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ReportError(fmt::format("{}: cannot open for reading", path.string()));
  }
  std::string line;
  size_t number = 0;
  // Lives: a `start` after a start or a step line begins the next one. A life "rejoined" when it
  // took up a running job: every life after the first, and one with a `rejoin` event (PS).
  bool life_has_lines = false;
  bool rejoined = false;
  bool first_step_of_life = true;
  // Whether the start event is the training loop's (run/training_loop.h): only then are `step`
  // events its steps. A sparse model's `step` events (every --log-every steps, counting the
  // steps done) carry nothing a comparison uses, as before.
  bool loop_steps = false;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    const std::string where = fmt::format("{}:{}", path.string(), number);
    if (line.size() > kMaxLine) {
      addWarning(run, dropped,
                 fmt::format("{}: line longer than {} bytes, skipped", where, kMaxLine));
      continue;
    }
    JsonObject object;
    try {
      object = JsonObject::parse(line);
    } catch (const JsonError& e) {
      addWarning(run, dropped, fmt::format("{}: not a JSON object ({}), skipped", where, e.what()));
      continue;
    }
    const auto event = object.string("event");
    if (!event) {
      addWarning(run, dropped, fmt::format("{}: no \"event\" field, skipped", where));
      continue;
    }
    if (*event == "start") {
      if (life_has_lines) {
        ++node.lives;
        rejoined = true;
        first_step_of_life = true;
        node.has_final = false;
        node.final_accuracy = node.final_steps = node.final_seconds = node.final_wait_s = 0;
        node.model_accuracy.reset();
        node.departed_peers.clear();
        node.lost_updates.clear();
        node.failed_pushes.reset();
        node.failed_pulls.reset();
        node.life_info.emplace_back();
      }
      life_has_lines = true;
      loop_steps = object.find("shard_samples") != nullptr;
      node.life_info.back().crash_step = crashStepOf(object.string("stragglers").value_or(""), id);
      node.mode = object.string("mode").value_or("");
      node.backup = object.string("backup").value_or("");
      if (node.mode == "ps") node.staleness = stalenessText(object.find("staleness"));
      // The sparse trainer's start line (ml/sparse_train.h) names its training points. A
      // rejoined life keeps the first life's evaluations: node 0's clock is the first life's.
      if (object.has("train_points") && !node.sparse) {
        node.sparse.emplace();
        node.sparse->technique = object.string("technique").value_or("");
        node.sparse->staleness = stalenessText(object.find("staleness"));
      }
      // A seed beyond 2^53 does not survive the trip through a double: better none than wrong.
      if (auto seed = object.number("seed"); seed && isStepNumber(*seed)) {
        node.seed = static_cast<uint64_t>(*seed);
      }
    } else if (*event == "round" || *event == "clock" || (*event == "step" && loop_steps)) {
      // The step events: `step` since every mode shares the name (run::kStepName), `round`
      // (consensus, single) or `clock` (PS) in files written before; the field is the event's.
      auto step = object.number(*event);
      auto time = object.number("time");
      if (!step || !time) {
        addWarning(
            run, dropped,
            fmt::format("{}: {} event without '{}' or 'time', skipped", where, *event, *event));
        continue;
      }
      if (!isStepNumber(*step)) {
        addWarning(run, dropped,
                   fmt::format("{}: {} {} is not a step number (0 to 2^53), skipped", where, *event,
                               *step));
        continue;
      }
      StepPoint point;
      point.step = static_cast<int64_t>(*step);
      point.time = *time;
      point.test_accuracy = object.number("test_accuracy");
      point.wait_s = object.number("wait_s").value_or(0);
      point.bytes_sent = object.number("bytes_sent").value_or(0);
      point.backups = object.number("backups");
      point.staleness_mean = object.number("staleness_mean");
      point.used = object.number("used");
      point.life = node.lives - 1;
      // A rejoined life's first step line is where it took up the job (unless a `rejoin`
      // event said so already).
      if (first_step_of_life && rejoined) {
        node.last_life_first_step = point.step;
        node.life_info.back().first_step = point.step;
      }
      first_step_of_life = false;
      life_has_lines = true;
      node.steps.push_back(point);
    } else if (*event == "rejoin") {
      rejoined = true;
      // `step`, or `clock` in files written before the modes shared the name.
      auto clock = object.number("step");
      if (!clock) clock = object.number("clock");
      if (clock && isStepNumber(*clock)) {
        node.last_life_first_step = static_cast<int64_t>(*clock);
        node.life_info.back().first_step = node.last_life_first_step;
        first_step_of_life = false;
      }
    } else if (*event == "target") {
      if (rejoined) {
        node.target_after_rejoin = true;
      } else if (!node.target_seconds) {
        node.target_seconds = object.number("seconds");
      }
    } else if (*event == "final") {
      life_has_lines = true;
      node.has_final = true;
      node.life_info.back().has_final = true;
      node.final_accuracy = object.number("test_accuracy").value_or(0);
      // The step reached, less where a rejoining node took up the run: what this process ran
      // (`steps` and `first_step`; `rounds` or `clocks` and their `first_` in older files).
      auto firstOf = [&](std::initializer_list<const char*> keys) {
        for (const char* key : keys) {
          if (auto value = object.number(key)) return *value;
        }
        return 0.0;
      };
      node.final_steps = firstOf({"steps", "rounds", "clocks"}) -
                         firstOf({"first_step", "first_round", "first_clock"});
      node.final_seconds = object.number("seconds").value_or(0);
      node.final_wait_s = object.number("wait_s").value_or(0);
      const double time_to_target = object.number("time_to_target").value_or(-1);
      if (time_to_target >= 0 && rejoined) {
        node.target_after_rejoin = true;
      } else if (!rejoined) {
        node.time_to_target = time_to_target;
      }
      node.model_accuracy = object.number("average_accuracy");
      if (!node.model_accuracy) node.model_accuracy = object.number("owner_accuracy");
      node.departed_peers = nodeIds(object, "departed_peers");
      std::vector<std::string> problems;
      node.lost_updates = lostUpdatesOf(object, where, problems);
      for (auto& problem : problems)
        addWarning(run, dropped, std::move(problem));
      node.failed_pushes = object.number("failed_pushes");
      node.failed_pulls = object.number("failed_pulls");
    } else if (*event == "epoch" && node.sparse) {
      // An evaluation epoch's line holds the first split's metrics (valid_mrr, test_rmse).
      if (auto point = qualityPoint(object, *node.sparse, false)) {
        node.sparse->quality.push_back(*point);
      }
    } else if (*event == "summary" && node.sparse) {
      // The sparse trainer's last line: its counters, and node 0's evaluation of every split.
      SparseMetrics& m = *node.sparse;
      life_has_lines = true;
      node.has_final = true;
      node.life_info.back().has_final = true;
      m.has_summary = true;
      m.steps = object.number("steps").value_or(0);
      m.train_seconds = object.number("train_seconds").value_or(0);
      m.wait_seconds = object.number("wait_seconds").value_or(0);
      m.bytes_out = object.number("bytes_out").value_or(0);
      m.local_share = object.number("local_share");
      m.rows_per_round = object.number("rows_per_round");
      m.max_staleness = object.number("max_staleness");
      if (auto point = qualityPoint(object, m, true)) m.quality.push_back(*point);
      if (!m.metric.empty()) {
        for (const char* split : {"test", "valid"}) {
          if (auto value = object.number(fmt::format("{}_{}", split, m.metric))) {
            m.final_value = value;
            m.final_hits10 = object.number(fmt::format("{}_hits@10", split));
            m.final_split = split;
            break;
          }
        }
      }
    }
    // Other events (a sparse model's "step", ...) carry nothing a comparison uses.
  }
  if (in.bad()) throw ReportError(fmt::format("{}: read error", path.string()));
  return node;
}

// What the last life of a node ran: its `final` line, or (killed) its step lines.
struct LifeRun {
  double steps = 0;  // rounds or clocks
  double seconds = 0;
  double wait = 0;
};

LifeRun lastLifeRun(const NodeMetrics& node) {
  LifeRun run;
  const int last = node.lives - 1;
  for (const auto& p : node.steps) {
    if (p.life == last) run.wait += p.wait_s;
  }
  if (node.has_final) {
    run.steps = node.final_steps;
    run.seconds = node.final_seconds;
    if (node.final_wait_s > 0) run.wait = node.final_wait_s;
  } else if (!node.steps.empty() && node.steps.back().life == last) {
    run.steps = static_cast<double>(node.steps.back().step + 1 - node.last_life_first_step);
    run.seconds = node.steps.back().time;
  }
  return run;
}

double meanOf(const std::vector<double>& values) {
  if (values.empty()) return 0;
  double sum = 0;
  for (double v : values)
    sum += v;
  return sum / static_cast<double>(values.size());
}

// A sparse run's numbers come from the sparse trainer's `summary` lines (it writes no `final`
// line): rates and waiting over its training time, the bytes its connections sent, and node 0's
// evaluation of the last split.
void summarizeSparse(const RunMetrics& metrics, RunSummary& s) {
  const SparseMetrics& ref = *metrics.nodes.front().sparse;
  s.sparse = true;
  s.quality_metric = ref.metric;
  s.final_accuracy.reset();
  s.model_accuracy.reset();
  s.final_quality = ref.final_value;
  s.final_hits10 = ref.final_hits10;
  s.technique = ref.technique;
  s.max_staleness = ref.max_staleness;
  s.steps = ref.steps;
  s.seconds = ref.train_seconds;
  std::vector<double> rates, waits, sent, local, rows;
  for (const NodeMetrics& node : metrics.nodes) {
    if (!node.sparse || !node.sparse->has_summary) continue;
    const SparseMetrics& m = *node.sparse;
    // Node 0's training time leaves its evaluations out; the others' would hold them: under a
    // bound (PS's clocks, consensus's tau) they go on at most a few steps and then wait until
    // node 0 trains again, seconds per evaluation on WN18RR. That wait is node 0's evaluating,
    // not the run's training, so it leaves their time and their waiting too (about: they
    // still run the steps the bound allows). Without a bound (`inf`: PS async) nobody waits for
    // it; a rotation run also says `inf` but trains MF only, whose evaluations take
    // milliseconds.
    const double held = &node == &metrics.nodes.front() || m.staleness == "inf"
                            ? 0.0
                            : std::min(ref.training_eval_seconds, m.wait_seconds);
    const double train_seconds = m.train_seconds - held;
    if (train_seconds > 0) {
      rates.push_back(m.steps / train_seconds);
      waits.push_back(std::min(1.0, (m.wait_seconds - held) / train_seconds));
    }
    sent.push_back(m.bytes_out);
    if (m.local_share) local.push_back(*m.local_share);
    if (m.rows_per_round) rows.push_back(*m.rows_per_round);
  }
  s.steps_per_s = meanOf(rates);
  s.wait_share = meanOf(waits);
  s.bytes_sent_per_node = meanOf(sent);
  // One node alone has nothing to share, and reads every row locally: no column for it.
  if (!local.empty() && metrics.nodes.size() > 1) s.local_share = meanOf(local);
  if (!rows.empty() && metrics.nodes.size() > 1) s.rows_per_round = meanOf(rows);
  if (metrics.nodes.size() < 2) s.max_staleness.reset();
}

}  // namespace

RunMetrics readRunFolder(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw ReportError(fmt::format("{}: no such folder", dir.string()));
  }
  RunMetrics run;
  run.dir = dir.string();
  size_t dropped = 0;
  std::vector<std::pair<uint32_t, fs::path>> files;
  // The error_code forms throughout: buildReport() promises to turn a bad folder into a failed
  // run, and the throwing ones escaped it (a node file that is a symlink loop).
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto id = nodeIdOf(it->path().filename().string());
    if (!id) continue;
    std::error_code file_ec;
    const bool regular = it->is_regular_file(file_ec);
    if (file_ec) {
      addWarning(run, dropped,
                 fmt::format("{}: cannot tell what it is ({}), skipped", it->path().string(),
                             file_ec.message()));
    }
    if (regular) files.emplace_back(*id, it->path());
  }
  if (ec) throw ReportError(fmt::format("{}: cannot list: {}", dir.string(), ec.message()));
  if (files.empty()) {
    throw ReportError(fmt::format(
        "{}: no node-<id>.jsonl metrics files (is it the --out folder of a run?)", dir.string()));
  }
  std::sort(files.begin(), files.end());
  for (const auto& [id, path] : files)
    run.nodes.push_back(readNodeFile(path, id, run, dropped));
  for (const NodeMetrics& node : run.nodes) {
    if (node.lives > 1) {
      addWarning(run, dropped,
                 fmt::format("{}: node {} rejoined ({} lives in its file); its rate and waiting "
                             "share are its last life's",
                             node.file, node.node, node.lives));
    }
  }
  const NodeMetrics& ref = run.nodes.front();
  if (ref.node != 0) {
    addWarning(run, dropped,
               fmt::format("{}: no node-0.jsonl; node {} (the lowest id present) is the reference "
                           "node of this run",
                           dir.string(), ref.node));
  }
  if (ref.target_after_rejoin && ref.time_to_target < 0 && !ref.target_seconds) {
    addWarning(run, dropped,
               fmt::format("{}: node {} reached the target only after it rejoined; the file does "
                           "not say how long the node was down, so its time to target since the "
                           "run started is unknown and left blank",
                           ref.file, ref.node));
  }
  if (dropped > 0) run.warnings.push_back(fmt::format("... and {} more skipped lines", dropped));
  return run;
}

RunSummary summarizeRun(const RunMetrics& metrics) {
  RunSummary s;
  s.nodes = static_cast<int>(metrics.nodes.size());
  if (metrics.nodes.empty()) return s;
  const NodeMetrics& ref = metrics.nodes.front();
  s.reference_node = ref.node;
  const LifeRun ref_run = lastLifeRun(ref);
  s.steps = ref_run.steps;
  s.seconds = ref_run.seconds;
  if (ref.has_final) {
    s.final_accuracy = ref.final_accuracy;
    s.model_accuracy = ref.model_accuracy;
  } else {
    for (auto it = ref.steps.rbegin(); it != ref.steps.rend(); ++it) {
      if (it->test_accuracy) {
        s.final_accuracy = it->test_accuracy;
        break;
      }
    }
  }
  if (ref.time_to_target >= 0) {
    s.time_to_target = ref.time_to_target;
  } else if (ref.target_seconds) {
    s.time_to_target = ref.target_seconds;
  }

  std::vector<double> rates, waits, sent;
  std::vector<double> backups;
  // Staleness per model mixed in: each round's mean weighted by how many models it mixed (a
  // round that mixed none logs a mean of 0, which is no model at all).
  double staleness_sum = 0, models_mixed = 0;
  for (const auto& node : metrics.nodes) {
    const LifeRun life = lastLifeRun(node);
    // Bytes over every life: what the node sent in the run.
    double bytes = 0;
    for (const auto& p : node.steps) {
      bytes += p.bytes_sent;
      if (p.backups) backups.push_back(*p.backups);
      if (p.staleness_mean && p.used && *p.used >= 0) {
        staleness_sum += *p.staleness_mean * *p.used;
        models_mixed += *p.used;
      }
    }
    if (life.seconds > 0) {
      rates.push_back(life.steps / life.seconds);
      waits.push_back(std::min(1.0, life.wait / life.seconds));
    }
    sent.push_back(bytes);
  }
  s.steps_per_s = meanOf(rates);
  s.wait_share = meanOf(waits);
  s.bytes_sent_per_node = meanOf(sent);
  // A one-node consensus run (the single variant) has no neighbors to wait for or mix.
  if (ref.mode == "consensus" && metrics.nodes.size() > 1) {
    if (!backups.empty()) s.mean_backups = meanOf(backups);
    if (models_mixed > 0) s.mean_staleness = staleness_sum / models_mixed;
  }
  if (ref.mode == "ps") s.staleness_bound = ref.staleness;
  if (ref.sparse) summarizeSparse(metrics, s);
  return s;
}

std::optional<double> sparseTimeToTarget(const SparseMetrics& metrics,
                                         const QualityTarget& target) {
  if (metrics.metric != target.metric) return std::nullopt;
  for (const QualityPoint& point : metrics.quality) {
    if (target.reachedBy(point.value)) return point.time;
  }
  return std::nullopt;
}

std::string variantNameOf(const RunMetrics& metrics) {
  if (metrics.nodes.empty()) return "run";
  const NodeMetrics& ref = metrics.nodes.front();
  // One node training alone (chorus train, compare's single variant); older runs of the single
  // variant were one-node consensus runs.
  if (ref.mode == "single") return "single";
  if (ref.mode == "consensus") {
    if (metrics.nodes.size() == 1) return "single";
    return ref.backup.empty() ? "consensus" : "consensus:" + ref.backup;
  }
  if (ref.mode == "ps") {
    if (ref.staleness.empty()) return "ps";
    // The metrics' spelling of the bound, read with the grammar that wrote it; a bound this
    // build cannot read (1e+300) is shown as written.
    const node::Result<run::StalenessBound> bound = run::StalenessBound::read(ref.staleness);
    return bound.ok() ? "ps:" + bound->variantName() : "ps:ssp:" + ref.staleness;
  }
  return "run";
}

}  // namespace chorus::report
