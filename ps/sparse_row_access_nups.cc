// The nups path of sparse PS mode (NuPS): the hot keys have a replica on every node (ps/
// replica_shell.h): a step reads and pushes them here at once, and the background sync sums every
// node's changes `syncs_per_second` times a second; every other key is managed as under lapse,
// relocated to the worker that localizes it (ps/relocation_shell.h). A request of the loop is
// split by key: the hot part is served by the replicas before the call returns, the rest goes to
// the relocation shell, and a pull's two parts land in the caller's buffer when it is waited
// for. docs/ps-replication.md ("In sparse PS mode") has the semantics: hot keys are bounded-stale
// in time (about one sync interval), not in clocks; the others obey SSP.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "node/node.h"
#include "ps/relocation_shell.h"
#include "ps/replica_set.h"
#include "ps/replica_shell.h"
#include "ps/sparse_row_access.h"

namespace chorus::ps {

namespace {

using std::chrono::duration;

class NupsRowAccess final : public SparseRowAccess {
 public:
  NupsRowAccess(node::Node& node, KeyStore store, const RowAccessSetup& setup)
      : node_(node),
        space_(store.space()),
        relocation_(node, *setup.map, std::move(store), setup.members,
                    RelocationShellOptions{.staleness = setup.staleness,
                                           .on_peer_clock = setup.on_peer_clock}) {
    const ReplicaSetup& r = setup.replicas;
    syncs_per_second_ = r.syncs_per_second;
    name_ = sparseTechniqueName(r.technique);
    if (!r.keys.empty()) {
      if (!r.policy) throw std::logic_error("nups: the replicas need the owners' update policy");
      auto layout =
          std::make_shared<const ReplicaLayout>(space_, r.keys, *setup.map, r.policy.get());
      replicas_ = std::make_unique<ReplicaShell>(
          node, std::move(layout), r.initial, r.policy,
          ReplicaShellOptions{.syncs_per_second = r.syncs_per_second});
    }
  }

  // Before the node (which outlives this) stops delivering: the replica shell first, since its
  // destructor waits for the loop.
  ~NupsRowAccess() override { replicas_.reset(); }

  Handle pull(std::span<const Key> keys, std::span<float> out) override {
    return read(std::nullopt, keys, out);
  }
  Handle pullAt(Clock min_clock, std::span<const Key> keys, std::span<float> out) override {
    return read(min_clock, keys, out);
  }

  Handle push(std::span<const Key> keys, std::span<const float> grads) override {
    if (!replicas_) return own(relocation_.push(keys, grads));
    Split split = splitKeys(keys, grads.size());
    if (!split.hot.empty()) {
      gather(split.hot_floats, grads, split.hot_grads);
      replicas_->push(split.hot, split.hot_grads, clock_);
      keys_replica_ += split.hot.size();
    }
    if (split.cold.empty()) return own(std::nullopt);
    gather(split.cold_floats, grads, split.cold_grads);
    return own(relocation_.push(split.cold, split.cold_grads));
  }

  node::Status wait(Handle handle) override {
    Pending pending;
    {
      std::lock_guard lock(mu_);
      auto it = pending_.find(handle);
      if (it == pending_.end()) return {};  // waited for already
      pending = std::move(it->second);
      pending_.erase(it);
    }
    if (!pending.relocation) return {};
    const node::Status status = relocation_.wait(*pending.relocation);
    if (status.ok() && !pending.cold_out.empty()) {
      // The relocated rows' values, read into a buffer of their own, go to their places.
      size_t from = 0;
      for (const auto& [at, floats] : pending.cold_places) {
        std::copy_n(pending.cold_out.begin() + static_cast<std::ptrdiff_t>(from), floats,
                    pending.out.begin() + static_cast<std::ptrdiff_t>(at));
        from += floats;
      }
    }
    return status;
  }

  void localize(std::span<const Key> keys, KeyLocalizer::Done done) override {
    // A replicated key is local everywhere: only the others move.
    if (!replicas_) return relocation_.localize(keys, std::move(done));
    std::vector<Key> cold;
    cold.reserve(keys.size());
    for (Key key : keys) {
      if (!replicas_->isReplicated(key)) cold.push_back(key);
    }
    if (cold.empty()) {
      if (done) done(node::Status{});
      return;
    }
    relocation_.localize(cold, std::move(done));
  }

