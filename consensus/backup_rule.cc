#include "consensus/backup_rule.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace chorus::consensus {

namespace {
// The smallest signal the progress model assumes, as a share of G (see estimateDynamic).
constexpr double kMinSignalShare = 0.1;
}  // namespace

LagWindow::LagWindow(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

void LagWindow::add(double seconds) {
  lags_.push_back(std::max(0.0, seconds));
  if (lags_.size() > capacity_) lags_.pop_front();
}

double LagWindow::mean() const {
  if (lags_.empty()) return 0;
  double sum = 0;
  for (double l : lags_)
    sum += l;
  return sum / static_cast<double>(lags_.size());
}

double LagWindow::quantile(double q) const {
  if (lags_.empty()) return 0;
  std::vector<double> sorted(lags_.begin(), lags_.end());
  std::sort(sorted.begin(), sorted.end());
  double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  double frac = pos - static_cast<double>(lo);
  return sorted[lo] * (1 - frac) + sorted[hi] * frac;
}

std::vector<double> expectedOrderedLags(const std::vector<const LagWindow*>& windows,
                                        const std::vector<const LagWindow*>& gate_windows) {
  const size_t n = windows.size();
  constexpr double kNever = std::numeric_limits<double>::infinity();
  size_t rounds = 0;
  for (const LagWindow* w : windows)
    rounds = std::max(rounds, w->size());
  std::vector<double> sum(n, 0.0);
  if (rounds == 0) return std::vector<double>(n, kNever);
  std::vector<double> round(n);
  // A shorter window repeats its oldest sample: the best guess we have for that round.
  auto sample = [](const LagWindow* w, size_t i) { return w->recent(std::min(i, w->size() - 1)); };
  for (size_t i = 0; i < rounds; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const LagWindow* w = windows[j];
      round[j] = w->empty() ? kNever : sample(w, i);
    }
    // The gate of this synthetic round: no m ends it before every neighbor within tau is in.
    double gate = 0;
    for (const LagWindow* g : gate_windows) {
      if (g != nullptr && !g->empty()) gate = std::max(gate, sample(g, i));
    }
    std::sort(round.begin(), round.end());
    for (size_t m = 0; m < n; ++m)
      sum[m] += std::max(round[m], gate);
  }
  for (double& s : sum)
    s /= static_cast<double>(rounds);
  return sum;
}

DynamicEstimate estimateDynamic(const RoundObservation& obs, double tolerance) {
  DynamicEstimate est;
  const size_t n = obs.neighbor_lags.size();
  if (n == 0) return est;
  // Before any neighbor has arrived there is nothing to trade: wait for everyone, as
  // synchronous training would, and learn the lags from that round.
  bool any_history = false;
  for (const LagWindow* w : obs.neighbor_lags)
    any_history = any_history || !w->empty();
  if (!any_history) {
    est.chosen = n;
    return est;
  }
  std::vector<double> lags = expectedOrderedLags(obs.neighbor_lags, obs.neighbor_gate_lags);
  const double g = std::max(obs.grad_norm_sq, 0.0);
  const double noise = std::max(obs.grad_noise, 0.0);
  // E||g||^2 = ||grad f||^2 + sigma^2, so G - sigma^2 is the signal. It is a difference of two
  // noisy averages and sigma^2 (from successive gradients) also holds the drift of the
  // iterate, so it is often near or below 0: the floor keeps a round worth something.
  const double signal = std::max(g - noise, kMinSignalShare * g);
  const double late = std::clamp(obs.late_credit, 0.0, 1.0);
  const double backup_used = std::clamp(obs.backup_used, 0.0, 1.0);
  const double backup_staleness = std::max(obs.backup_staleness, 0.0);
  for (size_t m = 1; m <= n; ++m) {
    double t = std::max(obs.compute_seconds, 0.0) + lags[m - 1];
    const double backups = static_cast<double>(n - m);
    const double averaged = 1.0 + static_cast<double>(m) + backups * late;
    // With no gradient information yet every m makes the same progress; the rule then only
    // trades time, and the tolerance keeps it at wait-all unless someone is clearly late.
    double p = (signal + noise > 0) ? signal / (signal + noise / averaged) : 1.0;
    // A model s rounds behind, mixed at weight 1 / (1 + |S|), moves this node back about s
    // steps times that weight: the backups' stale models undo part of the round's own step.
    // The m models waited for are of this round (staleness 0).
    const double mixed = 1.0 + static_cast<double>(m) + backups * backup_used;
    p *= std::max(0.0, 1.0 - backups * backup_staleness / mixed);
    est.round_seconds.push_back(t);
    est.progress.push_back(p);
    est.rate.push_back(std::isfinite(t) && t > 0 ? p / t : (std::isfinite(t) ? 1e300 : 0.0));
  }
  size_t best = n;
  for (size_t m = n; m >= 1; --m) {
    if (est.rate[m - 1] > est.rate[best - 1] * (1 + tolerance)) best = m;
  }
  est.chosen = best;
  return est;
}

