#include "ps/kv_worker.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <stdexcept>

#include "chorus/chorus_generated.h"
#include "node/finite.h"
#include "node/node.h"
#include "ps/codec.h"
#include "ps/kv_server.h"

namespace chorus::ps {

KvWorker::KvWorker(node::Node& node, KvServer& local, const ShardMap& map, const KeySpace& space,
                   OwnerOptimizer optimizer, WorkerOptions options)
    : KvWorker(node, local, KeyDirectory(map, space), optimizer, std::move(options)) {}

KvWorker::KvWorker(node::Node& node, KvServer& local, KeyDirectory directory,
                   OwnerOptimizer optimizer, WorkerOptions options)
    : node_(node),
      local_(local),
      directory_(std::move(directory)),
      optimizer_(optimizer),
      options_(std::move(options)),
      fresh_(options_.staleness),
      self_(node.id()) {
  if (options_.staleness.infinite()) options_.cache = false;
  for (NodeId n : directory_.shardMap().nodes()) {
    if (n != self_) others_.push_back(n);
  }
  node_.setHandler(messageType(wire::Body::PsReply),
                   [this](NodeId from, const node::InboundFrame& frame) { onReply(from, frame); });
  node_.setAttachmentPlacer(messageType(wire::Body::PsReply),
                            [this](NodeId from, const node::InboundFrame& frame, size_t bytes) {
                              return placeReply(from, *messageOf(frame).body_as_PsReply(), bytes);
                            });
}

// The caller's buffer of one pull, as the landing of its reply's values. Destroyed by the node
// once the reply was handled (the sub-request is gone by then, so release() does nothing) or
// when the reply was cut off or dropped (release() fails the sub-request).
class KvWorker::ReplyLanding : public node::AttachmentLanding {
 public:
  ReplyLanding(std::vector<std::span<uint8_t>> pieces, KvWorker& worker, uint64_t request,
               NodeId owner)
      : AttachmentLanding(std::move(pieces)), worker_(worker), request_(request), owner_(owner) {}
  ReplyLanding(const ReplyLanding&) = delete;
  ReplyLanding& operator=(const ReplyLanding&) = delete;
  ~ReplyLanding() override {
    worker_.release(
        request_,
        {node::ErrorCode::kClosed,
         arrived() ? fmt::format("the reply of node {} was dropped unread", owner_)
                   : fmt::format("the connection to node {} ended inside a reply", owner_)});
  }

