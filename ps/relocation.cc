#include "ps/relocation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace chorus::ps {

const char* refusedKindName(RefusedKind kind) {
  switch (kind) {
    case RefusedKind::kLocalize:
      return "localize";
    case RefusedKind::kHandOver:
      return "hand-over";
    case RefusedKind::kTransfer:
      return "transfer";
    case RefusedKind::kPush:
      return "push";
    case RefusedKind::kPull:
      return "pull";
    case RefusedKind::kAnswer:
      return "answer";
    case RefusedKind::kNotice:
      return "notice";
  }
  return "unknown";
}

namespace {

struct KindName {
  const char* operator()(const LocalizeRequest&) const { return "localize"; }
  const char* operator()(const HandOver&) const { return "hand-over"; }
  const char* operator()(const Transfer&) const { return "transfer"; }
  const char* operator()(const KeyPush&) const { return "push"; }
  const char* operator()(const KeyPull&) const { return "pull"; }
  const char* operator()(const PushApplied&) const { return "push-applied"; }
  const char* operator()(const PullAnswer&) const { return "pull-answer"; }
  const char* operator()(const Refusal&) const { return "refusal"; }
  const char* operator()(const LocalizeAccepted&) const { return "localize-accepted"; }
  const char* operator()(const TransferLost&) const { return "transfer-lost"; }
  const char* operator()(const RowLost&) const { return "row-lost"; }
  const char* operator()(const TransferQuery&) const { return "transfer-query"; }
  const char* operator()(const NoHandOver&) const { return "no-hand-over"; }
  const char* operator()(const OpLost&) const { return "op-lost"; }
};

}  // namespace

const char* completionKindName(Completion::Kind kind) {
  switch (kind) {
    case Completion::Kind::kLocalize:
      return "localize";
    case Completion::Kind::kPush:
      return "push";
    case Completion::Kind::kPull:
      return "pull";
  }
  return "operation";
}

const char* relocationKindName(const RelocationBody& body) {
  return std::visit(KindName{}, body);
}

Key relocationKey(const RelocationBody& body) {
  return std::visit([](const auto& m) { return m.key; }, body);
}

Relocation::Relocation(const ShardMap& map, KeyStore store, RelocationOptions options)
    : self_(options.self),
      members_(map.nodes()),
      directory_(map, store.space()),
      store_(std::move(store)),
      cache_capacity_(std::max<size_t>(options.cache_capacity, 1)) {
  if (!std::binary_search(members_.begin(), members_.end(), self_)) {
    throw std::invalid_argument(fmt::format("node {} is not a member of the shard map", self_));
  }
  if (!options.workers.empty()) clocks_.emplace(options.workers, Staleness{0});
}

// --- This node's worker -------------------------------------------------------------------

void Relocation::checkKey(Key key, const char* what) const {
  if (!store_.space().contains(key)) {
    throw std::invalid_argument(fmt::format("{} of key {}: not in the key space", what, key));
  }
}

uint64_t Relocation::nextOp(Completion::Kind kind, Key key) {
  const uint64_t id = next_op_++;
  pending_[id] = Pending{kind, key, false};
  return id;
}

uint64_t Relocation::localize(Key key) {
  checkKey(key, "localize");
  const uint64_t id = nextOp(Completion::Kind::kLocalize, key);
  if (store_.contains(key)) {
    complete(Completion{id, Completion::Kind::kLocalize, key, {}, std::nullopt});
    return id;
  }
  const NodeId home = directory_.home(key);
  if (home != self_ && down_.count(home)) {
    complete(Completion{id,
                        Completion::Kind::kLocalize,
                        key,
                        {},
                        fmt::format("key {} cannot move: its home, node {}, is down", key, home)});
    return id;
  }
  Transit& t = transit_[key];
  t.localizes.push_back(id);
  // A transfer here that no noted hand-over takes away again: wait for it with the others.
  if (t.awaiting > t.pass_ons.size()) return id;
  if (home == self_) {
    relocate(key, self_);
  } else {
    ++t.awaiting;
    ++stats_.localizes_sent;
    send(home, LocalizeRequest{key});
  }
  return id;
}

