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

#include "node/result.h"

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
  // Per live neighbor (same order as neighbor_lags; may be empty): how long after this node
  // began waiting in round k the staleness gate let go of that neighbor (its model of round
  // >= k - tau arrived). The round cannot end before the slowest of these, whatever m is.
  std::vector<const LagWindow*> neighbor_gate_lags{};  // `{}`: designated initializers may omit it
  // How much one backup worker's model still counts although nobody waited for it: late
  // models within tau are mixed in a later round anyway (a model s rounds late counts
  // 1 / (1 + s)). Measured by the protocol, in [0, 1]; 0 before any round had backups.
  double late_credit = 0;
  // Per backup worker, measured by the protocol over rounds with backups (0 before any): how
  // many of its models were mixed in anyway (fresh beyond the m waited for, or late within
  // tau), in [0, 1], and the sum of their staleness in rounds. A model s rounds behind this
  // node pulls it back by about s steps times its mixing weight: the dynamic rule's cost of
  // backups (docs/backup-rules.md).
  double backup_used = 0;
  double backup_staleness = 0;
};

// The rule's answer: wait until `wait_for` neighbors' models have arrived, or, when a deadline
// is set, until the deadline passes with at least `wait_for` arrived (whichever is later).
struct WaitPlan {
  size_t wait_for = 0;
  std::optional<double> deadline_seconds;  // measured from the start of the wait
  // backup workers this round: live neighbors not waited for (what the metrics log as b_i)
  size_t backups = 0;
};

// Which backup rule a run uses, as a value: read once from --backup (or a variant's name) and
// carried typed (the run spec has its kind and number); the rule itself, which keeps state
// across rounds, is made from it by makeBackupRule().
struct BackupRuleSpec {
  enum class Kind : uint8_t { kWaitAll = 0, kStatic = 1, kDeadline = 2, kDynamic = 3 };
  static constexpr double kDefaultTolerance = 0.10;  // dynamic's tolerance when not given

  Kind kind = Kind::kDynamic;
  // static: B, the backup workers (a whole number in [0, 1e6]); deadline: the quantile Q in
  // (0, 1]; dynamic: the tolerance (>= 0); wait-all: 0.
  double value = kDefaultTolerance;

  // The rule as written on the command line, e.g. "static:1" or "dynamic" (read() reads it back).
  std::string name() const;
  // `wait-all`, `static:B`, `deadline:Q` or `dynamic[:TOLERANCE]`, or an error naming the text
  // and the accepted forms.
  static node::Result<BackupRuleSpec> read(std::string_view text);
  // A spec made elsewhere (a run spec's fields), with read()'s range checks.
  static node::Result<BackupRuleSpec> fromValues(Kind kind, double value);

  friend bool operator==(const BackupRuleSpec&, const BackupRuleSpec&) = default;
};

class BackupRule {
 public:
  virtual ~BackupRule() = default;
  // The plan for the next round. With no live neighbors the plan waits for nobody.
  virtual WaitPlan plan(const RoundObservation& obs) = 0;
  // The rule as written on the command line, e.g. "static:1".
  virtual std::string name() const = 0;
};

// The rule `spec` names, fresh (no history).
std::unique_ptr<BackupRule> makeBackupRule(const BackupRuleSpec& spec);

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
// samples counts as never arriving (infinity). With `gate_windows` (one per neighbor, or
// empty), every synthetic round's m-th lag is at least the largest gate lag of that round:
// the staleness gate holds the round that long whatever m is.
std::vector<double> expectedOrderedLags(const std::vector<const LagWindow*>& windows,
                                        const std::vector<const LagWindow*>& gate_windows = {});

// Picks m maximizing progress(m) / (compute + E[max(m-th lag, gate lag)]), where progress(m)
// is the product of the averaging gain S / (S + sigma^2 / n(m)), the share of the averaged
// update that is signal (S = G - sigma^2: G is the squared norm of a noisy gradient, so this is
// the unbiased signal, floored at G / 10; n(m) = 1 + m + (n - m) * late_credit models are
// averaged: the own, the m waited for, and the backups' late models mixed anyway, as in DBW),
// and the staleness factor 1 - (n - m) * backup_staleness / (1 + m + (n - m) * backup_used),
// the share of the node's own step that mixing the backups' stale models (uniform weights, each
// s rounds behind) does not undo, at least 0. A smaller m is taken only when its rate beats the
// larger one's by more than `tolerance` (relative), so that without stragglers the rule is
// wait-all. With no lag history at all it waits for everyone.
DynamicEstimate estimateDynamic(const RoundObservation& obs, double tolerance);

}  // namespace chorus::consensus
