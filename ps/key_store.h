// The rows a node holds in PS mode: per key its floats, its optimizer state and its management
// technique, in a store that can gain keys (insert, with their state) and lose them (extract,
// for a transfer to another node), so that relocation (Lapse) and replication (NuPS) move rows
// in and out without touching the rest. Updates go through the technique's UpdatePolicy
// (ps/update_policy.h). Free of any networking; single-threaded (the owner's loop thread).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/key_directory.h"
#include "ps/key_runs.h"
#include "ps/key_space.h"
#include "ps/shard_map.h"
#include "ps/update_policy.h"

namespace chorus::ps {

// How a key is managed (NuPS, Renz-Wieland et al.): one value per key, so the techniques can
// coexist in one store, each with its own UpdatePolicy.
enum class KeyTechnique : uint8_t {
  kHome,  // classic: the owner holds the only copy and applies every update
};
inline constexpr size_t kKeyTechniques = 1;
const char* keyTechniqueName(KeyTechnique technique);

// One row outside the store: what insert() takes, extract() gives back for a transfer and
// copyRow() returns: its floats, optimizer state and technique.
struct KeyEntry {
  KeyTechnique technique = KeyTechnique::kHome;
  std::vector<float> values;
  std::vector<float> state;  // the policy's optimizer state; empty when it keeps none
  uint64_t updates = 0;      // pushes applied
};

// Rows live in slabs, one per table of the key space: the values of all rows of a table held
// here in one array, their optimizer states in another, and per slot its key, technique and
// update count. Rows taken in key order (the constructors, a peer inserting its rows at start)
// lie in key order, so a request for keys that are next to each other among this node's keys
// reads and updates whole runs of rows at once, whatever keys the other nodes hold in between
// (issue 25: a node per key and two heap vectors per row made every key a pointer chase).
// A key that leaves (extract) frees its slot; one that arrives (insert) takes the slot after
// its predecessor's when that is free, else a freed slot, else a new one at the end.
class KeyStore {
 public:
  // Spaces of up to this many keys get a table from key to slot (4 bytes per key: 16 MiB at
  // most), so that the hot path does no hashing; larger spaces use a hash map.
  static constexpr size_t kIndexedKeys = size_t{1} << 22;

  // Rows that lie next to each other in one slab, with one technique: what locate() finds and
  // applyRuns() updates. Consecutive keys of a request that are consecutive slots here make one
  // run, however far apart the keys are.
  struct Run {
    uint32_t table = 0;  // the slab (the table's index in the key space)
    uint32_t slot = 0;   // the first row's slot
    uint32_t rows = 0;
    KeyTechnique technique = KeyTechnique::kHome;
    size_t floats = 0;  // values of the run's rows together
  };

  // An empty store over `space`; rows of every technique are updated with `policy`.
  KeyStore(KeySpace space, std::shared_ptr<const UpdatePolicy> policy);
  // Takes the keys of `space` whose home in `map` is `self`, initialized from `initial` (the
  // whole flat model, identical on every node), updated with SGD as `optimizer` says.
  KeyStore(const KeySpace& space, const ShardMap& map, NodeId self, std::span<const float> initial,
           OwnerOptimizer optimizer);
  KeyStore(KeyStore&&) = default;
  KeyStore& operator=(KeyStore&&) = default;
  KeyStore(const KeyStore&) = delete;
  KeyStore& operator=(const KeyStore&) = delete;

  // Gains `key` with `row` (its values, its state: as the policy sizes them, or empty for a
  // fresh state). Errors (nothing changed): a key outside the space or held already, values or
  // state of the wrong length.
  std::optional<std::string> insert(Key key, KeyEntry row);
  // Loses `key`: its row, state included, for a transfer; nullopt when it is not held.
  std::optional<KeyEntry> extract(Key key);
  // Sets the policy of one technique (the constructor's applies to all until then).
  void setPolicy(KeyTechnique technique, std::shared_ptr<const UpdatePolicy> policy);