  // A replicated key is local on every node; the others while the relocation shell holds them.
  bool isLocal(Key key) const override {
    return (replicas_ && replicas_->isReplicated(key)) || relocation_.holdsNow(key);
  }

  void clock() override {
    relocation_.clock();
    ++clock_;
    if (!replicas_) return;
    // The replicas' age at this clock's end: what a step of the next clock reads at most.
    const ReplicaShellCounters c = replicas_->counters();
    if (c.staleness) {
      const double age = duration<double>(*c.staleness).count();
      std::lock_guard lock(mu_);
      staleness_sum_ += age;
      staleness_max_ = std::max(staleness_max_, age);
      ++staleness_samples_;
    }
  }

  void cancelAll(const node::Status& status) override { relocation_.cancelAll(status); }

  RowAccessStats stats() const override {
    const RelocationShellStats r = relocation_.stats();
    RowAccessStats s;
    s.keys_local = r.keys_local + keys_replica_;
    s.keys_remote = r.keys_remote;
    s.localized = r.localized;
    s.localize_failed = r.localize_failed;
    s.held_keys = r.held_keys;
    if (replicas_) {
      const ReplicaShellCounters c = replicas_->counters();
      s.replicated_keys = replicas_->layout().size();
      s.keys_replica = keys_replica_;
      s.replica_rounds = c.rounds;
      s.replica_lost_deltas = c.lost_deltas;
      s.replica_bytes_sent = c.wire_bytes_sent;
      std::lock_guard lock(mu_);
      s.replica_staleness_mean_s =
          staleness_samples_ > 0 ? staleness_sum_ / static_cast<double>(staleness_samples_) : 0;
      s.replica_staleness_max_s = staleness_max_;
      s.replica_digest = replica_digest_;
    }
    return s;
  }

  PsRunHooks runHooks() override {
    PsRunHooks hooks;
    hooks.finished = [this](NodeId from) { relocation_.peerFinished(from); };
    hooks.peer_event = [this](const node::PeerEvent& event) {
      relocation_.onPeerEvent(event);
      if (replicas_) replicas_->onPeerEvent(event);
    };
    return hooks;
  }

  SparseTechnique technique() const override { return SparseTechnique::kNups; }

  void startRun() override {
    if (!replicas_) return;
    replicas_->start();
    // Every node makes the same choice: one line is enough, but each node's log has it.
    node_.logger().info("{}: {} hot keys replicated on every node, synced {} times a second{}",
                        name_, replicas_->layout().size(), syncsPerSecondText(),
                        name_ == std::string("nups")
                            ? fmt::format("; the other {} keys are relocated",
                                          space_.numKeys() - replicas_->layout().size())
                            : std::string());
  }

  node::Status finishPushes(std::chrono::milliseconds timeout) override {
    if (!replicas_) return {};
    node::Status status = replicas_->drain(timeout);
    if (!status.ok()) return status;
    // Every node that drained holds the same bits (ReplicaShell::drain): their digest says so
    // in each node's log and metrics.
    std::vector<float> values;
    replicas_->pull(replicas_->layout().keys(), values);
    const uint64_t digest = XXH3_64bits(values.data(), values.size() * sizeof(float));
    replica_digest_ = digest;
    node_.logger().info(
        "{}: replicas drained after {} sync rounds: every live node's pushes are in them "
        "(digest {:016x})",
        name_, replicas_->counters().rounds, digest);
    return status;
  }

 private:
  // A request's keys split into the replicated (hot) ones and the others, with where each one's
  // floats sit in the request's buffer: (offset, floats) per key.
  struct Split {
    std::vector<Key> hot, cold;
    std::vector<std::pair<size_t, size_t>> hot_floats, cold_floats;
    std::vector<float> hot_grads, cold_grads;
  };
  // A pull or push of the loop: the relocation shell's part, and for a pull where its values go.
  struct Pending {
    std::optional<RelocationShell::Handle> relocation;
    std::span<float> out;
    std::vector<float> cold_out;
    std::vector<std::pair<size_t, size_t>> cold_places;
  };

  std::string syncsPerSecondText() const { return fmt::format("{:g}", syncs_per_second_); }

