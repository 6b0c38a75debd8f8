// The sampling primitives over the real runtime (ps/sample_worker.h): three nodes on loopback,
// port 0, each holding its home rows behind a technique's data path (SparseRowAccess: classic's
// KvServer + KvWorker, or lapse's relocation shell); node 0 samples (node 1 too where rows are
// to move back and forth). Under both techniques pullSample returns the keys the scheme handed
// out with their current values and onlylocal sends no frame. Under lapse, where rows move:
// the conforming schemes follow pi (chi-square, while another node's sampler pulls the same
// rows away), preloc's keys are local when pulled, pool hands each drawn key out U times and its
// reuses are local, and onlylocal follows the rows that moved here.
#include "ps/sample_worker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "node/node.h"
#include "ps/ps_peer.h"
#include "ps/sparse_row_access.h"
#include "sampling/negative_sampler.h"
#include "tests/sampling/chi_square.h"
#include "tests/support/local_cluster.h"

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;
using sampling::SampleSchemeKind;
using sampling::sampletest::chiSquare;
using sampling::sampletest::degreesOfFreedom;

constexpr size_t kRows = 30;
constexpr size_t kRowFloats = 3;
// The 0.9999 quantiles of chi-square with 1..29 degrees of freedom (kChi[df - 1]; tests/
// sampling/chi_square.h says how they were computed).
constexpr double kChi[] = {15.1367, 18.4207, 21.1075, 23.5127, 25.7448, 27.8563, 29.8775, 31.8276,
                           33.7199, 35.5640, 37.3670, 39.1344, 40.8707, 42.5793, 44.2632, 45.9249,
                           47.5664, 49.1894, 50.7955, 52.3860, 53.9620, 55.5246, 57.0746, 58.6130,
                           60.1403, 61.6573, 63.1645, 64.6624, 66.1517};

// Nodes 0..2, each holding its home rows of one table of 30 rows of 3 floats (float i of the
// flat model starting at i) behind `technique`'s data path, fully asynchronous (a pull reads
// the current values). Heartbeats are an hour apart, so that a node's frame counters move only
// with PS traffic while a test runs.
class SampleCluster {
 public:
  explicit SampleCluster(SparseTechnique technique)
      : space_(entities()),
        map_(testsupport::membersOf(3)),
        cluster_(3, 0,
                 testsupport::NodeSettings{
                     .cluster = "sample-test", .heartbeat_interval = 1h, .peer_timeout = 2h}) {
    optimizer_.sgd.momentum = 0;
    optimizer_.schedule.baseLr = 0.5;
    expected_.resize(space_.total());
    for (size_t i = 0; i < expected_.size(); ++i)
      expected_[i] = static_cast<float>(i);
    RowAccessSetup setup;
    setup.map = &map_;
    setup.members = testsupport::membersOf(3);
    setup.staleness = Staleness{Staleness::kInfinite};
    setup.max_clock = 1000;
    setup.ps = &ps_options_;
    for (size_t i = 0; i < cluster_.size(); ++i) {
      const auto self = static_cast<NodeId>(i);
      access_[i] = makeSparseRowAccess(technique, cluster_.node(i),
                                       KeyStore(space_, map_, self, expected_, optimizer_), setup);
    }
    cluster_.connect();
  }
  ~SampleCluster() {
    for (auto& access : access_)
      access->cancelAll({node::ErrorCode::kShutdown, "test over"});
  }

  static KeySpace entities() {
    KeySpace space;
    space.addTable("entities", kRows, kRowFloats);
    return space;
  }
  const KeySpace& space() const { return space_; }
  node::Node& node(size_t i) { return cluster_.node(i); }
  SparseRowAccess& access(size_t i) { return *access_[i]; }
  NodeId home(Key key) const { return map_.home(key); }

