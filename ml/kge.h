// Knowledge-graph embeddings: DistMult and ComplEx over an entity and a relation table, the
// losses (logistic with optional self-adversarial weighting, softmax cross-entropy), L2 / N3
// regularization and negative sampling (N corrupted heads and N corrupted tails per positive,
// or every entity: 1-N scoring). The step writes sparse gradients of the rows it touched.
//
// With reciprocal relations (Lacroix et al. 2018, Dettmers et al. 2018) the relation table has
// a second row r + R for each relation r: head prediction (?, r, t) is the tail query
// (t, r + R, ?), in training and in evaluation alike, so each direction has its own relation row.
//
// Both models are bilinear, so each direction is a query vector dotted with candidate rows:
// score(h, r, t) = <q(h, r), t> = <h, g(r, t)>. Tail prediction ranks entities e by <q, e>,
// head prediction by <e, g>; a batch of queries against all entities is one matrix product.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ml/rng.h"
#include "ml/sparse_data.h"
#include "ml/sparse_table.h"
#include "ml/tensor.h"
#include "sampling/negative_sampler.h"

namespace chorus::ml {

// The scoring function (--model).
enum class KgeModelKind { kDistMult, kComplEx };
// The loss of one query over its candidates (--loss).
enum class KgeLossKind { kLogistic, kCrossEntropy };
// The penalty on the rows a positive uses (--reg).
enum class KgeRegularizerKind { kNone, kL2, kN3 };

// Parsers for the command line; each throws std::invalid_argument naming its flag.
KgeModelKind parseKgeModel(const std::string& name);              // distmult | complex
KgeLossKind parseKgeLoss(const std::string& name);                // logistic | ce
KgeRegularizerKind parseKgeRegularizer(const std::string& name);  // none | l2 | n3
// The names the parsers accept.
const char* kgeModelName(KgeModelKind kind);
const char* kgeLossName(KgeLossKind kind);
const char* kgeRegularizerName(KgeRegularizerKind kind);
// The model names `chorus train --model` takes for knowledge graphs.
const std::vector<std::string>& kgeModelNames();

// Everything that defines a KGE model and its training objective.
struct KgeConfig {
  KgeModelKind model = KgeModelKind::kComplEx;
  // Floats per embedding row (ComplEx: dim/2 complex numbers, real parts first, then imaginary
  // parts; dim must be even). DistMult and ComplEx of one dim have the same size.
  size_t dim = 400;
  size_t negatives = 256;     // per positive and direction (ignored with allNegatives)
  bool allNegatives = false;  // 1-N: every entity is a candidate (--negatives all)
  // --share-negatives: the `negatives` entities are drawn once per step and every query of the
  // batch is scored against them (matrix products, as 1-N) instead of fresh ones per query.
  bool sharedNegatives = false;
  KgeLossKind loss = KgeLossKind::kLogistic;
  double adversarialTemperature = 0.0;  // > 0: RotatE's self-adversarial negative weights
  KgeRegularizerKind regularizer = KgeRegularizerKind::kN3;
  double regWeight = 0.0;
  double initScale = 1e-3;  // rows start N(0, initScale^2)
  // Reciprocal relations (--reciprocal): 2 x relations rows, head queries use row r + R.
  bool reciprocal = false;

  // Throws std::invalid_argument naming the flag when a value is out of range.
  void validate() const;
  // One line that identifies the model for checkpoints ("complex dim=400 entities=... ").
  std::string spec(size_t entities, size_t relations) const;
  // Rows of the relation table for a graph of `relations` relations (2x with reciprocal).
  size_t relationRows(size_t relations) const { return reciprocal ? 2 * relations : relations; }
};

// --- The pure pieces, exposed for tests and the benchmark. `dim` floats per row. ---

// q(h, r): the tail query, score(h, r, e) = <q, e>. Writes q.
void kgeTailQuery(KgeModelKind model, size_t dim, const float* h, const float* r, float* q);
// g(r, t): the head query, score(e, r, t) = <e, g>. Writes g.
void kgeHeadQuery(KgeModelKind model, size_t dim, const float* r, const float* t, float* g);
// Adds d<q,.>/dh and d/dr for a gradient dq of the tail query into dh and dr.
void kgeTailQueryBackward(KgeModelKind model, size_t dim, const float* h, const float* r,
                          const float* dq, float* dh, float* dr);
// Adds the gradients of the head query g(r, t) for dg into dr and dt.
void kgeHeadQueryBackward(KgeModelKind model, size_t dim, const float* r, const float* t,
                          const float* dg, float* dr, float* dt);
// score(h, r, t), in double.
double kgeScore(KgeModelKind model, size_t dim, const float* h, const float* r, const float* t);

// The loss of one query over its candidates' scores, candidate `trueIndex` being the true
// entity and every other candidate a negative. Logistic: (softplus(-s+) + sum_j w_j
// softplus(s_j)) / 2, w_j = 1/n or, with temperature a > 0, softmax(a s_j) over the negatives
// taken as constants (RotatE). Cross-entropy: -s+ + log sum_j exp(s_j) over all candidates.
// Overwrites `scores` with dloss/dscore and returns the loss.
double kgeCandidateLoss(KgeLossKind loss, double adversarialTemperature, std::span<float> scores,
                        size_t trueIndex);

// The regularizer of one row: L2 sum x^2; N3 sum |x|^3 (ComplEx: sum of |z|^3 over the complex
// numbers z, Lacroix et al. 2018). Adds weight * its gradient into `grad` (if not null) and
// returns weight * value.
double kgeRegularize(KgeModelKind model, KgeRegularizerKind reg, double weight, size_t dim,
                     const float* row, float* grad);

// A KGE model: its two tables and the scratch of its training step. One thread at a time.
class KgeModel {
 public:
  // Tables of `entities` and config.relationRows(`relations`) rows, initialized from `seed`
  // (entity table from mixSeed(seed, 1), relation table from mixSeed(seed, 2)). config must
  // validate().
  KgeModel(const KgeConfig& config, size_t entities, size_t relations, uint64_t seed);

