// Sparse gossip, the pure core of consensus mode for sparse models (docs/sparse-consensus.md):
// which rows of a node's tables go to which neighbor in a round (the rows changed since they
// last went there: hot rows every round, cold rows batched every K rounds or within a byte
// budget), and the row-wise mixing step (a row is averaged over the models that carried it, the
// weights normalized over those; a row nobody sent stays). No networking, no threads: the shell
// (consensus/sparse_consensus_peer.h) calls it from its trainer thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "consensus/mixing.h"

namespace chorus::consensus {

using RowKey = uint64_t;

// A row's hop count: 0 for a change made by the node's own local step, h + 1 for a change that
// mixing brought in from a row that travelled with hop count h. kNoHop: nothing pending.
inline constexpr uint8_t kNoHop = 255;

// The rows of one table that travel in a share.
struct RowBlock {
  uint32_t table = 0;
  std::vector<RowKey> keys;   // sorted, unique, below the table's rows
  std::vector<float> values;  // keys.size() x the table's dim, row after row
  std::vector<uint8_t> hops;  // per key: the hop count of the change it carries
};

// What one node sends one neighbor in one round: the blocks of the tables that have rows (by
// ascending table index). An empty share still travels: it says "round r is done, nothing
// changed" (the round board counts it as the neighbor's model of that round).
struct RowShare {
  Round round = 0;
  std::vector<RowBlock> blocks;

  // Rows over every block.
  size_t rows() const;
  // The bytes of its rows on the wire: per row its key (8), its hop count (1) and its values.
  uint64_t payloadBytes() const;
};

// Bytes a row of `dim` floats costs in a share (key, hop count, values).
inline uint64_t rowWireBytes(size_t dim) {
  return 8 + 1 + 4 * uint64_t{dim};
}

struct GossipTableShape {
  size_t rows = 0;
  size_t dim = 0;
};

struct SparseGossipOptions {
  std::vector<GossipTableShape> tables;
  std::vector<NodeId> neighbors;
  // Per table, the hot keys (sampling/access_stats.h's chooseHotSet): a changed hot row travels
  // in the very next round. May be shorter than `tables` (no hot rows in the rest).
  std::vector<std::vector<RowKey>> hot;
  // K: a changed cold row waits at most K - 1 rounds: every round r with (r + 1) % K == 0 sends
  // every pending cold row. 1: every changed row every round.
  int64_t cold_every = 8;
  // B > 0: in the other rounds, cold rows also travel oldest first while the share's rows stay
  // within B bytes (hot rows are sent whatever their bytes). 0: no budget.
  uint64_t round_bytes = 0;
  // A change travels at most this many hops from the node whose local step made it (a row that
  // mixing changed is passed on while its hop count stays below this; the diameter of the graph
  // reaches every node). >= 1.
  int relay_hops = 2;
  // The dense exchange (a measurement baseline, and the test of bit-for-bit equality with
  // dense consensus): every row of every table to every neighbor in every round.
  bool dense = false;
};

// Throws std::invalid_argument naming the flag for an option out of range.
void validateSparseGossipOptions(const SparseGossipOptions& options);

// One neighbor's share used in a mixing step, with the Metropolis degree of its sender.
struct CarriedShare {
  NodeId from = 0;
  size_t degree = 0;
  const RowShare* share = nullptr;
};

struct MixResult {
  size_t rows_mixed = 0;    // rows that at least one share carried
  size_t rows_relayed = 0;  // of them, rows marked to be passed on
};

// The per-neighbor send state of one node's tables. One thread.
class SparseGossip {
 public:
  // Throws std::invalid_argument for bad options.
  explicit SparseGossip(SparseGossipOptions options);

  // The node's local step of round `round` changed rows `keys` of table `table` (any order,
  // may repeat): each is due to every neighbor, with hop count 0.
  void markLocal(size_t table, std::span<const RowKey> keys, Round round);