 private:
  KvWorker& worker_;
  uint64_t request_;
  NodeId owner_;
};

void KvWorker::checkRequest(std::span<const Key> keys, size_t floats_given,
                            const char* what) const {
  if (auto error = space().check(keys, floats_given)) {
    throw std::invalid_argument(fmt::format("{}: {}", what, *error));
  }
}

Clock KvWorker::currentClock() const {
  std::lock_guard lock(mu_);
  return clock_;
}

WorkerStats KvWorker::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

KvWorker::Handle KvWorker::pull(std::span<const Key> keys, std::span<float> out,
                                const Callback& done) {
  return pullImpl(std::nullopt, keys, out, done);
}

KvWorker::Handle KvWorker::pullAt(Clock min_clock, std::span<const Key> keys, std::span<float> out,
                                  const Callback& done) {
  return pullImpl(min_clock, keys, out, done);
}

KvWorker::Handle KvWorker::begin(size_t parts, const Callback& done,
                                 std::unique_lock<std::mutex>&) {
  const Handle handle = next_handle_++;
  Operation& op = operations_[handle];
  op.remaining = parts;
  op.done = done;
  op.complete = parts == 0;
  return handle;
}

namespace {

// Kept plans: at most this many keys together (8 bytes each, twice), and this many plans.
constexpr size_t kPlannedKeys = size_t{1} << 22;
constexpr size_t kPlans = 256;
// Hashes of key sets seen once, remembered to recognize the second sight.
constexpr size_t kSeenSets = 64;

uint64_t hashKeys(std::span<const Key> keys) {
  return XXH3_64bits(keys.data(), keys.size_bytes());
}

}  // namespace

template <typename Skip>
void KvWorker::groupKeys(std::span<const Key> keys, Skip&& skip, KeyPlan& plan) const {
  std::map<NodeId, OwnerPart> parts;
  std::map<NodeId, std::shared_ptr<std::vector<Key>>> part_keys;
  // Consecutive keys mostly share an owner (or alternate between few): the last part is kept
  // so that most keys cost no map lookup.
  NodeId last_owner = 0;
  OwnerPart* last = nullptr;
  std::vector<Key>* last_keys = nullptr;
  size_t offset = 0;
  for (Key key : keys) {
    const size_t len = space().length(key);
    if (skip(key, offset)) {
      offset += len;
      continue;
    }
    const NodeId owner = directory_.owner(key);
    if (last == nullptr || owner != last_owner) {
      last = &parts[owner];
      last->owner = owner;
      auto& k = part_keys[owner];
      if (!k) k = std::make_shared<std::vector<Key>>();
      last_keys = k.get();
      last_owner = owner;
    }
    last_keys->push_back(key);
    // Keys whose floats follow each other in the caller's buffer share one run (one copy, one
    // piece).
    if (!last->runs.empty() && last->runs.back().offset + last->runs.back().floats == offset) {
      last->runs.back().floats += len;
      ++last->runs.back().keys;
    } else {
      last->runs.push_back(PartRun{.offset = offset, .floats = len, .keys = 1});
    }
    last->floats += len;
    offset += len;
  }
  plan.parts.reserve(parts.size());
  for (auto& [owner, part] : parts) {
    part.keys = std::move(part_keys[owner]);
    plan.parts.push_back(std::move(part));
  }
}

std::shared_ptr<KvWorker::KeyPlan> KvWorker::planFor(std::span<const Key> keys) {
  const uint64_t hash = hashKeys(keys);
  const uint64_t version = directory_.version();
  if (auto it = plans_.find(hash); it != plans_.end()) {
    const KeyPlan& kept = *it->second;
    if (kept.directory_version == version &&
        std::equal(keys.begin(), keys.end(), kept.keys.begin(), kept.keys.end())) {
      return it->second;
    }
    // Another set with the same hash, or keys that moved since: resolved again below.
    planned_keys_ -= it->second->keys.size();
    plans_.erase(it);
  }
  auto plan = std::make_shared<KeyPlan>();
  plan->directory_version = version;
  groupKeys(
      keys, [](Key, size_t) { return false; }, *plan);
  const bool seen = std::find(seen_.begin(), seen_.end(), hash) != seen_.end();
  if (!seen) {
    if (seen_.size() < kSeenSets) {
      seen_.push_back(hash);
    } else {
      seen_[seen_next_++ % kSeenSets] = hash;
    }
    return plan;
  }
  if (keys.size() > kPlannedKeys) return plan;
  if (plans_.size() >= kPlans || planned_keys_ + keys.size() > kPlannedKeys) {
    plans_.clear();  // simple and rare: a workload with that many distinct repeating sets
    planned_keys_ = 0;
  }
  plan->keys.assign(keys.begin(), keys.end());
  plan->cached = true;
  planned_keys_ += keys.size();
  plans_[hash] = plan;
  return plan;
}

void KvWorker::learnSlotsLocked(const SubRequest& sub, std::span<const uint8_t> slots,
                                uint64_t layout) {
  if (!sub.plan || !sub.plan->cached || slots.empty()) return;
  OwnerPart& part = sub.plan->parts[sub.part];
  part.slots.assign(slots.begin(), slots.end());
  part.layout = layout;
}

KvWorker::Handle KvWorker::pullImpl(std::optional<Clock> min_clock, std::span<const Key> keys,
                                    std::span<float> out, const Callback& done) {
  checkRequest(keys, out.size(), "pull");
  struct Send {
    uint64_t id;
    NodeId owner;
    std::shared_ptr<const std::vector<Key>> keys;
    std::vector<uint8_t> slots;  // by slots when not empty (copied: the plan may change)
    uint64_t layout;
    bool want_slots;
  };
  std::vector<Send> sends;
  Clock reader = 0, required = 0;
  Handle handle = 0;
  std::vector<uint64_t> failed;  // sub-requests to owners known to be down
  // Set when cancelAll() ran before these requests were registered (its list then lacks them;
  // a later cancelAll() finds them in requests_).
  std::optional<node::Status> cancelled;
  size_t parts = 0;
  {
    std::unique_lock lock(mu_);
    cancelled = cancelled_;
    reader = clock_;
    required = min_clock ? *min_clock : options_.staleness.requiredMinStep(reader);
    const bool use_cache = !min_clock && options_.cache;
    std::shared_ptr<KeyPlan> plan;
    size_t hits = 0;
    if (use_cache && !cache_.empty()) {
      // Fresh cached rows are served here; the rest is grouped for this call only.
      plan = std::make_shared<KeyPlan>();
      groupKeys(
          keys,
          [&](Key key, size_t offset) {
            auto it = cache_.find(key);
            if (it == cache_.end() || !fresh_.fresh(it->second.stamp, reader)) return false;
            float* p = out.data() + offset;
            std::copy(it->second.values.begin(), it->second.values.end(), p);
            if (inModelView(p)) read_stamps_[key] = it->second.stamp;
            ++hits;
            return true;
          },
          *plan);
    } else {
      plan = planFor(keys);
    }
    stats_.cache_hits += hits;
    if (!min_clock) stats_.cache_misses += keys.size() - hits;
    parts = plan->parts.size();
    handle = begin(parts, done, lock);
    for (size_t i = 0; i < parts; ++i) {
      const OwnerPart& part = plan->parts[i];
      const NodeId owner = part.owner;
      const uint64_t id = next_request_++;
      (owner == self_ ? stats_.keys_local : stats_.keys_remote) += part.keys->size();
      if (owner != self_ && !down_owners_.count(owner)) ++stats_.messages_sent;
      if (owner != self_ && down_owners_.count(owner)) failed.push_back(id);
      SubRequest& sub = requests_[id];
      sub.handle = handle;
      sub.owner = owner;
      sub.pull = true;
      sub.keys = part.keys;
      sub.dest.reserve(part.runs.size());
      for (const PartRun& run : part.runs) {
        sub.dest.push_back(
            DestRun{.at = out.data() + run.offset, .floats = run.floats, .keys = run.keys});
      }
      sub.floats = part.floats;
      sub.plan = plan;
      sub.part = i;
      sub.clock = reader;
      sub.min_clock = required;
      const bool by_slots = owner != self_ && !part.slots.empty();
      sub.by_slots = by_slots;
      if (by_slots) ++stats_.by_slots;
      sends.push_back(Send{.id = id,
                           .owner = owner,
                           .keys = part.keys,
                           .slots = by_slots ? part.slots : std::vector<uint8_t>{},
                           .layout = part.layout,
                           .want_slots = plan->cached && !by_slots});
    }
    if (parts == 0 && done) operations_.erase(handle);
  }
  if (parts == 0 && done) done({});
  for (Send& send : sends) {
    const uint64_t id = send.id;
    const NodeId owner = send.owner;
    if (cancelled) {
      finishSub(id, *cancelled, 0, {}, {});
      continue;
    }
    if (std::find(failed.begin(), failed.end(), id) != failed.end()) {
      finishSub(id, {node::ErrorCode::kNotConnected, fmt::format("owner node {} is down", owner)},
                0, {}, {});
      continue;
    }
    if (owner == self_) {
      // Same loop, same order as this worker's earlier local pushes: no network, no copy of
      // the values until the answer.
      const bool posted = node_.post([this, id, reader, required, keys = send.keys] {
        local_.pull(self_, reader, required, *keys,
                    [this, id](const std::string& error, Clock stamp, std::span<const uint64_t> k,
                               const KeyStore* store) {
                      if (!error.empty()) {
                        finishSub(id, {node::ErrorCode::kProtocol, error}, 0, {}, {});
                        return;
                      }
                      std::vector<float> values(store->floatsOf(k));
                      store->copyTo(k, values.data());
                      finishSub(id, {}, stamp, k, values);
                    });
      });
      if (!posted) {
        finishSub(id, {node::ErrorCode::kShutdown, "the node is shutting down"}, 0, {}, {});
      }
      continue;
    }
    node::SharedFrame frame =
        send.slots.empty()
            ? encode(node_, pullRequest(id, reader, required, *send.keys, send.want_slots))
            : encode(node_, pullBySlots(id, reader, required, send.slots, send.layout));
    node_.send(owner, frame, [this, id](node::NodeId, const node::Status& status) {
      if (!status.ok()) finishSub(id, status, 0, {}, {});
    });
  }
  return handle;
}

KvWorker::Handle KvWorker::push(std::span<const Key> keys, std::span<const float> grads,
                                const Callback& done) {
  return pushImpl(keys, grads, done, false);
}

KvWorker::Handle KvWorker::pushInPlace(std::span<const Key> keys, std::span<const float> grads,
                                       const Callback& done) {
  return pushImpl(keys, grads, done, true);
}

KvWorker::Handle KvWorker::pushImpl(std::span<const Key> keys, std::span<const float> grads,
                                    const Callback& done, bool in_place) {
  checkRequest(keys, grads.size(), "push");
  struct Send {
    uint64_t id;
    NodeId owner;
    std::shared_ptr<const std::vector<Key>> keys;
    std::vector<float> values;  // for this node's own server (it outlives the call)
    std::vector<std::span<const float>> pieces;  // for other owners (the sub-request's)
    size_t floats;
    std::vector<uint8_t> slots;  // by slots when not empty
    uint64_t layout;
  };
  std::vector<Send> sends;
  Clock clock = 0;
  Handle handle = 0;
  std::optional<node::Status> cancelled;  // as in pullImpl
  size_t parts = 0;
  {
    std::unique_lock lock(mu_);
    cancelled = cancelled_;
    clock = clock_;
    // Read-my-writes for cached rows: the owner will apply exactly this update.
    if (!cache_.empty()) {
      size_t offset = 0;
      for (Key key : keys) {
        const size_t len = space().length(key);
        const std::span<const float> grad = grads.subspan(offset, len);
        offset += len;
        if (auto it = cache_.find(key); it != cache_.end()) {
          if (optimizer_.stateless()) {
            ml::sgdUpdate(optimizer_.sgd, optimizer_.pushLr(clock), it->second.values, grad, {});
          } else {
            cache_.erase(it);
          }
        }
      }
    }
    const std::shared_ptr<KeyPlan> plan = planFor(keys);
    parts = plan->parts.size();
    handle = begin(parts, done, lock);
    for (size_t i = 0; i < parts; ++i) {
      const OwnerPart& part = plan->parts[i];
      const NodeId owner = part.owner;
      const uint64_t id = next_request_++;
      (owner == self_ ? stats_.keys_local : stats_.keys_remote) += part.keys->size();
      SubRequest& sub = requests_[id];
      sub.handle = handle;
      sub.owner = owner;
      sub.keys = part.keys;
      sub.floats = part.floats;
      sub.plan = plan;
      sub.part = i;
      sub.clock = clock;
      Send send{.id = id,
                .owner = owner,
                .keys = part.keys,
                .values = {},
                .pieces = {},
                .floats = part.floats,
                .slots = {},
                .layout = part.layout};
      if (owner == self_) {
        send.values.reserve(part.floats);
        for (const PartRun& run : part.runs) {
          const auto grad = grads.subspan(run.offset, run.floats);
          send.values.insert(send.values.end(), grad.begin(), grad.end());
        }
      } else {
        // The frames are written from the gradients (in place: the caller's; otherwise this
        // sub-request's copy, which also outlives a resend by keys).
        if (in_place) {
          sub.pieces.reserve(part.runs.size());
          for (const PartRun& run : part.runs)
            sub.pieces.push_back(grads.subspan(run.offset, run.floats));
        } else {
          sub.values.reserve(part.floats);
          for (const PartRun& run : part.runs) {
            const auto grad = grads.subspan(run.offset, run.floats);
            sub.values.insert(sub.values.end(), grad.begin(), grad.end());
          }
          sub.pieces.emplace_back(sub.values);
        }
        send.pieces = sub.pieces;
        if (!part.slots.empty()) send.slots = part.slots;
        sub.by_slots = !send.slots.empty();
        if (sub.by_slots) ++stats_.by_slots;
        // From here until its frame is written (or never will be), this sub-request points
        // into the gradients: nothing may complete it and let them go.
        sub.busy = 1;
        if (!down_owners_.count(owner)) ++stats_.messages_sent;
      }
      sends.push_back(std::move(send));
    }
    if (parts == 0 && done) operations_.erase(handle);
  }
  if (parts == 0 && done) done({});
  for (Send& send : sends) {
    const uint64_t id = send.id;
    const NodeId owner = send.owner;
    bool owner_down = false;
    {
      std::lock_guard lock(mu_);
      owner_down = down_owners_.count(owner) > 0;
    }
    auto fail = [&](const node::Status& status) {
      if (owner != self_) {
        release(id, status);
      } else {
        finishSub(id, status, 0, {}, {});
      }
    };
    if (cancelled) {
      fail(*cancelled);
      continue;
    }
    if (owner_down) {
      fail({node::ErrorCode::kNotConnected, fmt::format("owner node {} is down", owner)});
      continue;
    }
    if (owner == self_) {
      const bool posted = node_.post(
          [this, id, clock, keys = std::move(send.keys), values = std::move(send.values)] {
            if (auto error = local_.push(self_, clock, *keys, values)) {
              finishSub(id, {node::ErrorCode::kProtocol, *error}, 0, {}, {});
            } else {
              finishSub(id, {}, 0, {}, {});
            }
          });
      if (!posted) {
        finishSub(id, {node::ErrorCode::kShutdown, "the node is shutting down"}, 0, {}, {});
      }
      continue;
    }
    // The gradients travel as the frame's attachment, written from where they are.
    node::SharedFrame frame =
        send.slots.empty()
            ? encode(node_, pushRequest(id, clock, *send.keys, send.pieces, send.floats, true))
            : encode(node_, pushBySlots(id, clock, send.slots, send.layout, send.pieces));
    node_.send(owner, frame,
               [this, id](node::NodeId, const node::Status& status) { release(id, status); });
  }
  return handle;
}

bool KvWorker::resendByKeys(uint64_t request) {
  std::shared_ptr<const std::vector<Key>> keys;
  std::vector<std::span<const float>> pieces;
  bool pull = false;
  NodeId owner = 0;
  Clock clock = 0, min_clock = 0;
  size_t floats = 0;
  {
    std::lock_guard lock(mu_);
    auto it = requests_.find(request);
    if (it == requests_.end()) return true;  // ended meanwhile (owner down, cancelled)
    SubRequest& sub = it->second;
    if (!sub.by_slots || sub.resent || !sub.keys) return false;
    if (sub.plan) {
      OwnerPart& part = sub.plan->parts[sub.part];
      part.slots.clear();  // learned again from the answer to this pull, or the next one
    }
    sub.resent = true;
    sub.by_slots = false;
    ++stats_.resent_by_keys;
    keys = sub.keys;
    pieces = sub.pieces;
    pull = sub.pull;
    owner = sub.owner;
    clock = sub.clock;
    min_clock = sub.min_clock;
    floats = sub.floats;
    if (!pull) ++sub.busy;  // the new frame is written from the same gradients
  }
  if (pull) {
    node_.send(owner, encode(node_, pullRequest(request, clock, min_clock, *keys, true)),
               [this, request](node::NodeId, const node::Status& status) {
                 if (!status.ok()) finishSub(request, status, 0, {}, {});
               });
  } else {
    node_.send(
        owner, encode(node_, pushRequest(request, clock, *keys, pieces, floats, true)),
        [this, request](node::NodeId, const node::Status& status) { release(request, status); });
  }
  return true;
}

void KvWorker::clock() {
  Clock clock = 0;
  {
    std::lock_guard lock(mu_);
    clock = ++clock_;
  }
  announceClock(clock);
}

void KvWorker::resumeAt(Clock clock) {
  {
    std::lock_guard lock(mu_);
    if (clock <= clock_) return;
    clock_ = clock;
  }
  announceClock(clock);
}

void KvWorker::setModelView(std::span<const float> model) {
  std::lock_guard lock(mu_);
  model_view_ = model;
  read_stamps_.assign(space().keyEnd(), -1);
}

std::optional<std::string> KvWorker::lastRead(std::span<const Key> keys, std::vector<float>& out,
                                              Clock& read_clock) const {
  std::lock_guard lock(mu_);
  if (model_view_.size() != space().total()) {
    return fmt::format("node {} keeps no model view to answer from", self_);
  }
  std::optional<Clock> oldest;
  for (Key key : keys) {
    if (!space().contains(key)) return fmt::format("unknown key {}", key);
    const auto row = model_view_.subspan(space().offset(key), space().length(key));
    out.insert(out.end(), row.begin(), row.end());
    oldest = std::min(oldest.value_or(read_stamps_[key]), read_stamps_[key]);
  }
  read_clock = oldest.value_or(-1);
  return std::nullopt;
}

node::SharedFrame KvWorker::clockFrame(Clock clock) {
  return encode(node_, clockAnnouncement(clock));
}

void KvWorker::announceClock(Clock clock) {
  node::SharedFrame frame =
      others_.empty() || !options_.announce_to_peers ? nullptr : clockFrame(clock);
  // One closure on the loop: after this worker's pushes of the clock (posted before it), and it
  // records the clock that an owner coming back up must hear again (onPeerEvent).
  node_.post([this, clock, frame] {
    announced_ = clock;
    if (frame) node_.broadcast(others_, frame);
    if (auto error = local_.clock(self_, clock)) {
      node_.logger().error("own server refused clock {}: {}", clock, *error);
    }
  });
}

void KvWorker::finishSub(uint64_t request, const node::Status& status, Clock min_clock,
                         std::span<const uint64_t> keys, std::span<const float> values) {
  Callback callback;
  node::Status final_status;
  {
    std::lock_guard lock(mu_);
    auto it = requests_.find(request);
    if (it == requests_.end()) return;  // already failed (owner down) or a duplicate reply
    SubRequest& sub = it->second;
    if (sub.busy) {
      if (!sub.outcome) sub.outcome = status;  // the first ending counts, once release() runs
      return;
    }
    node::Status result = status;
    if (result.ok() && sub.pull) {
      // The request id names the keys; an answer that names them (this node's own server, or
      // an older owner) must name the same ones.
      const std::vector<Key>& asked = *sub.keys;
      const bool same_keys =
          keys.empty() || std::equal(keys.begin(), keys.end(), asked.begin(), asked.end());
      if (!same_keys || values.size() != sub.floats) {
        result = {node::ErrorCode::kProtocol,
                  fmt::format("node {} answered a pull of {} key(s) with {} key(s) and {} floats "
                              "(expected {})",
                              sub.owner, asked.size(), keys.size(), values.size(), sub.floats)};
      } else if (!node::allFinite(values)) {
        result = nonFiniteReply(sub.owner, values);
      } else {
        // One copy per run of keys that are next to each other in the caller's buffer (a
        // copy per 1-float key would be a call per key).
        const float* from = values.data();
        for (const DestRun& run : sub.dest) {
          std::copy_n(from, run.floats, run.at);
          from += run.floats;
        }
        recordPullLocked(sub, min_clock);
      }
    }
    callback = settleLocked(request, result, &final_status);
  }
  completed_.notify_all();
  if (callback) callback(final_status);
}

node::Status KvWorker::nonFiniteReply(NodeId owner, std::span<const float> values) const {
  const size_t first = node::firstNonFinite(values).value_or(0);
  return {node::ErrorCode::kProtocol,
          fmt::format("node {} answered a pull with {} non-finite value(s) (the first, {}, is "
                      "float {} of {}): refused",
                      owner, node::countNonFinite(values), values[first], first, values.size())};
}

node::Status KvWorker::checkLandedLocked(const SubRequest& sub) {
  node::Status result;
  size_t i = 0;  // the first key of the run
  for (const DestRun& run : sub.dest) {
    const size_t first = i;
    i += run.keys;
    if (node::allFinite(std::span<const float>(run.at, run.floats))) continue;
    float* p = run.at;
    for (size_t k = first; k < i; ++k) {
      const Key key = (*sub.keys)[k];
      const std::span<float> row(p, space().length(key));
      p += row.size();
      if (node::allFinite(std::span<const float>(row))) continue;
      if (result.ok()) result = nonFiniteReply(sub.owner, row);
      // The values were read in place: put back what this worker last read of the key, when
      // the cache has it (otherwise the row keeps what came, and the trainer's divergence
      // check names this refusal).
      auto cached = cache_.find(key);
      if (cached != cache_.end() && cached->second.values.size() == row.size()) {
        std::copy(cached->second.values.begin(), cached->second.values.end(), row.begin());
      }
    }
  }
  return result;
}

void KvWorker::recordPullLocked(const SubRequest& sub, Clock min_clock) {
  if (model_view_.empty() && !options_.cache) return;  // nothing is kept per key
  size_t i = 0;
  for (const DestRun& run : sub.dest) {
    // A run lies in the caller's buffer, which is the model view or outside it.
    const bool viewed = inModelView(run.at);
    float* p = run.at;
    for (size_t k = 0; k < run.keys; ++k, ++i) {
      const Key key = (*sub.keys)[i];
      const size_t len = space().length(key);
      if (viewed) read_stamps_[key] = min_clock;
      if (options_.cache) {
        CachedRow& cached = cache_[key];
        cached.stamp = min_clock;
        cached.values.assign(p, p + len);
      }
      p += len;
    }
  }
}

KvWorker::Callback KvWorker::settleLocked(uint64_t request, const node::Status& result,
                                          node::Status* final_status) {
  auto it = requests_.find(request);
  const Handle handle = it->second.handle;
  requests_.erase(it);
  if (!result.ok()) ++stats_.failed_requests;
  auto op = operations_.find(handle);
  if (op == operations_.end()) return {};
  if (op->second.status.ok() && !result.ok()) op->second.status = result;
  if (--op->second.remaining > 0) return {};
  op->second.complete = true;
  if (!op->second.done) return {};  // wait() collects it
  Callback callback = std::move(op->second.done);
  *final_status = op->second.status;
  operations_.erase(op);
  return callback;
}

void KvWorker::release(uint64_t request, const node::Status& status) {
  Callback callback;
  node::Status final_status;
  {
    std::lock_guard lock(mu_);
    auto it = requests_.find(request);
    if (it == requests_.end()) return;
    SubRequest& sub = it->second;
    if (sub.busy > 0) --sub.busy;
    if (!status.ok() && !sub.outcome) sub.outcome = status;
    // Still written (a resend) or read; or written and the owner's answer is still to come.
    if (sub.busy > 0 || !sub.outcome) return;
    // A pull released here never had its values handled (onReply settles the ones that did).
    const node::Status result = sub.pull && sub.outcome->ok() ? status : *sub.outcome;
    callback = settleLocked(request, result, &final_status);
  }
  completed_.notify_all();
  if (callback) callback(final_status);
}

std::unique_ptr<node::AttachmentLanding> KvWorker::placeReply(NodeId from,
                                                              const wire::PsReply& reply,
                                                              size_t bytes) {
  if (reply.op() != wire::PsOp::Pull || reply.error() != nullptr || reply.values() != nullptr) {
    return nullptr;
  }
  std::lock_guard lock(mu_);
  auto it = requests_.find(reply.request());
  if (it == requests_.end()) return nullptr;
  SubRequest& sub = it->second;
  // The request id names the keys; an older owner also sent them, and they must match.
  if (sub.owner != from || !sub.pull || sub.busy > 0 ||
      (reply.keys() != nullptr && !std::equal(reply.keys()->begin(), reply.keys()->end(),
                                              sub.keys->begin(), sub.keys->end()))) {
    return nullptr;
  }
  if (sub.floats * sizeof(float) != bytes) return nullptr;
  // One piece per run of keys that are next to each other in the caller's buffer.
  std::vector<std::span<uint8_t>> pieces;
  pieces.reserve(sub.dest.size());
  for (const DestRun& run : sub.dest) {
    pieces.emplace_back(reinterpret_cast<uint8_t*>(run.at), run.floats * sizeof(float));
  }
  sub.busy = 1;
  return std::make_unique<ReplyLanding>(std::move(pieces), *this, reply.request(), from);
}

void KvWorker::onReply(NodeId from, const node::InboundFrame& frame) {
  const wire::PsReply& body = *messageOf(frame).body_as_PsReply();
  const ReplyView reply = decodeReply(body);
  const std::string& error = reply.error;
  if (reply.op == wire::PsOp::Clock) {
    node_.logger().error("node {} refused this worker's clock: {}", from, error);
    return;
  }
  if (frame.landing() != nullptr) {
    // placeReply() matched this reply to its pull (owner, keys, size) and its values are in
    // the caller's buffer already.
    Callback callback;
    node::Status final_status;
    {
      std::lock_guard lock(mu_);
      auto it = requests_.find(reply.request);
      if (it == requests_.end()) return;
      SubRequest& sub = it->second;
      sub.busy = 0;
      node::Status result = sub.outcome.value_or(node::Status{});
      if (result.ok()) result = checkLandedLocked(sub);
      if (result.ok()) recordPullLocked(sub, reply.min_clock);
      if (result.ok()) learnSlotsLocked(sub, reply.slot_runs, reply.layout);
      callback = settleLocked(reply.request, result, &final_status);
    }
    completed_.notify_all();
    if (callback) callback(final_status);
    return;
  }
  {
    std::lock_guard lock(mu_);
    auto it = requests_.find(reply.request);
    if (it == requests_.end() || it->second.owner != from ||
        it->second.pull != (reply.op == wire::PsOp::Pull)) {
      node_.logger().warn("reply from node {} to an unknown {} request {}: ignored", from,
                          wire::EnumNamePsOp(reply.op), reply.request);
      return;
    }
    if (error.empty()) learnSlotsLocked(it->second, reply.slot_runs, reply.layout);
  }
  // Rows named by slot moved at the owner (relocation, a restarted owner): the same request
  // again by keys, once.
  if (!error.empty() && reply.stale && resendByKeys(reply.request)) return;
  if (!error.empty()) {
    finishSub(reply.request,
              {node::ErrorCode::kProtocol, fmt::format("node {} refused the {}: {}", from,
                                                       wire::EnumNamePsOp(reply.op), error)},
              0, {}, {});
    return;
  }
  const std::optional<std::span<const float>> values = valuesOf(body.values(), frame);
  if (!values) {
    finishSub(reply.request,
              {node::ErrorCode::kProtocol,
               fmt::format("node {} answered with values in both the body and an attachment, "
                           "or an attachment of {} bytes that are not whole floats",
                           from, frame.attachment().size())},
              0, {}, {});
    return;
  }
  finishSub(reply.request, {}, reply.min_clock, reply.keys, *values);
}

void KvWorker::onPeerEvent(const node::PeerEvent& event) {
  if (event.kind == node::PeerEventKind::kUp) {
    {
      std::lock_guard lock(mu_);
      down_owners_.erase(event.peer);
    }
    // The announcements sent while it was unreachable are lost; the latest stands for them (the
    // owner takes a jump as clocks whose updates did not reach it).
    if (announced_ > 0 && options_.announce_to_peers) {
      node_.send(event.peer, clockFrame(announced_));
    }
    return;
  }
  if (event.kind != node::PeerEventKind::kDown && event.kind != node::PeerEventKind::kLeft) return;
  std::vector<uint64_t> pending;
  {
    std::lock_guard lock(mu_);
    down_owners_.insert(event.peer);
    for (const auto& [id, sub] : requests_) {
      if (sub.owner == event.peer) pending.push_back(id);
    }
  }
  for (uint64_t id : pending) {
    finishSub(id,
              {node::ErrorCode::kClosed,
               fmt::format("owner node {} went down before answering", event.peer)},
              0, {}, {});
  }
}

std::optional<std::string> KvWorker::offerRows(NodeId owner, Clock min_clock,
                                               std::span<const Key> keys,
                                               std::span<const float> values) {
  if (auto error = space().check(keys, values.size())) return error;
  for (Key key : keys) {
    if (directory_.owner(key) != owner) return fmt::format("key {} is not node {}'s", key, owner);
  }
  if (!node::allFinite(values)) return nonFiniteReply(owner, values).message();
  std::lock_guard lock(mu_);
  if (!options_.cache) return std::nullopt;
  const float* p = values.data();
  for (Key key : keys) {
    const size_t len = space().length(key);
    CachedRow& row = cache_[key];
    row.stamp = min_clock;
    row.values.assign(p, p + len);
    p += len;
  }
  return std::nullopt;
}

void KvWorker::cancelAll(const node::Status& status) {
  std::vector<uint64_t> pending;
  {
    std::lock_guard lock(mu_);
    cancelled_ = status;
    for (const auto& [id, sub] : requests_)
      pending.push_back(id);
  }
  for (uint64_t id : pending)
    finishSub(id, status, 0, {}, {});
}

node::Status KvWorker::wait(Handle handle) {
  std::unique_lock lock(mu_);
  for (;;) {
    auto it = operations_.find(handle);
    if (it == operations_.end()) return {};
    if (it->second.complete) {
      node::Status status = it->second.status;
      operations_.erase(it);
      return status;
    }
    if (completed_.wait_for(lock, options_.report_every) == std::cv_status::timeout) {
      std::set<NodeId> owners;
      for (const auto& [id, sub] : requests_) {
        if (sub.handle == handle) owners.insert(sub.owner);
      }
      const std::vector<NodeId> waiting(owners.begin(), owners.end());
      const Clock clock = clock_;
      lock.unlock();
      node_.logger().info(
          "clock {}: waiting for node(s) {} to answer (an owner holds a read back until every "
          "worker is within the staleness bound; its log names the slow ones)",
          clock, fmt::join(waiting, ", "));
      if (options_.on_waiting) options_.on_waiting(clock, waiting);
      lock.lock();
    }
  }
}

}  // namespace chorus::ps
