#include "ps/relocation_shell.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>
#include <stdexcept>

#include "node/node.h"
#include "ps/ps_service.h"

namespace chorus::ps {

namespace {

RelocationOptions coreOptions(NodeId self, const std::vector<NodeId>& members,
                              const RelocationShellOptions& options) {
  RelocationOptions o;
  o.self = self;
  o.workers = members;
  o.cache_capacity = options.cache_capacity;
  return o;
}

constexpr wire::Body kRelocationBodies[] = {
    wire::Body::RelocLocalize,   wire::Body::RelocHandOver, wire::Body::RelocTransfer,
    wire::Body::RelocPush,       wire::Body::RelocPull,     wire::Body::RelocPushApplied,
    wire::Body::RelocPullAnswer, wire::Body::RelocRefusal,  wire::Body::RelocNotice};

}  // namespace

RelocationShell::RelocationShell(node::Node& node, const ShardMap& map, KeyStore store,
                                 std::vector<NodeId> members, RelocationShellOptions options)
    : node_(node),
      self_(node.id()),
      members_(std::move(members)),
      options_(options),
      space_(store.space()),
      core_(map, std::move(store), coreOptions(node.id(), members_, options)),
      outbox_(node) {
  std::sort(members_.begin(), members_.end());
  stats_.held_keys = core_.store().size();
  size_t slots = 0;
  for (const KeyTable& table : space_.tables()) {
    table_slots_.push_back(slots);
    slots += table.rows;
  }
  held_now_ = std::make_unique<std::atomic<bool>[]>(slots);
  noteAllHeldFromLoop();  // no loop callback runs yet: the handlers are installed below
  for (const wire::Body body : kRelocationBodies) {
    node_.setHandler(messageType(body), [this](NodeId from, const node::InboundFrame& frame) {
      onFrameFromLoop(from, frame);
    });
  }
  node_.setHandler(
      messageType(wire::Body::PsClock),
      [this](NodeId from, const node::InboundFrame& frame) { onClockFromLoop(from, frame); });
}

// --- The worker ---------------------------------------------------------------------------

void RelocationShell::checkKeys(std::span<const Key> keys, size_t floats, const char* what) const {
  size_t total = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!space_.contains(keys[i])) {
      throw std::invalid_argument(fmt::format("{}: key {} is not in the key space", what, keys[i]));
    }
    if (i > 0 && keys[i] <= keys[i - 1]) {
      throw std::invalid_argument(fmt::format("{}: keys must be sorted and unique", what));
    }
    total += space_.length(keys[i]);
  }
  if (floats != SIZE_MAX && total != floats) {
    throw std::invalid_argument(
        fmt::format("{}: {} floats given for keys of {} floats", what, floats, total));
  }
}

RelocationShell::Handle RelocationShell::begin(size_t parts, KeyLocalizer::Done done) {
  std::lock_guard lock(mu_);
  const Handle handle = next_handle_++;
  Operation& op = operations_[handle];
  op.remaining = parts;
  op.done = std::move(done);
  if (cancelled_) {
    op.status = *cancelled_;
    op.remaining = 0;
  }
  if (op.remaining == 0) op.complete = true;
  return handle;
}

bool RelocationShell::cancelledOp(Handle handle) const {
  std::lock_guard lock(mu_);
  auto it = operations_.find(handle);
  return it == operations_.end() || it->second.complete;
}

RelocationShell::Handle RelocationShell::pull(std::span<const Key> keys, std::span<float> out) {
  Clock clock = 0;
  {
    std::lock_guard lock(mu_);
    clock = clock_;
  }
  return pullAt(options_.staleness.requiredMinStep(clock), keys, out);
}

RelocationShell::Handle RelocationShell::pullAt(Clock min_clock, std::span<const Key> keys,
                                                std::span<float> out) {
  checkKeys(keys, out.size(), "pull");
  const Handle handle = begin(keys.size(), {});
  std::vector<Key> copy(keys.begin(), keys.end());
  float* base = out.data();
  const bool posted = node_.post([this, handle, min_clock, copy = std::move(copy), base] {
    if (cancelledOp(handle)) return;
    size_t at = 0;
    uint64_t local = 0;
    for (const Key key : copy) {
      const size_t n = space_.length(key);
      if (core_.holds(key)) ++local;
      const uint64_t id = core_.pull(key, min_clock);
      core_ops_[id] = CoreOp{handle, base + at, n, false, 0};
      at += n;
    }
    {
      std::lock_guard lock(mu_);
      stats_.keys_local += local;
      stats_.keys_remote += copy.size() - local;
    }
    flushFromLoop();
  });
  if (!posted) cancelAll({node::ErrorCode::kShutdown, "the node stopped"});
  return handle;
}

