// Filtered link-prediction evaluation (Bordes et al. 2013's protocol, as published results on
// WN18RR use it): every triple of a split is ranked twice, tail prediction (h, r, ?) and head
// prediction (?, r, t), against all entities, after filtering out every other entity that
// makes a known true triple (train + valid + test). MRR and Hits@k average both directions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ml/kge.h"
#include "ml/sparse_data.h"

namespace chorus::ml {

// The known true triples, indexed for filtering: the true tails of each (head, relation) and
// the true heads of each (relation, tail), each list sorted. Built once per data set.
class KnownTriples {
 public:
  // Indexes the union of `splits` (duplicates are harmless).
  KnownTriples(std::initializer_list<std::span<const Triple>> splits);
  // The known true tails of (head, relation), sorted, unique.
  std::span<const uint32_t> tails(uint32_t head, uint32_t relation) const;
  // The known true heads of (relation, tail), sorted, unique.
  std::span<const uint32_t> heads(uint32_t relation, uint32_t tail) const;

 private:
  struct Index {
    std::vector<uint64_t> keys;     // sorted unique (entity << 32 | relation)
    std::vector<size_t> offsets;    // keys.size() + 1
    std::vector<uint32_t> targets;  // per key, its sorted unique answers
    std::span<const uint32_t> find(uint64_t key) const;
  };
  static Index build(std::vector<std::pair<uint64_t, uint32_t>> pairs);
  Index byHeadRelation_, byTailRelation_;
};

// The filtered rank of the true entity among `scores` (all entities): 1 + the number of other,
// not filtered entities scoring strictly higher + half the number of those scoring exactly the
// same (the mean of the optimistic and pessimistic rank, as LibKGE; with continuous scores,
// ties do not occur and every convention agrees). `filtered` holds the known answers, the true
// one among them or not. A non-finite true score gets the worst rank.
double filteredRank(std::span<const float> scores, uint32_t trueEntity,
                    std::span<const uint32_t> filtered);

// Link-prediction quality of one split.
struct KgeRanking {
  size_t queries = 0;  // 2 x triples (both directions)
  double mrr = 0.0;    // mean of 1/rank
  double meanRank = 0.0;
  double hits1 = 0.0, hits3 = 0.0, hits10 = 0.0;  // fraction with rank <= k
  double tailMrr = 0.0, headMrr = 0.0;            // each direction alone
  std::vector<double> ranks;  // with keepRanks: tail ranks of triples 0..n-1, then head ranks
};

// Ranks every triple of `split` in both directions with filtering, scoring a block of queries
// against all entities with one matrix product. `keepRanks` keeps every rank (tests).
KgeRanking evaluateFiltered(const KgeModel& model, std::span<const Triple> split,
                            const KnownTriples& known, bool keepRanks = false);

}  // namespace chorus::ml
