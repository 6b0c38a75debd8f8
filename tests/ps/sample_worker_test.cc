// The sampling primitives over the real runtime (ps/sample_worker.h): three nodes on loopback,
// port 0, each with a KvServer and a KvWorker; node 0 samples. pullSample returns the keys the
// scheme handed out with their current values for every scheme; onlylocal sends no frame (the
// node's frame and byte counters do not move, while naive's do); preloc's localize, executed as
// a read ahead until relocation lands, leaves the sample in the row cache.
#include "ps/sample_worker.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <vector>

#include "node/node.h"
#include "ps/key_localizer.h"
#include "ps/kv_server.h"
#include "ps/kv_worker.h"
#include "sampling/negative_sampler.h"
#include "tests/support/local_cluster.h"

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;
using sampling::SampleSchemeKind;

constexpr size_t kRows = 40;
constexpr size_t kRowFloats = 3;

// Nodes 0..2, each an owner and a worker of one table of 40 rows of 3 floats, float i of the
// flat model starting at i. Heartbeats are an hour apart, so that a node's frame counters move
// only with PS traffic while a test runs.
class SampleCluster {
 public:
  explicit SampleCluster(Staleness staleness, bool cache)
      : space_(entities()),
        cluster_(3, 0,
                 testsupport::NodeSettings{
                     .cluster = "sample-test", .heartbeat_interval = 1h, .peer_timeout = 2h}),
        map_(testsupport::membersOf(3)),
        directory_(map_, space_) {
    optimizer_.sgd.momentum = 0;
    optimizer_.schedule.baseLr = 0.5;
    expected_.resize(space_.total());
    for (size_t i = 0; i < expected_.size(); ++i)
      expected_[i] = static_cast<float>(i);
    ServerOptions server;
    server.bsp = !staleness.infinite() && staleness.bound == 0;
    WorkerOptions worker;
    worker.staleness = staleness;
    worker.cache = cache;
    for (size_t i = 0; i < cluster_.size(); ++i) {
      const auto self = static_cast<NodeId>(i);
      members_[i].server = std::make_unique<KvServer>(
          cluster_.node(i), KeyStore(space_, map_, self, expected_, optimizer_),
          testsupport::membersOf(3), server);
      members_[i].worker = std::make_unique<KvWorker>(cluster_.node(i), *members_[i].server, map_,
                                                      space_, optimizer_, worker);
    }
    cluster_.connect();
  }
  ~SampleCluster() {
    for (Member& m : members_)
      m.worker->cancelAll({node::ErrorCode::kShutdown, "test over"});
  }

  static KeySpace entities() {
    KeySpace space;
    space.addTable("entities", kRows, kRowFloats);
    return space;
  }
  const KeySpace& space() const { return space_; }
  node::Node& node(size_t i) { return cluster_.node(i); }
  KvWorker& worker(size_t i) { return *members_[i].worker; }
  const KeyDirectory& directory() const { return directory_; }

