// The auto path of sparse PS mode (--technique auto): each key on the data path of the technique
// chooseTechniques gave it (ps/technique_choice.h):
// - replicated and relocated keys on nups's path (replicas synced in the background; the
//   relocation shell, where a localize moves only the relocated keys);
// - the keys left at their homes on classic's path (KvWorker and KvServer): requests batched per
//   owner with rows named by slot and the optimizer applied over a message's rows, which is
//   what makes classic fast (issue 25; these are most of the keys on WN18RR).
// A request of the loop is split by key class; a pull's two parts land in the caller's buffer
// when it is waited for. The two paths share the node's PsClock frames: the relocation shell
// owns the handler and announces the worker's clocks (after its own pushes, and so after the
// classic worker's pushes, which were posted to the loop before: FIFO links), and hands every
// peer clock it hears to the classic part (hearPeerClock), whose worker announces nothing
// itself. docs/ps-replication.md ("--technique auto") has the semantics.
#include <algorithm>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "ps/replica_set.h"
#include "ps/sparse_row_access.h"

namespace chorus::ps {

namespace {

class AutoRowAccess final : public SparseRowAccess {
 public:
  AutoRowAccess(node::Node& node, KeyStore store, const RowAccessSetup& setup)
      : space_(store.space()), relocated_(setup.relocated) {
    if (!std::is_sorted(relocated_.begin(), relocated_.end())) {
      throw std::logic_error("auto: the relocated keys must be sorted");
    }
    const std::vector<Key>& replicated = setup.replicas.keys;
    if (!std::is_sorted(replicated.begin(), replicated.end())) {
      throw std::logic_error("auto: the replicated keys must be sorted");
    }
    if (!setup.replicas.policy) {
      throw std::logic_error("auto: the classic part needs the owners' update policy");
    }
    // Which keys stay at home: one flag per key of the space (a byte each; WN18RR's 41k keys).
    home_.assign(space_.keyEnd(), 1);
    for (Key key : relocated_)
      home_[key] = 0;
    for (Key key : replicated)
      home_[key] = 0;
    // This node's home rows of the keys left at home move, with their state, to the classic
    // part's store; the relocation shell keeps the rest (it never sees a home key: a localize
    // moves only relocated keys, and every node makes the same choice).
    KeyStore home_rows(space_, setup.replicas.policy);
    for (Key key : store.ownedKeys()) {
      if (!home_[key]) continue;
      std::optional<KeyEntry> row = store.extract(key);
      if (std::optional<std::string> error = home_rows.insert(key, std::move(*row))) {
        throw std::logic_error("auto: " + *error);
      }
    }
    // The classic part first: its KvServer installs a PsClock handler that the relocation
    // shell's (built next) replaces; the shell then hands the peers' clocks on.
    RowAccessSetup classic_setup = setup;
    classic_setup.announce_clock = false;
    classic_ = makeClassicRowAccess(node, std::move(home_rows), classic_setup);
    RowAccessSetup nups_setup = setup;
    SparseRowAccess* classic = classic_.get();
    nups_setup.on_peer_clock = [classic](NodeId from, Clock clock) {
      classic->hearPeerClock(from, clock);
    };
    nups_ = makeNupsRowAccess(node, std::move(store), nups_setup);
  }

  // The nups part first: its replica shell's destructor waits for the loop.
  ~AutoRowAccess() override {
    nups_.reset();
    classic_.reset();
  }

  Handle pull(std::span<const Key> keys, std::span<float> out) override {
    return read(std::nullopt, keys, out);
  }
  Handle pullAt(Clock min_clock, std::span<const Key> keys, std::span<float> out) override {
    return read(min_clock, keys, out);
  }

