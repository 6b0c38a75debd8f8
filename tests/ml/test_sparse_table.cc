// Sparse tables, sparse gradients and the sparse optimizers.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ml/sparse_table.h"

namespace chorus::ml {
namespace {

TEST(SparseGradAccumulator, SumsDuplicatesAndSortsKeys) {
  SparseGradAccumulator acc(10, 2);
  const RowKey keys[] = {7, 2, 7, 5, 2, 7};
  for (size_t i = 0; i < std::size(keys); ++i) {
    float* row = acc.row(keys[i]);
    row[0] += 1.0f;
    row[1] += static_cast<float>(i);
  }
  EXPECT_EQ(acc.touched(), 3u);
  SparseGrad grad;
  acc.finish(grad);
  ASSERT_EQ(grad.keys, (std::vector<RowKey>{2, 5, 7}));
  EXPECT_EQ(grad.row(0)[0], 2.0f);  // key 2 twice: i = 1, 4
  EXPECT_EQ(grad.row(0)[1], 5.0f);
  EXPECT_EQ(grad.row(1)[0], 1.0f);  // key 5: i = 3
  EXPECT_EQ(grad.row(1)[1], 3.0f);
  EXPECT_EQ(grad.row(2)[0], 3.0f);  // key 7: i = 0, 2, 5
  EXPECT_EQ(grad.row(2)[1], 7.0f);
  EXPECT_FALSE(grad.isDense(10));
}

TEST(SparseGradAccumulator, StartsEveryStepFromZero) {
  SparseGradAccumulator acc(4, 3);
  SparseGrad grad;
  acc.row(1)[2] = 5.0f;
  acc.finish(grad);
  // A new step: key 1 again must start from zero, and key 3 is new.
  acc.row(3)[0] += 1.0f;
  acc.row(1)[0] += 2.0f;
  acc.finish(grad);
  ASSERT_EQ(grad.keys, (std::vector<RowKey>{1, 3}));
  EXPECT_EQ(grad.row(0)[0], 2.0f);
  EXPECT_EQ(grad.row(0)[2], 0.0f);
  EXPECT_EQ(grad.row(1)[0], 1.0f);
}

TEST(SparseGradAccumulator, DenseModeHandsOutEveryKeyAndThenGoesBackToSparse) {
  SparseGradAccumulator acc(3, 2);
  float* all = acc.beginDense();
  for (int i = 0; i < 6; ++i)
    all[i] = static_cast<float>(i);
  acc.row(1)[0] += 10.0f;
  SparseGrad grad;
  acc.finish(grad);
  ASSERT_EQ(grad.keys, (std::vector<RowKey>{0, 1, 2}));
  EXPECT_TRUE(grad.isDense(3));
  EXPECT_EQ(grad.row(1)[0], 12.0f);
  EXPECT_EQ(grad.row(2)[1], 5.0f);
  acc.row(2)[1] += 1.0f;
  acc.finish(grad);
  ASSERT_EQ(grad.keys, (std::vector<RowKey>{2}));
  EXPECT_EQ(grad.row(0)[0], 0.0f);
  EXPECT_EQ(grad.row(0)[1], 1.0f);
  EXPECT_THROW(
      {
        acc.row(0);
        acc.beginDense();
      },
      std::logic_error);
}

TEST(SparseOptimizer, SgdTouchesOnlyTheGradientsRows) {
  SparseTable table("t", 4, 2);
  for (size_t i = 0; i < 8; ++i)
    table.values()[i] = 1.0f;
  SparseOptimizer sgd({.kind = SparseOptimizerKind::kSgd, .lr = 0.5}, table);
  EXPECT_TRUE(sgd.state().empty());
  SparseGrad grad{.dim = 2, .keys = {1, 3}, .rows = {2.0f, 4.0f, -2.0f, 0.0f}};
  sgd.apply(table, grad);
  EXPECT_EQ(table.row(0)[0], 1.0f);
  EXPECT_EQ(table.row(1)[0], 0.0f);
  EXPECT_EQ(table.row(1)[1], -1.0f);
  EXPECT_EQ(table.row(2)[1], 1.0f);
  EXPECT_EQ(table.row(3)[0], 2.0f);
}

// AdaGrad as torch.optim.Adagrad: G += g^2; w -= lr g / (sqrt(G) + eps), per parameter, and
// rows a step does not touch keep their state.
TEST(SparseOptimizer, AdagradMatchesTheElementwiseRule) {
  SparseTable table("t", 3, 2);
  SparseOptimizer adagrad({.kind = SparseOptimizerKind::kAdagrad, .lr = 0.1, .epsilon = 1e-10},
                          table);
  ASSERT_EQ(adagrad.state().size(), 6u);
  SparseGrad first{.dim = 2, .keys = {0, 2}, .rows = {3.0f, -4.0f, 1.0f, 0.0f}};
  adagrad.apply(table, first);
  EXPECT_NEAR(table.row(0)[0], -0.1, 1e-6);  // first step: lr * sign(g)
  EXPECT_NEAR(table.row(0)[1], 0.1, 1e-6);
  EXPECT_NEAR(table.row(2)[0], -0.1, 1e-6);
  EXPECT_EQ(table.row(2)[1], 0.0f);  // zero gradient: no move (0 / eps)
  SparseGrad second{.dim = 2, .keys = {0}, .rows = {4.0f, 0.0f}};
  adagrad.apply(table, second);
  EXPECT_NEAR(table.row(0)[0], -0.1 - 0.1 * 4.0 / 5.0, 1e-6);  // G = 9 + 16
  EXPECT_NEAR(adagrad.state()[0], 25.0, 1e-5);
  EXPECT_NEAR(adagrad.state()[4], 1.0, 1e-6);  // row 2 untouched by the second step
}

TEST(SparseOptimizer, ADenseGradientUpdatesLikeOneRowAtATime) {
  SparseTable a("a", 5, 3), b("b", 5, 3);
  a.initNormal(1, 1.0);
  b.initNormal(1, 1.0);
  SparseOptimizer oa({.kind = SparseOptimizerKind::kAdagrad, .lr = 0.1}, a);
  SparseOptimizer ob({.kind = SparseOptimizerKind::kAdagrad, .lr = 0.1}, b);
  SparseGrad dense{.dim = 3, .keys = {0, 1, 2, 3, 4}, .rows = {}};
  for (int i = 0; i < 15; ++i)
    dense.rows.push_back(static_cast<float>(i % 4) - 1.5f);
  oa.apply(a, dense);
  for (RowKey k = 0; k < 5; ++k) {
    SparseGrad one{.dim = 3, .keys = {k}, .rows = {}};
    one.rows.assign(dense.row(k), dense.row(k) + 3);
    ob.apply(b, one);
  }
  for (size_t i = 0; i < 15; ++i)
    EXPECT_EQ(a.values()[i], b.values()[i]);
}

TEST(SparseOptimizer, ParseNamesTheFlag) {
  EXPECT_EQ(parseSparseOptimizer("sgd"), SparseOptimizerKind::kSgd);
  EXPECT_EQ(parseSparseOptimizer("adagrad"), SparseOptimizerKind::kAdagrad);
  try {
    parseSparseOptimizer("adam");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--optimizer"), std::string::npos);
  }
}

}  // namespace
}  // namespace chorus::ml
