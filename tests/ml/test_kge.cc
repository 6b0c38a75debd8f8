// KGE models, losses and regularizers: finite-difference gradient checks of the whole training
// step (sampled negatives and 1-N scoring), the bilinear identities the scoring relies on, and
// the loss formulas on hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gradient_check.h"
#include "ml/kge.h"

namespace chorus::ml {
namespace {

// A tiny graph: 7 entities, 3 relations.
std::vector<Triple> tinyBatch() {
  return {{0, 0, 1}, {2, 1, 3}, {4, 2, 5}, {1, 0, 6}, {3, 1, 3}};
}

struct StepCase {
  KgeModelKind model;
  KgeLossKind loss;
  double temperature;
  KgeRegularizerKind reg;
  bool all;
  bool reciprocal = false;
  bool shared = false;
};

std::string caseName(const StepCase& c) {
  return std::string(kgeModelName(c.model)) + "/" + kgeLossName(c.loss) +
         (c.temperature > 0 ? "/adversarial" : "") + "/" + kgeRegularizerName(c.reg) +
         (c.all      ? "/all"
          : c.shared ? "/shared"
                     : "/sampled") +
         (c.reciprocal ? "/reciprocal" : "");
}

// The step's loss for fixed negatives (the rng is re-seeded each time).
double stepLoss(KgeModel& model, std::span<const Triple> batch, uint64_t negativeSeed) {
  SparseGradAccumulator e(model.entities().rows(), model.config().dim);
  SparseGradAccumulator r(model.relations().rows(), model.config().dim);
  Rng rng(negativeSeed);
  return model.computeGradients(batch, rng, e, r);
}

// The step's gradient of both tables, scattered into dense arrays shaped like the tables.
std::pair<std::vector<float>, std::vector<float>> stepGradient(KgeModel& model,
                                                               std::span<const Triple> batch,
                                                               uint64_t negativeSeed) {
  const size_t dim = model.config().dim;
  SparseGradAccumulator e(model.entities().rows(), dim);
  SparseGradAccumulator r(model.relations().rows(), dim);
  Rng rng(negativeSeed);
  model.computeGradients(batch, rng, e, r);
  SparseGrad ge, gr;
  e.finish(ge);
  r.finish(gr);
  std::vector<float> de(model.entities().values().size(), 0.0f);
  std::vector<float> dr(model.relations().values().size(), 0.0f);
  for (size_t i = 0; i < ge.size(); ++i)
    std::copy_n(ge.row(i), dim, de.begin() + static_cast<std::ptrdiff_t>(ge.keys[i] * dim));
  for (size_t i = 0; i < gr.size(); ++i)
    std::copy_n(gr.row(i), dim, dr.begin() + static_cast<std::ptrdiff_t>(gr.keys[i] * dim));
  return {de, dr};
}

class KgeGradientTest : public ::testing::TestWithParam<StepCase> {};

TEST_P(KgeGradientTest, StepGradientMatchesFiniteDifferences) {
  const StepCase c = GetParam();
  KgeConfig config;
  config.model = c.model;
  config.dim = 6;
  config.negatives = 4;
  config.allNegatives = c.all;
  config.reciprocal = c.reciprocal;
  config.sharedNegatives = c.shared;
  config.loss = c.loss;
  config.adversarialTemperature = c.temperature;
  config.regularizer = c.reg;
  config.regWeight = c.reg == KgeRegularizerKind::kNone ? 0.0 : 0.3;
  // Large enough values that every term matters; small enough that no softplus saturates.
  config.initScale = 0.7;
  KgeModel model(config, 7, 3, 11);
  const auto batch = tinyBatch();
  constexpr uint64_t kNegatives = 5;
  const auto [de, dr] = stepGradient(model, batch, kNegatives);
  // The gradient must not be trivially zero (a test that cannot fail is no test).
  double norm = 0.0;
  for (float g : de)
    norm += std::abs(g);
  ASSERT_GT(norm, 1e-3);
  if (c.reciprocal) {
    // The inverse rows (3..5) are trained: head prediction goes through them.
    ASSERT_EQ(model.relations().rows(), 6u);
    double inverseNorm = 0.0;
    for (size_t i = 3 * config.dim; i < dr.size(); ++i)
      inverseNorm += std::abs(dr[i]);
    ASSERT_GT(inverseNorm, 1e-3);
  }
  auto loss = [&] { return stepLoss(model, batch, kNegatives); };
  testing::expectGradientsMatch(model.entities().values(), de, loss, caseName(c) + " entity", 1e-3);
  testing::expectGradientsMatch(model.relations().values(), dr, loss, caseName(c) + " relation",
                                1e-3);
}

// The self-adversarial weights are constants of the gradient (RotatE detaches them), so the step
// gradient is not the derivative of the loss; it is the derivative of the loss with the weights
// frozen at the current scores. Checked here on the candidate loss (the step's backward pass
// from the scores on is the one the other losses check).
TEST(KgeLosses, SelfAdversarialGradientFreezesTheWeights) {
  const std::vector<float> base = {0.8f, -0.3f, 1.7f, 0.2f, -1.1f};
  const double temperature = 1.5;
  std::vector<float> grad = base;
  kgeCandidateLoss(KgeLossKind::kLogistic, temperature, grad, 0);
  std::vector<double> w(base.size(), 0.0);
  double z = 0.0;
  for (size_t j = 1; j < base.size(); ++j)
    z += std::exp(temperature * base[j]);
  for (size_t j = 1; j < base.size(); ++j)
    w[j] = std::exp(temperature * base[j]) / z;
  auto softplus = [](double x) { return std::log1p(std::exp(x)); };
  std::vector<float> s = base;
  auto frozen = [&] {
    double loss = softplus(-double{s[0]});
    for (size_t j = 1; j < s.size(); ++j)
      loss += w[j] * softplus(s[j]);
    return 0.5 * loss;
  };
  testing::expectGradientsMatch(s, grad, frozen, "self-adversarial", 1e-3);
  // And the weights matter: uniform weights give another gradient.
  std::vector<float> uniform = base;
  kgeCandidateLoss(KgeLossKind::kLogistic, 0.0, uniform, 0);
  EXPECT_GT(std::abs(uniform[2] - grad[2]), 0.05);
}

std::vector<StepCase> allCases() {
  std::vector<StepCase> cases;
  for (auto model : {KgeModelKind::kDistMult, KgeModelKind::kComplEx}) {
    for (bool all : {false, true}) {
      for (auto reg :
           {KgeRegularizerKind::kNone, KgeRegularizerKind::kL2, KgeRegularizerKind::kN3}) {
        cases.push_back({model, KgeLossKind::kLogistic, 0.0, reg, all});
        cases.push_back({model, KgeLossKind::kCrossEntropy, 0.0, reg, all});
        cases.push_back({model, KgeLossKind::kCrossEntropy, 0.0, reg, all, true});
      }
    }
    // Negatives shared by the whole batch (4 of them for 5 triples: some repeat, some are the
    // true entity of another query).
    for (auto reg : {KgeRegularizerKind::kNone, KgeRegularizerKind::kN3}) {
      cases.push_back({model, KgeLossKind::kLogistic, 0.0, reg, false, false, true});
      cases.push_back({model, KgeLossKind::kCrossEntropy, 0.0, reg, false, false, true});
      cases.push_back({model, KgeLossKind::kCrossEntropy, 0.0, reg, false, true, true});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllModelsLossesRegularizers, KgeGradientTest,
                         ::testing::ValuesIn(allCases()),
                         [](const ::testing::TestParamInfo<StepCase>& info) {
                           std::string name = caseName(info.param);
                           for (char& ch : name)
                             if (ch == '/') ch = '_';
                           return name;
                         });

// <q(h, r), t> and <h, g(r, t)> are both score(h, r, t): the identity the 1-N scoring and the
// head/tail evaluation are built on.
TEST(KgeModels, QueriesReproduceTheScoreInBothDirections) {
  Rng rng(3);
  for (auto model : {KgeModelKind::kDistMult, KgeModelKind::kComplEx}) {
    const size_t dim = 8;
    std::vector<float> h(dim), r(dim), t(dim), q(dim), g(dim);
    for (auto* v : {&h, &r, &t})
      for (float& x : *v)
        x = static_cast<float>(rng.normal());
    kgeTailQuery(model, dim, h.data(), r.data(), q.data());
    kgeHeadQuery(model, dim, r.data(), t.data(), g.data());
    double viaTail = 0.0, viaHead = 0.0;
    for (size_t i = 0; i < dim; ++i) {
      viaTail += double{q[i]} * t[i];
      viaHead += double{h[i]} * g[i];
    }
    const double score = kgeScore(model, dim, h.data(), r.data(), t.data());
    EXPECT_NEAR(viaTail, score, 1e-5) << kgeModelName(model);
    EXPECT_NEAR(viaHead, score, 1e-5) << kgeModelName(model);
  }
}

// ComplEx is Re(<h, r, conj(t)>): with one complex coordinate, h = 1+2i, r = 3-i, t = 2+i:
// h*r = 5+5i, times conj(t) = 2-i gives 15+5i, real part 15. DistMult is not symmetric-free:
// score(h, r, t) == score(t, r, h), ComplEx is not.
TEST(KgeModels, ComplExIsTheRealPartOfTheTrilinearProduct) {
  const float h[2] = {1, 2}, r[2] = {3, -1}, t[2] = {2, 1};
  EXPECT_NEAR(kgeScore(KgeModelKind::kComplEx, 2, h, r, t), 15.0, 1e-6);
  EXPECT_NEAR(kgeScore(KgeModelKind::kDistMult, 2, h, r, t),
              kgeScore(KgeModelKind::kDistMult, 2, t, r, h), 1e-6);
  EXPECT_GT(std::abs(kgeScore(KgeModelKind::kComplEx, 2, h, r, t) -
                     kgeScore(KgeModelKind::kComplEx, 2, t, r, h)),
            1.0);
}

TEST(KgeLosses, LogisticAndCrossEntropyOnHandComputedScores) {
  // Logistic, uniform weights: (softplus(-1) + (softplus(0) + softplus(2)) / 2) / 2.
  std::vector<float> s = {1.0f, 0.0f, 2.0f};
  const double sp = std::log1p(std::exp(-1.0)), s0 = std::log(2.0), s2 = std::log1p(std::exp(2.0));
  EXPECT_NEAR(kgeCandidateLoss(KgeLossKind::kLogistic, 0.0, s, 0), 0.5 * (sp + 0.5 * (s0 + s2)),
              1e-6);
  EXPECT_NEAR(s[0], 0.5 * (1.0 / (1.0 + std::exp(-1.0)) - 1.0), 1e-6);
  EXPECT_NEAR(s[1], 0.5 * 0.5 * 0.5, 1e-6);
  // Cross-entropy: -1 + log(e^1 + e^0 + e^2).
  s = {1.0f, 0.0f, 2.0f};
  const double z = std::exp(1.0) + 1.0 + std::exp(2.0);
  EXPECT_NEAR(kgeCandidateLoss(KgeLossKind::kCrossEntropy, 0.0, s, 0), -1.0 + std::log(z), 1e-6);
  EXPECT_NEAR(s[0], std::exp(1.0) / z - 1.0, 1e-6);
  EXPECT_NEAR(s[2], std::exp(2.0) / z, 1e-6);
  // Self-adversarial weights favour the higher-scoring negative: temperature 1 gives weights
  // softmax(0, 2) = (0.119, 0.881).
  s = {1.0f, 0.0f, 2.0f};
  const double w2 = std::exp(2.0) / (1.0 + std::exp(2.0));
  EXPECT_NEAR(kgeCandidateLoss(KgeLossKind::kLogistic, 1.0, s, 0),
              0.5 * (sp + (1.0 - w2) * s0 + w2 * s2), 1e-6);
}

TEST(KgeRegularizers, ValuesOnHandComputedRows) {
  const float row[4] = {3, -1, 4, 2};  // ComplEx: z = 3+4i (|z| = 5), -1+2i (|z| = sqrt 5)
  EXPECT_NEAR(kgeRegularize(KgeModelKind::kDistMult, KgeRegularizerKind::kL2, 2.0, 4, row, nullptr),
              2.0 * 30.0, 1e-5);
  EXPECT_NEAR(kgeRegularize(KgeModelKind::kDistMult, KgeRegularizerKind::kN3, 1.0, 4, row, nullptr),
              27.0 + 1.0 + 64.0 + 8.0, 1e-4);
  EXPECT_NEAR(kgeRegularize(KgeModelKind::kComplEx, KgeRegularizerKind::kN3, 1.0, 4, row, nullptr),
              125.0 + 5.0 * std::sqrt(5.0), 1e-4);
}

TEST(KgeConfigCheck, BadValuesNameTheirFlag) {
  auto message = [](KgeConfig c) {
    try {
      c.validate();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  KgeConfig c;
  c.dim = 401;
  EXPECT_NE(message(c).find("--dim"), std::string::npos);
  c = KgeConfig{};
  c.negatives = 0;
  EXPECT_NE(message(c).find("--negatives"), std::string::npos);
  c = KgeConfig{};
  c.loss = KgeLossKind::kCrossEntropy;
  c.adversarialTemperature = 1.0;
  EXPECT_NE(message(c).find("--adversarial-temperature"), std::string::npos);
  EXPECT_THROW(parseKgeModel("transe"), std::invalid_argument);
  EXPECT_THROW(parseKgeLoss("hinge"), std::invalid_argument);
  EXPECT_THROW(parseKgeRegularizer("l1"), std::invalid_argument);
}

}  // namespace
}  // namespace chorus::ml
