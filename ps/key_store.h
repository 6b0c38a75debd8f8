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

// One row: its floats, optimizer state and technique.
struct KeyEntry {
  KeyTechnique technique = KeyTechnique::kHome;
  std::vector<float> values;
  std::vector<float> state;  // the policy's optimizer state; empty when it keeps none
  uint64_t updates = 0;      // pushes applied
};

class KeyStore {
 public:
  // Spaces of up to this many keys get a table from key to row (8 bytes per key: 32 MiB at
  // most, next to at least 4M rows of ~100 bytes each), so that the hot path does no hashing.
  static constexpr size_t kIndexedKeys = size_t{1} << 22;

  // An empty store over `space`; rows of every technique are updated with `policy`.
  KeyStore(KeySpace space, std::shared_ptr<const UpdatePolicy> policy);
  // Takes the keys of `space` whose home in `map` is `self`, initialized from `initial` (the
  // whole flat model, identical on every node), updated with SGD as `optimizer` says.
  KeyStore(const KeySpace& space, const ShardMap& map, NodeId self, std::span<const float> initial,
           OwnerOptimizer optimizer);
  // Movable (the rows stay where they are), not copyable (the index points at them).
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
  // Replaces `out` with the values of checked `keys`, in key order, where they live: valid
  // until the next apply, applyClock, restore or extract. `out` is the caller's to reuse.
  void rowsOf(std::span<const uint64_t> keys, std::vector<std::span<const float>>& out) const;
  // Applies the gradients `grads` (key order, checked), pushed at `clock`, with each row's
  // policy.
  void apply(std::span<const uint64_t> keys, std::span<const float> grads, int64_t clock);
  // check() and the rows of `keys` in one pass (the rows of a request are looked up once):
  // on success `rows` holds them in key order, for applyRows() before the store changes.
  std::optional<std::string> locate(std::span<const uint64_t> keys, std::optional<size_t> values,
                                    const KeyDirectory* directory, std::vector<KeyEntry*>& rows);
  // apply() on rows that locate() found: one policy call per technique for the whole push.
  void applyRows(std::span<KeyEntry* const> rows, std::span<const float> grads, int64_t clock);
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
  size_t size() const { return rows_.size(); }
  // Is `key` held here?
  bool contains(Key key) const { return lookup(key) != nullptr; }
  // The row of `key`, or null when it is not held here.
  const KeyEntry* find(Key key) const;
  // Every key that may be held, with its length.
  const KeySpace& space() const { return space_; }
  // The update policy of `technique`.
  const UpdatePolicy& policy(KeyTechnique technique) const {
    return *policies_[static_cast<size_t>(technique)];
  }
  // Pushes applied (a BSP clock applied at once counts one).
  uint64_t updatesApplied() const { return updates_; }

 private:
  // The row of `key`, or null when it is not held here.
  KeyEntry* lookup(Key key) const {
    if (!index_.empty()) return key < index_.size() ? index_[key] : nullptr;
    auto it = rows_.find(key);
    return it == rows_.end() ? nullptr : const_cast<KeyEntry*>(&it->second);
  }
  KeyEntry& at(Key key) { return *lookup(key); }
  const KeyEntry& at(Key key) const { return *lookup(key); }
  // Adds a row (a key in the space, not held yet) to rows_ and the index.
  void add(Key key, KeyEntry row);

  KeySpace space_;
  std::array<std::shared_ptr<const UpdatePolicy>, kKeyTechniques> policies_;
  // Node-based: a row and its buffers stay where they are when other keys come and go.
  std::unordered_map<Key, KeyEntry> rows_;
  // For a space of at most kIndexedKeys keys (a dense model): each key's row or null, so that
  // the hot path does no hashing. Empty for larger spaces.
  std::vector<KeyEntry*> index_;
  uint64_t updates_ = 0;
  std::array<std::vector<RowUpdate>, kKeyTechniques> scratch_;  // apply()'s per-technique rows
  std::vector<KeyEntry*> located_;                              // apply()'s rows
};

}  // namespace chorus::ps
