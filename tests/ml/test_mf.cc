// The Zipf rating generator (determinism, measured skew, value scale, size checks) and matrix
// factorization (sparse gradients against finite differences, optimizers, training to near the
// noise floor on small generated data).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <vector>

#include "ml/mf.h"
#include "ml/mf_workload.h"
#include "ml/ratings.h"
#include "ml/sparse_stats.h"
#include "ml/sparse_train.h"

namespace chorus::ml {
namespace {

ZipfRatingsOptions small(uint64_t seed = 1) {
  ZipfRatingsOptions o;
  o.rows = 2000;
  o.cols = 1000;
  o.cells = 300000;
  o.rank = 4;
  o.seed = seed;
  return o;
}

bool sameRatings(const std::vector<Rating>& a, const std::vector<Rating>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](auto& x, auto& y) {
           return x.row == y.row && x.col == y.col && x.value == y.value;
         });
}

TEST(ZipfRatings, SameSeedSameDataOtherSeedOtherData) {
  const RatingsData a = makeZipfRatings(small(1)), b = makeZipfRatings(small(1));
  const RatingsData c = makeZipfRatings(small(2));
  EXPECT_TRUE(sameRatings(a.train, b.train));
  EXPECT_TRUE(sameRatings(a.test, b.test));
  EXPECT_FALSE(sameRatings(a.train, c.train));
  EXPECT_EQ(a.train.size() + a.test.size(), 300000u);
  EXPECT_NEAR(static_cast<double>(a.test.size()) / 300000.0, 0.1, 0.005);
  EXPECT_EQ(a.rows, 2000u);
  EXPECT_DOUBLE_EQ(a.noiseSigma, 0.3);
  for (const Rating& r : a.train) {
    ASSERT_LT(r.row, 2000u);
    ASSERT_LT(r.col, 1000u);
  }
}

// The exponent of a log-log least-squares fit of count against rank over the `top` most
// frequent ids (ranks from 1).
double fittedExponent(std::vector<double> counts, size_t top) {
  std::sort(counts.begin(), counts.end(), std::greater<>());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < top; ++i) {
    const double x = std::log(static_cast<double>(i + 1)), y = std::log(counts[i]);
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double n = static_cast<double>(top);
  return -(n * sxy - sx * sy) / (n * sxx - sx * sx);
}

// Rows and columns follow their Zipf exponents: a log-log fit over the 100 most frequent ids
// (counts of several hundred each, so sampling noise is small) is within 0.08 of the exponent.
TEST(ZipfRatings, MeasuredSkewFitsTheExponents) {
  for (auto [rowExp, colExp] : {std::pair{1.1, 1.1}, std::pair{0.8, 1.4}}) {
    ZipfRatingsOptions o = small(3);
    o.rowExponent = rowExp;
    o.colExponent = colExp;
    RatingsData data = makeZipfRatings(o);
    const MfAccessStats stats = mfAccessStats(data);
    EXPECT_NEAR(fittedExponent(stats.rows, 100), rowExp, 0.08);
    EXPECT_NEAR(fittedExponent(stats.cols, 100), colExp, 0.08);
    // The permutation spreads the hot ids: the most frequent row is not simply id 0.
    const auto hottest = std::max_element(stats.rows.begin(), stats.rows.end());
    EXPECT_NE(hottest - stats.rows.begin(), 0);
  }
}

// The planted signal has variance 1, so values have variance about 1 + sigma^2 and mean ~0.
TEST(ZipfRatings, ValueScaleIsAsDocumented) {
  ZipfRatingsOptions o = small(4);
  o.noiseSigma = 0.5;
  o.rowExponent = o.colExponent = 0.01;  // nearly uniform: many distinct factor rows
  const RatingsData data = makeZipfRatings(o);
  double sum = 0, squares = 0;
  for (const Rating& r : data.train) {
    sum += r.value;
    squares += static_cast<double>(r.value) * r.value;
  }
  const double n = static_cast<double>(data.train.size());
  EXPECT_NEAR(sum / n, 0.0, 0.05);
  EXPECT_NEAR(squares / n - (sum / n) * (sum / n), 1.25, 0.12);
}