  Handle push(std::span<const Key> keys, std::span<const float> grads) override {
    Split split = splitKeys(keys, grads.size());
    Pending pending;
    // Both parts copy the gradients before returning.
    if (!split.home.empty()) {
      if (split.other.empty()) {
        pending.classic = classic_->push(keys, grads);
      } else {
        std::vector<float> part;
        gather(split.home_floats, grads, part);
        pending.classic = classic_->push(split.home, part);
      }
    }
    if (!split.other.empty()) {
      if (split.home.empty()) {
        pending.nups = nups_->push(keys, grads);
      } else {
        std::vector<float> part;
        gather(split.other_floats, grads, part);
        pending.nups = nups_->push(split.other, part);
      }
    }
    return own(std::move(pending));
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
    // Both parts are waited for (neither is left in flight with the caller's buffer), the
    // first error wins.
    node::Status status;
    if (pending.classic) status = classic_->wait(*pending.classic);
    if (pending.nups) {
      node::Status other = nups_->wait(*pending.nups);
      if (status.ok()) status = std::move(other);
    }
    if (status.ok()) {
      scatter(pending.home_out, pending.home_places, pending.out);
      scatter(pending.other_out, pending.other_places, pending.out);
    }
    return status;
  }

  // Any thread (relocated_ never changes after construction). Only the relocated keys move;
  // replicated ones are local already (nups skips them), the others stay at their homes.
  void localize(std::span<const Key> keys, KeyLocalizer::Done done) override {
    std::vector<Key> moving;
    moving.reserve(keys.size());
    for (Key key : keys) {
      if (std::binary_search(relocated_.begin(), relocated_.end(), key)) moving.push_back(key);
    }
    if (moving.empty()) {
      if (done) done(node::Status{});
      return;
    }
    nups_->localize(moving, std::move(done));
  }
  // A key at home is local where its home is; the others as nups says.
  bool isLocal(Key key) const override {
    if (key < home_.size() && home_[key]) return classic_->isLocal(key);
    return nups_->isLocal(key);
  }
  // The classic worker's clock first: it tells this node's own server and posts nothing a
  // peer needs; the relocation shell's announcement of the clock (to every peer) comes after
  // the classic pushes of the clock, which were posted to the loop before it.
  void clock() override {
    classic_->clock();
    nups_->clock();
  }
  void cancelAll(const node::Status& status) override {
    classic_->cancelAll(status);
    nups_->cancelAll(status);
  }
  RowAccessStats stats() const override {
    const RowAccessStats c = classic_->stats();
    RowAccessStats s = nups_->stats();
    s.keys_local += c.keys_local;
    s.keys_remote += c.keys_remote;
    s.held_keys += c.held_keys;
    s.keys_home = c.keys_local + c.keys_remote;
    return s;
  }
  PsRunHooks runHooks() override {
    PsRunHooks classic = classic_->runHooks();
    PsRunHooks nups = nups_->runHooks();
    PsRunHooks hooks;
    hooks.finished = [classic = classic.finished, nups = nups.finished](NodeId from) {
      if (classic) classic(from);
      if (nups) nups(from);
    };
    hooks.peer_event = [classic = classic.peer_event,
                        nups = nups.peer_event](const node::PeerEvent& event) {
      if (classic) classic(event);
      if (nups) nups(event);
    };
    hooks.tick = [classic = classic.tick,
                  nups = nups.tick](std::chrono::steady_clock::time_point now) {
      if (classic) classic(now);
      if (nups) nups(now);
    };
    return hooks;
  }
  SparseTechnique technique() const override { return SparseTechnique::kAuto; }
  void startRun() override {
    classic_->startRun();
    nups_->startRun();
  }
  node::Status finishPushes(std::chrono::milliseconds timeout) override {
    return nups_->finishPushes(timeout);
  }

 private:
  using Places = std::vector<std::pair<size_t, size_t>>;  // (offset, floats) per key
  // A request's keys split into those at home (classic) and the others (nups), with where each
  // one's floats sit in the request's buffer.
  struct Split {
    std::vector<Key> home, other;
    Places home_floats, other_floats;
  };
  // A pull or push of the loop: each part's handle, and for a mixed pull where its values go.
  struct Pending {
    std::optional<Handle> classic, nups;
    std::span<float> out;
    std::vector<float> home_out, other_out;
    Places home_places, other_places;
  };