RelocationShell::Handle RelocationShell::push(std::span<const Key> keys,
                                              std::span<const float> grads) {
  checkKeys(keys, grads.size(), "push");
  Clock clock = 0;
  {
    std::lock_guard lock(mu_);
    clock = clock_;
  }
  const Handle handle = begin(keys.size(), {});
  std::vector<Key> key_copy(keys.begin(), keys.end());
  std::vector<float> grad_copy(grads.begin(), grads.end());
  const bool posted = node_.post([this, handle, clock, key_copy = std::move(key_copy),
                                  grad_copy = std::move(grad_copy)] {
    if (cancelledOp(handle)) return;
    size_t at = 0;
    uint64_t local = 0;
    for (const Key key : key_copy) {
      const size_t n = space_.length(key);
      if (core_.holds(key)) ++local;
      const uint64_t id = core_.push(key, std::span<const float>(grad_copy).subspan(at, n), clock);
      core_ops_[id] = CoreOp{handle, nullptr, 0, true, clock};
      ++pushes_by_clock_[clock];
      at += n;
    }
    {
      std::lock_guard lock(mu_);
      stats_.keys_local += local;
      stats_.keys_remote += key_copy.size() - local;
    }
    flushFromLoop();
  });
  if (!posted) cancelAll({node::ErrorCode::kShutdown, "the node stopped"});
  return handle;
}

void RelocationShell::localize(std::span<const Key> keys, KeyLocalizer::Done done) {
  checkKeys(keys, SIZE_MAX, "localize");
  const Handle handle = begin(keys.size(), std::move(done));
  KeyLocalizer::Done at_once;
  node::Status status;
  {
    std::lock_guard lock(mu_);
    stats_.localized += keys.size();
    auto it = operations_.find(handle);
    if (it->second.complete) {
      // Ends at once (no keys, or cancelled): on the calling thread, as KeyLocalizer allows.
      at_once = std::move(it->second.done);
      status = it->second.status;
      operations_.erase(it);
    }
  }
  if (at_once || keys.empty() || status.code() != node::ErrorCode::kOk) {
    if (at_once) at_once(status);
    return;
  }
  std::vector<Key> copy(keys.begin(), keys.end());
  const bool posted = node_.post([this, handle, copy = std::move(copy)] {
    if (cancelledOp(handle)) return;
    for (const Key key : copy) {
      const uint64_t id = core_.localize(key);
      core_ops_[id] = CoreOp{handle, nullptr, 0, false, 0};
      noteHeldFromLoop(key);
    }
    flushFromLoop();
  });
  if (!posted) cancelAll({node::ErrorCode::kShutdown, "the node stopped"});
}

node::Status RelocationShell::wait(Handle handle) {
  std::unique_lock lock(mu_);
  auto it = operations_.find(handle);
  if (it == operations_.end()) return {};
  completed_.wait(lock, [&] { return it->second.complete; });
  node::Status status = it->second.status;
  operations_.erase(it);
  return status;
}

void RelocationShell::clock() {
  Clock now = 0;
  {
    std::lock_guard lock(mu_);
    now = ++clock_;
  }
  node_.post([this, now] {
    wanted_clock_ = std::max(wanted_clock_, now);
    flushFromLoop();
  });
}

Clock RelocationShell::currentClock() const {
  std::lock_guard lock(mu_);
  return clock_;
}

node::Status RelocationShell::waitWorkerClock(NodeId worker, Clock clock) {
  if (!std::binary_search(members_.begin(), members_.end(), worker)) {
    return {node::ErrorCode::kInvalidArgument,
            fmt::format("node {} is not a member of this job", worker)};
  }
  std::unique_lock lock(mu_);
  const auto reached = [&] {
    // Every worker starts at clock 0, announced or not.
    const auto it = announced_by_.find(worker);
    return (it == announced_by_.end() ? Clock{0} : it->second) >= clock;
  };
  completed_.wait(lock, [&] { return reached() || gone_.count(worker) > 0 || cancelled_; });
  if (reached()) return {};
  if (cancelled_) return *cancelled_;
  return {node::ErrorCode::kPeerLeft,
          fmt::format("node {} went down before it announced clock {}", worker, clock)};
}

