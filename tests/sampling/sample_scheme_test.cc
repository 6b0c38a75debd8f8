// The sampling schemes' core (sampling/sample_scheme.h): each scheme's guarantee checked with a
// fixed seed. The conforming schemes pass Pearson's chi-square against pi (naive and preloc on
// all their draws; pool on the marginal of fixed positions across independent seeds and on its
// draws; postpone on its multiset); onlylocal hands out local keys only, asks for nothing, and
// follows pi restricted to the local keys; pool hands every draw out exactly `reuse` times;
// postpone keeps pool's multiset. Critical values: tests/sampling/chi_square.h says how they
// were derived (0.9999 quantiles, significance 1e-4).
#include "sampling/sample_scheme.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "sampling/negative_sampler.h"
#include "tests/sampling/chi_square.h"

namespace chorus::sampling {
namespace {

using sampletest::chiSquare;
using sampletest::degreesOfFreedom;

// 0.9999 quantiles of chi-square with 28 and 18 degrees of freedom (tests/sampling/chi_square.h).
constexpr double kChi28 = 64.662446;
constexpr double kChi18 = 49.189394;

constexpr size_t kKeys = 30;

// frequency^0.75 over 30 keys with uneven counts; key 7 has count 0 and is never drawn.
NegativeSampler skewedPi() {
  std::vector<uint64_t> counts(kKeys);
  for (size_t k = 0; k < kKeys; ++k)
    counts[k] = 1 + (k * 37) % 101;
  counts[7] = 0;
  return NegativeSampler::byFrequency(counts, 0.75);
}

bool evenKeysLocal(Key k) {
  return k % 2 == 0;
}

SampleSchemeOptions schemeOf(SampleSchemeKind kind, uint32_t reuse = 1, size_t group = 16) {
  SampleSchemeOptions o;
  o.kind = kind;
  o.reuse = reuse;
  o.group_size = group;
  return o;
}

std::vector<uint64_t> countsOf(const std::vector<Key>& keys) {
  std::vector<uint64_t> seen(kKeys);
  for (Key k : keys)
    ++seen.at(k);
  return seen;
}

// Prepares samples of `sample` keys until `total` keys were handed out, pulling each in pieces
// of `piece`; every key in order.
std::vector<Key> drawAll(SampleScheme& scheme, size_t total, size_t sample, size_t piece) {
  std::vector<Key> keys;
  while (keys.size() < total) {
    const size_t n = std::min(sample, total - keys.size());
    const SampleId id = scheme.prepare(n).id;
    for (size_t got = 0; got < n;) {
      const size_t k = std::min(piece, n - got);
      SampleKeys pulled = scheme.pull(id, k);
      EXPECT_FALSE(pulled.error);
      EXPECT_EQ(pulled.keys.size(), k);
      keys.insert(keys.end(), pulled.keys.begin(), pulled.keys.end());
      got += k;
    }
    EXPECT_EQ(scheme.remaining(id), 0u);
  }
  EXPECT_EQ(scheme.openSamples(), 0u);
  return keys;
}

TEST(SampleScheme, NamesAndOptions) {
  for (auto kind : {SampleSchemeKind::kNaive, SampleSchemeKind::kPreloc, SampleSchemeKind::kPool,
                    SampleSchemeKind::kPostpone, SampleSchemeKind::kOnlyLocal}) {
    EXPECT_EQ(parseSampleScheme(sampleSchemeName(kind)), kind);
  }
  EXPECT_EQ(parseSampleScheme("local"), std::nullopt);
  EXPECT_FALSE(checkSampleOptions({}));
  SampleSchemeOptions bad;
  bad.reuse = 0;
  EXPECT_TRUE(checkSampleOptions(bad));
  const NegativeSampler pi = skewedPi();
  EXPECT_THROW(SampleScheme(pi, bad, 1, evenKeysLocal), std::invalid_argument);
  EXPECT_THROW(SampleScheme(pi, {}, 1, {}), std::invalid_argument);
}

TEST(SampleScheme, FlagsParseOnceWithErrorsNamingTheFlag) {
  SampleSchemeOptions o;
  EXPECT_FALSE(sampleOptionsFromFlags("pool", std::nullopt, o));
  EXPECT_EQ(o.kind, SampleSchemeKind::kPool);
  EXPECT_EQ(o.reuse, 16u);  // NuPS's untuned setting
  EXPECT_FALSE(sampleOptionsFromFlags("postpone", 4, o));
  EXPECT_EQ(o.kind, SampleSchemeKind::kPostpone);
  EXPECT_EQ(o.reuse, 4u);
  EXPECT_FALSE(sampleOptionsFromFlags("preloc", std::nullopt, o));
  EXPECT_EQ(o.reuse, 1u);
  auto error = sampleOptionsFromFlags("local", std::nullopt, o);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("--sample-scheme"), std::string::npos) << *error;
  EXPECT_EQ(o.kind, SampleSchemeKind::kPreloc);  // unchanged by a refused flag
  error = sampleOptionsFromFlags("naive", 4, o);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("--sample-reuse applies to"), std::string::npos) << *error;
  error = sampleOptionsFromFlags("pool", 0, o);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("[1, 1000000]"), std::string::npos) << *error;
}

