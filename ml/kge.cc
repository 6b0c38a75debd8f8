#include "ml/kge.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace chorus::ml {

KgeModelKind parseKgeModel(const std::string& name) {
  if (name == "distmult") return KgeModelKind::kDistMult;
  if (name == "complex") return KgeModelKind::kComplEx;
  throw std::invalid_argument("--model must be distmult or complex for knowledge graphs, not '" +
                              name + "'");
}

KgeLossKind parseKgeLoss(const std::string& name) {
  if (name == "logistic") return KgeLossKind::kLogistic;
  if (name == "ce") return KgeLossKind::kCrossEntropy;
  throw std::invalid_argument("--loss must be logistic or ce, not '" + name + "'");
}

KgeRegularizerKind parseKgeRegularizer(const std::string& name) {
  if (name == "none") return KgeRegularizerKind::kNone;
  if (name == "l2") return KgeRegularizerKind::kL2;
  if (name == "n3") return KgeRegularizerKind::kN3;
  throw std::invalid_argument("--reg must be none, l2 or n3, not '" + name + "'");
}

const char* kgeModelName(KgeModelKind kind) {
  return kind == KgeModelKind::kDistMult ? "distmult" : "complex";
}

const char* kgeLossName(KgeLossKind kind) {
  return kind == KgeLossKind::kLogistic ? "logistic" : "ce";
}

const char* kgeRegularizerName(KgeRegularizerKind kind) {
  switch (kind) {
    case KgeRegularizerKind::kNone:
      return "none";
    case KgeRegularizerKind::kL2:
      return "l2";
    default:
      return "n3";
  }
}

const std::vector<std::string>& kgeModelNames() {
  static const std::vector<std::string> names = {"complex", "distmult"};
  return names;
}

void KgeConfig::validate() const {
  if (dim == 0 || dim > 100000) throw std::invalid_argument("--dim must be in [1, 100000]");
  if (model == KgeModelKind::kComplEx && dim % 2 != 0) {
    throw std::invalid_argument(fmt::format(
        "--dim {} is odd: ComplEx needs an even --dim (real and imaginary halves)", dim));
  }
  if (!allNegatives && (negatives == 0 || negatives > 1'000'000)) {
    throw std::invalid_argument("--negatives must be 'all' or in [1, 1000000]");
  }
  if (allNegatives && sharedNegatives) {
    throw std::invalid_argument(
        "--share-negatives shares N sampled negatives; --negatives all already scores every "
        "entity");
  }
  if (!(adversarialTemperature >= 0.0) || !std::isfinite(adversarialTemperature)) {
    throw std::invalid_argument("--adversarial-temperature must be a number >= 0");
  }
  if (adversarialTemperature > 0.0 && loss != KgeLossKind::kLogistic) {
    throw std::invalid_argument(
        "--adversarial-temperature weights the negatives of --loss logistic; --loss ce has no "
        "separate negative term");
  }
  if (!(regWeight >= 0.0) || !std::isfinite(regWeight)) {
    throw std::invalid_argument("--reg-weight must be a number >= 0");
  }
  if (!(initScale > 0.0) || !std::isfinite(initScale)) {
    throw std::invalid_argument("--init-scale must be a positive number");
  }
}

std::string KgeConfig::spec(size_t entityCount, size_t relationCount) const {
  // Reciprocal models have another relation table: a checkpoint of one must not load as the other.
  return fmt::format("{} dim={} entities={} relations={}{}", kgeModelName(model), dim, entityCount,
                     relationCount, reciprocal ? " reciprocal" : "");
}

// --- Model algebra. ComplEx rows are [re(0..k) | im(0..k)], k = dim/2. ---

void kgeTailQuery(KgeModelKind model, size_t dim, const float* h, const float* r, float* q) {
  if (model == KgeModelKind::kDistMult) {
    for (size_t i = 0; i < dim; ++i)
      q[i] = h[i] * r[i];
    return;
  }
  const size_t k = dim / 2;
  const float *hr = h, *hi = h + k, *rr = r, *ri = r + k;
  for (size_t i = 0; i < k; ++i) {
    q[i] = hr[i] * rr[i] - hi[i] * ri[i];
    q[k + i] = hr[i] * ri[i] + hi[i] * rr[i];
  }
}