  // Node 1 pushes a gradient to every key and waits; the expected model follows (SGD, lr 0.5).
  void pushEverywhere(float grad) {
    const std::vector<Key> keys = space_.allKeys();
    std::vector<float> grads(space_.total(), grad);
    ASSERT_TRUE(access(1).wait(access(1).push(keys, grads)).ok());
    for (float& v : expected_)
      v -= 0.5f * grad;
  }
  // Node `i` localizes `keys` and waits until they arrived.
  void localize(size_t i, const std::vector<Key>& keys) {
    std::promise<node::Status> done;
    access(i).localize(keys, [&done](const node::Status& s) { done.set_value(s); });
    ASSERT_TRUE(done.get_future().get().ok());
  }
  // Every key of `batch` has the expected values.
  void expectCurrent(const SampleBatch& batch) const {
    ASSERT_EQ(batch.offsets.size(), batch.keys.size());
    ASSERT_EQ(batch.values.size(), batch.keys.size() * kRowFloats);
    for (size_t i = 0; i < batch.keys.size(); ++i) {
      const std::span<const float> row = batch.row(i);
      ASSERT_EQ(row.size(), kRowFloats);
      for (size_t j = 0; j < kRowFloats; ++j) {
        EXPECT_FLOAT_EQ(row[j], expected_[batch.keys[i] * kRowFloats + j])
            << "key " << batch.keys[i] << " float " << j;
      }
    }
  }

 private:
  KeySpace space_;
  ShardMap map_;
  PsOptions ps_options_;
  OwnerOptimizer optimizer_;
  std::vector<float> expected_;
  // Declared before the cluster: destroyed after it shut the nodes down, as the data paths
  // require.
  std::unique_ptr<SparseRowAccess> access_[3];
  testsupport::LocalCluster cluster_;
};

sampling::SampleSchemeOptions schemeOf(SampleSchemeKind kind, uint32_t reuse = 2) {
  sampling::SampleSchemeOptions o;
  o.kind = kind;
  o.reuse = kind == SampleSchemeKind::kPool || kind == SampleSchemeKind::kPostpone ? reuse : 1;
  o.group_size = 8;
  return o;
}

// frequency^0.75 over the 30 keys with uneven counts; key 7 has count 0 and is never drawn.
sampling::NegativeSampler skewedPi() {
  std::vector<uint64_t> counts(kRows);
  for (size_t k = 0; k < kRows; ++k)
    counts[k] = 1 + (k * 37) % 101;
  counts[7] = 0;
  return sampling::NegativeSampler::byFrequency(counts, 0.75);
}

std::string techniqueParamName(const ::testing::TestParamInfo<SparseTechnique>& info) {
  return sparseTechniqueName(info.param);
}

class SampleWorkerOn : public ::testing::TestWithParam<SparseTechnique> {};

TEST_P(SampleWorkerOn, PullSampleReturnsTheKeysWithTheirCurrentValues) {
  SampleCluster cluster(GetParam());
  const auto pi = sampling::NegativeSampler::uniform(0, kRows);
  for (auto kind : {SampleSchemeKind::kNaive, SampleSchemeKind::kPreloc, SampleSchemeKind::kPool,
                    SampleSchemeKind::kPostpone, SampleSchemeKind::kOnlyLocal}) {
    SCOPED_TRACE(sampling::sampleSchemeName(kind));
    SampleWorker sampler(cluster.access(0), cluster.space(), pi, schemeOf(kind), 17);
    for (int round = 0; round < 3; ++round) {
      const sampling::SampleId id = sampler.prepareSample(30);
      for (int piece = 0; piece < 3; ++piece) {
        SampleBatch batch;
        ASSERT_TRUE(sampler.pullSample(id, 10, batch).ok());
        ASSERT_EQ(batch.keys.size(), 10u);
        cluster.expectCurrent(batch);
      }
      // The model changes between samples (node 1 pushes to every row, wherever it is now);
      // the next sample reads the new values.
      cluster.pushEverywhere(0.25f * static_cast<float>(round + 1));
    }
    sampler.awaitLocalizes();
    const SampleWorkerStats stats = sampler.stats();
    EXPECT_EQ(stats.scheme.handed_out, 90u);
    EXPECT_EQ(stats.localize_failed, 0u);
    EXPECT_EQ(stats.localize_ended, stats.localize_requests);
    if (kind == SampleSchemeKind::kOnlyLocal) {
      EXPECT_EQ(stats.remote_keys, 0u);
      EXPECT_EQ(stats.localize_requests, 0u);
    } else if (kind == SampleSchemeKind::kNaive || GetParam() == SparseTechnique::kClassic) {
      EXPECT_GT(stats.remote_keys, 0u);  // two thirds of the keys live elsewhere
    }
    if (kind == SampleSchemeKind::kPreloc || kind == SampleSchemeKind::kPool) {
      EXPECT_GT(stats.localize_requests, 0u);
    }
  }
}