uint64_t Relocation::push(Key key, std::span<const float> grad, Clock clock) {
  checkKey(key, "push");
  if (grad.size() != store_.space().length(key)) {
    throw std::invalid_argument(fmt::format("push of key {}: {} floats, the row has {}", key,
                                            grad.size(), store_.space().length(key)));
  }
  const uint64_t id = nextOp(Completion::Kind::kPush, key);
  dispatch(key, KeyOp{self_, id, true, clock, std::vector<float>(grad.begin(), grad.end())});
  return id;
}

uint64_t Relocation::pull(Key key, Clock min_clock) {
  checkKey(key, "pull");
  const uint64_t id = nextOp(Completion::Kind::kPull, key);
  KeyOp op{self_, id, false, 0, {}};
  // SSP at the reader: once every worker announced min_clock, all their pushes of clocks below
  // it were applied to the row's one copy (announcements follow completions), wherever it is.
  if (!clocks_ || clocks_->ready(min_clock)) {
    dispatch(key, std::move(op));
  } else {
    clocks_->whenReady(min_clock, [this, key, op]() mutable { dispatch(key, std::move(op)); });
  }
  return id;
}

std::optional<std::string> Relocation::workerClock(WorkerId worker, Clock clock) {
  if (!clocks_) return fmt::format("worker {}: this node gates no pulls on clocks", worker);
  return clocks_->advance(worker, clock);
}

void Relocation::excludeWorker(WorkerId worker) {
  if (clocks_) clocks_->exclude(worker);
}

// --- Where an operation goes ----------------------------------------------------------------

Relocation::Transit* Relocation::transit(Key key) {
  auto it = transit_.find(key);
  return it == transit_.end() ? nullptr : &it->second;
}

void Relocation::settle(Key key) {
  auto it = transit_.find(key);
  if (it != transit_.end() && it->second.empty() && it->second.localizes.empty()) {
    transit_.erase(it);
  }
}

void Relocation::dispatch(Key key, KeyOp op) {
  if (store_.contains(key)) {
    applyHere(key, std::move(op));
    return;
  }
  if (Transit* t = transit(key); t && t->awaiting > 0) {
    // The row is on its way here: the operation waits for it, after those that came before.
    t->queued.push_back(std::move(op));
    ++stats_.queued;
    return;
  }
  const NodeId home = directory_.home(key);
  NodeId next = home;
  bool cached = false;
  if (home == self_) {
    if (auto lost = lost_.find(key); lost != lost_.end()) {
      failOp(key, op, fmt::format("key {} was lost with node {}", key, lost->second));
      return;
    }
    next = directory_.owner(key);
  } else if (auto it = cache_.find(key); it != cache_.end()) {
    // Versions only grow along a chain of cache entries (each names a later holder), so
    // following them ends at the row or at the home; a stale entry costs a hop, never a loop.
    next = it->second.owner;
    cached = true;
  }
  if (next == self_) {
    // The directory names this node only while it holds or awaits the row.
    failOp(key, op,
           fmt::format("key {}: node {}'s directory names itself, but the row is "
                       "neither here nor on its way (a bug)",
                       key, self_));
    return;
  }
  if (down_.count(next)) {
    failOp(key, op,
           fmt::format("key {}: node {} ({}) is down", key, next,
                       next == home ? "its home" : "where it was last seen"));
    return;
  }
  if (op.origin == self_) {
    ++stats_.sent;
    if (cached) ++stats_.cache_hits;
    if (auto it = pending_.find(op.id); it != pending_.end()) it->second.on_network = true;
  } else {
    ++stats_.passed_on;
    std::deque<Passed>& passed = passed_[next];
    if (passed.size() == kPassedMemory) passed.pop_front();
    passed.push_back(Passed{op.origin, op.id, key});
  }
  if (op.push) {
    send(next, KeyPush{key, op.origin, op.id, op.clock, std::move(op.grad)});
  } else {
    send(next, KeyPull{key, op.origin, op.id});
  }
}