void kgeHeadQuery(KgeModelKind model, size_t dim, const float* r, const float* t, float* g) {
  if (model == KgeModelKind::kDistMult) {
    for (size_t i = 0; i < dim; ++i)
      g[i] = r[i] * t[i];
    return;
  }
  const size_t k = dim / 2;
  const float *rr = r, *ri = r + k, *tr = t, *ti = t + k;
  for (size_t i = 0; i < k; ++i) {
    g[i] = rr[i] * tr[i] + ri[i] * ti[i];
    g[k + i] = rr[i] * ti[i] - ri[i] * tr[i];
  }
}

void kgeTailQueryBackward(KgeModelKind model, size_t dim, const float* h, const float* r,
                          const float* dq, float* dh, float* dr) {
  if (model == KgeModelKind::kDistMult) {
    for (size_t i = 0; i < dim; ++i) {
      dh[i] += dq[i] * r[i];
      dr[i] += dq[i] * h[i];
    }
    return;
  }
  const size_t k = dim / 2;
  const float *hr = h, *hi = h + k, *rr = r, *ri = r + k, *dqr = dq, *dqi = dq + k;
  for (size_t i = 0; i < k; ++i) {
    dh[i] += dqr[i] * rr[i] + dqi[i] * ri[i];
    dh[k + i] += -dqr[i] * ri[i] + dqi[i] * rr[i];
    dr[i] += dqr[i] * hr[i] + dqi[i] * hi[i];
    dr[k + i] += -dqr[i] * hi[i] + dqi[i] * hr[i];
  }
}

void kgeHeadQueryBackward(KgeModelKind model, size_t dim, const float* r, const float* t,
                          const float* dg, float* dr, float* dt) {
  if (model == KgeModelKind::kDistMult) {
    for (size_t i = 0; i < dim; ++i) {
      dr[i] += dg[i] * t[i];
      dt[i] += dg[i] * r[i];
    }
    return;
  }
  const size_t k = dim / 2;
  const float *rr = r, *ri = r + k, *tr = t, *ti = t + k, *dgr = dg, *dgi = dg + k;
  for (size_t i = 0; i < k; ++i) {
    dr[i] += dgr[i] * tr[i] + dgi[i] * ti[i];
    dr[k + i] += dgr[i] * ti[i] - dgi[i] * tr[i];
    dt[i] += dgr[i] * rr[i] - dgi[i] * ri[i];
    dt[k + i] += dgr[i] * ri[i] + dgi[i] * rr[i];
  }
}

double kgeScore(KgeModelKind model, size_t dim, const float* h, const float* r, const float* t) {
  double s = 0.0;
  if (model == KgeModelKind::kDistMult) {
    for (size_t i = 0; i < dim; ++i)
      s += double{h[i]} * r[i] * t[i];
    return s;
  }
  const size_t k = dim / 2;
  for (size_t i = 0; i < k; ++i) {
    const double hr = h[i], hi = h[k + i], rr = r[i], ri = r[k + i], tr = t[i], ti = t[k + i];
    s += hr * rr * tr + hi * rr * ti + hr * ri * ti - hi * ri * tr;
  }
  return s;
}

namespace {

double softplus(double x) {
  return std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x)));
}

double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}

}  // namespace