// onlylocal reads only rows held here, so its samples send no frame: the node's frame and byte
// counters stay put over 1,000 keys, while naive's move them. Under lapse the local set is what
// the node holds now: rows it localized count (and are drawn), and the draws follow pi
// restricted to that set.
TEST_P(SampleWorkerOn, OnlyLocalSendsNoFrame) {
  SampleCluster cluster(GetParam());
  const bool lapse = GetParam() == SparseTechnique::kLapse;
  std::vector<Key> moved;  // keys homed elsewhere that node 0 holds now
  if (lapse) {
    for (Key k = 0; k < kRows && moved.size() < 4; ++k) {
      if (cluster.home(k) != 0) moved.push_back(k);
    }
    cluster.localize(0, moved);
  }
  std::vector<bool> local(kRows);
  size_t local_keys = 0;
  for (Key k = 0; k < kRows; ++k) {
    local[k] = cluster.access(0).isLocal(k);
    EXPECT_EQ(local[k], cluster.home(k) == 0 || std::count(moved.begin(), moved.end(), k) > 0)
        << "key " << k;
    local_keys += local[k] ? 1 : 0;
  }
  ASSERT_GE(local_keys, 4u);
  ASSERT_LT(local_keys, kRows);
  const auto pi = sampling::NegativeSampler::uniform(0, kRows);
  SampleWorker onlylocal(cluster.access(0), cluster.space(), pi,
                         schemeOf(SampleSchemeKind::kOnlyLocal), 3);
  const node::PeerStats before = cluster.node(0).totals();
  const RowAccessStats access_before = cluster.access(0).stats();
  std::vector<uint64_t> seen(kRows);
  size_t keys = 0;
  for (int s = 0; s < 50; ++s) {
    const sampling::SampleId id = onlylocal.prepareSample(20);
    SampleBatch batch;
    ASSERT_TRUE(onlylocal.pullSample(id, 20, batch).ok());
    cluster.expectCurrent(batch);
    for (Key k : batch.keys) {
      EXPECT_TRUE(local[k]) << "key " << k;
      ++seen[k];
    }
    keys += batch.keys.size();
  }
  EXPECT_EQ(keys, 1000u);
  const node::PeerStats after = cluster.node(0).totals();
  EXPECT_EQ(after.frames_out, before.frames_out);
  EXPECT_EQ(after.bytes_out, before.bytes_out);
  const RowAccessStats access_after = cluster.access(0).stats();
  EXPECT_EQ(access_after.keys_remote, access_before.keys_remote);
  EXPECT_GT(access_after.keys_local, access_before.keys_local);  // read, from this node's rows
  for (Key k : moved)
    EXPECT_GT(seen[k], 0u) << "moved key " << k << " never drawn";
  // pi restricted to the local keys: uniform over them.
  std::vector<double> restricted(kRows);
  for (Key k = 0; k < kRows; ++k)
    restricted[k] = local[k] ? 1.0 / static_cast<double>(local_keys) : 0.0;
  EXPECT_LT(chiSquare(seen, restricted, keys), kChi[degreesOfFreedom(restricted) - 1]);

  // The counters do move when a scheme reads remote keys (naive, same node, same stretch).
  SampleWorker naive(cluster.access(0), cluster.space(), pi, schemeOf(SampleSchemeKind::kNaive), 3);
  const sampling::SampleId id = naive.prepareSample(20);
  SampleBatch batch;
  ASSERT_TRUE(naive.pullSample(id, 20, batch).ok());
  cluster.expectCurrent(batch);
  EXPECT_GT(cluster.node(0).totals().frames_out, after.frames_out);
}

INSTANTIATE_TEST_SUITE_P(Techniques, SampleWorkerOn,
                         ::testing::Values(SparseTechnique::kClassic, SparseTechnique::kLapse),
                         techniqueParamName);