namespace {

WaitPlan planFor(size_t live, size_t wait_for) {
  WaitPlan p;
  p.wait_for = std::min(wait_for, live);
  p.backups = live - p.wait_for;
  return p;
}

class WaitAll final : public BackupRule {
 public:
  WaitPlan plan(const RoundObservation& obs) override {
    return planFor(obs.neighbor_lags.size(), obs.neighbor_lags.size());
  }
  std::string name() const override { return "wait-all"; }
};

class StaticBackups final : public BackupRule {
 public:
  explicit StaticBackups(size_t b) : b_(b) {}
  WaitPlan plan(const RoundObservation& obs) override {
    size_t live = obs.neighbor_lags.size();
    // Never zero while anyone is alive: a round must mix with at least one neighbor.
    size_t wait = live > b_ ? live - b_ : std::min<size_t>(live, 1);
    return planFor(live, wait);
  }
  std::string name() const override { return fmt::format("static:{}", b_); }

 private:
  size_t b_;
};

class DeadlineRule final : public BackupRule {
 public:
  explicit DeadlineRule(double q) : q_(q) {}
  WaitPlan plan(const RoundObservation& obs) override {
    size_t live = obs.neighbor_lags.size();
    WaitPlan p = planFor(live, std::min<size_t>(live, 1));
    LagWindow pooled(1 << 20);
    for (const LagWindow* w : obs.neighbor_lags) {
      for (size_t i = 0; i < w->size(); ++i)
        pooled.add(w->recent(i));
    }
    // Until there is history, wait for everyone (the deadline is learned from them).
    if (pooled.empty()) return planFor(live, live);
    p.deadline_seconds = pooled.quantile(q_);
    return p;
  }
  std::string name() const override { return fmt::format("deadline:{}", q_); }

 private:
  double q_;
};

class DynamicRule final : public BackupRule {
 public:
  explicit DynamicRule(double tolerance) : tolerance_(tolerance) {}
  WaitPlan plan(const RoundObservation& obs) override {
    size_t live = obs.neighbor_lags.size();
    if (live == 0) return planFor(0, 0);
    return planFor(live, estimateDynamic(obs, tolerance_).chosen);
  }
  std::string name() const override {
    return tolerance_ == kDefaultTolerance ? "dynamic" : fmt::format("dynamic:{}", tolerance_);
  }
  static constexpr double kDefaultTolerance = 0.10;

 private:
  double tolerance_;
};

node::Status badRule(std::string_view spec, std::string_view why) {
  return node::invalidInput(fmt::format(
      "bad backup rule '{}': {} (accepted: wait-all, static:B, deadline:Q with 0 < Q <= 1, "
      "dynamic or dynamic:TOLERANCE)",
      spec, why));
}

// Bounded so that the conversion is defined; a plan never uses more than the neighbors.
constexpr double kMaxBackups = 1e6;

}  // namespace

