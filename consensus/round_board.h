// Where the loop thread leaves neighbors' models and the trainer thread waits for them.
//
// Per round k the trainer calls gather(k, plan): it blocks until the wait plan is met (enough
// neighbors' round-k models, or a deadline) and no live neighbor is more than tau rounds behind
// (Hop's iteration gap), then takes every neighbor's newest not-yet-used model of round <= k
// within the staleness bound. The loop thread calls modelArrived / neighborDown / neighborUp.
// Arrival lags and gate lags are measured here, for the backup rules, and a node that all its
// neighbors have left behind asks skipTarget / takeNewest to jump to their round (Hop's
// iteration skipping). Thread-safe: one mutex, one condition variable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "consensus/backup_rule.h"
#include "consensus/mixing.h"

namespace chorus::consensus {

using SteadyTime = std::chrono::steady_clock::time_point;
using ModelPtr = std::shared_ptr<const std::vector<float>>;

struct BoardOptions {
  std::vector<NodeId> neighbors;
  // tau: a model of round r may be mixed into round k while k - r <= tau, and no node waits
  // less than needed to stay within tau rounds of every live neighbor. 0 with wait-all is
  // synchronous D-PSGD.
  int64_t staleness_bound = 2;
  size_t lag_window = 32;
  // A live neighbor that sent no model for this long is stalled: the staleness gate stops
  // holding this node back for it (the wait plan may still wait for it: wait-all does).
  std::chrono::milliseconds stall_timeout{10000};
  // Longest a gather waits before it returns with what it has (and says who is missing).
  std::chrono::milliseconds round_timeout{300000};
  // How often a waiting gather calls its `still_waiting` report.
  std::chrono::milliseconds report_every{5000};
  // Iteration skipping (Hop): a node whose every live neighbor is at least this many rounds
  // ahead of the round it is about to send may jump to their round (skipTarget). 0: never.
  int64_t skip_gap = 0;
};

// A neighbor's model used in a round.
struct UsedModel {
  NodeId from = 0;
  Round round = 0;
  int64_t staleness = 0;  // k - round, 0 when the model is from round k or newer
  ModelPtr values;
};

struct GatherResult {
  std::vector<UsedModel> models;
  double waited_seconds = 0;
  bool timed_out = false;
  bool stopped = false;
  size_t live_neighbors = 0;
  // Live neighbors whose round-k model had not arrived when the gather returned.
  std::vector<NodeId> missing;
};

class RoundBoard {
 public:
  explicit RoundBoard(BoardOptions options);

  // Loop thread: `from`'s complete model of `round` arrived at `at`. A model of a round that
  // can no longer be mixed (below the last gathered round minus tau) is not kept, and a
  // neighbor's models are at most modelsHeldPerNeighbor(): the oldest goes first.
  void modelArrived(NodeId from, Round round, ModelPtr values, SteadyTime at);
  // 2 tau + 2: the models of rounds k - tau .. k + tau + 1 that a neighbor can have sent while
  // this node is in round k (it runs at most tau + 1 rounds ahead). More are only possible
  // when this node stalled or rejoined; they are still kept, so that it learns how far ahead
  // its neighbors are and skips, but only the newest of them.
  size_t modelsHeldPerNeighbor() const;
  // Any thread: the models held for every neighbor, and their bytes.
  size_t heldModels() const;
  size_t heldBytes() const;
  // Loop thread: the runtime reported `peer` down (or left): it leaves the wait set at once
  // and its old models are dropped.
  void neighborDown(NodeId peer);
  // Loop thread: `peer` is back; it rejoins the wait set with its first model.
  void neighborUp(NodeId peer);
  // Any thread: every gather returns at once from now on.
  void stop();

  // Trainer thread: waits for round k per `plan` and the staleness gate. `still_waiting` is
  // called every report_every while blocked, with the neighbors being waited for.
  GatherResult gather(Round k, const WaitPlan& plan,
                      const std::function<void(const std::vector<NodeId>&)>& still_waiting = {});

  // Trainer thread: the round a node about to send its round-k model should jump to instead:
  // the lowest latest round of its live, joined, not stalled neighbors, when every one of them
  // is at least skip_gap rounds ahead of k (so they all have done the rounds it skips, and the
  // jump puts it ahead of nobody). nullopt when it should not skip.
  std::optional<Round> skipTarget(Round k) const;
  // Trainer thread: takes, from every live neighbor, its newest model of round <= k within the
  // staleness bound that was not used before (what a gather of round k takes), without
  // waiting. A skipping node mixes these in before it continues at round k.
  std::vector<UsedModel> takeNewest(Round k);

  // Trainer thread: what the backup rule needs (live neighbors' lag and gate-lag windows). The
  // pointers are valid until the next call into the board; call under no lock of your own.
  RoundObservation observe(double compute_seconds, double grad_norm_sq, double grad_noise);

  // Snapshot helpers for logs and tests.
  std::vector<NodeId> liveNeighbors() const;
  std::optional<Round> latestRound(NodeId peer) const;

 private:
  struct Neighbor {
    bool live = true;
    bool joined = true;                 // has sent a model since it (re)appeared
    SteadyTime last_heard;              // last model, or when it (re)appeared
    std::optional<Round> latest_round;  // newest round received
    // Recent models by round. A neighbor may already be a round ahead; its newer model waits
    // here for this node's next round, so that a round-k mix uses models of round k or older
    // (with tau = 0 and wait-all that is exactly synchronous D-PSGD).
    std::map<Round, ModelPtr> models;
    std::optional<Round> last_used;
    // Arrival lags per round of this node: until the neighbor's latest round was >= k (what a
    // wait plan needs; a neighbor that skipped round k is in with its first later round) and
    // until it was >= k - tau (what the staleness gate needs).
    LagWindow lags;
    LagWindow gate_lags;
    // The newest of this node's rounds whose lag / gate lag is recorded; later rounds in
    // wait_start_ are pending until the neighbor's models get there.
    Round lag_measured = -1;
    Round gate_measured = -1;
  };

  // Must hold mu_. Whether round k may end now: the staleness gate holds and the plan is met.
  bool satisfiedLocked(Round k, const WaitPlan& plan, SteadyTime start, SteadyTime now) const;
  // Must hold mu_. The earliest future moment a stalled-neighbor check can change the answer.
  SteadyTime nextStallLocked(SteadyTime now) const;
  std::vector<NodeId> missingLocked(Round k) const;
  // Must hold mu_. Records the lags of every pending round that n's latest model now covers.
  void measureLocked(Neighbor& n, SteadyTime at);
  // Must hold mu_. The gather's take: see takeNewest.
  std::vector<UsedModel> takeLocked(Round k, size_t* live);
  // Must hold mu_. Whether n holds the staleness gate (and counts for skipping) at `now`.
  bool stalledLocked(const Neighbor& n, SteadyTime now) const;

  BoardOptions options_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<NodeId, Neighbor> neighbors_;
  std::map<Round, SteadyTime> wait_start_;  // recent rounds' wait start, for late-model lags
  bool stopped_ = false;
  std::vector<LagWindow> observe_copy_;  // stable copies handed out by observe()
  std::vector<LagWindow> observe_gate_copy_;
};

}  // namespace chorus::consensus