void RelocationShell::cancelAll(const node::Status& status) {
  std::vector<std::pair<KeyLocalizer::Done, node::Status>> callbacks;
  {
    std::lock_guard lock(mu_);
    if (!cancelled_) cancelled_ = status;
    for (auto& [handle, op] : operations_) {
      if (op.complete) continue;
      op.complete = true;
      if (op.status.ok()) op.status = status;
      if (op.done) callbacks.emplace_back(std::move(op.done), op.status);
    }
  }
  completed_.notify_all();
  // Localize callbacks belong on the loop thread; when the node no longer runs, here.
  for (auto& callback : callbacks) {
    auto shared = std::make_shared<KeyLocalizer::Done>(std::move(callback.first));
    const node::Status s = callback.second;
    if (!node_.post([shared, s] { (*shared)(s); })) (*shared)(s);
  }
}

// --- Loop thread --------------------------------------------------------------------------

void RelocationShell::settleFromLoop(Handle handle, const node::Status& status) {
  KeyLocalizer::Done callback;
  node::Status final_status;
  {
    std::lock_guard lock(mu_);
    auto it = operations_.find(handle);
    if (it == operations_.end()) return;
    Operation& op = it->second;
    if (op.complete) return;  // cancelled meanwhile
    if (!status.ok() && op.status.ok()) op.status = status;
    if (--op.remaining > 0) return;
    op.complete = true;
    if (op.done) {
      callback = std::move(op.done);
      final_status = op.status;
      operations_.erase(it);
    }
  }
  if (callback) {
    callback(final_status);
  } else {
    completed_.notify_all();
  }
}

void RelocationShell::completeFromLoop(const Completion& c) {
  auto it = core_ops_.find(c.op);
  if (it == core_ops_.end()) return;
  const CoreOp op = it->second;
  core_ops_.erase(it);
  if (op.push) {
    auto p = pushes_by_clock_.find(op.clock);
    if (p != pushes_by_clock_.end() && --p->second == 0) pushes_by_clock_.erase(p);
  }
  node::Status status;
  if (c.error) {
    status =
        node::Status(node::ErrorCode::kNotConnected,
                     fmt::format("{} of key {}: {}", completionKindName(c.kind), c.key, *c.error));
    std::lock_guard lock(mu_);
    if (c.kind == Completion::Kind::kLocalize) {
      ++stats_.localize_failed;
    } else {
      ++stats_.failed_ops;
    }
  } else if (op.dest != nullptr) {
    if (c.values.size() == op.floats) {
      std::copy(c.values.begin(), c.values.end(), op.dest);
    } else {
      // The core checks an answer's length against the key space; this is a bug, not a peer's.
      status = node::Status(node::ErrorCode::kProtocol,
                            fmt::format("pull of key {}: {} floats for a row of {}", c.key,
                                        c.values.size(), op.floats));
    }
  }
  // A failed localize is harmless (the key is read where it is): the callback hears it.
  settleFromLoop(op.handle, status);
}

void RelocationShell::sendOutgoingFromLoop() {
  std::vector<Outgoing> out = core_.takeOutgoing();
  if (out.empty()) return;
  // Runs of one batch kind to one peer become one frame; the order per peer is kept (FIFO).
  std::map<NodeId, std::vector<std::vector<RelocationBody>>> runs;
  std::map<NodeId, int> last_kind;
  for (Outgoing& o : out) {
    auto& peer_runs = runs[o.to];
    const int kind = relocationBatchKind(o.body);
    auto last = last_kind.find(o.to);
    if (last == last_kind.end() || last->second != kind) {
      peer_runs.emplace_back();
      last_kind[o.to] = kind;
    }
    peer_runs.back().push_back(std::move(o.body));
  }
  for (auto& [to, peer_runs] : runs) {
    for (std::vector<RelocationBody>& run : peer_runs) {
      const node::SharedFrame frame = encodeMessage(
          node_, relocationWireBody(run.front()),
          [&run](flatbuffers::FlatBufferBuilder& b) { return writeRelocation(b, run); });
      sendFromLoop(to, frame);
    }
  }
}