  // Worker 1 pushes a gradient to every key and waits; the expected model follows (SGD, lr 0.5).
  void pushEverywhere(float grad) {
    const std::vector<Key> keys = space_.allKeys();
    std::vector<float> grads(space_.total(), grad);
    ASSERT_TRUE(worker(1).wait(worker(1).push(keys, grads)).ok());
    for (float& v : expected_)
      v -= 0.5f * grad;
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
  struct Member {
    std::unique_ptr<KvServer> server;
    std::unique_ptr<KvWorker> worker;
  };
  // Declared before the cluster: destroyed after it shut the nodes down, as KvServer and
  // KvWorker require.
  Member members_[3];
  KeySpace space_;
  testsupport::LocalCluster cluster_;
  ShardMap map_;
  KeyDirectory directory_;
  OwnerOptimizer optimizer_;
  std::vector<float> expected_;
};

sampling::SampleSchemeOptions schemeOf(SampleSchemeKind kind) {
  sampling::SampleSchemeOptions o;
  o.kind = kind;
  o.reuse = 2;
  o.group_size = 8;
  return o;
}

TEST(SampleWorker, PullSampleReturnsTheKeysWithTheirCurrentValues) {
  SampleCluster cluster(Staleness{Staleness::kInfinite}, /*cache=*/false);
  const auto pi = sampling::NegativeSampler::uniform(0, kRows);
  PrefetchLocalizer localizer(cluster.worker(0), cluster.space());
  for (auto kind : {SampleSchemeKind::kNaive, SampleSchemeKind::kPreloc, SampleSchemeKind::kPool,
                    SampleSchemeKind::kPostpone, SampleSchemeKind::kOnlyLocal}) {
    SCOPED_TRACE(sampling::sampleSchemeName(kind));
    SampleWorker sampler(cluster.worker(0), cluster.space(), pi, schemeOf(kind), 17,
                         ownedHere(cluster.directory(), 0), localizer);
    for (int round = 0; round < 3; ++round) {
      const sampling::SampleId id = sampler.prepareSample(30);
      for (int piece = 0; piece < 3; ++piece) {
        SampleBatch batch;
        ASSERT_TRUE(sampler.pullSample(id, 10, batch).ok());
        ASSERT_EQ(batch.keys.size(), 10u);
        cluster.expectCurrent(batch);
      }
      // The model changes between samples; the next sample reads the new values.
      cluster.pushEverywhere(0.25f * static_cast<float>(round + 1));
    }
    const SampleWorkerStats stats = sampler.stats();
    EXPECT_EQ(stats.scheme.handed_out, 90u);
    if (kind == SampleSchemeKind::kOnlyLocal) {
      EXPECT_EQ(stats.remote_keys, 0u);
      EXPECT_EQ(stats.localize_requests, 0u);
    } else {
      EXPECT_GT(stats.remote_keys, 0u);  // two thirds of the keys live elsewhere
    }
    if (kind == SampleSchemeKind::kPreloc || kind == SampleSchemeKind::kPool) {
      EXPECT_GT(stats.localize_requests, 0u);
    }
  }
}

TEST(SampleWorker, OnlyLocalSendsNoFrame) {
  SampleCluster cluster(Staleness{Staleness::kInfinite}, /*cache=*/false);
  const auto pi = sampling::NegativeSampler::uniform(0, kRows);
  PrefetchLocalizer localizer(cluster.worker(0), cluster.space());
  SampleWorker onlylocal(cluster.worker(0), cluster.space(), pi,
                         schemeOf(SampleSchemeKind::kOnlyLocal), 3,
                         ownedHere(cluster.directory(), 0), localizer);
  const node::PeerStats before = cluster.node(0).totals();
  const WorkerStats worker_before = cluster.worker(0).stats();
  size_t keys = 0;
  for (int s = 0; s < 50; ++s) {
    const sampling::SampleId id = onlylocal.prepareSample(20);
    SampleBatch batch;
    ASSERT_TRUE(onlylocal.pullSample(id, 20, batch).ok());
    cluster.expectCurrent(batch);
    for (Key k : batch.keys)
      EXPECT_EQ(cluster.directory().owner(k), 0u) << "key " << k;
    keys += batch.keys.size();
  }
  EXPECT_EQ(keys, 1000u);
  const node::PeerStats after = cluster.node(0).totals();
  EXPECT_EQ(after.frames_out, before.frames_out);
  EXPECT_EQ(after.bytes_out, before.bytes_out);
  const WorkerStats worker_after = cluster.worker(0).stats();
  EXPECT_EQ(worker_after.messages_sent, worker_before.messages_sent);
  EXPECT_EQ(worker_after.keys_remote, worker_before.keys_remote);
  EXPECT_GT(worker_after.keys_local, worker_before.keys_local);  // read, from this node's server

  // The counters do move when a scheme reads remote keys (naive, same node, same stretch).
  SampleWorker naive(cluster.worker(0), cluster.space(), pi, schemeOf(SampleSchemeKind::kNaive), 3,
                     ownedHere(cluster.directory(), 0), localizer);
  const sampling::SampleId id = naive.prepareSample(20);
  SampleBatch batch;
  ASSERT_TRUE(naive.pullSample(id, 20, batch).ok());
  cluster.expectCurrent(batch);
  EXPECT_GT(cluster.node(0).totals().frames_out, after.frames_out);
}

// Wraps the prefetching localizer and tells the test when every read ahead ended.
class CountingLocalizer final : public KeyLocalizer {
 public:
  explicit CountingLocalizer(KeyLocalizer& inner) : inner_(inner) {}
  void localize(std::span<const Key> keys, Done done) override {
    inner_.localize(keys, [this, done = std::move(done)](const node::Status& status) {
      done(status);
      ended_.set_value(status);
    });
  }
  // The status of the one localize this test expects.
  node::Status ended() { return ended_.get_future().get(); }

 private:
  KeyLocalizer& inner_;
  std::promise<node::Status> ended_;
};

// Until relocation lands, preloc's localize reads the sample ahead: once that read ended, the
// sample's keys come from the worker's row cache (SSP, bound 1), without a frame.
TEST(SampleWorker, APrefetchedSampleIsReadFromTheRowCache) {
  SampleCluster cluster(Staleness{1}, /*cache=*/true);
  const auto pi = sampling::NegativeSampler::uniform(0, kRows);
  PrefetchLocalizer prefetch(cluster.worker(0), cluster.space());
  CountingLocalizer localizer(prefetch);
  SampleWorker preloc(cluster.worker(0), cluster.space(), pi, schemeOf(SampleSchemeKind::kPreloc),
                      9, ownedHere(cluster.directory(), 0), localizer);
  const sampling::SampleId id = preloc.prepareSample(25);
  ASSERT_TRUE(localizer.ended().ok());
  EXPECT_EQ(preloc.stats().localize_requests, 1u);
  const node::PeerStats before = cluster.node(0).totals();
  SampleBatch batch;
  ASSERT_TRUE(preloc.pullSample(id, 25, batch).ok());
  cluster.expectCurrent(batch);
  EXPECT_GT(preloc.stats().remote_keys, 0u);  // remote keys, all served from the cache
  EXPECT_EQ(cluster.node(0).totals().frames_out, before.frames_out);
  EXPECT_EQ(preloc.stats().localize_failed, 0u);
}

TEST(SampleWorker, RefusesBadDistributionsAndReportsAnEmptyNode) {
  SampleCluster cluster(Staleness{Staleness::kInfinite}, /*cache=*/false);
  PrefetchLocalizer localizer(cluster.worker(0), cluster.space());
  const auto too_wide = sampling::NegativeSampler::uniform(0, kRows + 1);
  EXPECT_THROW(
      SampleWorker(cluster.worker(0), cluster.space(), too_wide, schemeOf(SampleSchemeKind::kNaive),
                   1, ownedHere(cluster.directory(), 0), localizer),
      std::invalid_argument);
  // onlylocal on a node that holds none of pi's keys: an error naming the cause, no hang.
  const auto pi = sampling::NegativeSampler::uniform(0, kRows);
  sampling::SampleSchemeOptions options = schemeOf(SampleSchemeKind::kOnlyLocal);
  options.max_draws_per_key = 500;
  SampleWorker nothing(
      cluster.worker(0), cluster.space(), pi, options, 1, [](Key) { return false; }, localizer);
  SampleBatch batch;
  const node::Status status = nothing.pullSample(nothing.prepareSample(5), 5, batch);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("none was local"), std::string::npos) << status.message();
}

}  // namespace
}  // namespace chorus::ps
