#include "ml/kge_eval.h"

#include <algorithm>
#include <cmath>

namespace chorus::ml {

namespace {

uint64_t pairKey(uint32_t entity, uint32_t relation) {
  return (uint64_t{entity} << 32) | relation;
}

}  // namespace

KnownTriples::KnownTriples(std::initializer_list<std::span<const Triple>> splits) {
  std::vector<std::pair<uint64_t, uint32_t>> byHead, byTail;
  for (const auto& split : splits) {
    for (const Triple& t : split) {
      byHead.emplace_back(pairKey(t.head, t.relation), t.tail);
      byTail.emplace_back(pairKey(t.tail, t.relation), t.head);
    }
  }
  byHeadRelation_ = build(std::move(byHead));
  byTailRelation_ = build(std::move(byTail));
}

KnownTriples::Index KnownTriples::build(std::vector<std::pair<uint64_t, uint32_t>> pairs) {
  std::sort(pairs.begin(), pairs.end());
  pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  Index index;
  index.targets.reserve(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (i == 0 || pairs[i].first != pairs[i - 1].first) {
      index.keys.push_back(pairs[i].first);
      index.offsets.push_back(i);
    }
    index.targets.push_back(pairs[i].second);
  }
  index.offsets.push_back(pairs.size());
  return index;
}

std::span<const uint32_t> KnownTriples::Index::find(uint64_t key) const {
  const auto it = std::lower_bound(keys.begin(), keys.end(), key);
  if (it == keys.end() || *it != key) return {};
  const auto i = static_cast<size_t>(it - keys.begin());
  return {targets.data() + offsets[i], offsets[i + 1] - offsets[i]};
}

std::span<const uint32_t> KnownTriples::tails(uint32_t head, uint32_t relation) const {
  return byHeadRelation_.find(pairKey(head, relation));
}

std::span<const uint32_t> KnownTriples::heads(uint32_t relation, uint32_t tail) const {
  return byTailRelation_.find(pairKey(tail, relation));
}

double filteredRank(std::span<const float> scores, uint32_t trueEntity,
                    std::span<const uint32_t> filtered) {
  const float target = scores[trueEntity];
  if (!std::isfinite(target)) return static_cast<double>(scores.size());
  // Count over every entity first (a branch-free, vectorized pass), then take back the filtered
  // ones: there are few of them, and most entities are not.
  int64_t higher = 0, equal = 0;
  for (const float s : scores) {
    higher += s > target;
    equal += s == target;
  }
  equal -= 1;  // the true entity itself
  for (const uint32_t e : filtered) {
    if (e == trueEntity) continue;
    higher -= scores[e] > target;
    equal -= scores[e] == target;
  }
  return 1.0 + static_cast<double>(higher) + 0.5 * static_cast<double>(equal);
}

KgeRanking evaluateFiltered(const KgeModel& model, std::span<const Triple> split,
                            const KnownTriples& known, bool keepRanks) {
  // 256 queries against 41k entities is a 42 MB score block: large enough for a fast GEMM,
  // small enough to share the machine.
  constexpr size_t kBlock = 256;
  KgeRanking result;
  result.queries = 2 * split.size();
  if (split.empty()) return result;
  if (keepRanks) result.ranks.assign(2 * split.size(), 0.0);
  const size_t entityCount = model.entities().rows();
  Matrix scores;
  double reciprocal[2] = {0.0, 0.0};
  double rankSum = 0.0;
  size_t hits[3] = {0, 0, 0};
  for (int direction = 0; direction < 2; ++direction) {
    const bool tail = direction == 0;
    for (size_t begin = 0; begin < split.size(); begin += kBlock) {
      const auto block = split.subspan(begin, std::min(kBlock, split.size() - begin));
      model.scoreAllEntities(block, tail, scores);
      for (size_t j = 0; j < block.size(); ++j) {
        const Triple& t = block[j];
        const std::span<const float> column(scores.col(static_cast<Eigen::Index>(j)).data(),
                                            entityCount);
        const double rank = tail ? filteredRank(column, t.tail, known.tails(t.head, t.relation))
                                 : filteredRank(column, t.head, known.heads(t.relation, t.tail));
        reciprocal[direction] += 1.0 / rank;
        rankSum += rank;
        hits[0] += rank <= 1.0;
        hits[1] += rank <= 3.0;
        hits[2] += rank <= 10.0;
        if (keepRanks) result.ranks[direction * split.size() + begin + j] = rank;
      }
    }
  }
  const auto n = static_cast<double>(split.size());
  result.tailMrr = reciprocal[0] / n;
  result.headMrr = reciprocal[1] / n;
  result.mrr = (reciprocal[0] + reciprocal[1]) / (2.0 * n);
  result.meanRank = rankSum / (2.0 * n);
  result.hits1 = static_cast<double>(hits[0]) / (2.0 * n);
  result.hits3 = static_cast<double>(hits[1]) / (2.0 * n);
  result.hits10 = static_cast<double>(hits[2]) / (2.0 * n);
  return result;
}

}  // namespace chorus::ml
