// Filtered link-prediction ranking: ranks on a hand-made graph whose scores are known, the
// filter index, and the batched evaluation against a one-triple-at-a-time definition.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ml/kge_eval.h"

namespace chorus::ml {
namespace {

// DistMult with dim 1: score(h, r, t) = v[h] * w[r] * v[t], so every score is known by hand.
KgeModel scalarModel(const std::vector<float>& entityValues,
                     const std::vector<float>& relationValues) {
  KgeConfig config;
  config.model = KgeModelKind::kDistMult;
  config.dim = 1;
  KgeModel model(config, entityValues.size(), relationValues.size(), 1);
  std::copy(entityValues.begin(), entityValues.end(), model.entities().values().begin());
  std::copy(relationValues.begin(), relationValues.end(), model.relations().values().begin());
  return model;
}

// Entities 0..5 score as their values 1, 2, 3, 4, 5, 3 (entity 5 ties with entity 2).
//  test (0, 0, 2), tail: q = 1; entities 3 and 4 score higher but are known tails of (0, 0)
//    (train), so they are filtered; entity 5 ties: rank 1 + 0 + 1/2 = 1.5.
//  test (0, 0, 2), head: g = 3; every other entity (1..5) scores higher and none is a known head
//    of (0, 2): rank 6.
//  test (1, 0, 5), tail: q = 2; entities 3, 4 higher (not known tails of (1, 0)), entity 2
//    ties: rank 3.5.
//  test (1, 0, 5), head: g = 3; entities 2, 3, 4, 5 higher: rank 5.
TEST(KgeRanking, HandMadeGraphHasTheKnownFilteredRanks) {
  const KgeModel model = scalarModel({1, 2, 3, 4, 5, 3}, {1});
  const std::vector<Triple> train = {{0, 0, 4}, {0, 0, 3}}, valid = {},
                            test = {{0, 0, 2}, {1, 0, 5}};
  const KnownTriples known({train, valid, test});
  const KgeRanking r = evaluateFiltered(model, test, known, true);
  ASSERT_EQ(r.ranks.size(), 4u);
  EXPECT_DOUBLE_EQ(r.ranks[0], 1.5);  // tail of test triple 0
  EXPECT_DOUBLE_EQ(r.ranks[1], 3.5);  // tail of test triple 1
  EXPECT_DOUBLE_EQ(r.ranks[2], 6.0);  // head of test triple 0
  EXPECT_DOUBLE_EQ(r.ranks[3], 5.0);  // head of test triple 1
  EXPECT_EQ(r.queries, 4u);
  EXPECT_NEAR(r.mrr, (1 / 1.5 + 1 / 3.5 + 1 / 6.0 + 1 / 5.0) / 4, 1e-12);
  EXPECT_NEAR(r.tailMrr, (1 / 1.5 + 1 / 3.5) / 2, 1e-12);
  EXPECT_NEAR(r.headMrr, (1 / 6.0 + 1 / 5.0) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(r.hits1, 0.0);
  EXPECT_DOUBLE_EQ(r.hits3, 0.25);
  EXPECT_DOUBLE_EQ(r.hits10, 1.0);
  EXPECT_DOUBLE_EQ(r.meanRank, (1.5 + 3.5 + 6 + 5) / 4);
}

TEST(KgeRanking, ValidTriplesAreFilteredToo) {
  const KgeModel model = scalarModel({1, 2, 3, 4, 5, 3}, {1});
  const std::vector<Triple> train = {{0, 0, 4}}, valid = {{0, 0, 3}}, test = {{0, 0, 2}};
  const KgeRanking r = evaluateFiltered(model, test, KnownTriples({train, valid, test}), true);
  EXPECT_DOUBLE_EQ(r.ranks[0], 1.5);
  // Unfiltered, entities 3 and 4 count: the raw rank would be 3.5.
  const KgeRanking raw = evaluateFiltered(model, test, KnownTriples({test}), true);
  EXPECT_DOUBLE_EQ(raw.ranks[0], 3.5);
}

TEST(KgeRanking, FilteredRankConventions) {
  const std::vector<float> scores = {0.5f, 0.9f, 0.5f, 0.1f, 0.5f};
  // Entity 0: one higher (1), two ties (2, 4): 1 + 1 + 2/2.
  EXPECT_DOUBLE_EQ(filteredRank(scores, 0, {}), 3.0);
  // Filtering a tie and the higher one: 1 + 0 + 1/2. The true entity in the list is ignored.
  const std::vector<uint32_t> known = {0, 1, 2};
  EXPECT_DOUBLE_EQ(filteredRank(scores, 0, known), 1.5);
  // All scores equal (an untrained model): the middle rank, not 1.
  const std::vector<float> flat(11, 0.0f);
  EXPECT_DOUBLE_EQ(filteredRank(flat, 3, {}), 6.0);
  // A non-finite true score is the worst rank.
  const std::vector<float> nan = {std::nanf(""), 1.0f, 2.0f};
  EXPECT_DOUBLE_EQ(filteredRank(nan, 0, {}), 3.0);
}

TEST(KnownTriples, ListsSortedUniqueAnswersPerQuery) {
  const std::vector<Triple> a = {{1, 0, 5}, {1, 0, 3}, {2, 0, 5}}, b = {{1, 0, 5}, {1, 1, 4}};
  const KnownTriples known({a, b});
  const auto tails = known.tails(1, 0);
  EXPECT_EQ(std::vector<uint32_t>(tails.begin(), tails.end()), (std::vector<uint32_t>{3, 5}));
  const auto heads = known.heads(0, 5);
  EXPECT_EQ(std::vector<uint32_t>(heads.begin(), heads.end()), (std::vector<uint32_t>{1, 2}));
  EXPECT_TRUE(known.tails(7, 0).empty());
  EXPECT_TRUE(known.heads(1, 3).empty());
}

// The batched evaluation (blocks of queries against all entities as matrix products, counts
// then filter corrections) against the definition computed one triple and one entity at a time,
// on a random ComplEx model and more triples than one block holds. With reciprocal relations a
// head query (?, r, t) scores e as the tail of (t, r + R): score(t, r + R, e); the filter is the
// known heads of (r, t) all the same.
void expectBatchedEvaluationMatchesTheDefinition(bool reciprocal) {
  KgeConfig config;
  config.model = KgeModelKind::kComplEx;
  config.dim = 8;
  config.initScale = 1.0;
  config.reciprocal = reciprocal;
  const size_t entities = 40, relations = 3;
  KgeModel model(config, entities, relations, 9);
  Rng rng(4);
  std::vector<Triple> train, test;
  for (int i = 0; i < 600; ++i) {
    const Triple t{static_cast<uint32_t>(rng.below(entities)),
                   static_cast<uint32_t>(rng.below(relations)),
                   static_cast<uint32_t>(rng.below(entities))};
    (i < 300 ? train : test).push_back(t);
  }
  const KnownTriples known({train, test});
  const KgeRanking r = evaluateFiltered(model, test, known, true);
  auto isKnown = [&](uint32_t h, uint32_t rel, uint32_t t) {
    for (const auto* split : {&train, &test})
      for (const Triple& x : *split)
        if (x.head == h && x.relation == rel && x.tail == t) return true;
    return false;
  };
  for (size_t i = 0; i < test.size(); ++i) {
    const Triple& t = test[i];
    for (int direction = 0; direction < 2; ++direction) {
      const bool tail = direction == 0;
      auto score = [&](uint32_t e) {
        if (tail) {
          return kgeScore(config.model, config.dim, model.entities().row(t.head),
                          model.relations().row(t.relation), model.entities().row(e));
        }
        if (reciprocal) {
          return kgeScore(config.model, config.dim, model.entities().row(t.tail),
                          model.relations().row(t.relation + relations), model.entities().row(e));
        }
        return kgeScore(config.model, config.dim, model.entities().row(e),
                        model.relations().row(t.relation), model.entities().row(t.tail));
      };
      const uint32_t truth = tail ? t.tail : t.head;
      const double target = score(truth);
      double rank = 1.0;
      for (uint32_t e = 0; e < entities; ++e) {
        if (e == truth) continue;
        if (tail ? isKnown(t.head, t.relation, e) : isKnown(e, t.relation, t.tail)) continue;
        const double s = score(e);
        // Scores agree to float precision between the GEMM and the double loop.
        if (s > target + 1e-5)
          rank += 1.0;
        else if (std::abs(s - target) <= 1e-5)
          rank += 0.5;
      }
      EXPECT_DOUBLE_EQ(r.ranks[direction * test.size() + i], rank)
          << "triple " << i << (tail ? " tail" : " head");
    }
  }
}

TEST(KgeRanking, BatchedEvaluationMatchesTheDefinition) {
  expectBatchedEvaluationMatchesTheDefinition(false);
}

TEST(KgeRanking, ReciprocalHeadQueriesUseTheInverseRelation) {
  expectBatchedEvaluationMatchesTheDefinition(true);
}

}  // namespace
}  // namespace chorus::ml
