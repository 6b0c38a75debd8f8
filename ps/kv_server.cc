#include "ps/kv_server.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "chorus/chorus_generated.h"
#include "node/finite.h"
#include "node/node.h"
#include "ps/codec.h"

namespace chorus::ps {

namespace {

using SteadyClock = std::chrono::steady_clock;

GateOptions gateOptions(const ServerOptions& options) {
  return GateOptions{.bsp = options.bsp,
                     .down_timeout = options.down_timeout,
                     .report_every = options.report_every,
                     .max_clock = options.max_clock};
}

}  // namespace

Clock leadLimit(Staleness staleness) {
  if (staleness.infinite()) return Staleness::kInfinite;
  return 2 * (staleness.bound + 1) + kLeadSlack;
}

KvServer::KvServer(node::Node& node, KeyStore store, const std::vector<WorkerId>& workers,
                   ServerOptions options)
    : KvServer(node, std::move(store), std::nullopt, workers, std::move(options)) {}

KvServer::KvServer(node::Node& node, KeyStore store, KeyDirectory directory,
                   const std::vector<WorkerId>& workers, ServerOptions options)
    : KvServer(node, std::move(store), std::optional<KeyDirectory>(std::move(directory)), workers,
               std::move(options)) {}

KvServer::KvServer(node::Node& node, KeyStore store, std::optional<KeyDirectory> directory,
                   const std::vector<WorkerId>& workers, ServerOptions options)
    : node_(node),
      store_(std::move(store)),
      // Without a directory, every key of the store's space at its home among the workers.
      directory_(directory ? std::move(*directory)
                           : KeyDirectory(ShardMap(workers), store_.space())),
      options_(std::move(options)),
      gate_(workers, gateOptions(options_)),
      num_workers_(std::max<Clock>(1, static_cast<Clock>(workers.size()))),
      holding_(options_.hold_until_restored) {
  if (options_.start_clock > 0) {
    std::vector<WorkerView> views;
    for (WorkerId worker : workers)
      views.push_back({worker, options_.start_clock, true});
    gate_.restore(views);
    for (WorkerId worker : workers)
      heard_[worker] = options_.start_clock;
  }
  node_.setHandler(
      messageType(wire::Body::PsPull),
      [this](node::NodeId from, const node::InboundFrame& frame) { onPullFrame(from, frame); });
  node_.setHandler(
      messageType(wire::Body::PsPush),
      [this](node::NodeId from, const node::InboundFrame& frame) { onPushFrame(from, frame); });
  node_.setHandler(
      messageType(wire::Body::PsClock),
      [this](node::NodeId from, const node::InboundFrame& frame) { onClockFrame(from, frame); });
}

void KvServer::countError() {
  std::lock_guard lock(mu_);
  ++summary_.errors;
}

std::optional<std::string> KvServer::checkParkLimit(WorkerId worker, const char* what) const {
  const auto it = waiting_.find(worker);
  const size_t waiting = it == waiting_.end() ? 0 : it->second;
  if (waiting < options_.max_parked_per_worker) return std::nullopt;
  return fmt::format(
      "{} refused: node {} already has {} request(s) waiting here (for a clock, or for this "
      "owner's restore), the most one worker may have (a worker reads each clock once per owner)",
      what, worker, waiting);
}

std::optional<std::string> KvServer::checkLead(WorkerId worker, Clock clock) const {
  // Before restore() a restarted owner knows no clock yet: every announcement is ahead of 0.
  if (options_.max_lead >= Staleness::kInfinite || holding_) return std::nullopt;
  std::optional<WorkerId> ahead;
  for (WorkerId other : gate_.workers()) {
    if (other != worker && gate_.counted(other) &&
        (!ahead || gate_.clockOf(other) > gate_.clockOf(*ahead))) {
      ahead = other;
    }
  }
  // Nobody else counts: no read waits for anyone but this worker, whose clock releases nothing
  // it would not release itself.
  if (!ahead) return std::nullopt;
  const Clock lead = clock - gate_.clockOf(*ahead);
  if (lead <= options_.max_lead) return std::nullopt;
  return fmt::format(
      "PsClock at clock {} from node {} runs {} clock(s) ahead of node {} (at clock {}), the most "
      "advanced other worker reads wait for; a worker of this run cannot be more than {} ahead: "
      "refused, its clock stays {}",
      clock, worker, lead, *ahead, gate_.clockOf(*ahead), options_.max_lead, gate_.clockOf(worker));
}

std::optional<std::string> KvServer::hold(WorkerId worker, const char* what,
                                          std::function<void()> request) {
  if (auto error = checkParkLimit(worker, what)) return error;
  ++waiting_[worker];
  held_requests_.push_back([this, worker, request = std::move(request)] {
    --waiting_[worker];
    request();
  });
  return std::nullopt;
}

bool KvServer::park(WorkerId worker, Clock min_clock, std::function<void()> release) {
  if (gate_.ready(min_clock)) {
    gate_.whenReady(min_clock, std::move(release), SteadyClock::now());  // runs it now
    return false;
  }
  ++waiting_[worker];
  return gate_.whenReady(
      min_clock,
      [this, worker, release = std::move(release)] {
        --waiting_[worker];
        release();
      },
      SteadyClock::now());
}

void KvServer::checkRunningJob(WorkerId worker, Clock clock, Clock first) {
  if (!options_.on_running_job || options_.hold_until_restored || running_job_reported_) return;
  const std::optional<bool> late = gate_.startedLate(worker, clock, first);
  if (!late) return;
  if (!*late) {
    node_.logger().warn(
        "worker node {} is at clock {} in the first of its messages heard here; its earlier "
        "announcements were lost when its connection dropped",
        worker, clock);
    return;
  }
  running_job_reported_ = true;
  holding_ = true;
  options_.on_running_job(worker, clock);
}

void KvServer::pull(WorkerId worker, Clock clock, Clock min_clock, std::vector<uint64_t> keys,
                    PullAnswer answer) {
  if (auto error = gate_.checkSender(worker, clock, "pull")) {
    countError();
    answer(*error, 0, {}, nullptr);
    return;
  }
  checkRunningJob(worker, clock, 0);  // a pull at clock c follows the worker's PsClock(c)
  if (holding_) {
    if (auto error = hold(worker, "pull", [this, worker, clock, min_clock, keys, answer]() {
          pull(worker, clock, min_clock, keys, answer);
        })) {
      countError();
      answer(*error, 0, {}, nullptr);
    }
    return;
  }
  std::optional<std::string> error = checkPull(worker, clock, min_clock);
  if (!error) error = store_.check(keys, std::nullopt, &directory_);
  if (!error && !gate_.ready(min_clock)) error = checkParkLimit(worker, "pull");
  if (error) {
    countError();
    answer(*error, 0, {}, nullptr);
    return;
  }
  // The release runs now or from a later clock(); the store is read only then, so the answer
  // holds every update that arrived before the condition became true.
  const bool parked =
      park(worker, min_clock, [this, keys = std::move(keys), answer = std::move(answer)] {
        applyDue();
        {
          std::lock_guard lock(mu_);
          ++summary_.pulls;
        }
        answer("", gate_.minClock(), keys, &store_);
      });
  if (parked) {
    std::lock_guard lock(mu_);
    ++summary_.parked;
  }
}

std::optional<std::string> KvServer::checkPull(WorkerId worker, Clock clock, Clock min_clock) {
  std::optional<std::string> error = gate_.checkWithinRun(clock, "pull");
  if (!error) error = gate_.checkNotBehind(worker, clock, "pull");
  if (!error && min_clock > clock) {
    error = fmt::format("pull at clock {} asks for min clock {}, above its own", clock, min_clock);
  }
  return error;
}

std::optional<std::string> KvServer::push(WorkerId worker, Clock clock,
                                          std::span<const uint64_t> keys,
                                          std::span<const float> grads) {
  return pushChecked(worker, clock, keys, grads, false);
}

std::optional<std::string> KvServer::pushChecked(WorkerId worker, Clock clock,
                                                 std::span<const uint64_t> keys,
                                                 std::span<const float> grads, bool resent) {
  std::optional<std::string> error = gate_.checkSender(worker, clock, "push");
  if (!error) error = gate_.checkWithinRun(clock, "push");
  if (!error && !resent) error = gate_.checkNotBehind(worker, clock, "push");
  // The rows are looked up once, here, and applied below without a second lookup.
  if (!error) error = store_.locate(keys, grads.size(), &directory_, located_);
  if (error) {
    countError();
    return error;
  }
  return pushLocated(worker, clock, keys, grads);
}

std::optional<std::string> KvServer::pushLocated(WorkerId worker, Clock clock,
                                                 std::span<const uint64_t> keys,
                                                 std::span<const float> grads) {
  std::optional<std::string> error;
  {
    // One vectorizable pass; a NaN applied here would reach every worker's next read.
    if (const std::optional<size_t> bad = node::firstNonFinite(grads)) {
      error = fmt::format(
          "push at clock {} holds {} non-finite value(s) (the first, {}, is float {} of its {}): "
          "nothing applied",
          clock, node::countNonFinite(grads), grads[*bad], *bad, grads.size());
    }
  }
  if (error) {
    countError();
    return error;
  }
  if (options_.bsp) {
    std::vector<Key> held(keys.begin(), keys.end());
    if (keys.empty()) store_.keysOf(located_, held);
    gate_.hold(worker, clock, SspGate::HeldPush{std::move(held), {grads.begin(), grads.end()}});
    applyDue();  // the push may already be due (a worker excluded meanwhile)
    return std::nullopt;
  }
  store_.applyRuns(located_, grads, options_.lr_by_progress ? gate_.total() / num_workers_ : clock);
  std::lock_guard lock(mu_);
  ++summary_.pushes;
  return std::nullopt;
}

void KvServer::whenClocksApplied(Clock clock, std::function<void(const KeyStore&)> snapshot) {
  gate_.whenReady(
      clock,
      [this, snapshot = std::move(snapshot)] {
        applyDue();  // BSP: the held pushes of the clocks below
        snapshot(store_);
      },
      SteadyClock::now());
}

void KvServer::applyDue() {
  uint64_t applied = 0;
  for (const auto& [clock, pushes] : gate_.takeDue()) {
    if (!store_.stepsPerClock()) {
      for (const SspGate::HeldPush& push : pushes)
        store_.apply(push.keys, push.grads, clock);
    } else {
      // Momentum per clock: the clock's pushes as one step on their mean, which is synchronous
      // SGD with momentum exactly (one step per push could only approximate it).
      std::vector<KeyStore::Push> views;
      views.reserve(pushes.size());
      for (const SspGate::HeldPush& push : pushes)
        views.push_back({push.keys, push.grads});
      store_.applyClock(views, clock);
    }
    applied += pushes.size();
  }
  if (applied > 0) {
    std::lock_guard lock(mu_);
    summary_.pushes += applied;
  }
}

std::optional<std::string> KvServer::clock(WorkerId worker, Clock clock) {
  if (auto error = gate_.checkSender(worker, clock, "PsClock")) {
    countError();
    return error;
  }
  checkRunningJob(worker, clock, 1);  // every worker announces clock 1 first
  std::optional<std::string> error = gate_.checkWithinRun(clock, "PsClock");
  if (!error) error = checkLead(worker, clock);
  if (error) {
    countError();
    return error;
  }
  const SspGate::Advance advanced = gate_.advance(worker, clock);
  if (advanced.gap) {
    const ClockGap& gap = *advanced.gap;
    node_.logger().warn(
        "worker node {} went from clock {} to clock {}: its updates of clocks {}-{} "
        "are lost",
        gap.worker, gap.from, gap.to, gap.from, gap.to - 1);
    std::lock_guard lock(mu_);
    summary_.skipped.push_back(gap);
  }
  if (advanced.error) {
    countError();
    return advanced.error;
  }
  {
    std::lock_guard lock(mu_);
    heard_[worker] = gate_.clockOf(worker);
  }
  applyDue();
  return std::nullopt;
}

Clock KvServer::othersClockTotal(WorkerId self) const {
  std::lock_guard lock(mu_);
  Clock sum = 0;
  for (const auto& [worker, clock] : heard_) {
    if (worker != self) sum += clock;
  }
  return sum;
}

void KvServer::replyError(WorkerId to, uint64_t request, wire::PsOp op, const std::string& error) {
  if (refusals_.count(to)) {
    const uint64_t count = refusals_.countOf(to);
    node_.logger().warn(
        "refused a {} request from node {}: {}{}", wire::EnumNamePsOp(op), to, error,
        count > 1 ? fmt::format(" ({} refused from node {} so far)", count, to) : std::string());
  }
  node_.send(to, encode(node_, errorReply(request, op, error)));
}

void KvServer::onPullFrame(WorkerId from, const node::InboundFrame& frame) {
  PullRequest request;
  if (auto malformed =
          decodePull(*messageOf(frame).body_as_PsPull(), store_.size(), key_buffer_, request)) {
    countError();
    replyError(from, request.request, wire::PsOp::Pull, *malformed);
    return;
  }
  if (request.by_slots) {
    onSlotPull(from, request);
    return;
  }
  const uint64_t id = request.request;
  const bool want_slots = request.want_slots;
  pull(from, request.clock, request.min_clock, {request.keys.begin(), request.keys.end()},
       [this, from, id, want_slots](const std::string& error, Clock min_clock,
                                    std::span<const uint64_t> keys, const KeyStore* store) {
         if (!error.empty()) {
           replyError(from, id, wire::PsOp::Pull, error);
           return;
         }
         // The values travel as the frame's attachment, straight from the rows: what the
         // socket does not take before the next push may change them is copied
         // (Node::sendTransient), and the worker reads them straight into its buffer.
         slot_bytes_.clear();
         if (want_slots) {
           // The same rows, and their slots for the worker's next request of these keys.
           store->locate(keys, std::nullopt, nullptr, reply_runs_);
           store->rowsOfRuns(reply_runs_, row_buffer_);
           KeyStore::slotRunsOf(reply_runs_, slot_buffer_);
           encodeSlotRuns(slot_buffer_, slot_bytes_);
         } else {
           store->rowsOf(keys, row_buffer_);
         }
         size_t floats = 0;
         for (std::span<const float> row : row_buffer_)
           floats += row.size();
         node_.sendTransient(from, encode(node_, pullReply(id, min_clock, row_buffer_, floats,
                                                           slot_bytes_, store->layout())));
       });
}

void KvServer::onSlotPull(WorkerId from, const PullRequest& request) {
  std::optional<std::string> error = decodeSlotRuns(request.slot_runs, store_.size(), slot_buffer_);
  if (!error && request.layout != store_.layout()) {
    countError();
    node_.send(from, encode(node_, staleReply(request.request, wire::PsOp::Pull,
                                              "the rows named by slot have moved: ask by keys")));
    return;
  }
  std::vector<KeyStore::Run> runs;
  if (!error) error = store_.locateSlots(slot_buffer_, std::nullopt, runs);
  if (error) {
    countError();
    replyError(from, request.request, wire::PsOp::Pull, *error);
    return;
  }
  pullRuns(from, request.request, request.clock, request.min_clock, request.layout,
           std::move(runs));
}

void KvServer::pullRuns(WorkerId worker, uint64_t id, Clock clock, Clock min_clock, uint64_t layout,
                        std::vector<KeyStore::Run> runs) {
  if (auto error = gate_.checkSender(worker, clock, "pull")) {
    countError();
    replyError(worker, id, wire::PsOp::Pull, *error);
    return;
  }
  checkRunningJob(worker, clock, 0);
  if (holding_) {
    if (auto error = hold(worker, "pull", [this, worker, id, clock, min_clock, layout, runs] {
          pullRuns(worker, id, clock, min_clock, layout, runs);
        })) {
      countError();
      replyError(worker, id, wire::PsOp::Pull, *error);
    }
    return;
  }
  std::optional<std::string> error = checkPull(worker, clock, min_clock);
  if (!error && !gate_.ready(min_clock)) error = checkParkLimit(worker, "pull");
  if (error) {
    countError();
    replyError(worker, id, wire::PsOp::Pull, *error);
    return;
  }
  const bool parked = park(worker, min_clock, [this, worker, id, layout, runs = std::move(runs)] {
    applyDue();
    if (store_.layout() != layout) {  // rows left while the pull waited
      countError();
      node_.send(worker, encode(node_, staleReply(id, wire::PsOp::Pull,
                                                  "the rows named by slot have moved: ask "
                                                  "by keys")));
      return;
    }
    {
      std::lock_guard lock(mu_);
      ++summary_.pulls;
    }
    store_.rowsOfRuns(runs, row_buffer_);
    size_t floats = 0;
    for (const KeyStore::Run& run : runs)
      floats += run.floats;
    node_.sendTransient(worker,
                        encode(node_, pullReply(id, gate_.minClock(), row_buffer_, floats)));
  });
  if (parked) {
    std::lock_guard lock(mu_);
    ++summary_.parked;
  }
}

void KvServer::onPushFrame(WorkerId from, const node::InboundFrame& frame) {
  PushRequest request;
  std::optional<std::string> error = decodePush(
      *messageOf(frame).body_as_PsPush(), frame.attachment(), store_.size(), key_buffer_, request);
  if (!error) error = gate_.checkSender(from, request.clock, "push");
  if (error) {
    countError();
    replyError(from, request.request, wire::PsOp::Push, *error);
    return;
  }
  if (request.by_slots) {
    onSlotPush(from, request);
    return;
  }
  checkRunningJob(from, request.clock, 0);
  bool resent = false;
  if (auto it = stale_pushes_.find(from); it != stale_pushes_.end()) {
    resent = it->second.erase(request.request) > 0;
  }
  if (holding_) {
    // The frame is gone after this handler: keep copies.
    if (auto error = hold(from, "push",
                          [this, from, id = request.request, clock = request.clock,
                           keys = std::vector<uint64_t>(request.keys.begin(), request.keys.end()),
                           grads = std::vector<float>(request.grads.begin(), request.grads.end()),
                           resent] { handlePush(from, id, clock, keys, grads, resent); })) {
      countError();
      replyError(from, request.request, wire::PsOp::Push, *error);
    }
    return;
  }
  handlePush(from, request.request, request.clock, request.keys, request.grads, resent);
}

void KvServer::onSlotPush(WorkerId from, const PushRequest& request) {
  const uint64_t id = request.request;
  std::optional<std::string> error = decodeSlotRuns(
      request.slot_runs, std::min(store_.size(), request.grads.size()), slot_buffer_);
  if (!error && request.layout != store_.layout()) {
    countError();
    std::set<uint64_t>& stale = stale_pushes_[from];
    if (stale.size() < options_.max_parked_per_worker) stale.insert(id);
    node_.send(from, encode(node_, staleReply(id, wire::PsOp::Push,
                                              "the rows named by slot have moved: ask by keys")));
    return;
  }
  if (!error) error = store_.locateSlots(slot_buffer_, request.grads.size(), located_);
  if (error) {
    countError();
    replyError(from, id, wire::PsOp::Push, *error);
    return;
  }
  checkRunningJob(from, request.clock, 0);
  if (holding_) {
    // Rare (a restarted owner before its restore): held by keys, as a push by keys would be.
    if (auto error = checkParkLimit(from, "push")) {
      countError();
      replyError(from, id, wire::PsOp::Push, *error);
      return;
    }
    std::vector<Key> keys;
    store_.keysOf(located_, keys);
    hold(from, "push",
         [this, from, id, clock = request.clock, keys = std::move(keys),
          grads = std::vector<float>(request.grads.begin(), request.grads.end())] {
           handlePush(from, id, clock, keys, grads, false);
         });
    return;
  }
  error = gate_.checkWithinRun(request.clock, "push");
  if (!error) error = gate_.checkNotBehind(from, request.clock, "push");
  if (error) {
    countError();
  } else {
    error = pushLocated(from, request.clock, {}, request.grads);
  }
  if (error) {
    replyError(from, id, wire::PsOp::Push, *error);
    return;
  }
  node_.send(from, encode(node_, pushAck(id)));
}

void KvServer::handlePush(WorkerId from, uint64_t request, Clock clock,
                          std::span<const uint64_t> keys, std::span<const float> grads,
                          bool resent) {
  if (auto error = pushChecked(from, clock, keys, grads, resent)) {
    replyError(from, request, wire::PsOp::Push, *error);
    return;
  }
  node_.send(from, encode(node_, pushAck(request)));
}

std::vector<WorkerView> KvServer::workerViews() const {
  return gate_.views();
}

std::optional<std::string> KvServer::restore(std::span<const uint64_t> keys,
                                             std::span<const float> values,
                                             const std::vector<WorkerView>& views) {
  if (auto error = store_.check(keys, values.size(), &directory_)) return error;
  if (auto error = gate_.checkViews(views)) return fmt::format("workers' clocks: {}", *error);
  if (const size_t owned = store_.size(); keys.size() != owned) {
    return fmt::format("{} key(s) to restore, but {} are owned here", keys.size(), owned);
  }
  store_.restore(keys, values);
  // This node is connected to every worker (it passed waitClusterReady), and its own down
  // time-outs decide who counts; an exclusion taken over would never be lifted.
  gate_.restore(views);
  {
    std::lock_guard lock(mu_);
    for (WorkerId worker : gate_.workers())
      heard_[worker] = gate_.clockOf(worker);
  }
  holding_ = false;
  std::vector<std::function<void()>> held = std::move(held_requests_);
  held_requests_.clear();
  for (auto& request : held)
    request();
  return std::nullopt;
}

void KvServer::onClockFrame(WorkerId from, const node::InboundFrame& frame) {
  const wire::PsClock* message = messageOf(frame).body_as_PsClock();
  if (auto error = clock(from, message->clock())) {
    replyError(from, 0, wire::PsOp::Clock, *error);
  }
}

void KvServer::onPeerEvent(const node::PeerEvent& event) {
  switch (event.kind) {
    case node::PeerEventKind::kDown:
    case node::PeerEventKind::kLeft:
      if (!gate_.workerDown(event.peer, event.kind == node::PeerEventKind::kDown,
                            SteadyClock::now())) {
        return;
      }
      if (options_.down_timeout.count() > 0) {
        node_.logger().warn(
            "worker node {} is {} at clock {}: pulls stop waiting for it in {} s unless it comes "
            "back",
            event.peer, event.kind == node::PeerEventKind::kLeft ? "gone" : "down",
            gate_.clockOf(event.peer), options_.down_timeout.count() / 1000.0);
      }
      break;
    case node::PeerEventKind::kUp:
      if (gate_.workerUp(event.peer)) {
        node_.logger().info("worker node {} is back; counting its clock {} again", event.peer,
                            gate_.clockOf(event.peer));
        std::lock_guard lock(mu_);
        summary_.excluded.erase(event.peer);
      }
      break;
    default:
      break;
  }
}

void KvServer::workerFinished(WorkerId worker) {
  gate_.workerFinished(worker);
}

void KvServer::tick(SteadyClock::time_point now) {
  const std::vector<std::pair<WorkerId, Clock>> excluded = gate_.expire(now);
  if (!excluded.empty()) applyDue();
  for (const auto& [worker, at] : excluded) {
    node_.logger().warn(
        "worker node {} has been down for {} s: pulls no longer wait for it; its updates from "
        "clock {} on are lost",
        worker, options_.down_timeout.count() / 1000.0, at);
    std::lock_guard lock(mu_);
    summary_.excluded[worker] = at;
  }
  const std::optional<SspGate::WaitReport> report = gate_.waitReport(now);
  if (!report) return;
  std::vector<std::string> who;
  who.reserve(report->lagging.size());
  for (WorkerId w : report->lagging)
    who.push_back(fmt::format("{} (at clock {})", w, gate_.clockOf(w)));
  node_.logger().info("{} pull(s) wait until every worker reaches clock {}; waiting for node(s) {}",
                      report->parked, report->needed, fmt::join(who, ", "));
  if (options_.on_waiting) options_.on_waiting(report->lagging, report->needed);
}

ServerSummary KvServer::summary() const {
  std::lock_guard lock(mu_);
  return summary_;
}

}  // namespace chorus::ps
