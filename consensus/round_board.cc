#include "consensus/round_board.h"

#include <algorithm>

namespace chorus::consensus {

RoundBoard::RoundBoard(BoardOptions options) : options_(std::move(options)) {
  const SteadyTime now = std::chrono::steady_clock::now();
  for (NodeId n : options_.neighbors) {
    neighbors_.emplace(
        n,
        Neighbor{true, true, now, std::nullopt, {}, std::nullopt, LagWindow(options_.lag_window)});
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
    if (!n.last_used || round > *n.last_used) n.models[round] = std::move(values);
    // The lag counts from when this node began waiting in that round; a model that came
    // before the wait began was not waited for at all.
    auto started = wait_start_.find(round);
    double lag = 0;
    if (started != wait_start_.end() && at > started->second) {
      lag = std::chrono::duration<double>(at - started->second).count();
    }
    n.lags.add(lag);
  }
  changed_.notify_all();
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
    const bool stalled = now - n.last_heard > options_.stall_timeout;
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
    if (still_waiting && std::chrono::steady_clock::now() >= next_report) {
      next_report += options_.report_every;
      auto missing = missingLocked(k);
      lock.unlock();
      still_waiting(missing);
      lock.lock();
    }
  }
  result.waited_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.missing = missingLocked(k);
  for (auto& [id, n] : neighbors_) {
    if (!n.live) continue;
    ++result.live_neighbors;
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
    result.models.push_back(UsedModel{id, round, std::max<int64_t>(0, k - round), values});
  }
  return result;
}

RoundObservation RoundBoard::observe(double compute_seconds, double grad_norm_sq,
                                     double grad_noise) {
  RoundObservation obs;
  obs.compute_seconds = compute_seconds;
  obs.grad_norm_sq = grad_norm_sq;
  obs.grad_noise = grad_noise;
  std::lock_guard lock(mu_);
  observe_copy_.clear();
  for (const auto& [id, n] : neighbors_) {
    if (n.live && n.joined) observe_copy_.push_back(n.lags);
  }
  for (const auto& w : observe_copy_)
    obs.neighbor_lags.push_back(&w);
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