TEST(ZipfRatings, RefusesSizesThatDoNotFitAndBadOptions) {
  ZipfRatingsOptions o = small();
  o.cells = 1'000'000'000'000ull;
  o.memoryLimitBytes = uint64_t{1} << 30;
  try {
    makeZipfRatings(o);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("lower --mf-cells"), std::string::npos) << e.what();
  }
  o = small();
  o.rows = 1'000'000'000;
  o.rank = 1000;
  o.memoryLimitBytes = uint64_t{1} << 30;
  EXPECT_THROW(makeZipfRatings(o), std::invalid_argument);
  o = small();
  o.rows = 0;
  EXPECT_THROW(makeZipfRatings(o), std::invalid_argument);
  o = small();
  o.rowExponent = -1;
  EXPECT_THROW(makeZipfRatings(o), std::invalid_argument);
  o = small();
  o.testShare = 1.0;
  EXPECT_THROW(makeZipfRatings(o), std::invalid_argument);
  EXPECT_GT(zipfRatingsBytes(small()), 300000u * sizeof(Rating));
}

TEST(SparseRowsBuilder, SortsKeysAndSumsDuplicates) {
  SparseRowsBuilder builder(100, 2);
  for (uint64_t key : {42u, 7u, 42u, 99u}) {
    float* row = builder.rowFor(key);
    row[0] += 1.0f;
    row[1] += static_cast<float>(key);
  }
  SparseRows out;
  builder.finish(out);
  EXPECT_EQ(out.keys, (std::vector<uint64_t>{7, 42, 99}));
  EXPECT_EQ(out.values, (std::vector<float>{1, 7, 2, 84, 1, 99}));
  // Starts empty again, and a reused key starts from zero.
  builder.rowFor(7)[0] += 5.0f;
  builder.finish(out);
  EXPECT_EQ(out.keys, (std::vector<uint64_t>{7}));
  EXPECT_EQ(out.values, (std::vector<float>{5, 0}));
}

// The sparse gradient of a batch (with a repeated row, column and cell) against central
// differences of the batch loss, and no gradient row for untouched keys.
TEST(MfGradient, MatchesFiniteDifferences) {
  MfModel model = makeMfModel(6, 5, 3, 0.7, false, 11);
  model.mean = 0.25f;
  const std::vector<Rating> batch = {{1, 2, 0.5f}, {4, 2, -1.0f}, {1, 0, 2.0f}, {1, 2, 0.1f}};
  const double reg = 0.05;
  SparseRowsBuilder rb(6, 3), cb(5, 3);
  mfGradient(model, batch, reg, rb, cb);
  SparseRows rowGrad, colGrad;
  rb.finish(rowGrad);
  cb.finish(colGrad);
  EXPECT_EQ(rowGrad.keys, (std::vector<uint64_t>{1, 4}));
  EXPECT_EQ(colGrad.keys, (std::vector<uint64_t>{0, 2}));
  auto loss = [&] {
    SparseRowsBuilder r(6, 3), c(5, 3);
    return mfGradient(model, batch, reg, r, c).loss;
  };
  auto check = [&](FactorTable& table, const SparseRows& grad) {
    for (size_t i = 0; i < grad.keys.size(); ++i) {
      for (size_t k = 0; k < 3; ++k) {
        float& w = table.row(grad.keys[i])[k];
        const float saved = w;
        const float h = 1e-2f;
        w = saved + h;
        const double up = loss();
        w = saved - h;
        const double down = loss();
        w = saved;
        const double numeric = (up - down) / (2.0 * h);
        EXPECT_NEAR(grad.row(i)[k], numeric, 2e-3 * std::max(1.0, std::abs(numeric)))
            << "key " << grad.keys[i] << " k " << k;
      }
    }
  };
  check(model.rowFactors, rowGrad);
  check(model.colFactors, colGrad);
}