double kgeCandidateLoss(KgeLossKind loss, double adversarialTemperature, std::span<float> scores,
                        size_t trueIndex) {
  using Array = Eigen::Map<Eigen::ArrayXf>;
  const auto n = static_cast<Eigen::Index>(scores.size());
  Array s(scores.data(), n);
  const float positive = s[static_cast<Eigen::Index>(trueIndex)];
  if (loss == KgeLossKind::kCrossEntropy) {
    // Softmax over every candidate, the true one included (kbc's 1-N loss when all entities are
    // candidates). Eigen's exp is vectorized: with 1-N scoring this loop sees entities x batch
    // scores per direction and step.
    const float top = s.maxCoeff();
    s = (s - top).exp();
    const double z = static_cast<double>(s.sum());
    s *= static_cast<float>(1.0 / z);
    s[static_cast<Eigen::Index>(trueIndex)] -= 1.0f;
    return -(double{positive} - top) + std::log(z);
  }
  const double positiveLoss = softplus(-double{positive});
  const double positiveGrad = sigmoid(double{positive}) - 1.0;
  const Eigen::Index negatives = n - 1;
  if (negatives == 0) {
    s[0] = static_cast<float>(0.5 * positiveGrad);
    return 0.5 * positiveLoss;
  }
  // -inf takes the true candidate out of every negative term below: its weight, softplus and
  // sigmoid all come out 0.
  s[static_cast<Eigen::Index>(trueIndex)] = -std::numeric_limits<float>::infinity();
  thread_local Eigen::ArrayXf e, w;
  e = (-s.abs()).exp();  // exp(-|s|): softplus and sigmoid from one vectorized exp
  if (adversarialTemperature > 0.0) {
    const auto a = static_cast<float>(adversarialTemperature);
    const float top = a * s.maxCoeff();
    w = (a * s - top).exp();
    w /= w.sum();
  } else {
    w.setConstant(n, 1.0f / static_cast<float>(negatives));
    w[static_cast<Eigen::Index>(trueIndex)] = 0.0f;
  }
  const double negativeLoss = static_cast<double>((w * (s.max(0.0f) + e.log1p())).sum());
  // sigmoid(s) = 1/(1+e) for s >= 0, e/(1+e) below.
  s = 0.5f * w * (s >= 0.0f).select(1.0f / (1.0f + e), e / (1.0f + e));
  s[static_cast<Eigen::Index>(trueIndex)] = static_cast<float>(0.5 * positiveGrad);
  return 0.5 * (positiveLoss + negativeLoss);
}

double kgeRegularize(KgeModelKind model, KgeRegularizerKind reg, double weight, size_t dim,
                     const float* row, float* grad) {
  if (reg == KgeRegularizerKind::kNone || weight == 0.0) return 0.0;
  const auto wf = static_cast<float>(weight);
  double value = 0.0;
  if (reg == KgeRegularizerKind::kL2) {
    for (size_t i = 0; i < dim; ++i) {
      value += double{row[i]} * row[i];
      if (grad) grad[i] += 2.0f * wf * row[i];
    }
    return weight * value;
  }
  if (model == KgeModelKind::kDistMult) {
    for (size_t i = 0; i < dim; ++i) {
      const float a = std::abs(row[i]);
      value += double{a} * a * a;
      if (grad) grad[i] += 3.0f * wf * row[i] * a;
    }
    return weight * value;
  }
  // ComplEx: |z|^3 of each complex coordinate; d/dre = 3 re |z|, d/dim = 3 im |z|.
  const size_t k = dim / 2;
  for (size_t i = 0; i < k; ++i) {
    const float re = row[i], im = row[k + i];
    const float modulus = std::sqrt(re * re + im * im);
    value += double{modulus} * modulus * modulus;
    if (grad) {
      grad[i] += 3.0f * wf * re * modulus;
      grad[k + i] += 3.0f * wf * im * modulus;
    }
  }
  return weight * value;
}

// --- KgeModel ---

KgeModel::KgeModel(const KgeConfig& config, size_t entityCount, size_t relationCount, uint64_t seed)
    : config_(config),
      relationCount_(relationCount),
      entities_("entity", entityCount, config.dim),
      relations_("relation", config.relationRows(relationCount), config.dim),
      negatives_(sampling::NegativeSampler::uniform(0, std::max<size_t>(entityCount, 1))) {
  config_.validate();
  entities_.initNormal(mixSeed(seed, 1), config_.initScale);
  relations_.initNormal(mixSeed(seed, 2), config_.initScale);
}

KgeModel::Query KgeModel::queryOf(const Triple& t, bool tailDirection) const {
  if (tailDirection) return {t.head, t.relation, t.tail, true};
  if (config_.reciprocal) {
    return {t.tail, static_cast<uint32_t>(t.relation + relationCount_), t.head, true};
  }
  return {t.tail, t.relation, t.head, false};
}

void KgeModel::buildQuery(const Query& q, float* out) const {
  if (q.tailForm) {
    kgeTailQuery(config_.model, config_.dim, entities_.row(q.anchor), relations_.row(q.relation),
                 out);
  } else {
    kgeHeadQuery(config_.model, config_.dim, relations_.row(q.relation), entities_.row(q.anchor),
                 out);
  }
}