// The conforming schemes under lapse follow pi while rows move: node 0 and node 1 sample from
// the same table at the same time with the same scheme, so preloc and pool pull the rows to
// and fro. Node 0's hand-outs (pool and postpone: per drawn group, hand-outs / U, over whole
// groups) pass Pearson's chi-square against pi at significance 1e-4, and every read succeeds.
class ConformingUnderLapse : public ::testing::TestWithParam<SampleSchemeKind> {};

TEST_P(ConformingUnderLapse, HandOutsFollowPiWhileRowsMove) {
  SampleCluster cluster(SparseTechnique::kLapse);
  const sampling::NegativeSampler pi = skewedPi();
  const SampleSchemeKind kind = GetParam();
  constexpr uint32_t kReuse = 4;
  const sampling::SampleSchemeOptions options = schemeOf(kind, kReuse);
  // 320 samples of 100: 32,000 hand-outs, 1,000 whole groups of 8 keys x 4 for pool.
  constexpr size_t kSamples = 320;
  constexpr size_t kSampleKeys = 100;
  auto sample = [&](size_t node, uint64_t seed, std::vector<uint64_t>* seen) {
    SampleWorker sampler(cluster.access(node), cluster.space(), pi, options, seed);
    for (size_t s = 0; s < kSamples; ++s) {
      const sampling::SampleId id = sampler.prepareSample(kSampleKeys);
      for (int piece = 0; piece < 4; ++piece) {
        SampleBatch batch;
        const node::Status status = sampler.pullSample(id, kSampleKeys / 4, batch);
        ASSERT_TRUE(status.ok()) << status.message();
        ASSERT_EQ(batch.values.size(), batch.keys.size() * kRowFloats);
        if (seen == nullptr) continue;
        for (Key k : batch.keys)
          ++(*seen)[k];
      }
    }
    sampler.awaitLocalizes();
    EXPECT_EQ(sampler.stats().scheme.handed_out, kSamples * kSampleKeys);
  };
  std::vector<uint64_t> seen(kRows);
  std::thread other([&] { sample(1, sampling::workerSeed(5, 1), nullptr); });
  sample(0, sampling::workerSeed(5, 0), &seen);
  other.join();

  uint64_t draws = kSamples * kSampleKeys;
  if (kind == SampleSchemeKind::kPool || kind == SampleSchemeKind::kPostpone) {
    for (uint64_t& count : seen) {
      EXPECT_EQ(count % kReuse, 0u);
      count /= kReuse;
    }
    draws /= kReuse;
  }
  const std::vector<double> p = pi.distribution();
  ASSERT_EQ(degreesOfFreedom(p), 28u);
  EXPECT_LT(chiSquare(seen, p, draws), kChi[27]) << sampling::sampleSchemeName(kind);
  if (kind != SampleSchemeKind::kNaive) {
    EXPECT_GT(cluster.access(0).stats().localized, 0u);  // rows were asked to move here
  }
}

INSTANTIATE_TEST_SUITE_P(Schemes, ConformingUnderLapse,
                         ::testing::Values(SampleSchemeKind::kNaive, SampleSchemeKind::kPreloc,
                                           SampleSchemeKind::kPool, SampleSchemeKind::kPostpone),
                         [](const ::testing::TestParamInfo<SampleSchemeKind>& info) {
                           return std::string(sampling::sampleSchemeName(info.param));
                         });

// preloc under lapse: once the localize prepareSample started has ended, every key of the
// sample is held here: pullSample finds them all local and reads them without a frame, and the
// nodes they came from no longer hold them.
TEST(SampleWorkerLapse, PrelocSamplesAreLocalWhenPulled) {
  SampleCluster cluster(SparseTechnique::kLapse);
  const auto pi = sampling::NegativeSampler::uniform(0, kRows);
  SampleWorker preloc(cluster.access(0), cluster.space(), pi, schemeOf(SampleSchemeKind::kPreloc),
                      9);
  const uint64_t held_before = cluster.access(0).stats().held_keys;
  for (int round = 0; round < 5; ++round) {
    const sampling::SampleId id = preloc.prepareSample(12);
    preloc.awaitLocalizes();
    const node::PeerStats before = cluster.node(0).totals();
    SampleBatch batch;
    ASSERT_TRUE(preloc.pullSample(id, 12, batch).ok());
    cluster.expectCurrent(batch);
    EXPECT_EQ(cluster.node(0).totals().frames_out, before.frames_out) << "round " << round;
    for (Key k : batch.keys) {
      EXPECT_TRUE(cluster.access(0).isLocal(k)) << "key " << k;
      EXPECT_FALSE(cluster.access(1).isLocal(k) || cluster.access(2).isLocal(k)) << "key " << k;
    }
  }
  const SampleWorkerStats stats = preloc.stats();
  EXPECT_EQ(stats.scheme.handed_out, 60u);
  EXPECT_EQ(stats.scheme.local, 60u);
  EXPECT_EQ(stats.remote_keys, 0u);
  EXPECT_GT(stats.localize_requests, 0u);
  EXPECT_EQ(stats.localize_failed, 0u);
  EXPECT_GT(cluster.access(0).stats().held_keys, held_before);
}

