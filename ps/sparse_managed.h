// Managed communication for the rows of sparse PS mode (docs/managed-comm.md, "Sparse rows"),
// the cores without networking. An owner pushes the rows of its home keys that changed most
// since it last sent them (ChangeTracker's relative magnitude, under the dense path's
// TokenBucket), and every worker keeps a copy of every row, starting from the initial model
// that all nodes share. A step reads a row from its copy when the row's owner vouched for it
// recently enough under SSP, and pulls it otherwise.
//
// Why a copy of every row and announcements: a sparse step reads rows it has never read before
// (the cold rows of a Zipf workload), so a cache of pushed rows alone would miss on nearly
// every step, and one miss costs the step its round trip. Instead an owner's frame stamped m
// vouches for all of its rows at once: every row it owns that the worker was not told has
// changed is as the worker holds it, with every update from clocks below m. To keep that claim
// true when the budget cannot carry every changed row, an owner first announces the keys that
// changed since it last sent them (keys only, a few bytes each); the worker keeps trusting its
// copies of them only at the stamp the owner vouched for before the change (every update applied
// after it comes from a clock at or above it), until their values come.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ps/key_space.h"
#include "ps/managed_comm.h"
#include "ps/ssp.h"

namespace chorus::ps {

// One frame of an owner's push. `min_clock` kAnnouncement: `keys` changed since they were last
// sent and are not in this frame (no values); the workers' copies of them stay at the owner's
// previous stamp (they hold every update from clocks below it) until their values come.
// Otherwise (>= 0): the values of `keys` (their floats one after the other), and the claim that
// every other key of this owner that was not announced since its last send is unchanged since
// then; all of it holds every update from clocks below `min_clock`. On the wire a PsRowPush.
struct RowFrame {
  static constexpr Clock kAnnouncement = -1;
  Clock min_clock = kAnnouncement;
  std::vector<Key> keys;  // sorted, unique
  std::vector<float> values;
};

// The owner's side: which of its rows changed since they were last sent, which of those the
// workers were told about, and the frames of one pass. Every worker gets the same frames (a
// broadcast), so one record serves them all. Pure.
class SparseRowPusher {
 public:
  using SendFrame = std::function<void(const RowFrame&)>;
  // Tracks `keys` (sorted, unique: the owner's home keys) with `now(key)` as what every worker
  // holds (the initial model).
  SparseRowPusher(std::vector<Key> keys, const ChangeTracker::Rows& now);

  // One pass at the owner's minimum worker clock `min_clock`, while `can_send()` says the budget
  // allows: hands `send` first an announcement of the changed keys not announced yet, then the
  // values of the changed keys, most changed first, `message_bytes` of floats a frame at most
  // (at least one key); with nothing changed, an empty value frame when `min_clock` passed the
  // last stamp sent. True when everything is sent and current (nothing is due until an update
  // or a clock).
  bool pass(Clock min_clock, const ChangeTracker::Rows& now, size_t message_bytes,
            const std::function<bool()>& can_send, const SendFrame& send);

 private:
  ChangeTracker tracker_;
  std::unordered_set<Key> announced_;  // changed since sent, and announced
  Clock stamped_ = 0;                  // the last value frame's stamp (the model: 0)
};

// The worker's side: a copy of every row and, per owner, the stamp it last vouched for its rows
// with; per row announced as changed, the stamp it is frozen at. Not thread-safe (the shell locks).
// Pure.
class ManagedRowCache {
 public:
  using OwnerOf = std::function<NodeId(Key)>;
  // The rows of `space`, starting from `model` (KeySpace::total() floats in key order: the
  // initial values every node starts from, which hold every update from clocks below 0), each
  // owned by `owner(key)` for the whole run. A read at clock c takes a row from here when its
  // stamp is >= c - s (`staleness`'s RowCacheRule): its owner's, or for a row announced and not
  // sent since, the owner's stamp when it was announced.
  // std::invalid_argument when the model does not fit the space.
  ManagedRowCache(const KeySpace& space, OwnerOf owner, std::vector<float> model,
                  Staleness staleness);

  // `from`'s frame (RowFrame's meaning). Checked: keys sorted, unique, in the space and owned by
  // `from`; an announcement without values; a value frame with every key's floats, all finite.
  // The error (nothing changed), or nullopt.
  std::optional<std::string> offer(NodeId from, Clock min_clock, std::span<const Key> keys,
                                   std::span<const float> values);
  // Copies into `out` (the keys' floats one after the other) the rows a read at `clock` may
  // take from here, and appends the positions (in `keys`) of the others to `missing`. `keys`
  // sorted, unique, in the space. Returns how many were served.
  size_t read(std::span<const Key> keys, Clock clock, std::span<float> out,
              std::vector<size_t>& missing) const;
  // The stamp `owner` last vouched for its rows with (0 before its first frame).
  Clock stampOf(NodeId owner) const;

 private:
  const KeySpace& space_;
  OwnerOf owner_;
  std::vector<float> values_;  // every key's floats, KeySpace::offset order
  // By key: the stamp its owner had vouched for when it announced the row as changed, until
  // its value comes (kNotFrozen: the row follows its owner's stamp).
  static constexpr Clock kNotFrozen = std::numeric_limits<Clock>::max();
  std::vector<Clock> frozen_;
  std::unordered_map<NodeId, Clock> stamps_;
  RowCacheRule fresh_;
};

}  // namespace chorus::ps
