#include "consensus/round_board.h"

#include <algorithm>

namespace chorus::consensus {

RoundBoard::RoundBoard(BoardOptions options) : options_(std::move(options)) {
  const SteadyTime now = std::chrono::steady_clock::now();
  for (NodeId n : options_.neighbors) {
    Neighbor& nb = neighbors_[n];
    nb.last_heard = now;
    nb.lags = LagWindow(options_.lag_window);
    nb.gate_lags = LagWindow(options_.lag_window);
  }
}

void RoundBoard::measureLocked(Neighbor& n, SteadyTime at) {
  if (!n.latest_round) return;
  const Round have = *n.latest_round;
  auto lag_of = [&](SteadyTime started) {
    return at > started ? std::chrono::duration<double>(at - started).count() : 0.0;
  };
  // Rounds in order: once one is not covered yet, no later one is.
  for (auto it = wait_start_.upper_bound(n.lag_measured); it != wait_start_.end(); ++it) {
    if (it->first > have) break;
    n.lags.add(lag_of(it->second));
    n.lag_measured = it->first;
  }
  for (auto it = wait_start_.upper_bound(n.gate_measured); it != wait_start_.end(); ++it) {
    if (it->first - options_.staleness_bound > have) break;
    n.gate_lags.add(lag_of(it->second));
    n.gate_measured = it->first;
  }
}

void RoundBoard::modelArrived(NodeId from, Round round, ModelPtr values, SteadyTime at) {
  {
    std::lock_guard lock(mu_);
    auto it = neighbors_.find(from);
    if (it == neighbors_.end()) return;  // not a neighbor: the caller logs it
    Neighbor& n = it->second;
    n.live = true;  // a model is proof of life, even before the runtime says so
    n.joined = true;
    n.last_heard = at;
    if (!n.latest_round || round > *n.latest_round) n.latest_round = round;
    const Round gathered = wait_start_.empty() ? -1 : wait_start_.rbegin()->first;
    const bool mixable = gathered < 0 || round >= gathered - options_.staleness_bound;
    if ((!n.last_used || round > *n.last_used) && mixable) {
      n.models[round] = std::move(values);
      while (n.models.size() > modelsHeldPerNeighbor())
        n.models.erase(n.models.begin());
    }
    // Late models are measured too (from when this node began waiting in the rounds they
    // cover), so a straggler's lag stays known although nobody waited for it.
    measureLocked(n, at);
  }
  changed_.notify_all();
}

size_t RoundBoard::modelsHeldPerNeighbor() const {
  return 2 * static_cast<size_t>(std::max<int64_t>(options_.staleness_bound, 0)) + 2;
}

size_t RoundBoard::heldModels() const {
  std::lock_guard lock(mu_);
  size_t count = 0;
  for (const auto& [id, n] : neighbors_)
    count += n.models.size();
  return count;
}

size_t RoundBoard::heldBytes() const {
  std::lock_guard lock(mu_);
  size_t bytes = 0;
  for (const auto& [id, n] : neighbors_) {
    for (const auto& [round, model] : n.models)
      bytes += model ? model->size() * sizeof(float) : 0;
  }
  return bytes;
}

void RoundBoard::neighborDown(NodeId peer) {
  {
    std::lock_guard lock(mu_);
    auto it = neighbors_.find(peer);
    if (it == neighbors_.end()) return;
    Neighbor& n = it->second;
    n.live = false;
    n.latest_round.reset();
    n.models.clear();
    n.last_used.reset();
    n.lags.clear();
    n.gate_lags.clear();
  }
  changed_.notify_all();
}

void RoundBoard::neighborUp(NodeId peer) {
  {
    std::lock_guard lock(mu_);
    auto it = neighbors_.find(peer);
    if (it == neighbors_.end() || it->second.live) return;
    it->second.live = true;
    it->second.last_heard = std::chrono::steady_clock::now();
    // Until its first model arrives it is catching up (taking a neighbor's model first), so
    // nobody waits for it.
    it->second.joined = false;
    // Lags count from its return on: rounds this node waited in before are not its lags.
    const Round last = wait_start_.empty() ? -1 : wait_start_.rbegin()->first;
    it->second.lag_measured = last;
    it->second.gate_measured = last;
  }
  changed_.notify_all();
}

void RoundBoard::stop() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  changed_.notify_all();
}

bool RoundBoard::satisfiedLocked(Round k, const WaitPlan& plan, SteadyTime start,
                                 SteadyTime now) const {
  size_t arrived = 0, waiting_members = 0;
  for (const auto& [id, n] : neighbors_) {
    if (!n.live || !n.joined) continue;
    ++waiting_members;
    const Round have = n.latest_round.value_or(-1);
    const bool stalled = stalledLocked(n, now);
    // Hop's gap: no running more than tau rounds ahead of a live neighbor that still works.
    if (have < k - options_.staleness_bound && !stalled) return false;
    if (have >= k) ++arrived;
  }
  const size_t need = std::min(plan.wait_for, waiting_members);
  if (arrived >= waiting_members) return true;
  if (plan.deadline_seconds) {
    double waited = std::chrono::duration<double>(now - start).count();
    return waited >= *plan.deadline_seconds && arrived >= need;
  }
  return arrived >= need;
}

bool RoundBoard::stalledLocked(const Neighbor& n, SteadyTime now) const {
  return now - n.last_heard > options_.stall_timeout;
}

SteadyTime RoundBoard::nextStallLocked(SteadyTime now) const {
  SteadyTime next = SteadyTime::max();
  for (const auto& [id, n] : neighbors_) {
    SteadyTime at = n.last_heard + options_.stall_timeout;
    if (n.live && n.joined && at >= now) next = std::min(next, at + std::chrono::milliseconds(1));
  }
  return next;
}