  // The share for `to` in round `round`: its due hot rows, the cold rows the schedule lets go
  // (all of them with `flush`: the last round), their values read from `tables` (one row-major
  // span per table). The rows sent are no longer due to `to`. `to` must be a neighbor.
  RowShare select(NodeId to, Round round, std::span<const std::span<const float>> tables,
                  bool flush = false);

  // The mixing step of round `round` over `tables` (row-major, as select's): every row carried
  // by at least one of `used` becomes mixingWeights(kind, own_degree, degrees of the shares
  // that carried it) applied to this node's row and theirs, in `used` order (mixInto's
  // arithmetic, so that with every row in every share it is dense consensus to the bit). A row
  // that mixing changed, carried with hop count h, is due to the neighbors that did not carry it
  // when h + 1 < relay_hops. Shares must hold sorted unique keys below the tables' rows (the
  // shell checks what comes off the network).
  MixResult mix(Round round, std::span<const std::span<float>> tables, MixingKind kind,
                size_t own_degree, std::span<const CarriedShare> used);

  // Rows due to `to` now (hot and cold).
  size_t pendingRows(NodeId to) const;

  // Whole-cluster checkpoints (docs/checkpoints.md, "Sparse runs"): the send state as words (per
  // table its rows' hop counts; per neighbor and table its due rows in queue order with the
  // round each became due), so that a resumed node sends what the uninterrupted one would have.
  std::vector<uint64_t> exportState() const;
  // Sets the send state from exportState()'s words, of a run with the same tables and neighbors
  // whose rounds were below `next_round`. Throws std::invalid_argument saying what does not fit
  // (nothing changed then).
  void importState(std::span<const uint64_t> words, Round next_round);
  const SparseGossipOptions& options() const { return options_; }

 private:
  struct Outbox {
    NodeId to = 0;
    // Per table: per row, the round it became due to this neighbor, or -1.
    std::vector<std::vector<Round>> since;
    std::vector<std::vector<RowKey>> hot_due;  // per table, unsorted
    std::vector<std::deque<RowKey>> cold_due;  // per table, oldest first
    size_t pending = 0;
  };

  Outbox& outbox(NodeId to);
  // Makes row `key` of `table` due to `box` as of `round`.
  void markDue(Outbox& box, size_t table, RowKey key, Round round);
  void sent(Outbox& box, size_t table, RowKey key);

  SparseGossipOptions options_;
  std::vector<std::vector<bool>> hot_;  // per table, per row
  // Per table, per row: the hop count the row travels with next, and how many neighbors it is
  // still due to (the hop count is forgotten when that reaches 0).
  std::vector<std::vector<uint8_t>> hop_;
  std::vector<std::vector<uint16_t>> due_count_;
  std::vector<Outbox> outboxes_;  // by neighbor, options_.neighbors order
};

// The union of `shares` (oldest first), a row of a later share replacing the same row of an
// earlier one: what a neighbor's unmixed shares amount to when the round board hands over only
// the newest (its older ones were superseded while this node was busy).
RowShare mergeShares(std::span<const RowShare* const> shares);

// Why `share` cannot be mixed into tables of these shapes (nullopt: it can): a table index out
// of range, keys unsorted, repeated or out of range, values or hop counts of the wrong length,
// values not finite. `from` names the sender in the message.
std::optional<std::string> checkRowShare(const RowShare& share,
                                         std::span<const GossipTableShape> tables, NodeId from);

// Why `part` (one frame's rows) cannot extend `assembled` (the share's earlier parts, each of
// which passed): `part` must pass checkRowShare alone and continue `assembled` (tables ascending,
// a table's keys ascending across parts). A share whose every part passed is one checkRowShare
// accepts, so a receiver checks each part before it keeps it and holds nothing unchecked.
std::optional<std::string> checkRowSharePart(const RowShare& assembled, const RowShare& part,
                                             std::span<const GossipTableShape> tables, NodeId from);
// Appends `part`'s blocks to `assembled` (a block of `assembled`'s last table is extended).
void appendRowSharePart(RowShare& assembled, RowShare&& part);

}  // namespace chorus::consensus