// pool under lapse: each drawn key is handed out exactly U times (here 4: hand-outs are U times
// the draws, and every key's count a multiple of U over whole groups), and the reuse is what
// relocation pays for: with the group's localize awaited before each pull, every hand-out is
// local.
TEST(SampleWorkerLapse, PoolHandsEachKeyOutUTimesFromLocalRows) {
  SampleCluster cluster(SparseTechnique::kLapse);
  const auto pi = sampling::NegativeSampler::uniform(0, kRows);
  constexpr uint32_t kReuse = 4;
  SampleWorker pool(cluster.access(0), cluster.space(), pi,
                    schemeOf(SampleSchemeKind::kPool, kReuse), 21);
  std::map<Key, uint64_t> seen;
  // 40 samples of 16: 640 hand-outs, 20 whole groups of 8 keys x 4.
  for (int s = 0; s < 40; ++s) {
    const sampling::SampleId id = pool.prepareSample(16);
    pool.awaitLocalizes();
    SampleBatch batch;
    ASSERT_TRUE(pool.pullSample(id, 16, batch).ok());
    cluster.expectCurrent(batch);
    for (Key k : batch.keys)
      ++seen[k];
  }
  const SampleWorkerStats stats = pool.stats();
  EXPECT_EQ(stats.scheme.handed_out, 640u);
  EXPECT_GE(stats.scheme.drawn * kReuse, stats.scheme.handed_out);  // the pool drew ahead
  for (const auto& [key, count] : seen)
    EXPECT_EQ(count % kReuse, 0u) << "key " << key << " handed out " << count << " times";
  EXPECT_EQ(stats.scheme.local, stats.scheme.handed_out);
  EXPECT_EQ(stats.remote_keys, 0u);
  EXPECT_GT(stats.localize_requests, 0u);
}

// A node that holds none of pi's keys (the others localized all its rows) cannot sample
// onlylocal: an error naming the cause, no hang.
TEST(SampleWorkerLapse, OnlyLocalOnANodeThatHoldsNothingFails) {
  SampleCluster cluster(SparseTechnique::kLapse);
  std::vector<Key> node0;
  for (Key k = 0; k < kRows; ++k) {
    if (cluster.home(k) == 0) node0.push_back(k);
  }
  cluster.localize(1, node0);
  for (Key k = 0; k < kRows; ++k)
    ASSERT_FALSE(cluster.access(0).isLocal(k)) << "key " << k;
  const auto pi = sampling::NegativeSampler::uniform(0, kRows);
  sampling::SampleSchemeOptions options = schemeOf(SampleSchemeKind::kOnlyLocal);
  options.max_draws_per_key = 500;
  SampleWorker nothing(cluster.access(0), cluster.space(), pi, options, 1);
  SampleBatch batch;
  const node::Status status = nothing.pullSample(nothing.prepareSample(5), 5, batch);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("none was local"), std::string::npos) << status.message();
}

TEST(SampleWorker, RefusesADistributionOutsideOneTable) {
  SampleCluster cluster(SparseTechnique::kClassic);
  const auto too_wide = sampling::NegativeSampler::uniform(0, kRows + 1);
  EXPECT_THROW(SampleWorker(cluster.access(0), cluster.space(), too_wide,
                            schemeOf(SampleSchemeKind::kNaive), 1),
               std::invalid_argument);
}

}  // namespace
}  // namespace chorus::ps