TEST(SampleScheme, MisuseIsRefused) {
  const NegativeSampler pi = skewedPi();
  SampleScheme scheme(pi, schemeOf(SampleSchemeKind::kPreloc), 1, evenKeysLocal);
  EXPECT_THROW(scheme.prepare(0), std::invalid_argument);
  const SampleId id = scheme.prepare(5).id;
  EXPECT_THROW(scheme.pull(id, 6), std::invalid_argument);
  EXPECT_THROW(scheme.pull(id + 1, 1), std::invalid_argument);
  EXPECT_EQ(scheme.pull(id, 3).keys.size(), 3u);
  EXPECT_EQ(scheme.remaining(id), 2u);
  scheme.finish(id);
  EXPECT_EQ(scheme.remaining(id), 0u);
  EXPECT_THROW(scheme.pull(id, 1), std::invalid_argument);
}

TEST(SampleScheme, TheSameSeedDrawsTheSameKeys) {
  const NegativeSampler pi = skewedPi();
  for (auto kind : {SampleSchemeKind::kNaive, SampleSchemeKind::kPreloc, SampleSchemeKind::kPool,
                    SampleSchemeKind::kPostpone, SampleSchemeKind::kOnlyLocal}) {
    SampleScheme a(pi, schemeOf(kind, 3), 42, evenKeysLocal);
    SampleScheme b(pi, schemeOf(kind, 3), 42, evenKeysLocal);
    SampleScheme c(pi, schemeOf(kind, 3), 43, evenKeysLocal);
    const auto keys = drawAll(a, 500, 70, 9);
    EXPECT_EQ(keys, drawAll(b, 500, 70, 9)) << sampleSchemeName(kind);
    EXPECT_NE(keys, drawAll(c, 500, 70, 9)) << sampleSchemeName(kind);
  }
}

TEST(SampleScheme, NaiveDrawsAtPullTimeAndPassesChiSquare) {
  const NegativeSampler pi = skewedPi();
  ASSERT_EQ(degreesOfFreedom(pi.distribution()), 28u);
  SampleScheme scheme(pi, schemeOf(SampleSchemeKind::kNaive), 7, evenKeysLocal);
  const PreparedSample prepared = scheme.prepare(100);
  EXPECT_TRUE(prepared.localize.empty());
  EXPECT_EQ(scheme.stats().drawn, 0u);  // nothing drawn before the pull
  const SampleKeys pulled = scheme.pull(prepared.id, 100);
  EXPECT_EQ(scheme.stats().drawn, 100u);
  // The keys not local at pull time are the remote ones.
  std::vector<Key> odd;
  for (Key k : pulled.keys) {
    if (k % 2 == 1) odd.push_back(k);
  }
  std::sort(odd.begin(), odd.end());
  odd.erase(std::unique(odd.begin(), odd.end()), odd.end());
  EXPECT_EQ(pulled.remote, odd);

  const size_t n = 100000;
  const auto keys = drawAll(scheme, n, 5000, 64);
  EXPECT_LT(chiSquare(countsOf(keys), pi.distribution(), n), kChi28);
}

TEST(SampleScheme, PrelocDrawsAtPrepareLocalizesAndPassesChiSquare) {
  const NegativeSampler pi = skewedPi();
  SampleScheme scheme(pi, schemeOf(SampleSchemeKind::kPreloc), 8, evenKeysLocal);
  const PreparedSample prepared = scheme.prepare(200);
  EXPECT_EQ(scheme.stats().drawn, 200u);
  std::vector<Key> keys = scheme.pull(prepared.id, 200).keys;
  // It asked to localize exactly the sample's keys that were not local.
  std::vector<Key> odd;
  for (Key k : keys) {
    if (k % 2 == 1) odd.push_back(k);
  }
  std::sort(odd.begin(), odd.end());
  odd.erase(std::unique(odd.begin(), odd.end()), odd.end());
  EXPECT_EQ(prepared.localize, odd);
  EXPECT_FALSE(odd.empty());

  const size_t n = 100000;
  keys = drawAll(scheme, n, 3000, 100);
  EXPECT_LT(chiSquare(countsOf(keys), pi.distribution(), n), kChi28);
}