void KgeModel::queryBackward(const Query& q, const float* dq, SparseGradAccumulator& entityGrad,
                             SparseGradAccumulator& relationGrad) const {
  if (q.tailForm) {
    kgeTailQueryBackward(config_.model, config_.dim, entities_.row(q.anchor),
                         relations_.row(q.relation), dq, entityGrad.row(q.anchor),
                         relationGrad.row(q.relation));
  } else {
    kgeHeadQueryBackward(config_.model, config_.dim, relations_.row(q.relation),
                         entities_.row(q.anchor), dq, relationGrad.row(q.relation),
                         entityGrad.row(q.anchor));
  }
}

double KgeModel::computeGradients(std::span<const Triple> batch, Rng& rng,
                                  SparseGradAccumulator& entityGrad,
                                  SparseGradAccumulator& relationGrad) {
  drawNegatives(batch, rng);
  return computeDrawnGradients(batch, entityGrad, relationGrad);
}

void KgeModel::drawNegatives(std::span<const Triple> batch, Rng& rng) {
  drawn_.resize(negativeDraws(batch.size()));
  for (uint32_t& entity : drawn_)
    entity = static_cast<uint32_t>(negatives_(rng.engine()));
}

size_t KgeModel::negativeDraws(size_t points) const {
  return config_.allNegatives      ? 0
         : config_.sharedNegatives ? config_.negatives
                                   : points * 2 * config_.negatives;
}

void KgeModel::setNegatives(std::span<const RowKey> negatives) {
  for (RowKey entity : negatives) {
    if (entity >= entities_.rows()) {
      throw std::invalid_argument(
          fmt::format("negative entity {} is not below the {} entities", entity, entities_.rows()));
    }
  }
  drawn_.resize(negatives.size());
  for (size_t i = 0; i < negatives.size(); ++i)
    drawn_[i] = static_cast<uint32_t>(negatives[i]);
}

void KgeModel::stepRows(std::span<const Triple> batch, std::vector<RowKey>& entityRows,
                        std::vector<RowKey>& relationRows, bool withNegatives) const {
  if (config_.allNegatives) {
    for (RowKey key = 0; key < entities_.rows(); ++key)
      entityRows.push_back(key);
  } else if (withNegatives) {
    entityRows.insert(entityRows.end(), drawn_.begin(), drawn_.end());
  }
  for (const Triple& t : batch) {
    entityRows.push_back(t.head);
    entityRows.push_back(t.tail);
    relationRows.push_back(t.relation);
    if (config_.reciprocal) relationRows.push_back(t.relation + relationCount_);
  }
}

double KgeModel::computeDrawnGradients(std::span<const Triple> batch,
                                       SparseGradAccumulator& entityGrad,
                                       SparseGradAccumulator& relationGrad) {
  if (batch.empty()) return 0.0;
  double loss = config_.allNegatives      ? allEntitiesStep(batch, entityGrad, relationGrad)
                : config_.sharedNegatives ? sharedStep(batch, entityGrad, relationGrad)
                                          : sampledStep(batch, entityGrad, relationGrad);
  // The regularizer of each positive's three rows, in the batch mean.
  const double scale = 1.0 / static_cast<double>(batch.size());
  const size_t dim = config_.dim;
  if (config_.regularizer != KgeRegularizerKind::kNone && config_.regWeight > 0.0) {
    const double w = config_.regWeight * scale;
    // With reciprocal relations each of the two queries regularizes the rows it uses (kbc's
    // objective on the doubled training set): h and t twice, r and r + R once each.
    const double we = config_.reciprocal ? 2.0 * w : w;
    for (const Triple& t : batch) {
      loss += kgeRegularize(config_.model, config_.regularizer, we, dim, entities_.row(t.head),
                            entityGrad.row(t.head));
      loss += kgeRegularize(config_.model, config_.regularizer, w, dim, relations_.row(t.relation),
                            relationGrad.row(t.relation));
      if (config_.reciprocal) {
        const auto inverse = static_cast<uint32_t>(t.relation + relationCount_);
        loss += kgeRegularize(config_.model, config_.regularizer, w, dim, relations_.row(inverse),
                              relationGrad.row(inverse));
      }
      loss += kgeRegularize(config_.model, config_.regularizer, we, dim, entities_.row(t.tail),
                            entityGrad.row(t.tail));
    }
  }
  return loss;
}