void RelocationShell::sendFromLoop(NodeId to, const node::SharedFrame& frame) {
  if (down_.count(to)) return;  // a peer that went down is gone for good (peerDown)
  // Nodes start at different moments, and a lost push, pull or clock would stall a worker for
  // good: a frame for a peer not connected yet waits, behind the ones that wait already (the
  // order per peer is the protocol's: FIFO). The callback holds no `this`: a send may complete
  // after the shell is gone (the node outlives it).
  outbox_.sendFromLoop({to}, frame, [node = &node_](NodeId peer, const node::Status& status) {
    if (status.ok()) return;
    // A peer that is down gets its down event, which fails what waited on it.
    node->logger().debug("relocation: a frame to node {} was not sent ({})", peer,
                         status.toString());
  });
}

void RelocationShell::flushFromLoop() {
  // Until nothing moves: a completed push may let the clock go out, and the own clock may
  // release parked pulls.
  for (;;) {
    sendOutgoingFromLoop();
    const std::vector<Completion> completions = core_.takeCompletions();
    for (const Completion& c : completions)
      completeFromLoop(c);
    const bool announced = announceFromLoop();
    if (completions.empty() && !announced) break;
  }
  sendOutgoingFromLoop();
  std::lock_guard lock(mu_);
  stats_.core = core_.stats();
  stats_.held_keys = core_.store().size();
}

bool RelocationShell::announceFromLoop() {
  if (wanted_clock_ <= announced_) return false;
  // Every push of the clocks below the announcement completed (the core's SSP contract).
  Clock clock = wanted_clock_;
  if (!pushes_by_clock_.empty()) clock = std::min(clock, pushes_by_clock_.begin()->first);
  if (clock <= announced_) return false;
  announced_ = clock;
  if (std::optional<std::string> error = core_.workerClock(self_, clock)) {
    node_.logger().warn("relocation: own clock {}: {}", clock, *error);
  }
  noteAnnouncedFromLoop(self_, clock);
  const node::SharedFrame frame = encodeMessage(
      node_, wire::Body::PsClock,
      [clock](flatbuffers::FlatBufferBuilder& b) { return wire::CreatePsClock(b, clock).Union(); });
  for (const NodeId m : members_)
    if (m != self_) sendFromLoop(m, frame);
  return true;
}

void RelocationShell::countRefusal(NodeId from, const std::string& what) {
  {
    std::lock_guard lock(mu_);
    ++stats_.refused_from_peers;
  }
  if (refusals_.count(from)) {
    node_.logger().warn("relocation: refused from node {} ({} so far): {}", from,
                        refusals_.countOf(from), what);
  }
}

void RelocationShell::refuseFrameFromLoop(NodeId from, const std::string& reason) {
  countRefusal(from, reason);
  if (down_.count(from)) return;
  const node::SharedFrame frame = encodeMessage(
      node_, wire::Body::RelocRefusal,
      [&reason](flatbuffers::FlatBufferBuilder& b) { return writeFrameRefusal(b, reason); });
  sendFromLoop(from, frame);
}

void RelocationShell::onFrameFromLoop(NodeId from, const node::InboundFrame& frame) {
  if (!std::binary_search(members_.begin(), members_.end(), from) || from == self_) {
    countRefusal(from, "a relocation frame from a node that is not a member of this job");
    return;
  }
  if (down_.count(from)) return;  // after peerDown nothing from it reaches the core
  RelocationFrame got;
  const wire::Message& message = messageOf(frame);
  if (std::optional<std::string> error = readRelocation(message, space_, got)) {
    refuseFrameFromLoop(from, *error);
    return;
  }
  for (const std::string& reason : got.frame_refusals) {
    countRefusal(
        from, fmt::format("node {} could not read a relocation frame of ours: {}", from, reason));
  }
  for (RelocationBody& body : got.messages) {
    const std::string kind = relocationKindName(body);
    const Key key = relocationKey(body);
    // The core refuses a bad message (Refusal to `from` in its outbox) and changes nothing.
    if (std::optional<std::string> error = core_.receive(from, std::move(body))) {
      countRefusal(from, fmt::format("{}: {}", kind, *error));
    }
    // A message moves at most the row of the key it names (a transfer in, a hand-over out).
    noteHeldFromLoop(key);
  }
  flushFromLoop();
}

