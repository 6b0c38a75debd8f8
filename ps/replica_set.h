// One node's replicas of the hot keys (NuPS): their values, read and pushed locally at once, and
// the change since the last sync, which a sync round (ps/replica_sync.h) sums over every node.
//
// What a replica syncs: **parameter changes after the optimizer**, not raw gradients. A push
// goes through the update policy with this replica's optimizer state, like a push to an owner,
// and the row's change (after minus before) is added to the delta. A sync sums the deltas of
// all nodes, so that with no more pushes every replica holds the initial value plus every
// node's changes. Raw gradient sums would make each replica apply the others' gradients with a
// different state than its own (AdaGrad's step depends on the accumulator), and replicas would
// never agree. Optimizer state: when it only adds up (AdaGrad's sums of squares,
// UpdatePolicy::stateAddsUp) its changes are summed with the values, so every replica's
// accumulator converges to the one an owner applying every push would hold; otherwise (SGD's
// velocity, which decays) each replica keeps its own, never synced.
//
// Why replicas converge bit for bit: each row keeps `synced`, the sum every node agreed on at
// the last round it finished, and the local value is synced plus this node's changes since it
// took its delta. A round's sum is computed once per key (by the key's reducer) and sent to all,
// so every node adds the same floats to the same synced row; a row with no change pending is
// then exactly synced, on every node. Free of any networking; single-threaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ps/replica_layout.h"
#include "ps/update_policy.h"

namespace chorus::ps {

class ReplicaSet {
 public:
  // Replicas of `layout`'s keys starting at `initial` (their value floats, in key order:
  // layout->totalLength() floats, the same on every node), updated with `policy`.
  // std::invalid_argument when `initial` has the wrong length.
  ReplicaSet(std::shared_ptr<const ReplicaLayout> layout, std::span<const float> initial,
             std::shared_ptr<const UpdatePolicy> policy);

  // The hot keys and their rows' layout.
  const ReplicaLayout& layout() const { return *layout_; }
  // Is `key` replicated here?
  bool contains(Key key) const { return layout_->indexOf(key).has_value(); }
  // Why `keys` (with `floats` gradient floats, unchecked when nullopt) are no request on the
  // replicas, or nullopt: sorted, unique, hot, and exactly their value floats.
  std::optional<std::string> check(std::span<const Key> keys, std::optional<size_t> floats) const;
  // Appends the local values of checked `keys` to `out`, in key order.
  void read(std::span<const Key> keys, std::vector<float>& out) const;
  // The local value floats of hot key `key` (a hot key), valid until the next push or
  // applySum.
  std::span<const float> values(Key key) const;
  // The local optimizer state of hot key `key` (synced or not).
  std::span<const float> state(Key key) const;
  // Applies a push of checked `keys` with `grads` (key order), made at `clock`, to the local
  // rows at once, one policy call for the whole push, and adds each row's change to the delta.
  void push(std::span<const Key> keys, std::span<const float> grads, int64_t clock);
  // The change of every row touched since the last take (synced floats per row), and starts a
  // new delta: what this node contributes to the next sync round.
  SparseRows takeDelta();
  // Applies a finished round's sum of every node's delta (checked rows of the layout, this
  // node's own included): synced += sum, and each summed row's local value becomes synced plus
  // what this node pushed since it took its delta.
  void applySum(const SparseRows& sum);
  // Rows touched since the last take.
  size_t pendingRows() const { return touched_list_.size(); }
  // Bytes one replica row of `row_floats` value floats takes here with `policy` (values, their
  // synced copy and delta, and the state): what a memory budget for hot keys is divided by.
  static uint64_t bytesPerRow(size_t row_floats, const UpdatePolicy& policy);

 private:
  std::span<float> rowValues(size_t i) {
    return {row_.data() + layout_->offset(i), layout_->length(i)};
  }
  // Where row i's optimizer state lives: in row_ after its values when it is synced, else in
  // own_state_.
  struct StateAt {
    bool synced;
    size_t begin;
    size_t size;
  };
  StateAt stateAt(size_t i) const;
  std::span<float> rowState(size_t i) {
    const StateAt at = stateAt(i);
    return {(at.synced ? row_.data() : own_state_.data()) + at.begin, at.size};
  }

  std::shared_ptr<const ReplicaLayout> layout_;
  std::shared_ptr<const UpdatePolicy> policy_;
  std::vector<float> row_;        // local rows: synced floats (values, then summed state)
  std::vector<float> synced_;     // the rows every node agreed on at the last finished round
  std::vector<float> delta_;      // change since the last take
  std::vector<float> own_state_;  // state that is not synced (offsets below), else empty
  std::vector<size_t> own_state_offset_;
  std::vector<uint8_t> touched_;  // per hot key: in the delta
  std::vector<size_t> touched_list_;
  std::vector<float> before_;  // push()'s copy of its rows before the update
  std::vector<RowUpdate> updates_;
  std::vector<size_t> push_rows_;  // push()'s hot key numbers
};

}  // namespace chorus::ps