void Relocation::applyHere(Key key, KeyOp op) {
  ++stats_.served_here;
  const uint64_t version = heldVersion(key);
  if (op.push) {
    const Key keys[1] = {key};
    store_.apply(keys, op.grad, op.clock);
    if (op.origin == self_) {
      complete(Completion{op.id, Completion::Kind::kPush, key, {}, std::nullopt});
    } else {
      send(op.origin, PushApplied{key, op.id, self_, version});
    }
    return;
  }
  const std::span<const float> row = store_.valuesOf(key);
  std::vector<float> values(row.begin(), row.end());
  if (op.origin == self_) {
    complete(Completion{op.id, Completion::Kind::kPull, key, std::move(values), std::nullopt});
  } else {
    send(op.origin, PullAnswer{key, op.id, self_, version, std::move(values)});
  }
}

void Relocation::failOp(Key key, const KeyOp& op, const std::string& reason) {
  if (op.origin == self_) {
    complete(Completion{
        op.id, op.push ? Completion::Kind::kPush : Completion::Kind::kPull, key, {}, reason});
  } else {
    refuse(op.origin, op.push ? RefusedKind::kPush : RefusedKind::kPull, key, op.id, reason);
  }
}

void Relocation::complete(Completion completion) {
  // An operation failed by peerDown may still come back here (forwarded back to its origin):
  // it completed already.
  if (abandoned_.erase(completion.op)) return;
  pending_.erase(completion.op);
  completions_.push_back(std::move(completion));
}

// --- The three messages -----------------------------------------------------------------------

void Relocation::relocate(Key key, NodeId requester) {
  if (auto lost = lost_.find(key); lost != lost_.end()) {
    const std::string reason = fmt::format("key {} was lost with node {}", key, lost->second);
    if (requester == self_) {
      Transit& t = transit_[key];
      for (uint64_t id : std::exchange(t.localizes, {}))
        complete(Completion{id, Completion::Kind::kLocalize, key, {}, reason});
      settle(key);
    } else {
      refuse(requester, RefusedKind::kLocalize, key, 0, reason);
    }
    return;
  }
  const NodeId old = directory_.owner(key);
  const uint64_t from_version = directory_.keyVersion(key);
  directory_.setOwner(key, requester);  // a key of the space and a member: cannot fail
  const uint64_t version = directory_.keyVersion(key);
  last_giver_[key] = old;
  if (requester == self_) {
    Transit& t = transit_[key];
    ++t.awaiting;
    t.givers[version] = old;
  } else {
    send(requester, LocalizeAccepted{key, version, old});
  }
  if (old == self_) {
    handOver(key, requester, version, from_version);
  } else {
    send(old, HandOver{key, requester, version, from_version});
  }
}

void Relocation::handOver(Key key, NodeId to, uint64_t version, uint64_t from_version) {
  if (store_.contains(key) && heldVersion(key) == from_version) {
    sendRow(key, to, version);
    return;
  }
  // The row is on its way here: it goes on to `to` as soon as it came (Lapse forwards a second
  // localize that arrives during a transfer).
  transit_[key].pass_ons[from_version] = PassOn{to, version};
}

void Relocation::sendRow(Key key, NodeId to, uint64_t version) {
  std::optional<KeyEntry> row = store_.extract(key);
  held_versions_.erase(key);
  learn(key, to, version);
  if (down_.count(to)) {
    reportRowLost(key, version, to);  // the node it belongs to now is gone
    return;
  }
  ++stats_.transfers_out;
  send(to, Transfer{key, version, std::move(*row)});
}

