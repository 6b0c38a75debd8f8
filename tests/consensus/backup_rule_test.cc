#include "consensus/backup_rule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace chorus::consensus {
namespace {

// The rule `text` names (the tests' names are good ones: read() must accept them).
std::unique_ptr<BackupRule> ruleNamed(std::string_view text) {
  return makeBackupRule(BackupRuleSpec::read(text).value());
}

TEST(LagWindow, KeepsTheNewestSamples) {
  LagWindow w(3);
  for (double l : {1.0, 2.0, 3.0, 4.0})
    w.add(l);
  EXPECT_EQ(w.size(), 3u);
  EXPECT_EQ(w.recent(0), 4.0);
  EXPECT_EQ(w.recent(2), 2.0);
  EXPECT_DOUBLE_EQ(w.mean(), 3.0);
  EXPECT_DOUBLE_EQ(w.quantile(0), 2.0);
  EXPECT_DOUBLE_EQ(w.quantile(0.5), 3.0);
  EXPECT_DOUBLE_EQ(w.quantile(0.75), 3.5);
  w.add(-5);  // clock noise cannot make a lag negative
  EXPECT_EQ(w.recent(0), 0.0);
}

TEST(ExpectedOrderedLags, OrdersAlignedRounds) {
  LagWindow a, b, c, silent;
  for (int i = 0; i < 4; ++i) {
    a.add(3);
    b.add(1);
    c.add(2);
  }
  auto lags = expectedOrderedLags({&a, &b, &c, &silent});
  ASSERT_EQ(lags.size(), 4u);
  EXPECT_DOUBLE_EQ(lags[0], 1);
  EXPECT_DOUBLE_EQ(lags[1], 2);
  EXPECT_DOUBLE_EQ(lags[2], 3);
  EXPECT_TRUE(std::isinf(lags[3]));
}

TEST(BackupRule, ParsesAndRejects) {
  EXPECT_EQ(ruleNamed("wait-all")->name(), "wait-all");
  EXPECT_EQ(ruleNamed("static:2")->name(), "static:2");
  EXPECT_EQ(ruleNamed("deadline:0.9")->name(), "deadline:0.9");
  EXPECT_EQ(ruleNamed("dynamic")->name(), "dynamic");
  EXPECT_EQ(ruleNamed("dynamic:0.2")->name(), "dynamic:0.2");
  for (const char* bad : {"", "all", "static", "static:-1", "static:1.5", "static:1e20",
                          "deadline:0", "deadline:1.5", "deadline:x", "wait-all:3", "dynamic:-1"}) {
    const node::Result<BackupRuleSpec> read = BackupRuleSpec::read(bad);
    ASSERT_FALSE(read.ok()) << "accepted '" << bad << "'";
    EXPECT_NE(read.message().find("accepted: wait-all"), std::string::npos) << read.message();
  }
}

TEST(BackupRule, StaticAndWaitAllPlans) {
  LagWindow w[4];
  RoundObservation obs;
  for (auto& x : w)
    obs.neighbor_lags.push_back(&x);
  WaitPlan all = ruleNamed("wait-all")->plan(obs);
  EXPECT_EQ(all.wait_for, 4u);
  EXPECT_EQ(all.backups, 0u);
  WaitPlan one = ruleNamed("static:1")->plan(obs);
  EXPECT_EQ(one.wait_for, 3u);
  EXPECT_EQ(one.backups, 1u);
  // More backups than neighbors still mixes with one of them.
  WaitPlan many = ruleNamed("static:9")->plan(obs);
  EXPECT_EQ(many.wait_for, 1u);
  EXPECT_EQ(many.backups, 3u);
  RoundObservation alone;
  EXPECT_EQ(ruleNamed("static:1")->plan(alone).wait_for, 0u);
  EXPECT_EQ(ruleNamed("dynamic")->plan(alone).wait_for, 0u);
}

TEST(BackupRule, DeadlineIsTheQuantileOfRecentLags) {
  LagWindow a, b;
  RoundObservation obs{0.01, {&a, &b}, 0, 0};
  // No history yet: wait for everyone.
  EXPECT_EQ(ruleNamed("deadline:0.5")->plan(obs).wait_for, 2u);
  for (int i = 1; i <= 5; ++i) {
    a.add(i * 0.001);
    b.add(i * 0.001 + 0.1);
  }
  WaitPlan p = ruleNamed("deadline:0.5")->plan(obs);
  EXPECT_EQ(p.wait_for, 1u);
  ASSERT_TRUE(p.deadline_seconds.has_value());
  EXPECT_NEAR(*p.deadline_seconds, (0.005 + 0.101) / 2, 1e-9);
}

// Synthetic lags: neighbors finish at about the same time as this node (jitter up to 5% of
// the compute time) unless they are slowed down.
struct Synthetic {
  std::mt19937_64 rng{11};
  double compute = 0.010;
  double jitter() { return std::uniform_real_distribution<double>(0, 0.05 * compute)(rng); }
};

TEST(DynamicRule, EqualsWaitAllWithoutStragglers) {
  Synthetic s;
  LagWindow w[4];
  RoundObservation obs{s.compute, {&w[0], &w[1], &w[2], &w[3]}, 1.0, 1.0};
  auto rule = ruleNamed("dynamic");
  for (int round = 0; round < 200; ++round) {
    for (auto& x : w)
      x.add(s.jitter());
    EXPECT_EQ(rule->plan(obs).wait_for, 4u) << "round " << round;
  }
  // Even with no gradient noise to average away (progress equal for every m).
  obs.grad_noise = 0;
  EXPECT_EQ(rule->plan(obs).wait_for, 4u);
}

TEST(DynamicRule, LeavesOutAFiveTimesSlowerNeighborAndTakesItBack) {
  Synthetic s;
  LagWindow w[4];
  RoundObservation obs{s.compute, {&w[0], &w[1], &w[2], &w[3]}, 1.0, 1.0};
  auto rule = ruleNamed("dynamic");
  // Neighbor 3 computes 5x as long: its model lands 4 compute times after the others.
  for (int round = 0; round < 32; ++round) {
    for (int j = 0; j < 3; ++j)
      w[j].add(s.jitter());
    w[3].add(4 * s.compute + s.jitter());
  }
  WaitPlan slow = rule->plan(obs);
  EXPECT_EQ(slow.wait_for, 3u);
  EXPECT_EQ(slow.backups, 1u);
  DynamicEstimate est = estimateDynamic(obs, 0.1);
  EXPECT_GT(est.rate[2], est.rate[3] * 2);
  // It speeds up again: once its recent lags are short, the rule waits for it again.
  for (int round = 0; round < 32; ++round) {
    for (auto& x : w)
      x.add(s.jitter());
  }
  EXPECT_EQ(rule->plan(obs).wait_for, 4u);
}

TEST(DynamicRule, NoiseMakesWaitingWorthMore) {
  // A neighbor 30% late: worth waiting for when gradients are noisy (averaging it cuts the
  // noise), not when they are clean.
  LagWindow fast[3], late;
  for (int i = 0; i < 8; ++i) {
    for (auto& f : fast)
      f.add(0);
    late.add(0.003);
  }
  RoundObservation obs{0.010, {&fast[0], &fast[1], &fast[2], &late}, 1.0, 0.0};
  EXPECT_EQ(estimateDynamic(obs, 0.1).chosen, 3u);
  obs.grad_noise = 20.0;
  EXPECT_EQ(estimateDynamic(obs, 0.1).chosen, 4u);
}

TEST(DynamicRule, ANeighborThatNeverSendsIsNotWaitedFor) {
  LagWindow w[3], silent;
  for (int i = 0; i < 8; ++i) {
    for (auto& x : w)
      x.add(0.0005);
  }
  RoundObservation obs{0.010, {&w[0], &w[1], &w[2], &silent}, 1.0, 1.0};
  EXPECT_EQ(ruleNamed("dynamic")->plan(obs).wait_for, 3u);
  // Before anyone has arrived (the first round), the rule waits for everyone.
  LagWindow none[2];
  RoundObservation cold{0.010, {&none[0], &none[1]}, 1.0, 1.0};
  EXPECT_EQ(ruleNamed("dynamic")->plan(cold).wait_for, 2u);
}

TEST(ExpectedOrderedLags, TheGateIsAFloorForEveryM) {
  // Two neighbors arrive at once, but the staleness gate holds the round 0.5 s in every other
  // synthetic round (a slow node within tau): no m ends those rounds sooner.
  LagWindow a, b, gate_a, gate_b;
  for (int i = 0; i < 4; ++i) {
    a.add(0.1);
    b.add(0.2);
    gate_a.add(i % 2 == 0 ? 0.5 : 0.0);
    gate_b.add(0);
  }
  auto lags = expectedOrderedLags({&a, &b}, {&gate_a, &gate_b});
  ASSERT_EQ(lags.size(), 2u);
  EXPECT_DOUBLE_EQ(lags[0], (0.5 + 0.1) / 2);
  EXPECT_DOUBLE_EQ(lags[1], (0.5 + 0.2) / 2);
  // Without gate windows the lags are the plain order statistics.
  EXPECT_DOUBLE_EQ(expectedOrderedLags({&a, &b})[0], 0.1);
}

TEST(DynamicRule, WaitsWhenTheGateWaitsAnyway) {
  // Neighbor 3 is 5x slower, but the staleness gate holds every round until it is in (it is
  // at the bound): leaving it out would save no time, so the rule waits for it.
  Synthetic s;
  LagWindow w[4], gate[4];
  for (int round = 0; round < 32; ++round) {
    for (int j = 0; j < 3; ++j) {
      w[j].add(s.jitter());
      gate[j].add(0);
    }
    const double late = 4 * s.compute + s.jitter();
    w[3].add(late);
    gate[3].add(late);
  }
  RoundObservation obs{s.compute, {&w[0], &w[1], &w[2], &w[3]}, 1.0, 1.0};
  EXPECT_EQ(estimateDynamic(obs, 0.1).chosen, 3u);  // without the gate: leave it out
  obs.neighbor_gate_lags = {&gate[0], &gate[1], &gate[2], &gate[3]};
  DynamicEstimate est = estimateDynamic(obs, 0.1);
  EXPECT_EQ(est.chosen, 4u);
  EXPECT_NEAR(est.round_seconds[0], est.round_seconds[3], 1e-12);
}

TEST(DynamicRule, LateModelsMixedAnywayMakeBackupsCheaper) {
  // Neighbor 3 is 25% late: with noisy gradients (little signal beyond the noise) waiting
  // for it is worth it while a backup's model is lost, not when it is mixed in a round later.
  LagWindow fast[3], late;
  for (int i = 0; i < 8; ++i) {
    for (auto& f : fast)
      f.add(0);
    late.add(0.0025);
  }
  RoundObservation obs{0.010, {&fast[0], &fast[1], &fast[2], &late}, 1.0, 0.95};
  obs.late_credit = 0;
  DynamicEstimate lost = estimateDynamic(obs, 0.1);
  EXPECT_EQ(lost.chosen, 4u);
  obs.late_credit = 1;
  DynamicEstimate mixed = estimateDynamic(obs, 0.1);
  EXPECT_EQ(mixed.chosen, 3u);
  // With full credit every m averages the same number of models: the progress is equal.
  EXPECT_DOUBLE_EQ(mixed.progress[0], mixed.progress[3]);
  EXPECT_LT(lost.progress[2], lost.progress[3]);
}

TEST(DynamicRule, TheSignalIsTheGradientNormMinusItsNoise) {
  // G = 2, sigma^2 = 1: the signal is 1; one neighbor waited for, so 2 models are averaged
  // and P = 1 / (1 + 1/2).
  LagWindow w;
  w.add(0);
  RoundObservation obs{0.010, {&w}, 2.0, 1.0};
  DynamicEstimate est = estimateDynamic(obs, 0.1);
  ASSERT_EQ(est.progress.size(), 1u);
  EXPECT_DOUBLE_EQ(est.progress[0], 1.0 / (1.0 + 1.0 / 2.0));
  // Noise above the norm (a noisy estimate): the signal is floored at G / 10, not negative.
  obs.grad_noise = 3.0;
  est = estimateDynamic(obs, 0.1);
  EXPECT_DOUBLE_EQ(est.progress[0], 0.2 / (0.2 + 3.0 / 2.0));
}

TEST(DynamicRule, StaleBackupModelsMakeWaitingWorthMore) {
  // Neighbor 3 is 30% late and gradients carry no noise to average away (the averaging gain
  // is 1 for every m): leave it out while the backups' models cost nothing, wait for it when
  // they are mixed in a round late and pull this node back.
  LagWindow fast[3], late;
  for (int i = 0; i < 8; ++i) {
    for (auto& f : fast)
      f.add(0);
    late.add(0.003);
  }
  RoundObservation obs{0.010, {&fast[0], &fast[1], &fast[2], &late}, 1.0, 0.0};
  EXPECT_EQ(estimateDynamic(obs, 0.1).chosen, 3u);
  obs.backup_used = 1;
  obs.backup_staleness = 1;
  DynamicEstimate est = estimateDynamic(obs, 0.1);
  EXPECT_EQ(est.chosen, 4u);
  // One backup whose model is one round old among 1 + 3 + 1 mixed: 1/5 of the step is undone.
  EXPECT_DOUBLE_EQ(est.progress[2], 1.0 - 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(est.progress[3], 1.0);
  // Fresh backups (mixed, staleness 0) cost nothing: back to leaving the late one out.
  obs.backup_staleness = 0;
  EXPECT_EQ(estimateDynamic(obs, 0.1).chosen, 3u);
}

TEST(DynamicRule, StalenessFactorIsFlooredAtZero) {
  // Three backups whose models are two rounds old undo more than the own step when only one
  // neighbor is waited for: that round makes no progress (not negative), so it is never chosen.
  LagWindow w[4];
  for (auto& x : w)
    x.add(0);
  RoundObservation obs{0.010, {&w[0], &w[1], &w[2], &w[3]}, 1.0, 0.0};
  obs.backup_used = 1;
  obs.backup_staleness = 2;
  DynamicEstimate est = estimateDynamic(obs, 0.1);
  EXPECT_DOUBLE_EQ(est.progress[0], 0.0);
  EXPECT_DOUBLE_EQ(est.rate[0], 0.0);
  EXPECT_EQ(est.chosen, 4u);
}

}  // namespace
}  // namespace chorus::consensus