std::vector<NodeId> RoundBoard::missingLocked(Round k) const {
  std::vector<NodeId> out;
  for (const auto& [id, n] : neighbors_) {
    if (n.live && n.joined && (!n.latest_round || *n.latest_round < k)) out.push_back(id);
  }
  return out;
}

GatherResult RoundBoard::gather(
    Round k, const WaitPlan& plan,
    const std::function<void(const std::vector<NodeId>&)>& still_waiting) {
  GatherResult result;
  std::unique_lock lock(mu_);
  const SteadyTime start = std::chrono::steady_clock::now();
  wait_start_[k] = start;
  // Keep the wait starts of the rounds whose models may still arrive late.
  while (!wait_start_.empty() &&
         wait_start_.begin()->first < k - std::max<int64_t>(options_.staleness_bound, 0) - 64) {
    wait_start_.erase(wait_start_.begin());
  }
  for (auto& [id, n] : neighbors_) {
    if (n.live && n.joined) measureLocked(n, start);  // models that were here already: lag 0
  }
  const SteadyTime deadline_at = start + options_.round_timeout;
  SteadyTime next_report = start + options_.report_every;
  while (true) {
    SteadyTime now = std::chrono::steady_clock::now();
    if (stopped_) {
      result.stopped = true;
      break;
    }
    if (satisfiedLocked(k, plan, start, now)) break;
    if (now >= deadline_at) {
      result.timed_out = true;
      break;
    }
    SteadyTime wake = std::min({deadline_at, next_report, nextStallLocked(now)});
    if (plan.deadline_seconds) {
      SteadyTime plan_deadline =
          start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(*plan.deadline_seconds));
      // Once the plan's deadline has passed only an arrival can help: no busy waiting.
      if (plan_deadline > now) wake = std::min(wake, plan_deadline);
    }
    changed_.wait_until(lock, wake);
    if (std::chrono::steady_clock::now() < next_report) continue;
    // Advanced with or without a listener: a report time left in the past would make every
    // later wait return at once.
    next_report += options_.report_every;
    if (still_waiting) {
      auto missing = missingLocked(k);
      lock.unlock();
      still_waiting(missing);
      lock.lock();
    }
  }
  result.waited_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.missing = missingLocked(k);
  result.models = takeLocked(k, &result.live_neighbors);
  return result;
}

std::vector<UsedModel> RoundBoard::takeLocked(Round k, size_t* live) {
  std::vector<UsedModel> out;
  size_t live_count = 0;
  for (auto& [id, n] : neighbors_) {
    if (!n.live) continue;
    ++live_count;
    // The newest model of round <= k; within the staleness bound only; each model is used
    // once. Older ones can never be used again and are dropped.
    auto newest = n.models.upper_bound(k);
    if (newest == n.models.begin()) continue;
    --newest;
    const Round round = newest->first;
    ModelPtr values = newest->second;
    n.models.erase(n.models.begin(), std::next(newest));
    if (round < k - options_.staleness_bound) continue;
    if (n.last_used && *n.last_used >= round) continue;
    n.last_used = round;
    out.push_back(UsedModel{id, round, std::max<int64_t>(0, k - round), values});
  }
  if (live != nullptr) *live = live_count;
  return out;
}

std::vector<UsedModel> RoundBoard::takeNewest(Round k) {
  std::lock_guard lock(mu_);
  return takeLocked(k, nullptr);
}

std::optional<Round> RoundBoard::skipTarget(Round k) const {
  if (options_.skip_gap <= 0) return std::nullopt;
  std::lock_guard lock(mu_);
  const SteadyTime now = std::chrono::steady_clock::now();
  std::optional<Round> lowest;
  for (const auto& [id, n] : neighbors_) {
    // The same neighbors that hold the staleness gate: only they can be held back by us.
    if (!n.live || !n.joined || stalledLocked(n, now)) continue;
    if (!n.latest_round || *n.latest_round < k + options_.skip_gap) return std::nullopt;
    lowest = std::min(lowest.value_or(*n.latest_round), *n.latest_round);
  }
  // The lowest: it skips only rounds every neighbor has done, and is ahead of nobody.
  return lowest;
}

RoundObservation RoundBoard::observe(double compute_seconds, double grad_norm_sq,
                                     double grad_noise) {
  RoundObservation obs;
  obs.compute_seconds = compute_seconds;
  obs.grad_norm_sq = grad_norm_sq;
  obs.grad_noise = grad_noise;
  std::lock_guard lock(mu_);
  observe_copy_.clear();
  observe_gate_copy_.clear();
  for (const auto& [id, n] : neighbors_) {
    if (n.live && n.joined) {
      observe_copy_.push_back(n.lags);
      observe_gate_copy_.push_back(n.gate_lags);
    }
  }
  for (const auto& w : observe_copy_)
    obs.neighbor_lags.push_back(&w);
  for (const auto& w : observe_gate_copy_)
    obs.neighbor_gate_lags.push_back(&w);
  return obs;
}

std::vector<NodeId> RoundBoard::liveNeighbors() const {
  std::lock_guard lock(mu_);
  std::vector<NodeId> out;
  for (const auto& [id, n] : neighbors_) {
    if (n.live) out.push_back(id);
  }
  return out;
}

std::optional<Round> RoundBoard::latestRound(NodeId peer) const {
  std::lock_guard lock(mu_);
  auto it = neighbors_.find(peer);
  return it == neighbors_.end() ? std::nullopt : it->second.latest_round;
}

}  // namespace chorus::consensus