std::optional<std::string> Relocation::receive(NodeId from, RelocationBody body) {
  if (!std::binary_search(members_.begin(), members_.end(), from) || from == self_) {
    return fmt::format("a {} from node {}, which is no peer of node {}: ignored",
                       relocationKindName(body), from, self_);
  }
  return std::visit(
      [&](auto& m) -> std::optional<std::string> {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, LocalizeRequest>) {
          return onLocalize(from, m);
        } else if constexpr (std::is_same_v<T, HandOver>) {
          return onHandOver(from, m);
        } else if constexpr (std::is_same_v<T, Transfer>) {
          return onTransfer(from, m);
        } else if constexpr (std::is_same_v<T, KeyPush>) {
          return onPush(from, m);
        } else if constexpr (std::is_same_v<T, KeyPull>) {
          return onPull(from, m);
        } else if constexpr (std::is_same_v<T, PushApplied>) {
          return onPushApplied(from, m);
        } else if constexpr (std::is_same_v<T, PullAnswer>) {
          return onPullAnswer(from, m);
        } else if constexpr (std::is_same_v<T, Refusal>) {
          return onRefusal(from, m);
        } else if constexpr (std::is_same_v<T, LocalizeAccepted>) {
          return onAccepted(from, m);
        } else if constexpr (std::is_same_v<T, TransferLost>) {
          return onTransferLost(from, m);
        } else if constexpr (std::is_same_v<T, RowLost>) {
          return onRowLost(from, m);
        } else if constexpr (std::is_same_v<T, TransferQuery>) {
          return onTransferQuery(from, m);
        } else if constexpr (std::is_same_v<T, NoHandOver>) {
          return onNoHandOver(from, m);
        } else {
          static_assert(std::is_same_v<T, OpLost>);
          return onOpLost(from, m);
        }
      },
      body);
}

void Relocation::send(NodeId to, RelocationBody body) {
  if (down_.count(to)) return;  // the shell could not deliver it either
  outgoing_.push_back(Outgoing{to, std::move(body)});
}

void Relocation::refuse(NodeId to, RefusedKind kind, Key key, uint64_t op,
                        const std::string& reason) {
  ++stats_.refusals_sent;
  send(to, Refusal{kind, key, op, reason});
}

std::optional<std::string> Relocation::onLocalize(NodeId from, const LocalizeRequest& m) {
  std::string error;
  if (!store_.space().contains(m.key)) {
    error = fmt::format("node {} sent a localize for key {}, which does not exist", from, m.key);
  } else if (directory_.home(m.key) != self_) {
    error = fmt::format("node {} sent a localize for key {} to node {}, but its home is node {}",
                        from, m.key, self_, directory_.home(m.key));
  } else if (!lost_.count(m.key) && directory_.owner(m.key) == from) {
    error = fmt::format("node {} sent a localize for key {}, which it owns already (version {})",
                        from, m.key, directory_.keyVersion(m.key));
  }
  if (!error.empty()) {
    refuse(from, RefusedKind::kLocalize, m.key, 0, error);
    return error;
  }
  relocate(m.key, from);
  return std::nullopt;
}