TEST(MfOptimizers, SgdAndAdagradTouchOnlyTheGradientsRows) {
  std::vector<float> table = {1, 1, 1, 1, 1, 1};  // 3 rows of 2
  std::vector<float> state(6, 0.0f);
  SparseRows grad;
  grad.width = 2;
  grad.keys = {2};
  grad.values = {2.0f, -4.0f};
  sgdApply(table, grad, 0.5f);
  EXPECT_EQ(table, (std::vector<float>{1, 1, 1, 1, 0, 3}));
  adagradApply(table, state, grad, 0.1f);
  // s = g^2, so the step is lr * sign(g) the first time.
  EXPECT_FLOAT_EQ(table[4], -0.1f);
  EXPECT_FLOAT_EQ(table[5], 3.1f);
  EXPECT_FLOAT_EQ(state[4], 4.0f);
  EXPECT_FLOAT_EQ(state[0], 0.0f);
  adagradApply(table, state, grad, 0.1f);
  EXPECT_FLOAT_EQ(table[4], -0.1f - 0.1f * 2.0f / std::sqrt(8.0f));
}

// A few epochs on small generated data (300 x 200, 60k cells, planted rank 4, Zipf 1.1) reach
// a test RMSE within 5% of the noise floor (the target), with both optimizers, and the
// run is deterministic.
TEST(TrainMf, ReachesTheNoiseFloorOnSmallGeneratedData) {
  ZipfRatingsOptions z;
  z.rows = 300;
  z.cols = 200;
  z.cells = 60000;
  z.rank = 4;
  z.noiseSigma = 0.3;
  z.seed = 7;
  const RatingsData data = makeZipfRatings(z);
  std::FILE* sink = std::tmpfile();
  ProgressReporter progress(sink, false);
  MfOptions o;
  o.rank = 4;
  o.epochs = 15;
  o.batchSize = 100;
  o.learningRate = 0.1;
  const MfReport adagrad = trainMf(o, data, progress);
  EXPECT_LT(adagrad.noiseFloorRatio, 1.05);  // measured 1.027
  EXPECT_LT(adagrad.epochTestRmse.back(), adagrad.epochTestRmse.front());
  EXPECT_EQ(adagrad.epochTestRmse.size(), 15u);
  EXPECT_EQ(trainMf(o, data, progress).testRmse, adagrad.testRmse);
  o.optimizer = "sgd";
  o.learningRate = 0.01;
  o.epochs = 30;
  const MfReport sgd = trainMf(o, data, progress);
  EXPECT_LT(sgd.noiseFloorRatio, 1.05);  // measured 1.028
  o.optimizer = "rmsprop";
  EXPECT_THROW(trainMf(o, data, progress), std::invalid_argument);
  std::fclose(sink);
}

// The summary writer both distributed sparse modes share: the common fields, and the end-of-run
// evaluation of the splits asked for (the workload's own metrics, under the split's prefix).
TEST(SparseRunSummary, WritesTheCommonFieldsAndTheSplitsEvaluated) {
  ZipfRatingsOptions z;
  z.rows = 100;
  z.cols = 50;
  z.cells = 3000;
  z.rank = 2;
  z.seed = 3;
  const RatingsData data = makeZipfRatings(z);
  MfOptions o;
  o.rank = 2;
  MfWorkload workload(data, o);
  MetricsEvent summary("summary");
  const auto evaluated = evaluateSplitsInto(workload, {"test"}, summary);
  ASSERT_EQ(evaluated.size(), 1u);
  EXPECT_EQ(evaluated[0].first, "test");
  ASSERT_FALSE(evaluated[0].second.empty());
  EXPECT_EQ(evaluated[0].second.front().name, "rmse");
  EXPECT_EQ(evaluated[0].second.front().value, workload.evaluate("test").front().value);
  EXPECT_NE(summary.fields().find("\"test_rmse\":"), std::string::npos) << summary.fields();
  EXPECT_NE(summary.fields().find("\"test_eval_seconds\":"), std::string::npos);

  MetricsEvent run("summary");
  addSparseRunSummary(run, {.epochs = 3,
                            .steps = 120,
                            .train_seconds = 1.5,
                            .wait_seconds = 0.25,
                            .points_per_s = 80,
                            .bytes_out = 7,
                            .bytes_in = 9,
                            .stopped = true});
  EXPECT_EQ(run.fields(),
            ",\"epochs\":3,\"evaluated_epoch\":3,\"steps\":120,\"train_seconds\":1.5,"
            "\"wait_seconds\":0.25,\"points_per_s\":80,\"bytes_out\":7,\"bytes_in\":9,"
            "\"stopped\":true");
}

}  // namespace
}  // namespace chorus::ml