void RelocationShell::onClockFromLoop(NodeId from, const node::InboundFrame& frame) {
  if (down_.count(from)) return;
  const wire::PsClock* m = messageOf(frame).body_as_PsClock();
  if (m == nullptr) return;
  if (m->clock() < 0 || m->clock() >= kClockCeiling) {
    countRefusal(from, fmt::format("clock {} is out of range", m->clock()));
    return;
  }
  if (std::optional<std::string> error = core_.workerClock(from, m->clock())) {
    countRefusal(from, *error);
    return;
  }
  noteAnnouncedFromLoop(from, m->clock());
  if (options_.on_peer_clock) options_.on_peer_clock(from, m->clock());
  flushFromLoop();
}

void RelocationShell::noteAnnouncedFromLoop(NodeId worker, Clock clock) {
  {
    std::lock_guard lock(mu_);
    Clock& at = announced_by_[worker];
    at = std::max(at, clock);
  }
  completed_.notify_all();
}

void RelocationShell::peerFinished(NodeId peer) {
  finished_.insert(peer);
}

void RelocationShell::onPeerEvent(const node::PeerEvent& event) {
  if (event.peer == self_ || !std::binary_search(members_.begin(), members_.end(), event.peer)) {
    return;
  }
  if (event.kind == node::PeerEventKind::kUp) {
    if (!down_.count(event.peer)) outbox_.peerUpFromLoop(event.peer);
    return;
  }
  if (event.kind != node::PeerEventKind::kDown && event.kind != node::PeerEventKind::kLeft) return;
  if (!down_.insert(event.peer).second) return;
  {
    std::lock_guard lock(mu_);
    gone_.insert(event.peer);
  }
  completed_.notify_all();
  outbox_.dropFromLoop(event.peer, "it went down");  // it is gone
  // A lost connection counts as the peer's death: the core never sends to it again (rows it
  // held are lost, operations on the network fail).
  const DownReport report = core_.peerDown(event.peer);
  core_.excludeWorker(event.peer);
  noteAllHeldFromLoop();
  {
    std::lock_guard lock(mu_);
    stats_.lost_keys += report.lost.size();
    stats_.given_up += report.given_up.size();
  }
  const bool expected = finished_.count(event.peer) > 0;
  const auto level = expected ? spdlog::level::info : spdlog::level::warn;
  // A member that finished its clocks and leaves at the end takes its rows along as expected:
  // said only when something of this node's was still on the way.
  if (!report.given_up.empty() || report.failed_ops > 0 || !expected) {
    node_.logger().log(
        level,
        "relocation: node {} {}: {} key(s) homed here that it held are lost{}, {} row(s) on "
        "their way from it given up, {} operation(s) of this worker failed",
        event.peer, event.kind == node::PeerEventKind::kLeft ? "left" : "went down",
        report.lost.size(),
        report.lost.empty()
            ? std::string()
            : fmt::format(" (first {})", fmt::join(report.lost.begin(),
                                                   report.lost.begin() +
                                                       static_cast<std::ptrdiff_t>(
                                                           std::min<size_t>(report.lost.size(), 8)),
                                                   ", ")),
        report.given_up.size(), report.failed_ops);
  }
  flushFromLoop();
}

size_t RelocationShell::heldSlot(Key key) const {
  const KeyTable* table = space_.tableOf(key);
  if (table == nullptr) return SIZE_MAX;
  return table_slots_[static_cast<size_t>(table - space_.tables().data())] +
         static_cast<size_t>(key - table->first);
}

void RelocationShell::noteHeldFromLoop(Key key) {
  const size_t slot = heldSlot(key);
  if (slot != SIZE_MAX) held_now_[slot].store(core_.holds(key), std::memory_order_relaxed);
}

void RelocationShell::noteAllHeldFromLoop() {
  for (const KeyTable& table : space_.tables()) {
    for (Key key = table.first; key < table.end(); ++key)
      noteHeldFromLoop(key);
  }
}

bool RelocationShell::holdsNow(Key key) const {
  const size_t slot = heldSlot(key);
  return slot != SIZE_MAX && held_now_[slot].load(std::memory_order_relaxed);
}

RelocationShellStats RelocationShell::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void RelocationShell::inspect(const std::function<void(const Relocation&)>& fn) {
  std::promise<void> done;
  if (!node_.post([&] {
        fn(core_);
        done.set_value();
      })) {
    fn(core_);
    return;
  }
  done.get_future().wait();
}

}  // namespace chorus::ps
