// The key-access statistics of the sparse workloads, computed from their data by the sampling
// layer (sampling/access_stats.h). This sits in ml/ because ml/ depends on sampling/ and not the
// other way round: sampling/ knows keys and counts, ml/ knows what a triple or a rating touches.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "ml/sparse_data.h"
#include "sampling/access_stats.h"

namespace chorus::ml {

// Expected accesses per key of the KGE tables in one epoch over data.train.
struct KgAccessStats {
  std::vector<double> entities;   // per entity id
  std::vector<double> relations;  // per relation id
};

// Each training triple reads its head, relation and tail, and draws `negativesPerTriple`
// entities from `negativePi` (a distribution over the entity ids; empty: uniform, which adds
// negativesPerTriple / #entities per entity per triple).
KgAccessStats kgAccessStats(const KgData& data, double negativesPerTriple,
                            std::span<const double> negativePi = {});
// The same over the training triples `points` only (indices into data.train: one worker's
// shard): what that worker is expected to access in one epoch (--technique auto). Throws
// std::out_of_range for an index past data.train.
KgAccessStats kgShardAccessStats(const KgData& data, std::span<const size_t> points,
                                 double negativesPerTriple);

// Expected accesses per key of the MF tables in one epoch over data.train (no sampling: each
// rating reads its row and its column).
struct MfAccessStats {
  std::vector<double> rows;
  std::vector<double> cols;
};

// Counts of every row and column in data.train.
MfAccessStats mfAccessStats(const RatingsData& data);
// Counts of every row and column in the ratings `points` of data.train (one worker's shard).
// Throws std::out_of_range for an index past data.train.
MfAccessStats mfShardAccessStats(const RatingsData& data, std::span<const size_t> points);

// The start-up log lines: one sampling::formatSkew line per table.
std::vector<std::string> skewLines(const KgAccessStats& stats);
// The start-up log lines: one sampling::formatSkew line per table.
std::vector<std::string> skewLines(const MfAccessStats& stats);

}  // namespace chorus::ml