std::optional<std::string> Relocation::onHandOver(NodeId from, const HandOver& m) {
  std::string error;
  const Transit* t = transit(m.key);
  if (!store_.space().contains(m.key)) {
    error = fmt::format("node {} sent a hand-over of key {}, which does not exist", from, m.key);
  } else if (directory_.home(m.key) != from) {
    error = fmt::format("node {} sent a hand-over of key {}, but node {} is its home", from, m.key,
                        directory_.home(m.key));
  } else if (!std::binary_search(members_.begin(), members_.end(), m.to) || m.to == self_ ||
             m.version <= m.from_version) {
    error = fmt::format("node {} sent a hand-over of key {} to node {} at version {} (from {})",
                        from, m.key, m.to, m.version, m.from_version);
  } else if (auto lost = lost_arrivals_.find(m.key);
             lost != lost_arrivals_.end() && lost->second.count(m.from_version)) {
    // The row this hand-over follows died on its way here: so does the next transfer.
    send(m.to, TransferLost{m.key, m.version, lost->second.at(m.from_version)});
    return std::nullopt;
  } else if (store_.contains(m.key)) {
    if (heldVersion(m.key) != m.from_version) {
      error = fmt::format(
          "node {} sent a hand-over of key {} as of version {}, but the row here is at version {}",
          from, m.key, m.from_version, heldVersion(m.key));
    }
  } else if (!t || t->awaiting <= t->pass_ons.size() || t->pass_ons.count(m.from_version)) {
    error = fmt::format(
        "node {} sent a hand-over of key {}, which node {} neither holds nor "
        "awaits",
        from, m.key, self_);
  }
  if (!error.empty()) {
    refuse(from, RefusedKind::kHandOver, m.key, 0, error);
    return error;
  }
  handOver(m.key, m.to, m.version, m.from_version);
  return std::nullopt;
}

std::optional<std::string> Relocation::onTransfer(NodeId from, Transfer& m) {
  std::string error;
  const Transit* t = transit(m.key);
  const size_t len = store_.space().length(m.key);
  const bool orphan = orphaned_.count(m.key) && !store_.contains(m.key) && m.version > 0 &&
                      (!t || t->awaiting == 0);
  if (len == 0) {
    error = fmt::format("node {} sent a transfer of key {}, which does not exist", from, m.key);
  } else if (!orphan && (!t || t->awaiting == 0 || store_.contains(m.key) || m.version == 0 ||
                         (!t->givers.count(m.version) && t->awaiting <= t->givers.size()))) {
    error = fmt::format("node {} sent a transfer of key {}, which node {} did not ask for", from,
                        m.key, self_);
  } else if (m.row.values.size() != len) {
    error = fmt::format("node {} sent a transfer of key {} with {} floats; the row has {}", from,
                        m.key, m.row.values.size(), len);
  } else {
    const UpdatePolicy& rule = store_.policy(m.row.technique);
    if (m.row.state.size() != rule.stateFloats(len)) {
      error = fmt::format(
          "node {} sent a transfer of key {} with {} floats of optimizer state; {} keeps {}", from,
          m.key, m.row.state.size(), rule.name(), rule.stateFloats(len));
    }
  }
  if (!error.empty()) {
    refuse(from, RefusedKind::kTransfer, m.key, 0, error);
    return error;
  }
  if (orphan) {
    // A request whose home died after it sent the hand-over: the row is this node's now.
    if (--orphaned_[m.key] == 0) orphaned_.erase(m.key);
    ++transit_[m.key].awaiting;
  }
  arrive(m.key, m.version, std::move(m.row));
  return std::nullopt;
}

void Relocation::arrive(Key key, uint64_t version, KeyEntry row) {
  store_.insert(key, std::move(row));  // checked by onTransfer
  held_versions_[key] = version;
  ++stats_.transfers_in;
  cache_.erase(key);
  Transit& t = transit_[key];
  --t.awaiting;
  const NodeId home = directory_.home(key);
  if (!t.givers.erase(version) && home != self_ && !down_.count(home)) t.early.insert(version);
  // Operations that waited for the row, in the order they came; then the localizes.
  std::deque<KeyOp> queued = std::exchange(t.queued, {});
  std::vector<uint64_t> localizes = std::exchange(t.localizes, {});
  std::optional<PassOn> pass_on;
  if (auto it = t.pass_ons.find(version); it != t.pass_ons.end()) {
    pass_on = it->second;
    t.pass_ons.erase(it);
  }
  settle(key);
  for (KeyOp& op : queued)
    applyHere(key, std::move(op));
  for (uint64_t id : localizes)
    complete(Completion{id, Completion::Kind::kLocalize, key, {}, std::nullopt});
  if (pass_on) {
    ++stats_.passed_through;
    sendRow(key, pass_on->to, pass_on->version);
  }
}