double KgeModel::sampledStep(std::span<const Triple> batch, SparseGradAccumulator& entityGrad,
                             SparseGradAccumulator& relationGrad) {
  const size_t dim = config_.dim;
  const size_t n = config_.negatives + 1;  // candidate 0 is the true entity
  const auto scale = static_cast<float>(1.0 / static_cast<double>(batch.size()));
  candidates_.resize(n);
  scores_.resize(n);
  query_.resize(dim);
  dquery_.resize(dim);
  using ConstVec = Eigen::Map<const Vector>;
  using Vec = Eigen::Map<Vector>;
  Vec q(query_.data(), static_cast<Eigen::Index>(dim));
  Vec dq(dquery_.data(), static_cast<Eigen::Index>(dim));
  const auto d = static_cast<Eigen::Index>(dim);
  double loss = 0.0;
  const uint32_t* drawn = drawn_.data();
  for (const Triple& t : batch) {
    for (int direction = 0; direction < 2; ++direction) {
      const Query query = queryOf(t, direction == 0);
      buildQuery(query, query_.data());
      candidates_[0] = query.answer;
      for (size_t j = 1; j < n; ++j)
        candidates_[j] = *drawn++;
      // Gather and score: one dot product per candidate row, read in place (no copy).
      for (size_t j = 0; j < n; ++j)
        scores_[j] = ConstVec(entities_.row(candidates_[j]), d).dot(q);
      loss += kgeCandidateLoss(config_.loss, config_.adversarialTemperature, scores_, 0);
      // Scatter-add: d(row_j) = dscore_j * q, and dq = sum_j dscore_j * row_j.
      dq.setZero();
      for (size_t j = 0; j < n; ++j) {
        const float g = scores_[j] * scale;
        if (g == 0.0f) continue;
        dq += g * ConstVec(entities_.row(candidates_[j]), d);
        Vec(entityGrad.row(candidates_[j]), d) += g * q;
      }
      queryBackward(query, dquery_.data(), entityGrad, relationGrad);
    }
  }
  return loss / static_cast<double>(batch.size());
}

double KgeModel::sharedStep(std::span<const Triple> batch, SparseGradAccumulator& entityGrad,
                            SparseGradAccumulator& relationGrad) {
  // One set of negatives for the whole step: their rows are gathered once into a dim x N
  // matrix, and each chunk of queries is scored against it with one matrix product (candidate 0
  // of each query, its true entity, with a dot product), as 1-N does against all entities.
  constexpr size_t kChunk = 256;
  const auto dim = static_cast<Eigen::Index>(config_.dim);
  const auto n = static_cast<Eigen::Index>(config_.negatives);
  const auto scale = static_cast<float>(1.0 / static_cast<double>(batch.size()));
  using ConstVec = Eigen::Map<const Vector>;
  using Vec = Eigen::Map<Vector>;
  candidates_ = drawn_;
  negativeRows_.resize(dim, n);
  for (Eigen::Index k = 0; k < n; ++k)
    negativeRows_.col(k) = ConstVec(entities_.row(candidates_[static_cast<size_t>(k)]), dim);
  negativeGrad_.setZero(dim, n);
  double loss = 0.0;
  for (int direction = 0; direction < 2; ++direction) {
    const bool tail = direction == 0;
    for (size_t begin = 0; begin < batch.size(); begin += kChunk) {
      const std::span<const Triple> chunk =
          batch.subspan(begin, std::min(kChunk, batch.size() - begin));
      const auto cols = static_cast<Eigen::Index>(chunk.size());
      queries_.resize(dim, cols);
      for (Eigen::Index j = 0; j < cols; ++j)
        buildQuery(queryOf(chunk[static_cast<size_t>(j)], tail), queries_.col(j).data());
      scoreMatrix_.resize(n + 1, cols);
      scoreMatrix_.bottomRows(n).noalias() = negativeRows_.transpose() * queries_;
      for (Eigen::Index j = 0; j < cols; ++j) {
        const uint32_t answer = queryOf(chunk[static_cast<size_t>(j)], tail).answer;
        scoreMatrix_(0, j) = queries_.col(j).dot(ConstVec(entities_.row(answer), dim));
        loss += kgeCandidateLoss(
            config_.loss, config_.adversarialTemperature,
            std::span<float>(scoreMatrix_.col(j).data(), static_cast<size_t>(n + 1)), 0);
      }
      scoreMatrix_ *= scale;
      dqueries_.resize(dim, cols);
      dqueries_.noalias() = negativeRows_ * scoreMatrix_.bottomRows(n);
      negativeGrad_.noalias() += queries_ * scoreMatrix_.bottomRows(n).transpose();
      for (Eigen::Index j = 0; j < cols; ++j) {
        const Query query = queryOf(chunk[static_cast<size_t>(j)], tail);
        const float g = scoreMatrix_(0, j);
        dqueries_.col(j) += g * ConstVec(entities_.row(query.answer), dim);
        Vec(entityGrad.row(query.answer), dim) += g * queries_.col(j);
        queryBackward(query, dqueries_.col(j).data(), entityGrad, relationGrad);
      }
    }
  }
  // A negative drawn twice gets both columns' gradients.
  for (Eigen::Index k = 0; k < n; ++k)
    Vec(entityGrad.row(candidates_[static_cast<size_t>(k)]), dim) += negativeGrad_.col(k);
  return loss / static_cast<double>(batch.size());
}