  // Why `keys` (with `values` floats, or no values when nullopt) cannot be served here, or
  // nullopt: keys must be sorted and unique, exist in the space, be held here, and `values`
  // must hold exactly their floats. `directory`, when given, names a missing key's owner.
  std::optional<std::string> check(std::span<const uint64_t> keys, std::optional<size_t> values,
                                   const KeyDirectory* directory = nullptr) const;
  // Appends the values of checked `keys` to `out`, in key order.
  void read(std::span<const uint64_t> keys, std::vector<float>& out) const;
  // Writes the values of checked `keys` to `out` (exactly floatsOf(keys) floats), in key order.
  void copyTo(std::span<const uint64_t> keys, float* out) const;
  // Replaces `out` with the values of checked `keys`, in key order, where they live, one span
  // per run of rows: valid until the next insert, apply, applyClock, restore or extract. `out`
  // is the caller's to reuse.
  void rowsOf(std::span<const uint64_t> keys, std::vector<std::span<const float>>& out) const;
  // Applies the gradients `grads` (key order, checked), pushed at `clock`, with each row's
  // policy.
  void apply(std::span<const uint64_t> keys, std::span<const float> grads, int64_t clock);
  // check() and the runs of rows of `keys` in one pass (the rows of a request are looked up
  // once): on success `runs` holds them in key order, for applyRuns() before the store changes.
  std::optional<std::string> locate(std::span<const uint64_t> keys, std::optional<size_t> values,
                                    const KeyDirectory* directory, std::vector<Run>& runs) const;
  // Rows named by slot instead of key (issue 25, ps/key_runs.h SlotRun): the same check as
  // locate()'s, per run instead of per key (every slot in its slab and held, `values`, when
  // given, exactly their floats, no row named twice), and the runs with their techniques and
  // floats in `runs`, in the order named. Only meaningful while layout() is what it was when
  // the slots were handed out (the caller checks that first).
  std::optional<std::string> locateSlots(std::span<const SlotRun> named,
                                         std::optional<size_t> values,
                                         std::vector<Run>& runs) const;
  // The slot runs of `runs` (what a worker names next time instead of the keys).
  static void slotRunsOf(std::span<const Run> runs, std::vector<SlotRun>& out);
  // The values of `runs` where they live, one span per run (valid as rowsOf's).
  void rowsOfRuns(std::span<const Run> runs, std::vector<std::span<const float>>& out) const;
  // Appends the keys of the rows of `runs` to `out`, in run order.
  void keysOf(std::span<const Run> runs, std::vector<Key>& out) const;
  // Changes whenever a key's slot may no longer be what it was: when a row leaves (extract; its
  // slot may then hold another key). Starts at a random value per store, so that slots handed
  // out by another store (an owner that restarted) do not match. Rows that arrive keep every
  // other row where it is, and leave it unchanged.
  uint64_t layout() const { return layout_; }
  // apply() on runs that locate() found: one policy call per technique for the whole push,
  // with one RowUpdate per run when the policy is elementwise (UpdatePolicy::elementwise).
  void applyRuns(std::span<const Run> runs, std::span<const float> grads, int64_t clock);
  // One checked push: its keys (key order) and their gradients.
  struct Push {
    std::span<const uint64_t> keys;
    std::span<const float> grads;
  };
  // BSP: applies all pushes of `clock` as one step per key on their sum (UpdatePolicy::
  // applyClockSum; with SGD and momentum per clock: synchronous SGD with momentum, exactly).
  void applyClock(std::span<const Push> pushes, int64_t clock);
  // True when BSP owners use applyClock() instead of one apply() per push.
  bool stepsPerClock() const { return policies_[0]->stepsPerClock(); }
  // A restarted owner (--rejoin): sets checked `keys` to `values` (key order) and resets their
  // optimizer state, which died with the previous process.
  void restore(std::span<const uint64_t> keys, std::span<const float> values);