std::optional<std::string> Relocation::onPush(NodeId from, KeyPush& m) {
  std::string error;
  const size_t len = store_.space().length(m.key);
  if (len == 0) {
    error = fmt::format("node {} sent a push of key {}, which does not exist", from, m.key);
  } else if (m.grad.size() != len) {
    error = fmt::format("node {} sent a push of key {} with {} floats; the row has {}", from, m.key,
                        m.grad.size(), len);
  } else if (!std::all_of(m.grad.begin(), m.grad.end(), [](float g) { return std::isfinite(g); })) {
    error = fmt::format("node {} sent a push of key {} with a gradient that is not finite", from,
                        m.key);
  } else if (!std::binary_search(members_.begin(), members_.end(), m.origin) || m.clock < 0 ||
             m.clock >= kClockCeiling) {
    error = fmt::format("node {} sent a push of key {} from node {} at clock {}", from, m.key,
                        m.origin, m.clock);
  }
  if (!error.empty()) {
    refuse(from, RefusedKind::kPush, m.key, m.op, error);
    return error;
  }
  dispatch(m.key, KeyOp{m.origin, m.op, true, m.clock, std::move(m.grad)});
  return std::nullopt;
}

std::optional<std::string> Relocation::onPull(NodeId from, const KeyPull& m) {
  std::string error;
  if (!store_.space().contains(m.key)) {
    error = fmt::format("node {} sent a pull of key {}, which does not exist", from, m.key);
  } else if (!std::binary_search(members_.begin(), members_.end(), m.origin)) {
    error = fmt::format("node {} sent a pull of key {} for node {}, which is no member", from,
                        m.key, m.origin);
  }
  if (!error.empty()) {
    refuse(from, RefusedKind::kPull, m.key, m.op, error);
    return error;
  }
  dispatch(m.key, KeyOp{m.origin, m.op, false, 0, {}});
  return std::nullopt;
}

std::optional<std::string> Relocation::checkAnswer(NodeId from, uint64_t op, Completion::Kind kind,
                                                   Key key) const {
  auto it = pending_.find(op);
  if (it == pending_.end() || !it->second.on_network || it->second.kind != kind ||
      it->second.key != key) {
    return fmt::format(
        "node {} answered a {} of key {} (operation {}) that node {} has not "
        "sent",
        from, completionKindName(kind), key, op, self_);
  }
  return std::nullopt;
}

std::optional<std::string> Relocation::onPushApplied(NodeId from, const PushApplied& m) {
  if (abandoned_.erase(m.op)) return std::nullopt;  // failed by peerDown: too late
  std::optional<std::string> error = checkAnswer(from, m.op, Completion::Kind::kPush, m.key);
  if (!error && m.owner != from) {
    error = fmt::format("node {} answered a push of key {} in the name of node {}", from, m.key,
                        m.owner);
  }
  if (error) {
    refuse(from, RefusedKind::kAnswer, m.key, m.op, *error);
    return error;
  }
  learn(m.key, m.owner, m.version);
  complete(Completion{m.op, Completion::Kind::kPush, m.key, {}, std::nullopt});
  return std::nullopt;
}

std::optional<std::string> Relocation::onPullAnswer(NodeId from, PullAnswer& m) {
  if (abandoned_.erase(m.op)) return std::nullopt;
  std::optional<std::string> error = checkAnswer(from, m.op, Completion::Kind::kPull, m.key);
  if (!error && m.owner != from) {
    error = fmt::format("node {} answered a pull of key {} in the name of node {}", from, m.key,
                        m.owner);
  }
  if (!error && m.values.size() != store_.space().length(m.key)) {
    error = fmt::format("node {} answered a pull of key {} with {} floats; the row has {}", from,
                        m.key, m.values.size(), store_.space().length(m.key));
  }
  if (error) {
    refuse(from, RefusedKind::kAnswer, m.key, m.op, *error);
    return error;
  }
  learn(m.key, m.owner, m.version);
  complete(Completion{m.op, Completion::Kind::kPull, m.key, std::move(m.values), std::nullopt});
  return std::nullopt;
}