void KgeModel::scoreAllEntities(std::span<const Triple> queries, bool tailDirection,
                                Matrix& out) const {
  const auto dim = static_cast<Eigen::Index>(config_.dim);
  const auto entityCount = static_cast<Eigen::Index>(entities_.rows());
  Matrix q(dim, static_cast<Eigen::Index>(queries.size()));
  for (size_t j = 0; j < queries.size(); ++j)
    buildQuery(queryOf(queries[j], tailDirection), q.col(static_cast<Eigen::Index>(j)).data());
  // The entity table, row-major entities x dim, is the column-major dim x entities matrix.
  Eigen::Map<const Matrix> table(entities_.values().data(), dim, entityCount);
  out.resize(entityCount, q.cols());
  out.noalias() = table.transpose() * q;
}

double KgeModel::allEntitiesStep(std::span<const Triple> batch, SparseGradAccumulator& entityGrad,
                                 SparseGradAccumulator& relationGrad) {
  // 1-N scoring: every entity is a candidate of every query, so a chunk of queries is scored
  // with one matrix product, and the entity gradient (every row) with another.
  constexpr size_t kChunk = 128;  // keeps the entities x chunk score matrix near 20 MB on WN18RR
  const auto dim = static_cast<Eigen::Index>(config_.dim);
  const auto entityCount = static_cast<Eigen::Index>(entities_.rows());
  const auto scale = static_cast<float>(1.0 / static_cast<double>(batch.size()));
  Eigen::Map<const Matrix> table(entities_.values().data(), dim, entityCount);
  Eigen::Map<Matrix> tableGrad(entityGrad.beginDense(), dim, entityCount);
  bool first = true;
  double loss = 0.0;
  for (int direction = 0; direction < 2; ++direction) {
    const bool tail = direction == 0;
    for (size_t begin = 0; begin < batch.size(); begin += kChunk) {
      const std::span<const Triple> chunk =
          batch.subspan(begin, std::min(kChunk, batch.size() - begin));
      const auto cols = static_cast<Eigen::Index>(chunk.size());
      queries_.resize(dim, cols);
      for (Eigen::Index j = 0; j < cols; ++j)
        buildQuery(queryOf(chunk[static_cast<size_t>(j)], tail), queries_.col(j).data());
      scoreMatrix_.resize(entityCount, cols);
      scoreMatrix_.noalias() = table.transpose() * queries_;
      for (Eigen::Index j = 0; j < cols; ++j) {
        loss += kgeCandidateLoss(
            config_.loss, config_.adversarialTemperature,
            std::span<float>(scoreMatrix_.col(j).data(), static_cast<size_t>(entityCount)),
            queryOf(chunk[static_cast<size_t>(j)], tail).answer);
      }
      scoreMatrix_ *= scale;
      dqueries_.resize(dim, cols);
      dqueries_.noalias() = table * scoreMatrix_;
      if (first) {
        tableGrad.noalias() = queries_ * scoreMatrix_.transpose();
        first = false;
      } else {
        tableGrad.noalias() += queries_ * scoreMatrix_.transpose();
      }
      for (Eigen::Index j = 0; j < cols; ++j) {
        queryBackward(queryOf(chunk[static_cast<size_t>(j)], tail), dqueries_.col(j).data(),
                      entityGrad, relationGrad);
      }
    }
  }
  return loss / static_cast<double>(batch.size());
}

}  // namespace chorus::ml
