// How many neighbors a node waits for in a consensus round: the backup-worker rules.
// The dynamic rule and its estimators are explained in docs/backup-rules.md.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::consensus {

// A sliding window of one neighbor's arrival lags, in seconds: how long after this node began
// waiting in round k that neighbor's round-k model arrived (0 when it was already there). Late
// models are measured too when they arrive, so a straggler's lag is known even when nobody
// waited for it; a neighbor that never sends has no samples and is treated as never arriving.
class LagWindow {
 public:
  explicit LagWindow(size_t capacity = 32);
  // Records one lag (negative values are clamped to 0).
  void add(double seconds);
  size_t size() const { return lags_.size(); }
  bool empty() const { return lags_.empty(); }
  // Most recent first: recent(0) is the newest sample. Requires i < size().
  double recent(size_t i) const { return lags_[lags_.size() - 1 - i]; }
  double mean() const;
  // Linear-interpolated quantile of the window, q in [0, 1]; 0 when empty.
  double quantile(double q) const;
  void clear() { lags_.clear(); }

 private:
  size_t capacity_;
  std::deque<double> lags_;
};

// What a node knows when it picks the next round's wait set.
struct RoundObservation {
  // This node's own time per round spent computing (including straggler delay), smoothed.
  double compute_seconds = 0;
  // One window per live neighbor (neighbors reported down are left out by the caller).
  std::vector<const LagWindow*> neighbor_lags;
  // Smoothed squared norm of the minibatch gradient, ||g||^2, and an estimate of its noise,
  // the trace of the minibatch gradient's covariance (sigma^2). Only the dynamic rule uses them.
  double grad_norm_sq = 0;
  double grad_noise = 0;
};

// The rule's answer: wait until `wait_for` neighbors' models have arrived, or, when a deadline
// is set, until the deadline passes with at least `wait_for` arrived (whichever is later).
struct WaitPlan {
  size_t wait_for = 0;
  std::optional<double> deadline_seconds;  // measured from the start of the wait
  // backup workers this round: live neighbors not waited for (what the metrics log as b_i)
  size_t backups = 0;
};

class BackupRule {
 public:
  virtual ~BackupRule() = default;
  // The plan for the next round. With no live neighbors the plan waits for nobody.
  virtual WaitPlan plan(const RoundObservation& obs) = 0;
  // The rule as written on the command line, e.g. "static:1".
  virtual std::string name() const = 0;

  // Parses `wait-all`, `static:B`, `deadline:Q` or `dynamic[:TOLERANCE]`; throws
  // std::invalid_argument naming the accepted forms.
  static std::unique_ptr<BackupRule> parse(std::string_view spec);
};

// The dynamic rule's estimates, exposed for tests and logs.
struct DynamicEstimate {
  std::vector<double> round_seconds;  // [m-1]: expected round time waiting for m neighbors
  std::vector<double> progress;       // [m-1]: expected progress of a round averaging m models
  std::vector<double> rate;           // [m-1]: progress per second
  size_t chosen = 0;                  // the m chosen
};

// Expected time until the m-th fastest of the neighbors arrives, for m = 1..n, estimated from
// the windows by aligning samples by recency (the i-th newest sample of every neighbor forms
// one synthetic round) and averaging the m-th smallest over those rounds. A neighbor with no
// samples counts as never arriving (infinity).
std::vector<double> expectedOrderedLags(const std::vector<const LagWindow*>& windows);

// Picks m maximizing progress(m) / (compute + E[m-th lag]), where progress(m) =
// G / (G + sigma^2 / (m + 1)) is the share of the averaged update that is signal (averaging
// m + 1 models cuts the noise term about m + 1 times, as in DBW). A smaller m is taken only
// when its rate beats waiting for everyone by more than `tolerance` (relative), so that
// without stragglers the rule is wait-all. With no lag history at all it waits for everyone.
DynamicEstimate estimateDynamic(const RoundObservation& obs, double tolerance);

}  // namespace chorus::consensus