std::string BackupRuleSpec::name() const {
  switch (kind) {
    case Kind::kWaitAll:
      return "wait-all";
    case Kind::kStatic:
      return fmt::format("static:{}", value);
    case Kind::kDeadline:
      return fmt::format("deadline:{}", value);
    case Kind::kDynamic:
      return value == kDefaultTolerance ? "dynamic" : fmt::format("dynamic:{}", value);
  }
  return "?";
}

node::Result<BackupRuleSpec> BackupRuleSpec::fromValues(Kind kind, double value) {
  const BackupRuleSpec spec{kind, value};
  const std::string text = fmt::format("kind {} with {}", static_cast<int>(kind), value);
  switch (kind) {
    case Kind::kWaitAll:
      if (value != 0) return badRule(text, "wait-all takes no argument");
      return spec;
    case Kind::kStatic:
      if (!(value >= 0 && value <= kMaxBackups) || std::floor(value) != value) {
        return badRule(text, "B must be a whole number in [0, 1000000]");
      }
      return spec;
    case Kind::kDeadline:
      if (!(value > 0 && value <= 1)) return badRule(text, "Q must be within (0, 1]");
      return spec;
    case Kind::kDynamic:
      if (!(value >= 0) || !std::isfinite(value)) return badRule(text, "TOLERANCE must be >= 0");
      return spec;
  }
  return badRule(text, "unknown rule");
}

node::Result<BackupRuleSpec> BackupRuleSpec::read(std::string_view spec) {
  const size_t colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  const std::string_view arg = colon == std::string_view::npos ? "" : spec.substr(colon + 1);
  const bool has_arg = colon != std::string_view::npos;
  if (name == "wait-all") {
    if (has_arg) return badRule(spec, "wait-all takes no argument");
    return BackupRuleSpec{Kind::kWaitAll, 0};
  }
  if (name != "static" && name != "deadline" && name != "dynamic") {
    return badRule(spec, fmt::format("unknown rule '{}'", name));
  }
  double value = 0;
  if (has_arg) {
    auto [end, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), value);
    if (ec != std::errc() || end != arg.data() + arg.size() || !std::isfinite(value)) {
      return badRule(spec, fmt::format("'{}' is not a number", arg));
    }
  }
  if (name == "static") {
    if (!has_arg) return badRule(spec, "static needs the number of backup workers, e.g. static:1");
    if (value < 0 || value > kMaxBackups || std::floor(value) != value) {
      return badRule(spec, "B must be a whole number in [0, 1000000]");
    }
    return BackupRuleSpec{Kind::kStatic, value};
  }
  if (name == "deadline") {
    if (!has_arg) return badRule(spec, "deadline needs a quantile, e.g. deadline:0.9");
    if (value <= 0 || value > 1) return badRule(spec, "Q must be within (0, 1]");
    return BackupRuleSpec{Kind::kDeadline, value};
  }
  if (name == "dynamic") {
    if (!has_arg) value = kDefaultTolerance;
    if (value < 0) return badRule(spec, "TOLERANCE must be >= 0");
    return BackupRuleSpec{Kind::kDynamic, value};
  }
  return badRule(spec, fmt::format("unknown rule '{}'", name));
}

std::unique_ptr<BackupRule> makeBackupRule(const BackupRuleSpec& spec) {
  switch (spec.kind) {
    case BackupRuleSpec::Kind::kWaitAll:
      return std::make_unique<WaitAll>();
    case BackupRuleSpec::Kind::kStatic:
      return std::make_unique<StaticBackups>(static_cast<size_t>(spec.value));
    case BackupRuleSpec::Kind::kDeadline:
      return std::make_unique<DeadlineRule>(spec.value);
    case BackupRuleSpec::Kind::kDynamic:
      return std::make_unique<DynamicRule>(spec.value);
  }
  return std::make_unique<WaitAll>();
}

}  // namespace chorus::consensus
