// A sparse workload's step in two halves (drawStep, stepRows, computeDrawnGradients), as sparse
// PS mode runs it: the same gradient as computeGradients() with the same random stream, bit for
// bit, and the rows it names cover every row the gradient writes. MF's workload against ml/mf's
// gradient on the same model.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ml/kge_workload.h"
#include "ml/mf_workload.h"
#include "ml/ratings.h"
#include "sampling/negative_sampler.h"

namespace chorus::ml {
namespace {

KgData smallGraph() {
  KgData graph;
  for (int e = 0; e < 50; ++e)
    graph.entityNames.push_back("e" + std::to_string(e));
  for (int r = 0; r < 3; ++r)
    graph.relationNames.push_back("r" + std::to_string(r));
  Rng rng(9);
  for (int i = 0; i < 40; ++i) {
    graph.train.push_back({static_cast<uint32_t>(rng.below(50)),
                           static_cast<uint32_t>(rng.below(3)),
                           static_cast<uint32_t>(rng.below(50))});
  }
  graph.test = {graph.train[0]};
  return graph;
}

struct Gradients {
  double loss = 0;
  std::vector<SparseGrad> grads;
};

Gradients finish(double loss, std::vector<SparseGradAccumulator>& accumulators) {
  Gradients out{loss, std::vector<SparseGrad>(accumulators.size())};
  for (size_t t = 0; t < accumulators.size(); ++t)
    accumulators[t].finish(out.grads[t]);
  return out;
}

std::vector<SparseGradAccumulator> accumulatorsFor(SparseWorkload& workload) {
  std::vector<SparseGradAccumulator> accumulators;
  for (SparseTable* table : workload.tables())
    accumulators.emplace_back(table->rows(), table->dim());
  return accumulators;
}

class DrawnStep : public ::testing::TestWithParam<int> {};

TEST_P(DrawnStep, EqualsTheWholeStepAndNamesEveryRowItWrites) {
  const KgData graph = smallGraph();
  KgeConfig config;
  config.dim = 8;
  config.negatives = 5;
  config.regularizer = KgeRegularizerKind::kN3;
  config.regWeight = 0.01;
  config.allNegatives = GetParam() == 1;
  config.sharedNegatives = GetParam() == 2;
  config.reciprocal = GetParam() == 3;
  KgeWorkload whole(graph, config, 4), halves(graph, config, 4);
  std::vector<size_t> points = {3, 1, 4, 1, 5, 9, 2, 6};
  auto wholeAcc = accumulatorsFor(whole);
  auto halvesAcc = accumulatorsFor(halves);
  Rng a(17), b(17);
  const Gradients expected = finish(whole.computeGradients(points, a, wholeAcc), wholeAcc);
  halves.drawStep(points, b);
  std::vector<std::vector<RowKey>> rows(2);
  halves.stepRows(rows);
  const Gradients got = finish(halves.computeDrawnGradients(halvesAcc), halvesAcc);
  EXPECT_EQ(a.bits(), b.bits()) << "the halves draw exactly what the whole step draws";
  EXPECT_EQ(got.loss, expected.loss);
  for (size_t t = 0; t < 2; ++t) {
    EXPECT_EQ(got.grads[t].keys, expected.grads[t].keys);
    EXPECT_TRUE(std::equal(got.grads[t].rows.begin(), got.grads[t].rows.end(),
                           expected.grads[t].rows.begin(), expected.grads[t].rows.end()));
    const std::set<RowKey> named(rows[t].begin(), rows[t].end());
    for (RowKey key : got.grads[t].keys)
      EXPECT_EQ(named.count(key), 1u) << "table " << t << " row " << key;
    if (!config.allNegatives) {
      EXPECT_LT(named.size(), whole.tables()[t]->rows() + (t == 1 ? 1 : 0));
    }
  }
  if (config.allNegatives) {
    EXPECT_EQ(std::set<RowKey>(rows[0].begin(), rows[0].end()).size(), 50u);
  }
}

std::string negativesName(const ::testing::TestParamInfo<int>& info) {
  static const std::vector<std::string> names = {"sampled", "all", "shared", "reciprocal"};
  return names[static_cast<size_t>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Negatives, DrawnStep, ::testing::Values(0, 1, 2, 3), negativesName);

// Sparse PS mode's sampling primitives hand the workload its negatives (drawStepWith): given the
// keys the model would have drawn, the step is the drawn one, bit for bit, and the rows it
// names without them (stepRowsUnsampled) are the positives' only.
TEST(GivenNegatives, MakeTheSameStepAsDrawnOnesAndAreCounted) {
  const KgData graph = smallGraph();
  KgeConfig config;
  config.dim = 8;
  config.negatives = 5;
  KgeWorkload whole(graph, config, 4), given(graph, config, 4);
  const std::vector<size_t> points = {3, 1, 4, 1, 5};
  ASSERT_EQ(given.sampledTable(), std::optional<size_t>(0));
  ASSERT_EQ(given.sampledRowsPerStep(points.size()), points.size() * 2 * 5);
  // The model's own draws: uniform over the entities from the rng's engine, in order.
  Rng a(17), b(17);
  const auto pi = sampling::NegativeSampler::uniform(0, 50);
  std::vector<RowKey> negatives(given.sampledRowsPerStep(points.size()));
  for (RowKey& key : negatives)
    key = pi(b.engine());
  auto wholeAcc = accumulatorsFor(whole);
  auto givenAcc = accumulatorsFor(given);
  const Gradients expected = finish(whole.computeGradients(points, a, wholeAcc), wholeAcc);
  given.drawStepWith(points, negatives);
  std::vector<std::vector<RowKey>> rows(2);
  given.stepRowsUnsampled(rows);
  const Gradients got = finish(given.computeDrawnGradients(givenAcc), givenAcc);
  EXPECT_EQ(got.loss, expected.loss);
  for (size_t t = 0; t < 2; ++t)
    EXPECT_EQ(got.grads[t].keys, expected.grads[t].keys);
  std::set<RowKey> positives;
  for (size_t p : points) {
    positives.insert(graph.train[p].head);
    positives.insert(graph.train[p].tail);
  }
  EXPECT_EQ(std::set<RowKey>(rows[0].begin(), rows[0].end()), positives);
  // The wrong count, or an entity that is not one, is refused; --negatives all samples nothing.
  EXPECT_THROW(given.drawStepWith(points, std::span<const RowKey>(negatives).first(3)),
               std::invalid_argument);
  negatives[0] = 50;
  EXPECT_THROW(given.drawStepWith(points, negatives), std::invalid_argument);
  config.allNegatives = true;
  KgeWorkload all(graph, config, 4);
  EXPECT_FALSE(all.sampledTable().has_value());
}

TEST(MfWorkload, StepsOnMlMfsGradientAndModel) {
  ZipfRatingsOptions zipf;
  zipf.rows = 30;
  zipf.cols = 20;
  zipf.cells = 400;
  zipf.rank = 2;
  const RatingsData data = makeZipfRatings(zipf);
  MfOptions options;
  options.rank = 4;
  options.reg = 0.05;
  options.seed = 8;
  MfWorkload workload(data, options);
  std::vector<size_t> points = {0, 5, 7, 5, 11};
  Rng rng(1);
  workload.drawStep(points, rng);
  std::vector<std::vector<RowKey>> rows(2);
  workload.stepRows(rows);
  auto accumulators = accumulatorsFor(workload);
  const Gradients got = finish(workload.computeDrawnGradients(accumulators), accumulators);

  MfModel model = makeMfModel(data.rows, data.cols, 4, options.initStd, false, options.seed);
  double sum = 0;
  for (const Rating& r : data.train)
    sum += r.value;
  model.mean = static_cast<float>(sum / static_cast<double>(data.train.size()));
  std::vector<Rating> batch;
  for (size_t p : points)
    batch.push_back(data.train[p]);
  SparseRowsBuilder rowB(data.rows, 4), colB(data.cols, 4);
  const MfBatchLoss loss = mfGradient(model, batch, options.reg, rowB, colB);
  SparseRows rowG, colG;
  rowB.finish(rowG);
  colB.finish(colG);
  EXPECT_DOUBLE_EQ(got.loss, loss.loss / 5.0);
  EXPECT_EQ(got.grads[0].keys, rowG.keys);
  EXPECT_EQ(got.grads[1].keys, colG.keys);
  EXPECT_TRUE(std::equal(got.grads[0].rows.begin(), got.grads[0].rows.end(), rowG.values.begin(),
                         rowG.values.end()));
  EXPECT_EQ(std::set<RowKey>(rows[0].begin(), rows[0].end()),
            std::set<RowKey>(rowG.keys.begin(), rowG.keys.end()));
  EXPECT_EQ(workload.evalSplits(), std::vector<std::string>{"test"});
  EXPECT_FALSE(workload.higherIsBetter());
  EXPECT_GT(workload.evaluate("test").front().value, 0.0);
}

}  // namespace
}  // namespace chorus::ml