// Every position of the pool is marginally pi: across independent seeds, the first key, the
// last hand-out of the first group and a key of the second group each pass chi-square.
TEST(SampleScheme, PoolDrawsAreMarginallyPi) {
  const NegativeSampler pi = skewedPi();
  const uint32_t reuse = 4;
  const size_t group = 8;
  const std::vector<size_t> positions{0, group * reuse - 1, group * reuse + 3};
  std::vector<std::vector<uint64_t>> seen(positions.size(), std::vector<uint64_t>(kKeys));
  const size_t seeds = 20000;
  for (size_t s = 0; s < seeds; ++s) {
    SampleScheme scheme(pi, schemeOf(SampleSchemeKind::kPool, reuse, group), workerSeed(99, s),
                        evenKeysLocal);
    const SampleId id = scheme.prepare(2 * group * reuse).id;
    const std::vector<Key> keys = scheme.pull(id, 2 * group * reuse).keys;
    for (size_t p = 0; p < positions.size(); ++p)
      ++seen[p][keys[positions[p]]];
  }
  for (size_t p = 0; p < positions.size(); ++p) {
    EXPECT_LT(chiSquare(seen[p], pi.distribution(), seeds), kChi28) << "position " << positions[p];
  }
}

// Each group is handed out `reuse` times, each time in some order: consecutive blocks of
// group * reuse keys are `reuse` copies of one multiset, every key is handed out a multiple of
// `reuse` times, and the draws (hand-outs / reuse) pass chi-square.
TEST(SampleScheme, PoolHandsEachDrawOutReuseTimes) {
  const NegativeSampler pi = skewedPi();
  const uint32_t reuse = 4;
  const size_t group = 16;
  SampleScheme scheme(pi, schemeOf(SampleSchemeKind::kPool, reuse, group), 5, evenKeysLocal);
  const size_t groups = 2000;
  const auto keys = drawAll(scheme, groups * group * reuse, 80, 7);  // samples cross groups
  EXPECT_EQ(scheme.stats().handed_out, keys.size());
  // Drawn: the groups handed out and groups_ahead more waiting in the pool.
  EXPECT_EQ(scheme.stats().drawn, (groups + scheme.options().groups_ahead) * group);
  EXPECT_EQ(scheme.poolSize(), scheme.options().groups_ahead * group * reuse);

  bool orders_differ = false;
  for (size_t g = 0; g < groups; ++g) {
    const auto block = keys.begin() + static_cast<std::ptrdiff_t>(g * group * reuse);
    std::vector<Key> first(block, block + static_cast<std::ptrdiff_t>(group));
    std::vector<Key> sorted_first = first;
    std::sort(sorted_first.begin(), sorted_first.end());
    for (uint32_t u = 1; u < reuse; ++u) {
      const auto use = block + static_cast<std::ptrdiff_t>(u * group);
      std::vector<Key> again(use, use + static_cast<std::ptrdiff_t>(group));
      orders_differ = orders_differ || again != first;
      std::sort(again.begin(), again.end());
      ASSERT_EQ(again, sorted_first) << "group " << g << ", use " << u;
    }
  }
  EXPECT_TRUE(orders_differ);  // a new random order each time

  std::vector<uint64_t> seen = countsOf(keys);
  for (uint64_t& c : seen) {
    ASSERT_EQ(c % reuse, 0u);
    c /= reuse;
  }
  EXPECT_LT(chiSquare(seen, pi.distribution(), groups * group), kChi28);
}

// The fraction of each sample's keys that the sample before it also held, averaged.
double consecutiveOverlap(SampleScheme& scheme, size_t sample, size_t samples) {
  std::vector<Key> last;
  double overlap = 0;
  for (size_t s = 0; s < samples; ++s) {
    const SampleId id = scheme.prepare(sample).id;
    std::vector<Key> keys = scheme.pull(id, sample).keys;
    std::sort(keys.begin(), keys.end());
    if (s > 0) {
      size_t shared = 0;
      for (Key k : keys)
        shared += std::binary_search(last.begin(), last.end(), k) ? 1 : 0;
      overlap += static_cast<double>(shared) / static_cast<double>(sample);
    }
    last = std::move(keys);
  }
  return overlap / static_cast<double>(samples - 1);
}

