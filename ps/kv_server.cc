#include "ps/kv_server.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "chorus/chorus_generated.h"
#include "node/finite.h"
#include "node/node.h"

namespace chorus::ps {

namespace {

using SteadyClock = std::chrono::steady_clock;

// An owner answers a read once every live worker reached the reader's min_clock: a WorkerClocks
// with bound 0 parks on that clock as given (the worker applied its staleness already).
constexpr Staleness kExplicitMinClock{0};

}  // namespace

std::optional<std::span<const float>> valuesOf(const flatbuffers::Vector<float>* values,
                                               const node::InboundFrame& frame) {
  const std::span<const uint8_t> attached = frame.attachment();
  if (values != nullptr) {
    if (!attached.empty()) return std::nullopt;
    return std::span<const float>(values->data(), values->size());
  }
  if (attached.size() % sizeof(float) != 0) return std::nullopt;
  return std::span<const float>(reinterpret_cast<const float*>(attached.data()),
                                attached.size() / sizeof(float));
}

KvServer::KvServer(node::Node& node, KeyStore store, const std::vector<WorkerId>& workers,
                   ServerOptions options)
    : node_(node),
      store_(std::move(store)),
      options_(std::move(options)),
      clocks_(workers, kExplicitMinClock),
      num_workers_(std::max<Clock>(1, static_cast<Clock>(workers.size()))),
      holding_(options_.hold_until_restored) {
  node_.setHandler(wire::Body::PsPull, [this](node::NodeId from, const wire::Envelope& envelope) {
    onPullFrame(from, envelope);
  });
  node_.setFrameHandler(
      wire::Body::PsPush,
      [this](node::NodeId from, const node::InboundFrame& frame) { onPushFrame(from, frame); });
  node_.setHandler(wire::Body::PsClock, [this](node::NodeId from, const wire::Envelope& envelope) {
    onClockFrame(from, envelope);
  });
}

std::optional<std::string> KvServer::checkClock(WorkerId worker, Clock clock,
                                                const char* what) const {
  const Clock current = clocks_.clockOf(worker);
  // A restored clock is a helper's view, which may be ahead of what the worker still had in
  // flight to this owner: a push of clock 33 can arrive here after the helper heard clock 34.
  // Nothing reached this incarnation before, so such a request is no replay; it is accepted
  // until the worker's own next clock announcement anchors its clock here.
  if (clock < current && unanchored_.count(worker) == 0) {
    return fmt::format(
        "{} at clock {} but node {} already reached clock {} (clock going backwards)", what, clock,
        worker, current);
  }
  return std::nullopt;
}

std::optional<std::string> KvServer::checkSender(WorkerId worker, Clock clock,
                                                 const char* what) const {
  if (!clocks_.known(worker)) {
    return fmt::format("{} from node {}, which is not a worker of this run", what, worker);
  }
  if (clock < 0 || clock >= kClockCeiling) {
    return fmt::format("{} at clock {}, which no run reaches", what, clock);
  }
  return std::nullopt;
}

std::optional<std::string> KvServer::checkWithinRun(Clock clock, const char* what) const {
  if (clock > options_.max_clock) {
    return fmt::format("{} at clock {}, outside this run's clocks 0..{}", what, clock,
                       options_.max_clock);
  }
  return std::nullopt;
}

void KvServer::checkRunningJob(WorkerId worker, Clock clock, Clock first) {
  if (!options_.on_running_job || options_.hold_until_restored || running_job_reported_) return;
  if (!clocks_.known(worker) || clocks_.clockOf(worker) != 0 || clock <= first) return;
  if (dropped_.count(worker) > 0) {
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
  if (auto error = checkSender(worker, clock, "pull")) {
    {
      std::lock_guard lock(mu_);
      ++summary_.errors;
    }
    answer(*error, 0, {}, nullptr);
    return;
  }
  checkRunningJob(worker, clock, 0);  // a pull at clock c follows the worker's PsClock(c)
  if (holding_) {
    held_requests_.push_back(
        [this, worker, clock, min_clock, keys = std::move(keys), answer = std::move(answer)]() {
          pull(worker, clock, min_clock, keys, answer);
        });
    return;
  }
  std::optional<std::string> error = checkWithinRun(clock, "pull");
  if (!error) error = checkClock(worker, clock, "pull");
  if (!error && min_clock > clock) {
    error = fmt::format("pull at clock {} asks for min clock {}, above its own", clock, min_clock);
  }
  if (!error) error = store_.check(keys, std::nullopt);
  if (error) {
    {
      std::lock_guard lock(mu_);
      ++summary_.errors;
    }
    answer(*error, 0, {}, nullptr);
    return;
  }
  const bool ready = clocks_.ready(min_clock);
  if (!ready) {
    std::lock_guard lock(mu_);
    ++summary_.parked;
    if (!parked_since_) parked_since_ = SteadyClock::now();
  }
  // The release runs now or from a later clock(); the store is read only then, so the answer
  // holds every update that arrived before the condition became true.
  clocks_.whenReady(min_clock, [this, keys = std::move(keys), answer = std::move(answer)] {
    applyDue();
    {
      std::lock_guard lock(mu_);
      ++summary_.pulls;
    }
    answer("", clocks_.minClock(), keys, &store_);
  });
}

std::optional<std::string> KvServer::push(WorkerId worker, Clock clock,
                                          std::span<const uint64_t> keys,
                                          std::span<const float> grads) {
  std::optional<std::string> error = checkSender(worker, clock, "push");
  if (!error) error = checkWithinRun(clock, "push");
  if (!error) error = checkClock(worker, clock, "push");
  if (!error) error = store_.check(keys, grads.size());
  if (!error) {
    // One vectorizable pass; a NaN applied here would reach every worker's next read.
    if (const std::optional<size_t> bad = node::firstNonFinite(grads)) {
      error = fmt::format(
          "push at clock {} holds {} non-finite value(s) (the first, {}, is float {} of its {}): "
          "nothing applied",
          clock, node::countNonFinite(grads), grads[*bad], *bad, grads.size());
    }
  }
  if (error) {
    std::lock_guard lock(mu_);
    ++summary_.errors;
    return error;
  }
  if (options_.bsp) {
    held_[{clock, worker}].push_back(
        HeldPush{{keys.begin(), keys.end()}, {grads.begin(), grads.end()}});
    applyDue();  // the push may already be due (a worker excluded meanwhile)
    return std::nullopt;
  }
  store_.apply(keys, grads, options_.lr_by_progress ? clocks_.total() / num_workers_ : clock);
  std::lock_guard lock(mu_);
  ++summary_.pushes;
  return std::nullopt;
}

void KvServer::applyDue() {
  const Clock min = clocks_.minClock();
  uint64_t applied = 0;
  auto it = held_.begin();
  while (it != held_.end() && it->first.first < min) {
    const Clock clock = it->first.first;
    if (!store_.stepsPerClock()) {
      for (const HeldPush& push : it->second) {
        store_.apply(push.keys, push.grads, clock);
        ++applied;
      }
      it = held_.erase(it);
      continue;
    }
    // Momentum per clock: the clock's pushes as one step on their mean, which is synchronous
    // SGD with momentum exactly (one step per push could only approximate it).
    std::vector<KeyStore::Push> pushes;
    auto end = it;
    for (; end != held_.end() && end->first.first == clock; ++end) {
      for (const HeldPush& push : end->second)
        pushes.push_back({push.keys, push.grads});
    }
    store_.applyClock(pushes, clock);
    applied += pushes.size();
    it = held_.erase(it, end);
  }
  if (applied > 0) {
    std::lock_guard lock(mu_);
    summary_.pushes += applied;
  }
}

std::optional<std::string> KvServer::clock(WorkerId worker, Clock clock) {
  if (auto error = checkSender(worker, clock, "PsClock")) {
    std::lock_guard lock(mu_);
    ++summary_.errors;
    return error;
  }
  checkRunningJob(worker, clock, 1);  // every worker announces clock 1 first
  if (auto error = checkWithinRun(clock, "PsClock")) {
    std::lock_guard lock(mu_);
    ++summary_.errors;
    return error;
  }
  // Every clock is announced in order on a FIFO connection, so a jump means clocks the worker
  // never ran (a rejoin) or whose announcements were lost with a connection.
  // After restore() the clocks are another owner's view, which may be older or newer than what
  // the worker had in flight to this owner: the first clock heard from each worker then may
  // jump without anything lost, and clocks below the view change nothing.
  if (unanchored_.count(worker) > 0 && clock < clocks_.clockOf(worker)) return std::nullopt;
  const bool anchored = unanchored_.erase(worker) == 0;
  const Clock before = clocks_.known(worker) ? clocks_.clockOf(worker) : clock;
  if (anchored && clock > before + 1 && before > 0) {
    node_.logger().warn(
        "worker node {} went from clock {} to clock {}: its updates of clocks {}-{} "
        "are lost",
        worker, before, clock, before, clock - 1);
    std::lock_guard lock(mu_);
    summary_.skipped.push_back({worker, before, clock});
  }
  if (auto error = clocks_.advance(worker, clock)) {
    std::lock_guard lock(mu_);
    ++summary_.errors;
    return error;
  }
  {
    std::lock_guard lock(mu_);
    heard_[worker] = clocks_.clockOf(worker);
  }
  applyDue();
  if (clocks_.parked() == 0) parked_since_.reset();
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

void KvServer::replyError(WorkerId to, uint64_t request, int8_t op, const std::string& error) {
  if (refusals_.count(to)) {
    const uint64_t count = refusals_.countOf(to);
    node_.logger().warn(
        "refused a {} request from node {}: {}{}", wire::EnumNamePsOp(static_cast<wire::PsOp>(op)),
        to, error,
        count > 1 ? fmt::format(" ({} refused from node {} so far)", count, to) : std::string());
  }
  node::SharedFrame frame =
      node_.encode(wire::Body::PsReply, [&](flatbuffers::FlatBufferBuilder& b) {
        return wire::CreatePsReply(b, request, static_cast<wire::PsOp>(op), b.CreateString(error))
            .Union();
      });
  node_.send(to, frame);
}

void KvServer::onPullFrame(WorkerId from, const wire::Envelope& envelope) {
  const wire::PsPull* request = envelope.body_as_PsPull();
  if (request->keys() == nullptr) {
    {
      std::lock_guard lock(mu_);
      ++summary_.errors;
    }
    replyError(from, request->request(), static_cast<int8_t>(wire::PsOp::Pull),
               "pull without keys");
    return;
  }
  std::vector<uint64_t> keys(request->keys()->begin(), request->keys()->end());
  const uint64_t id = request->request();
  pull(
      from, request->clock(), request->min_clock(), std::move(keys),
      [this, from, id](const std::string& error, Clock min_clock, std::span<const uint64_t> keys,
                       const KeyStore* store) {
        if (!error.empty()) {
          replyError(from, id, static_cast<int8_t>(wire::PsOp::Pull), error);
          return;
        }
        // The values travel as the frame's attachment, straight from the rows: what the
        // socket does not take before the next push may change them is copied
        // (Node::sendTransient), and the worker reads them straight into its buffer.
        node::Attachment attachment;
        for (std::span<const float> row : store->rows(keys))
          attachment.push_back(node::bytesOf(row));
        node::SharedFrame frame = node_.encode(
            wire::Body::PsReply,
            [&](flatbuffers::FlatBufferBuilder& b) {
              auto key_vector = b.CreateVector(keys.data(), keys.size());
              return wire::CreatePsReply(b, id, wire::PsOp::Pull, 0, min_clock, key_vector).Union();
            },
            keys.size() * sizeof(uint64_t) + 256, std::move(attachment));
        node_.sendTransient(from, frame);
      });
}

void KvServer::onPushFrame(WorkerId from, const node::InboundFrame& frame) {
  const wire::PsPush* request = frame.envelope().body_as_PsPush();
  const std::optional<std::span<const float>> values = valuesOf(request->values(), frame);
  std::string malformed;
  if (request->keys() == nullptr) {
    malformed = "push without keys";
  } else if (!values) {
    malformed = fmt::format(
        "push with values in both the body and an attachment, or an attachment of {} bytes "
        "that are not whole floats",
        frame.attachment().size());
  }
  if (!malformed.empty()) {
    {
      std::lock_guard lock(mu_);
      ++summary_.errors;
    }
    replyError(from, request->request(), static_cast<int8_t>(wire::PsOp::Push), malformed);
    return;
  }
  const std::span<const uint64_t> keys(request->keys()->data(), request->keys()->size());
  const std::span<const float> grads = *values;
  if (auto error = checkSender(from, request->clock(), "push")) {
    {
      std::lock_guard lock(mu_);
      ++summary_.errors;
    }
    replyError(from, request->request(), static_cast<int8_t>(wire::PsOp::Push), *error);
    return;
  }
  checkRunningJob(from, request->clock(), 0);
  if (holding_) {
    // The frame is gone after this handler: keep copies.
    held_requests_.push_back([this, from, id = request->request(), clock = request->clock(),
                              keys = std::vector<uint64_t>(keys.begin(), keys.end()),
                              grads = std::vector<float>(grads.begin(), grads.end())] {
      handlePush(from, id, clock, keys, grads);
    });
    return;
  }
  handlePush(from, request->request(), request->clock(), keys, grads);
}

void KvServer::handlePush(WorkerId from, uint64_t request, Clock clock,
                          std::span<const uint64_t> keys, std::span<const float> grads) {
  if (auto error = push(from, clock, keys, grads)) {
    replyError(from, request, static_cast<int8_t>(wire::PsOp::Push), *error);
    return;
  }
  node::SharedFrame ack = node_.encode(wire::Body::PsReply, [&](flatbuffers::FlatBufferBuilder& b) {
    return wire::CreatePsReply(b, request, wire::PsOp::Push).Union();
  });
  node_.send(from, ack);
}

std::vector<WorkerView> KvServer::workerViews() const {
  std::vector<WorkerView> views;
  for (WorkerId worker : clocks_.workers())
    views.push_back({worker, clocks_.clockOf(worker), clocks_.live(worker)});
  return views;
}

std::optional<std::string> KvServer::restore(std::span<const uint64_t> keys,
                                             std::span<const float> values,
                                             const std::vector<WorkerView>& views) {
  if (auto error = store_.check(keys, values.size())) return error;
  if (const size_t owned = store_.ownedKeys().size(); keys.size() != owned) {
    return fmt::format("{} key(s) to restore, but {} are owned here", keys.size(), owned);
  }
  store_.restore(keys, values);
  for (const WorkerView& view : views) {
    if (!clocks_.known(view.worker)) continue;
    // Whether the helper still counted a worker is not taken over: that says how the helper's
    // link to it fared. This node is connected to every worker (it passed waitClusterReady),
    // and its own down time-outs decide; an exclusion here would never be lifted.
    if (view.clock > clocks_.clockOf(view.worker)) clocks_.advance(view.worker, view.clock);
  }
  {
    std::lock_guard lock(mu_);
    for (WorkerId worker : clocks_.workers()) {
      heard_[worker] = clocks_.clockOf(worker);
      unanchored_.insert(worker);
    }
  }
  holding_ = false;
  std::vector<std::function<void()>> held = std::move(held_requests_);
  held_requests_.clear();
  for (auto& request : held)
    request();
  return std::nullopt;
}

void KvServer::onClockFrame(WorkerId from, const wire::Envelope& envelope) {
  const wire::PsClock* message = envelope.body_as_PsClock();
  if (auto error = clock(from, message->clock())) {
    replyError(from, 0, static_cast<int8_t>(wire::PsOp::Clock), *error);
  }
}

void KvServer::onPeerEvent(const node::PeerEvent& event) {
  switch (event.kind) {
    case node::PeerEventKind::kDown:
    case node::PeerEventKind::kLeft:
      if (event.kind == node::PeerEventKind::kDown) dropped_.insert(event.peer);
      if (!clocks_.live(event.peer) || finished_.count(event.peer)) return;
      down_since_.emplace(event.peer, SteadyClock::now());
      if (options_.down_timeout.count() > 0) {
        node_.logger().warn(
            "worker node {} is {} at clock {}: pulls stop waiting for it in {} s unless it comes "
            "back",
            event.peer, event.kind == node::PeerEventKind::kLeft ? "gone" : "down",
            clocks_.clockOf(event.peer), options_.down_timeout.count() / 1000.0);
      }
      break;
    case node::PeerEventKind::kUp:
      down_since_.erase(event.peer);
      if (!clocks_.live(event.peer)) {
        clocks_.include(event.peer, clocks_.clockOf(event.peer));
        node_.logger().info("worker node {} is back; counting its clock {} again", event.peer,
                            clocks_.clockOf(event.peer));
        std::lock_guard lock(mu_);
        summary_.excluded.erase(event.peer);
      }
      break;
    default:
      break;
  }
}

void KvServer::workerFinished(WorkerId worker) {
  finished_.insert(worker);
  down_since_.erase(worker);
}

void KvServer::tick(SteadyClock::time_point now) {
  if (options_.down_timeout.count() > 0) {
    for (auto it = down_since_.begin(); it != down_since_.end();) {
      if (now - it->second < options_.down_timeout) {
        ++it;
        continue;
      }
      const WorkerId worker = it->first;
      it = down_since_.erase(it);
      const std::optional<Clock> at = clocks_.exclude(worker);
      if (!at) continue;
      applyDue();
      node_.logger().warn(
          "worker node {} has been down for {} s: pulls no longer wait for it; its updates from "
          "clock {} on are lost",
          worker, options_.down_timeout.count() / 1000.0, *at);
      std::lock_guard lock(mu_);
      summary_.excluded[worker] = *at;
    }
  }
  if (clocks_.parked() == 0) {
    parked_since_.reset();
    return;
  }
  if (!parked_since_) parked_since_ = now;
  if (now - *parked_since_ < options_.report_every || now < next_report_) return;
  next_report_ = now + options_.report_every;
  const Clock needed = *clocks_.lowestParked();
  const std::vector<WorkerId> lagging = clocks_.laggingBehind(needed);
  std::vector<std::string> who;
  who.reserve(lagging.size());
  for (WorkerId w : lagging)
    who.push_back(fmt::format("{} (at clock {})", w, clocks_.clockOf(w)));
  node_.logger().info("{} pull(s) wait until every worker reaches clock {}; waiting for node(s) {}",
                      clocks_.parked(), needed, fmt::join(who, ", "));
  if (options_.on_waiting) options_.on_waiting(lagging, needed);
}

ServerSummary KvServer::summary() const {
  std::lock_guard lock(mu_);
  return summary_;
}

}  // namespace chorus::ps