  // Splits `keys` (sorted, unique, in the space, `floats` floats in all: std::invalid_argument
  // otherwise, as the paths check). A part that holds every key is left empty of places: the
  // request then goes to that path as it is.
  Split splitKeys(std::span<const Key> keys, size_t floats) const {
    if (std::optional<std::string> error = space_.check(keys, floats)) {
      throw std::invalid_argument("auto: " + *error);
    }
    Split split;
    size_t at = 0;
    for (Key key : keys) {
      const size_t length = space_.length(key);
      if (home_[key]) {
        split.home.push_back(key);
        split.home_floats.emplace_back(at, length);
      } else {
        split.other.push_back(key);
        split.other_floats.emplace_back(at, length);
      }
      at += length;
    }
    return split;
  }

  static void gather(const Places& places, std::span<const float> from, std::vector<float>& to) {
    to.clear();
    for (const auto& [at, floats] : places)
      to.insert(to.end(), from.begin() + static_cast<std::ptrdiff_t>(at),
                from.begin() + static_cast<std::ptrdiff_t>(at + floats));
  }
  static void scatter(const std::vector<float>& from, const Places& places, std::span<float> to) {
    size_t at = 0;
    for (const auto& [offset, floats] : places) {
      std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(at), floats,
                  to.begin() + static_cast<std::ptrdiff_t>(offset));
      at += floats;
    }
  }
  static size_t floatsOf(const Places& places) {
    size_t floats = 0;
    for (const auto& place : places)
      floats += place.second;
    return floats;
  }

  Handle read(std::optional<Clock> min_clock, std::span<const Key> keys, std::span<float> out) {
    const auto readFrom = [&](SparseRowAccess& path, std::span<const Key> k, std::span<float> o) {
      return min_clock ? path.pullAt(*min_clock, k, o) : path.pull(k, o);
    };
    Split split = splitKeys(keys, out.size());
    Pending pending;
    if (split.other.empty()) {
      pending.classic = readFrom(*classic_, keys, out);
      return own(std::move(pending));
    }
    if (split.home.empty()) {
      pending.nups = readFrom(*nups_, keys, out);
      return own(std::move(pending));
    }
    // A mixed read: each part into a buffer of its own (the pending entry's, whose vectors'
    // storage does not move with it), scattered into `out` by wait().
    pending.out = out;
    pending.home_out.resize(floatsOf(split.home_floats));
    pending.other_out.resize(floatsOf(split.other_floats));
    pending.home_places = std::move(split.home_floats);
    pending.other_places = std::move(split.other_floats);
    pending.classic = readFrom(*classic_, split.home, pending.home_out);
    pending.nups = readFrom(*nups_, split.other, pending.other_out);
    return own(std::move(pending));
  }

  Handle own(Pending pending) {
    std::lock_guard lock(mu_);
    const Handle handle = next_handle_++;
    pending_.emplace(handle, std::move(pending));
    return handle;
  }

  KeySpace space_;
  const std::vector<Key> relocated_;
  std::vector<uint8_t> home_;  // per key: 1 when left at its home (classic's path)
  std::unique_ptr<SparseRowAccess> classic_;
  std::unique_ptr<SparseRowAccess> nups_;

  std::mutex mu_;  // guards what follows
  Handle next_handle_ = 1;
  std::unordered_map<Handle, Pending> pending_;
};

// The step rate the window assumes: sparse PS runs 12-40 steps a second per node on this
// machine's WN18RR runs (docs/ps-replication.md), so at NuPS's 25 syncs a second a window is
// about one clock, the shortest the rule uses anyway.
constexpr double kAssumedStepsPerSecond = 25;

}  // namespace

TechniqueChoice chooseAutoTechniques(const KeySpace& space, const ReplicationOptions& options,
                                     const UpdatePolicy& policy, int64_t clocks_per_epoch,
                                     int64_t total_clocks) {
  TechniqueChoiceOptions choice;
  choice.clocks_per_epoch = clocks_per_epoch;
  choice.window_clocks =
      autoWindowClocks(options.syncs_per_second, kAssumedStepsPerSecond, total_clocks);
  choice.bytes_per_float = ReplicaSet::bytesPerRow(1, policy);
  choice.budget_bytes = options.budget_bytes;
  return chooseTechniques(space, options.node_accesses, choice);
}

std::unique_ptr<SparseRowAccess> makeAutoRowAccess(node::Node& node, KeyStore store,
                                                   const RowAccessSetup& setup) {
  return std::make_unique<AutoRowAccess>(node, std::move(store), setup);
}

}  // namespace chorus::ps