// A group no larger than a sample is that sample handed out U times in a row (a step that
// shares its negatives trains U steps on the same ones); poolGroupSize makes a group span U
// samples, so that consecutive samples share about as few keys as i.i.d. ones.
TEST(SampleScheme, APoolGroupSpansReuseSamples) {
  SampleSchemeOptions pool = schemeOf(SampleSchemeKind::kPool, 16, 256);
  EXPECT_EQ(poolGroupSize(256, pool), 4096u);             // WN18RR's 256 shared negatives
  EXPECT_EQ(poolGroupSize(8, pool), 256u);                // never below the configured size
  EXPECT_EQ(poolGroupSize(262144, pool), kMaxPoolGroup);  // per-query negatives: capped
  EXPECT_EQ(poolGroupSize(SIZE_MAX / 2, pool), kMaxPoolGroup);
  pool.reuse = 1;
  EXPECT_EQ(poolGroupSize(1024, pool), 1024u);
  EXPECT_EQ(poolGroupSize(1024, schemeOf(SampleSchemeKind::kNaive, 1, 256)), 256u);
  EXPECT_EQ(poolGroupSize(1024, schemeOf(SampleSchemeKind::kPostpone, 4, 256)), 4096u);

  const NegativeSampler pi = NegativeSampler::uniform(0, 10000);
  constexpr size_t kSample = 32;
  constexpr uint32_t kReuse = 8;
  SampleScheme one_sample_groups(pi, schemeOf(SampleSchemeKind::kPool, kReuse, kSample), 3,
                                 evenKeysLocal);
  SampleSchemeOptions spanning = schemeOf(SampleSchemeKind::kPool, kReuse, kSample);
  spanning.group_size = poolGroupSize(kSample, spanning);
  EXPECT_EQ(spanning.group_size, kSample * kReuse);
  SampleScheme spanning_groups(pi, spanning, 3, evenKeysLocal);
  // One-sample groups: 7 of every 8 samples repeat the one before. Spanning groups: only a
  // sample at the start of a group's next pass meets keys of the one before (at most 1 in 8).
  EXPECT_GT(consecutiveOverlap(one_sample_groups, kSample, 400), 0.8);
  EXPECT_LT(consecutiveOverlap(spanning_groups, kSample, 400), 0.15);
}

TEST(SampleScheme, PoolLocalizesGroupsAheadOfUse) {
  const NegativeSampler pi = skewedPi();
  SampleScheme scheme(pi, schemeOf(SampleSchemeKind::kPool, 2, 16), 6, evenKeysLocal);
  const PreparedSample first = scheme.prepare(10);
  // The first prepare drew the sample's group and groups_ahead more and asks for their
  // non-local keys; the pool then holds the rest.
  EXPECT_EQ(scheme.stats().drawn, 3u * 16);
  EXPECT_EQ(scheme.poolSize(), 3u * 16 * 2 - 10);
  for (Key k : first.localize)
    EXPECT_EQ(k % 2, 1u);
  EXPECT_FALSE(first.localize.empty());
  // A sample the pool already holds draws nothing new; only its own non-local keys are asked
  // for again (they may have moved away since their group was localized).
  const SampleId second = scheme.prepare(10).id;
  EXPECT_EQ(scheme.stats().drawn, 3u * 16);
  const SampleKeys pulled = scheme.pull(second, 10);
  for (Key k : pulled.remote)
    EXPECT_EQ(k % 2, 1u);
}