  // Floats of all `keys` together (keys in the space).
  size_t floatsOf(std::span<const uint64_t> keys) const { return space_.floatsOf(keys); }
  // Keys held here, sorted.
  std::vector<Key> ownedKeys() const;
  // Number of keys held here.
  size_t size() const { return held_; }
  // Is `key` held here?
  bool contains(Key key) const;
  // A copy of the row of `key` (values, state, technique, updates), or nullopt when it is not
  // held here (tests, reports; not for the data path).
  std::optional<KeyEntry> copyRow(Key key) const;
  // The values of `key` where they live (valid as rowsOf's), or empty when it is not held here.
  std::span<const float> valuesOf(Key key) const;
  // Every key that may be held, with its length.
  const KeySpace& space() const { return space_; }
  // The update policy of `technique`.
  const UpdatePolicy& policy(KeyTechnique technique) const {
    return *policies_[static_cast<size_t>(technique)];
  }
  // Pushes applied (a BSP clock applied at once counts one).
  uint64_t updatesApplied() const { return updates_; }

 private:
  static constexpr uint32_t kNoSlot = UINT32_MAX;
  // The rows of one table held here (see the class comment).
  struct Slab {
    Key first = 0;  // the table's keys: [first, end)
    Key end = 0;
    size_t row_floats = 0;    // the table's row length: the values' stride per slot
    size_t state_stride = 0;  // floats of state per slot: the most any technique keeps
    std::vector<float> values;
    std::vector<float> state;
    std::vector<Key> keys;  // per slot; kFreeKey when free
    std::vector<KeyTechnique> techniques;
    std::vector<uint64_t> updates;
    std::vector<uint32_t> free;  // freed slots, possibly taken since (checked when popped)
    size_t held = 0;             // slots holding a row
  };
  static constexpr Key kFreeKey = UINT64_MAX;  // never a key of a slab (its end is past it)

  // The slab of `key` (a key in the space).
  uint32_t tableOf(Key key) const;
  // The slot of `key` in its slab, or kNoSlot.
  uint32_t slotOf(Key key) const {
    if (!index_.empty()) return key < index_.size() ? index_[key] - 1 : kNoSlot;
    auto it = slots_.find(key);
    return it == slots_.end() ? kNoSlot : it->second;
  }
  // Floats of `key` in slab `s` (the last row of a chunked table may be shorter).
  size_t lengthIn(const Slab& s, Key key) const {
    return key + 1 < s.end ? s.row_floats : space_.length(key);
  }
  // Floats of state a row of `len` floats keeps under `technique`.
  size_t stateOf(KeyTechnique technique, size_t len) const {
    return policy(technique).stateFloats(len);
  }
  std::span<float> valuesAt(Slab& s, uint32_t slot, size_t len) {
    return {s.values.data() + slot * s.row_floats, len};
  }
  std::span<float> stateAt(Slab& s, uint32_t slot, size_t floats) {
    return {s.state.data() + slot * s.state_stride, floats};
  }
  // Walks `keys` (in the space, sorted) run by run: fn(const Run&) in key order. kHeld: every
  // key is known to be held; otherwise the walk stops at one that is not and returns false.
  template <bool kHeld, typename Fn>
  bool forEachRun(std::span<const uint64_t> keys, Fn&& fn) const;
  // A free slot in slab `t` for `key` (see the class comment), grown when there is none.
  uint32_t takeSlot(uint32_t t, Key key);
  // Sets the state stride of every slab to what its policies need (moves states when it grows).
  void fitStateStrides();
  // Records where `key` lives (kNoSlot: not here).
  void setSlot(Key key, uint32_t slot);

  KeySpace space_;
  std::array<std::shared_ptr<const UpdatePolicy>, kKeyTechniques> policies_;
  std::vector<Slab> slabs_;  // one per table of the space
  // A space of at most kIndexedKeys keys: slot + 1 per key (0: not held). Otherwise slots_.
  std::vector<uint32_t> index_;
  std::unordered_map<Key, uint32_t> slots_;
  size_t held_ = 0;
  uint64_t updates_ = 0;
  uint64_t layout_ = 0;
  std::array<std::vector<RowUpdate>, kKeyTechniques> scratch_;  // applyRuns()'s per technique
  std::vector<Run> located_;                                    // apply()'s runs
};

}  // namespace chorus::ps
