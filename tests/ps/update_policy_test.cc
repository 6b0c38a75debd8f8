// The owners' update rules on plain rows: SGD (with momentum and weight decay) as ml::sgdUpdate,
// AdaGrad as ml::SparseOptimizer, each row with its own state.
#include "ps/update_policy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "ml/sparse_table.h"

namespace chorus::ps {
namespace {

TEST(UpdatePolicy, SgdIsTheOwnerOptimizerPerPush) {
  OwnerOptimizer optimizer;
  optimizer.sgd.momentum = 0.9;
  optimizer.sgd.weightDecay = 0.01;
  optimizer.schedule.baseLr = 0.1;
  optimizer.push_scale = 0.25;
  const SgdPolicy policy(optimizer);
  EXPECT_EQ(policy.stateFloats(6), 6u);
  EXPECT_TRUE(policy.stepsPerClock());

  std::vector<float> values{1, 2, 3, -1, -2, -3}, state(6);
  std::vector<float> expected = values, velocity(6);
  const std::vector<float> grad{0.5f, -0.5f, 1, 2, -2, 0};
  policy.initState(state);
  for (int64_t clock = 0; clock < 4; ++clock) {
    const RowUpdate row{values, state, grad};
    policy.applyPush(clock, std::span<const RowUpdate>(&row, 1));
    ml::sgdUpdate(optimizer.pushSgd(), optimizer.pushLr(clock), expected, grad, velocity);
  }
  EXPECT_EQ(values, expected);
  EXPECT_EQ(state, velocity);

  optimizer.sgd.momentum = 0;
  EXPECT_EQ(SgdPolicy(optimizer).stateFloats(6), 0u);
  EXPECT_FALSE(SgdPolicy(optimizer).stepsPerClock());
}

TEST(UpdatePolicy, SgdStepsOnceOnTheMeanOfAClock) {
  OwnerOptimizer optimizer;
  optimizer.sgd.momentum = 0.5;
  optimizer.schedule.baseLr = 0.2;
  optimizer.push_scale = 0.5;
  const SgdPolicy policy(optimizer);
  std::vector<float> values{1, 1}, state(2, 0.0f);
  const std::vector<float> sum{2, 4};  // two workers' gradients summed
  const RowUpdate row{values, state, sum};
  policy.applyClockSum(0, std::span<const RowUpdate>(&row, 1));
  // mean (1, 2); v = mean; w -= 0.2 * v
  EXPECT_FLOAT_EQ(values[0], 1 - 0.2f * 1);
  EXPECT_FLOAT_EQ(values[1], 1 - 0.2f * 2);
  EXPECT_FLOAT_EQ(state[0], 1);
  EXPECT_FLOAT_EQ(state[1], 2);
}

TEST(UpdatePolicy, AdagradKeepsOneAccumulatorPerFloatOfEachRow) {
  AdagradConfig config;
  config.schedule.baseLr = 0.3;
  config.initial_accumulator = 0.1;
  const AdagradPolicy policy(config);
  ASSERT_EQ(policy.stateFloats(4), 4u);

  // The same rows through ml::SparseOptimizer (one table of 3 rows of 4).
  ml::SparseTable table("t", 3, 4);
  ml::SparseOptimizerConfig reference;
  reference.kind = ml::SparseOptimizerKind::kAdagrad;
  reference.lr = 0.3;
  reference.initialAccumulator = 0.1;
  ml::SparseOptimizer optimizer(reference, table);

  std::vector<std::vector<float>> rows(3, std::vector<float>(4, 0.0f));
  std::vector<std::vector<float>> states(3, std::vector<float>(4));
  for (auto& s : states)
    policy.initState(s);
  for (int step = 0; step < 5; ++step) {
    // Rows 0 and 2 only: row 1's state must not move.
    ml::SparseGrad grad;
    grad.dim = 4;
    grad.keys = {0, 2};
    grad.rows.assign(8, 0.0f);
    for (size_t i = 0; i < 8; ++i)
      grad.rows[i] = static_cast<float>((i + step) % 5) - 2.0f;
    optimizer.apply(table, grad);
    std::vector<RowUpdate> updates;
    updates.push_back({rows[0], states[0], std::span<const float>(grad.row(0), 4)});
    updates.push_back({rows[2], states[2], std::span<const float>(grad.row(1), 4)});
    policy.applyPush(step, updates);
  }
  for (size_t r = 0; r < 3; ++r) {
    for (size_t j = 0; j < 4; ++j) {
      EXPECT_FLOAT_EQ(rows[r][j], table.row(r)[j]) << r << "," << j;
      EXPECT_FLOAT_EQ(states[r][j], optimizer.state()[r * 4 + j]) << r << "," << j;
    }
  }
  EXPECT_EQ(states[1], std::vector<float>(4, 0.1f));
}

// Issue 25: SgdPolicy applies a whole push in one call instead of ml::sgdUpdate per row. The
// result must be the same bits as the per-row call, for plain SGD, momentum (heavy ball and
// Nesterov), weight decay and the owner-momentum variant (momentum spread over a clock's pushes).
TEST(UpdatePolicy, SgdOverAPushIsBitForBitSgdUpdatePerRow) {
  std::mt19937 rng(25);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  struct Variant {
    double momentum, decay;
    bool nesterov;
    OwnerOptimizer::Momentum mode;
  };
  const std::vector<Variant> variants{
      {0.0, 0.0, false, OwnerOptimizer::Momentum::kPerClock},
      {0.0, 1e-3, false, OwnerOptimizer::Momentum::kPerClock},
      {0.9, 0.0, false, OwnerOptimizer::Momentum::kPerPush},
      {0.9, 1e-4, true, OwnerOptimizer::Momentum::kPerPush},
      {0.9, 1e-4, false, OwnerOptimizer::Momentum::kPerClock},
      {0.5, 0.0, true, OwnerOptimizer::Momentum::kPerClock},
  };
  for (const Variant& v : variants) {
    OwnerOptimizer optimizer;
    optimizer.sgd.momentum = v.momentum;
    optimizer.sgd.weightDecay = v.decay;
    optimizer.sgd.nesterov = v.nesterov;
    optimizer.schedule.baseLr = 0.037;
    optimizer.push_scale = 1.0 / 3.0;
    optimizer.momentum_mode = v.mode;
    const SgdPolicy policy(optimizer);
    // Rows of 1, 3, 64 and 517 floats (vector loops and their tails), three pushes each.
    const std::vector<size_t> lengths{1, 3, 64, 517, 1, 1, 2};
    std::vector<std::vector<float>> values, state, expected_values, expected_state;
    for (size_t len : lengths) {
      std::vector<float> w(len), s(policy.stateFloats(len));
      for (float& x : w)
        x = value(rng);
      for (float& x : s)
        x = value(rng);
      values.push_back(w);
      state.push_back(s);
      expected_values.push_back(w);
      expected_state.push_back(s);
    }
    for (int64_t clock = 0; clock < 3; ++clock) {
      std::vector<std::vector<float>> grads;
      std::vector<RowUpdate> rows;
      for (size_t r = 0; r < lengths.size(); ++r) {
        std::vector<float> g(lengths[r]);
        for (float& x : g)
          x = value(rng);
        grads.push_back(g);
      }
      for (size_t r = 0; r < lengths.size(); ++r)
        rows.push_back(RowUpdate{values[r], state[r], grads[r]});
      policy.applyPush(clock, rows);
      for (size_t r = 0; r < lengths.size(); ++r) {
        ml::sgdUpdate(optimizer.pushSgd(), optimizer.pushLr(clock), expected_values[r], grads[r],
                      expected_state[r]);
      }
    }
    for (size_t r = 0; r < lengths.size(); ++r) {
      ASSERT_EQ(std::memcmp(values[r].data(), expected_values[r].data(),
                            values[r].size() * sizeof(float)),
                0)
          << "momentum " << v.momentum << ", row " << r;
      ASSERT_EQ(state[r], expected_state[r]) << "momentum " << v.momentum << ", row " << r;
    }
  }
}

// The rules that say they are elementwise give the same bits for one update over a run of
// rows (KeyStore::applyRuns) as for one update per row; each keeps 0 or n floats of state.
TEST(UpdatePolicy, ElementwiseRulesGiveTheSameBitsOverARunAsPerRow) {
  std::vector<std::shared_ptr<const UpdatePolicy>> policies;
  for (const bool nesterov : {false, true}) {
    for (const double momentum : {0.0, 0.9}) {
      OwnerOptimizer optimizer;
      optimizer.sgd.momentum = momentum;
      optimizer.sgd.nesterov = nesterov && momentum > 0;
      optimizer.sgd.weightDecay = 0.01;
      optimizer.schedule.baseLr = 0.05;
      optimizer.push_scale = 0.5;
      policies.push_back(std::make_shared<SgdPolicy>(optimizer));
    }
  }
  AdagradConfig adagrad;
  adagrad.schedule.baseLr = 0.3;
  adagrad.initial_accumulator = 0.1;
  policies.push_back(std::make_shared<AdagradPolicy>(adagrad));
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  constexpr size_t kRows = 37, kLen = 3;  // odd sizes: vector loops and their tails
  for (const auto& policy : policies) {
    ASSERT_TRUE(policy->elementwise()) << policy->name();
    const size_t state_floats = policy->stateFloats(kLen);
    ASSERT_TRUE(state_floats == 0 || state_floats == kLen) << policy->name();
    std::vector<float> run_values(kRows * kLen), run_state(kRows * state_floats);
    for (float& v : run_values)
      v = uniform(rng);
    policy->initState(run_state);
    std::vector<float> row_values = run_values, row_state = run_state;
    for (int64_t clock = 0; clock < 5; ++clock) {
      std::vector<float> grads(kRows * kLen);
      for (float& g : grads)
        g = uniform(rng);
      const RowUpdate run{run_values, run_state, grads};
      policy->applyPush(clock, std::span<const RowUpdate>(&run, 1));
      std::vector<RowUpdate> rows;
      for (size_t r = 0; r < kRows; ++r) {
        rows.push_back(
            RowUpdate{std::span<float>(row_values).subspan(r * kLen, kLen),
                      std::span<float>(row_state).subspan(r * state_floats, state_floats),
                      std::span<const float>(grads).subspan(r * kLen, kLen)});
      }
      policy->applyPush(clock, rows);
    }
    EXPECT_EQ(std::memcmp(run_values.data(), row_values.data(), run_values.size() * 4), 0)
        << policy->name();
    EXPECT_EQ(run_state, row_state) << policy->name();
  }
}

}  // namespace
}  // namespace chorus::ps