std::optional<std::string> Relocation::onRefusal(NodeId from, const Refusal& m) {
  switch (m.refused) {
    case RefusedKind::kPush:
    case RefusedKind::kPull: {
      if (abandoned_.erase(m.op)) return std::nullopt;
      const auto kind =
          m.refused == RefusedKind::kPush ? Completion::Kind::kPush : Completion::Kind::kPull;
      if (auto error = checkAnswer(from, m.op, kind, m.key)) return error;
      complete(Completion{m.op, kind, m.key, {}, fmt::format("node {}: {}", from, m.reason)});
      return std::nullopt;
    }
    case RefusedKind::kLocalize: {
      Transit* t = transit(m.key);
      if (directory_.home(m.key) != from || !t || t->awaiting <= t->pass_ons.size()) {
        return fmt::format("node {} refused a localize of key {} that node {} did not send: {}",
                           from, m.key, self_, m.reason);
      }
      // The home took no step: no transfer comes for this request.
      --t->awaiting;
      std::vector<uint64_t> localizes = std::exchange(t->localizes, {});
      std::deque<KeyOp> queued;
      if (t->awaiting == 0) queued = std::exchange(t->queued, {});
      settle(m.key);
      for (uint64_t id : localizes) {
        complete(Completion{id,
                            Completion::Kind::kLocalize,
                            m.key,
                            {},
                            fmt::format("node {}: {}", from, m.reason)});
      }
      for (KeyOp& op : queued)
        dispatch(m.key, std::move(op));
      return std::nullopt;
    }
    case RefusedKind::kHandOver:
    case RefusedKind::kTransfer:
    case RefusedKind::kAnswer:
    case RefusedKind::kNotice:
      // Nothing to undo here, but a refused transfer lost a row: the shell logs it.
      return fmt::format("node {} refused node {}'s {} of key {}: {}", from, self_,
                         refusedKindName(m.refused), m.key, m.reason);
  }
  return fmt::format("node {} sent a refusal of an unknown kind", from);
}

// --- Location cache -----------------------------------------------------------------------

void Relocation::learn(Key key, NodeId owner, uint64_t version) {
  if (owner == self_ || directory_.home(key) == self_) return;  // the directory knows better
  auto it = cache_.find(key);
  if (it != cache_.end()) {
    if (version > it->second.version) it->second = CacheEntry{owner, version};
    return;
  }
  if (cache_.size() >= cache_capacity_) cache_.erase(cache_.begin());
  cache_.emplace(key, CacheEntry{owner, version});
}

std::optional<NodeId> Relocation::cachedOwner(Key key) const {
  auto it = cache_.find(key);
  if (it == cache_.end()) return std::nullopt;
  return it->second.owner;
}

// --- Outputs and state ----------------------------------------------------------------------

std::vector<Outgoing> Relocation::takeOutgoing() {
  return std::exchange(outgoing_, {});
}

std::vector<Completion> Relocation::takeCompletions() {
  return std::exchange(completions_, {});
}

uint64_t Relocation::heldVersion(Key key) const {
  auto it = held_versions_.find(key);
  return it == held_versions_.end() ? 0 : it->second;
}

std::optional<NodeId> Relocation::directoryOwner(Key key) const {
  if (!store_.space().contains(key) || directory_.home(key) != self_) return std::nullopt;
  return directory_.owner(key);
}

uint32_t Relocation::awaiting(Key key) const {
  auto it = transit_.find(key);
  return it == transit_.end() ? 0 : it->second.awaiting;
}

size_t Relocation::queuedOps(Key key) const {
  auto it = transit_.find(key);
  return it == transit_.end() ? 0 : it->second.queued.size();
}

}  // namespace chorus::ps
