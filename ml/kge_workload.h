// A knowledge graph as a sparse workload: a KgeModel trained on the graph's training triples,
// evaluated with the filtered ranking protocol on valid and test. What `chorus train --model
// complex|distmult` runs.
#pragma once

#include <memory>
#include <string>

#include "ml/kge.h"
#include "ml/kge_eval.h"
#include "ml/sparse_train.h"

namespace chorus::ml {

// The folder of the triple data set `name`: for wn18rr, findDataDir()'s rules; for any other
// name, `dataDir` itself or `dataDir/<name>` when given, else $CHORUS_DATA/<name>, then
// <source tree>/data/<name>. A folder qualifies when it holds
// train.txt, valid.txt and test.txt (each may be .gz). Throws DataError listing every place
// looked at.
std::string findTripleDir(const std::string& name, const std::string& dataDir);

// KGE training and evaluation over one graph. Keeps a reference to `data`, which must outlive it.
class KgeWorkload : public SparseWorkload {
 public:
  // A fresh model for `data` from `seed`. Throws std::invalid_argument for a bad config, or when
  // the graph has no entities or relations.
  KgeWorkload(const KgData& data, const KgeConfig& config, uint64_t seed);

  std::string spec() const override;
  std::vector<SparseTable*> tables() override;
  size_t trainPoints() const override { return data_.train.size(); }
  double computeGradients(std::span<const size_t> points, Rng& rng,
                          std::span<SparseGradAccumulator> grads) override;
  void drawStep(std::span<const size_t> points, Rng& rng) override;
  // The drawn step's entities (heads, tails, negatives) and relations.
  void stepRows(std::span<std::vector<RowKey>> rows) override;
  double computeDrawnGradients(std::span<SparseGradAccumulator> grads) override;
  // The entity table (0), unless every entity is a negative (--negatives all).
  std::optional<size_t> sampledTable() const override;
  size_t sampledRowsPerStep(size_t points) const override;
  void drawStepWith(std::span<const size_t> points, std::span<const RowKey> sampled) override;
  void stepRowsUnsampled(std::span<std::vector<RowKey>> rows) override;
  // The triples' heads and tails (none with --negatives all: every entity is read). Not the
  // relations: a few rows that every worker uses at every step, which relocation would only
  // pass round the workers (measured on WN18RR, 2 nodes: 3.4 s per epoch with them, 1.4 s
  // without); hot rows are replication's (NuPS), not relocation's.
  void pointRows(std::span<const size_t> points,
                 std::span<std::vector<RowKey>> rows) const override;
  // "valid" (when the graph has validation triples) and "test".
  std::vector<std::string> evalSplits() const override;
  // mrr, hits@1, hits@3, hits@10, mean_rank, tail_mrr, head_mrr of the filtered ranking.
  std::vector<NamedMetric> evaluate(const std::string& split) override;
  bool higherIsBetter() const override { return true; }

  // The full ranking result of a split ("valid" or "test").
  KgeRanking rank(const std::string& split) const;
  KgeModel& model() { return model_; }

 private:
  const KgData& data_;
  KgeModel model_;
  KnownTriples known_;
  std::vector<Triple> batch_;
};

}  // namespace chorus::ml
