// --technique auto's rule (issue 25, "Beyond NuPS"; docs/ps-replication.md, "--technique auto"):
// which technique manages each key, from what every worker is about to access, with no hand-set
// hot-set size. Free of any networking; every node computes the same choice from the same
// inputs (the data, the shards, the ties' order).
//
// For each key k and node r, lambda_r(k) = the accesses of k that node r's shard is expected to
// make in one replica-sync window (its accesses per epoch / clocks per epoch * window clocks). A
// step reads a row once however often its points use it, so node r touches k in a window with
// probability p_r(k) = 1 - exp(-lambda_r(k)) (Poisson). Then:
// - replicate when at least two nodes each touch k in a window more likely than not (p_r >= 1/2):
//   several nodes use it between two syncs, so relocation would pass the row (and its optimizer
//   state) between them in every window, and a remote owner would serve reads in every window
//   that the step waits for; a replica serves them all locally for one delta per window. Most
//   shared first (users(k) = sum_r p_r(k), the nodes expected to touch k in a window), as many
//   as fit the memory cap.
// - relocate when one node makes most of k's expected accesses (more than half): moving the row
//   there once makes most of its accesses local, and nobody takes it away often (Lapse).
// - home otherwise (classic): a key used now and then by several nodes, none of them most. Moving
//   it would follow each use round the cluster; at its home one node's accesses are local and
//   every other is one round trip, batched with the step's other reads from that owner.
// The thresholds are the rule's meaning ("two nodes", "more likely than not", "most accesses"),
// not tuning knobs: they do not depend on the workload, and no hot-set size is given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ps/key_space.h"
#include "ps/replica_choice.h"

namespace chorus::ps {

// What one node's shard is expected to access: one TableAccesses per table of the key space,
// each empty (none of the table's keys) or one count per row, in accesses per epoch (the data's
// own rows plus what sampling draws: ml::kgShardAccessStats, ml::mfShardAccessStats).
using NodeAccesses = std::vector<TableAccesses>;

// The settings of the rule.
struct TechniqueChoiceOptions {
  // The clocks of one epoch (sparseClocksPerEpoch): accesses per epoch become per clock.
  int64_t clocks_per_epoch = 1;
  // The replica-sync window in clocks (autoWindowClocks); > 0.
  double window_clocks = 1;
  // A replica's bytes per value float (ReplicaSet::bytesPerRow(1, policy)) and the replicas'
  // memory cap on each node: past it, the most shared keys win and the rest are relocated (when
  // one node makes most of their accesses) or left at home.
  uint64_t bytes_per_float = 1;
  uint64_t budget_bytes = uint64_t{64} << 20;
};

// The technique of every key.
struct TechniqueChoice {
  std::vector<Key> replicated;  // sorted: a replica on every node
  std::vector<Key> relocated;   // sorted: moved to the node that localizes it (its main user)
  size_t home = 0;              // keys left at their homes: every key of the space in neither
  uint64_t replica_bytes = 0;   // the replicas' memory on each node
  size_t over_budget = 0;       // keys the replication rule chose that the cap left out
  // Shares of all expected accesses (summed over the nodes), in [0, 1].
  double replicated_share = 0;
  double relocated_share = 0;
  double home_share = 0;
  double window_clocks = 0;  // the options' window
};

// Expected number of nodes that touch a key within one window, given each node's expected
// accesses of it in that window: sum of 1 - exp(-lambda) (users(k) above).
double expectedUsers(std::span<const double> lambdas);

// The replica-sync window in clocks: one sync interval (1 / syncs_per_second) at an assumed
// `steps_per_second`, at least one clock (a step reads a row once: a shorter window is a clock);
// syncs_per_second 0 (the replicas sync only at the end): the whole run, `total_clocks`.
double autoWindowClocks(double syncs_per_second, double steps_per_second, int64_t total_clocks);

// The rule above over `space`, one NodeAccesses per node (in member order; every entry with
// one TableAccesses per table, each empty or the table's row count long: std::invalid_argument
// otherwise, and for no node at all or a window or clock count <= 0).
TechniqueChoice chooseTechniques(const KeySpace& space, std::span<const NodeAccesses> nodes,
                                 const TechniqueChoiceOptions& options);

// One log line: "auto: 124 keys replicated (0.4 MiB per node, 41.0% of expected accesses), 310
// relocated (2.1%), 40531 at their homes (56.9%); window 1.0 clocks".
std::string formatTechniqueChoice(const TechniqueChoice& choice);

}  // namespace chorus::ps