// postpone hands out exactly pool's keys per sample (same seed: same draws), local ones first:
// while a local key is left in the sample, no non-local one is handed out.
TEST(SampleScheme, PostponeKeepsThePoolsMultisetAndUsesLocalKeysFirst) {
  const NegativeSampler pi = skewedPi();
  const uint32_t reuse = 3;
  SampleScheme pool(pi, schemeOf(SampleSchemeKind::kPool, reuse), 11, evenKeysLocal);
  SampleScheme postpone(pi, schemeOf(SampleSchemeKind::kPostpone, reuse), 11, evenKeysLocal);
  const size_t sample = 60;
  const size_t samples = 1000;
  std::vector<Key> all;
  bool reordered = false;
  size_t all_local_pool = 0, all_local_postpone = 0;  // pulls that read nothing remotely
  for (size_t s = 0; s < samples; ++s) {
    const SampleId a = pool.prepare(sample).id;
    const PreparedSample b = postpone.prepare(sample);
    std::vector<Key> from_pool, from_postpone;
    for (size_t got = 0; got < sample; got += 6) {
      const SampleKeys pulled = pool.pull(a, 6);
      const auto& x = pulled.keys;
      const SampleKeys y = postpone.pull(b.id, 6);
      all_local_pool += pulled.remote.empty() ? 1 : 0;
      all_local_postpone += y.remote.empty() ? 1 : 0;
      from_pool.insert(from_pool.end(), x.begin(), x.end());
      from_postpone.insert(from_postpone.end(), y.keys.begin(), y.keys.end());
    }
    reordered = reordered || from_pool != from_postpone;
    all.insert(all.end(), from_postpone.begin(), from_postpone.end());
    // Local keys first: once a non-local key is handed out, only non-local ones follow.
    const auto first_remote =
        std::find_if(from_postpone.begin(), from_postpone.end(), [](Key k) { return k % 2 == 1; });
    EXPECT_TRUE(std::all_of(first_remote, from_postpone.end(), [](Key k) { return k % 2 == 1; }))
        << "sample " << s;
    std::sort(from_pool.begin(), from_pool.end());
    std::sort(from_postpone.begin(), from_postpone.end());
    ASSERT_EQ(from_pool, from_postpone) << "sample " << s;
  }
  EXPECT_TRUE(reordered);
  EXPECT_GT(postpone.stats().postponed, 0u);
  // The same keys are local either way; postpone groups them, so more pulls stay on the node.
  EXPECT_EQ(postpone.stats().local, pool.stats().local);
  EXPECT_GT(all_local_postpone, all_local_pool);
  // The multiset is pool's: every draw handed out `reuse` times (samples * sample is a whole
  // number of groups), and the draws pass chi-square.
  ASSERT_EQ(all.size() % (reuse * postpone.options().group_size), 0u);
  std::vector<uint64_t> seen = countsOf(all);
  for (uint64_t& c : seen) {
    ASSERT_EQ(c % reuse, 0u);
    c /= reuse;
  }
  EXPECT_LT(chiSquare(seen, pi.distribution(), all.size() / reuse), kChi28);
}

// onlylocal: only local keys, no localize and no remote key ever, distributed as pi restricted
// to the local keys; a node holding none of pi's keys gets an error, not a hang.
TEST(SampleScheme, OnlyLocalNeverLeavesTheNode) {
  const NegativeSampler pi = skewedPi();
  auto local = [](Key k) { return k % 3 != 0; };
  SampleScheme scheme(pi, schemeOf(SampleSchemeKind::kOnlyLocal), 13, local);
  std::vector<Key> keys;
  for (size_t s = 0; s < 200; ++s) {
    const PreparedSample prepared = scheme.prepare(500);
    EXPECT_TRUE(prepared.localize.empty());
    for (size_t got = 0; got < 500; got += 50) {
      const SampleKeys pulled = scheme.pull(prepared.id, 50);
      EXPECT_TRUE(pulled.remote.empty());
      EXPECT_FALSE(pulled.error);
      keys.insert(keys.end(), pulled.keys.begin(), pulled.keys.end());
    }
  }
  EXPECT_EQ(scheme.stats().localize, 0u);
  EXPECT_EQ(scheme.stats().local, keys.size());
  EXPECT_TRUE(std::all_of(keys.begin(), keys.end(), local));
  // pi restricted to the local keys, renormalized.
  std::vector<double> restricted = pi.distribution();
  double mass = 0;
  for (Key k = 0; k < kKeys; ++k) {
    if (!local(k)) restricted[k] = 0;
    mass += restricted[k];
  }
  for (double& p : restricted)
    p /= mass;
  ASSERT_EQ(degreesOfFreedom(restricted), 18u);
  EXPECT_LT(chiSquare(countsOf(keys), restricted, keys.size()), kChi18);

  SampleSchemeOptions options = schemeOf(SampleSchemeKind::kOnlyLocal);
  options.max_draws_per_key = 1000;
  SampleScheme nothing_here(pi, options, 13, [](Key) { return false; });
  const SampleId id = nothing_here.prepare(4).id;
  const SampleKeys pulled = nothing_here.pull(id, 4);
  ASSERT_TRUE(pulled.error);
  EXPECT_NE(pulled.error->find("none was local"), std::string::npos) << *pulled.error;
  EXPECT_TRUE(pulled.keys.empty());
  EXPECT_EQ(nothing_here.openSamples(), 0u);
}

}  // namespace
}  // namespace chorus::sampling