  // Splits `keys` (sorted, unique, in the space, `floats` floats in all: std::invalid_argument
  // otherwise, as the shells check).
  Split splitKeys(std::span<const Key> keys, size_t floats) const {
    if (std::optional<std::string> error = space_.check(keys, floats)) {
      throw std::invalid_argument("nups: " + *error);
    }
    Split split;
    size_t at = 0;
    for (Key key : keys) {
      const size_t length = space_.length(key);
      if (replicas_->isReplicated(key)) {
        split.hot.push_back(key);
        split.hot_floats.emplace_back(at, length);
      } else {
        split.cold.push_back(key);
        split.cold_floats.emplace_back(at, length);
      }
      at += length;
    }
    return split;
  }

  static void gather(const std::vector<std::pair<size_t, size_t>>& places,
                     std::span<const float> from, std::vector<float>& to) {
    to.clear();
    for (const auto& [at, floats] : places)
      to.insert(to.end(), from.begin() + static_cast<std::ptrdiff_t>(at),
                from.begin() + static_cast<std::ptrdiff_t>(at + floats));
  }

  Handle read(std::optional<Clock> min_clock, std::span<const Key> keys, std::span<float> out) {
    const auto relocationRead = [&](std::span<const Key> k, std::span<float> o) {
      return min_clock ? relocation_.pullAt(*min_clock, k, o) : relocation_.pull(k, o);
    };
    if (!replicas_) return own(relocationRead(keys, out));
    Split split = splitKeys(keys, out.size());
    if (!split.hot.empty()) {
      // The replicas' values now: a hot key is bounded-stale in time, not in clocks (NuPS).
      std::vector<float> values;
      replicas_->pull(split.hot, values);
      size_t from = 0;
      for (const auto& [at, floats] : split.hot_floats) {
        std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(from), floats,
                    out.begin() + static_cast<std::ptrdiff_t>(at));
        from += floats;
      }
      keys_replica_ += split.hot.size();
    }
    if (split.cold.empty()) return own(std::nullopt);
    Pending pending;
    pending.out = out;
    size_t cold = 0;
    for (const auto& place : split.cold_floats)
      cold += place.second;
    pending.cold_out.resize(cold);
    pending.cold_places = std::move(split.cold_floats);
    // The buffer lives in the pending entry, whose vector's storage does not move with it.
    const std::span<float> cold_out(pending.cold_out);
    const RelocationShell::Handle handle = relocationRead(split.cold, cold_out);
    pending.relocation = handle;
    return own(std::move(pending));
  }

  Handle own(std::optional<RelocationShell::Handle> relocation) {
    Pending pending;
    pending.relocation = relocation;
    return own(std::move(pending));
  }
  Handle own(Pending pending) {
    std::lock_guard lock(mu_);
    const Handle handle = next_handle_++;
    pending_.emplace(handle, std::move(pending));
    return handle;
  }

  node::Node& node_;
  KeySpace space_;
  RelocationShell relocation_;
  std::unique_ptr<ReplicaShell> replicas_;  // null: nothing replicated (lapse exactly)
  double syncs_per_second_ = 0;
  const char* name_ = "nups";  // the log lines' technique
  Clock clock_ = 0;            // the worker's clock (trainer thread)
  std::atomic<uint64_t> keys_replica_{0};
  std::atomic<uint64_t> replica_digest_{0};

  mutable std::mutex mu_;  // guards what follows
  Handle next_handle_ = 1;
  std::unordered_map<Handle, Pending> pending_;
  double staleness_sum_ = 0;
  double staleness_max_ = 0;
  uint64_t staleness_samples_ = 0;
};

}  // namespace

ReplicaChoice chooseHotKeys(const KeySpace& space, const ReplicationOptions& options,
                            const UpdatePolicy& policy) {
  const uint64_t bytes_per_float = ReplicaSet::bytesPerRow(1, policy);
  if (options.replicate) {
    return chooseTopReplicas(space, options.accesses, bytes_per_float, *options.replicate);
  }
  return chooseReplicas(space, options.accesses, bytes_per_float, options.budget_bytes);
}

std::unique_ptr<SparseRowAccess> makeNupsRowAccess(node::Node& node, KeyStore store,
                                                   const RowAccessSetup& setup) {
  return std::make_unique<NupsRowAccess>(node, std::move(store), setup);
}

}  // namespace chorus::ps