  // One training step on `batch`: the loss of each positive is its tail-prediction loss plus its
  // head-prediction loss plus the regularizer of its three rows (with reciprocal relations: of
  // each query's three rows, h r t and t r+R h, as kbc); returns the batch mean (the
  // regularizer included) and accumulates d(mean)/d(rows) into the two accumulators (sized
  // for the tables). Negatives are drawn from `rng` through sampling::NegativeSampler, uniform
  // over entities, fresh for each positive and direction (not filtered: a negative may happen to
  // be true).
  double computeGradients(std::span<const Triple> batch, Rng& rng,
                          SparseGradAccumulator& entityGrad, SparseGradAccumulator& relationGrad);

  // The same step in two halves, so that a parameter server can fetch the rows a step touches
  // before computing it: drawNegatives() takes every random draw of the step on `batch` from
  // `rng` (in the order computeGradients() takes them: the same rng gives the same step),
  // stepRows() names the rows the drawn step reads and writes, computeDrawnGradients() computes
  // it. computeGradients() is drawNegatives() then computeDrawnGradients().
  void drawNegatives(std::span<const Triple> batch, Rng& rng);
  // How many negatives drawNegatives() draws for a batch of `points` (0 with allNegatives).
  size_t negativeDraws(size_t points) const;
  // drawNegatives() with the negatives given instead of drawn (sparse PS mode's sampling
  // primitives draw them): negativeDraws(batch size) entities in the order drawNegatives()
  // would draw them. std::invalid_argument for another count or an entity out of range.
  void setNegatives(std::span<const RowKey> negatives);
  // Appends the entity and relation rows of the drawn step on `batch` (unsorted, may repeat;
  // with allNegatives every entity); without the drawn negatives when `withNegatives` is false
  // (a negative that is also a positive's entity is still named, as that positive's).
  void stepRows(std::span<const Triple> batch, std::vector<RowKey>& entityRows,
                std::vector<RowKey>& relationRows, bool withNegatives = true) const;
  // The gradient of the step on `batch` with the negatives of the last drawNegatives(batch).
  double computeDrawnGradients(std::span<const Triple> batch, SparseGradAccumulator& entityGrad,
                               SparseGradAccumulator& relationGrad);

  // Scores of every entity as the tail of each (h, r) of `queries` (tailDirection) or as the
  // head of each (r, t) (with reciprocal relations: as the tail of (t, r + R)): out is
  // entities x queries.size(), column j for query j.
  void scoreAllEntities(std::span<const Triple> queries, bool tailDirection, Matrix& out) const;

  // The model's definition.
  const KgeConfig& config() const { return config_; }
  // The entity table (rows = entity ids) and the relation table (rows = relation ids).
  SparseTable& entities() { return entities_; }
  const SparseTable& entities() const { return entities_; }
  SparseTable& relations() { return relations_; }
  const SparseTable& relations() const { return relations_; }

 private:
  // One direction of a triple as the model scores it: candidates e are scored against the query
  // built from `anchor` and relation row `relation`, the tail form q(anchor, r) or the head
  // form g(r, anchor); `answer` is the true candidate.
  struct Query {
    uint32_t anchor, relation, answer;
    bool tailForm;
  };
  Query queryOf(const Triple& t, bool tailDirection) const;
  // Writes the query vector of `q` (dim floats).
  void buildQuery(const Query& q, float* out) const;
  // Adds the gradients of the query's two rows for a query gradient `dq`.
  void queryBackward(const Query& q, const float* dq, SparseGradAccumulator& entityGrad,
                     SparseGradAccumulator& relationGrad) const;
  double sampledStep(std::span<const Triple> batch, SparseGradAccumulator& entityGrad,
                     SparseGradAccumulator& relationGrad);
  double sharedStep(std::span<const Triple> batch, SparseGradAccumulator& entityGrad,
                    SparseGradAccumulator& relationGrad);
  double allEntitiesStep(std::span<const Triple> batch, SparseGradAccumulator& entityGrad,
                         SparseGradAccumulator& relationGrad);

  KgeConfig config_;
  size_t relationCount_;  // R: relations of the graph (the table has 2R rows with reciprocal)
  SparseTable entities_;
  SparseTable relations_;
  // Negatives: uniform over the entities, drawn through the shared sampling layer.
  sampling::NegativeSampler negatives_;
  // The drawn step's negatives: per positive and direction `negatives` entities (sampled), or
  // `negatives` for the whole step (shared); empty with allNegatives.
  std::vector<uint32_t> drawn_;
  // Step scratch, reused.
  std::vector<uint32_t> candidates_;
  std::vector<float> scores_, query_, dquery_;
  Matrix queries_, scoreMatrix_, dqueries_, negativeRows_, negativeGrad_;
};

}  // namespace chorus::ml
