// --technique auto's data path over the real runtime (ps/sparse_row_access_auto.cc): three nodes
// on loopback, port 0, one table of 30 rows of 3 floats, keys 0-2 replicated, keys 3-5
// relocated, every other key left at its home. A key left at home is read and written through
// the classic path (KvWorker and KvServer: keys_home counts it, the relocation shell never sees
// it), under an SSP bound whose clocks reach the classic servers through the relocation shell's
// announcements, and a localize moves only the relocated keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "node/node.h"
#include "ps/ps_peer.h"
#include "ps/sparse_row_access.h"
#include "tests/support/local_cluster.h"

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;

constexpr size_t kRows = 30;
constexpr size_t kRowFloats = 3;
constexpr float kLr = 0.5f;

class AutoCluster {
 public:
  explicit AutoCluster(Staleness staleness)
      : space_(entities()),
        map_(testsupport::membersOf(3)),
        cluster_(3, 0,
                 testsupport::NodeSettings{
                     .cluster = "auto-path", .heartbeat_interval = 1h, .peer_timeout = 2h}) {
    optimizer_.sgd.momentum = 0;
    optimizer_.schedule.baseLr = kLr;
    expected_.resize(space_.total());
    for (size_t i = 0; i < expected_.size(); ++i)
      expected_[i] = static_cast<float>(i);
    RowAccessSetup setup;
    setup.map = &map_;
    setup.members = testsupport::membersOf(3);
    setup.staleness = staleness;
    setup.max_clock = 1000;
    setup.ps = &ps_options_;
    setup.replicas.keys = {0, 1, 2};
    setup.replicas.initial.assign(expected_.begin(), expected_.begin() + 3 * kRowFloats);
    setup.replicas.policy = std::make_shared<SgdPolicy>(optimizer_);
    setup.replicas.syncs_per_second = 50;
    setup.replicas.technique = SparseTechnique::kAuto;
    setup.relocated = {3, 4, 5};
    for (size_t i = 0; i < cluster_.size(); ++i) {
      const auto self = static_cast<NodeId>(i);
      access_[i] = makeSparseRowAccess(SparseTechnique::kAuto, cluster_.node(i),
                                       KeyStore(space_, map_, self, expected_, optimizer_), setup);
    }
    cluster_.connect();
    for (auto& access : access_)
      access->startRun();
  }
  // The nodes stop delivering first; the data paths go while the nodes still exist (the replica
  // shell's destructor stops its timer on its node).
  ~AutoCluster() {
    for (auto& access : access_)
      access->cancelAll({node::ErrorCode::kShutdown, "test over"});
    for (size_t i = 0; i < cluster_.size(); ++i)
      cluster_.node(i).shutdown(std::chrono::milliseconds(0));
    for (auto& access : access_)
      access.reset();
  }

  static KeySpace entities() {
    KeySpace space;
    space.addTable("entities", kRows, kRowFloats);
    return space;
  }
  SparseRowAccess& access(size_t i) { return *access_[i]; }
  NodeId home(Key key) const { return map_.home(key); }
  float expected(Key key, size_t j) const { return expected_[key * kRowFloats + j]; }
  void pushed(Key key, float grad) {
    for (size_t j = 0; j < kRowFloats; ++j)
      expected_[key * kRowFloats + j] -= kLr * grad;
  }

  // Waits for `handle` of node `i`, at most 60 s (a read whose SSP condition never comes true
  // would otherwise hang the test).
  node::Status waitFor(size_t i, SparseRowAccess::Handle handle) {
    auto done = std::async(std::launch::async, [&] { return access(i).wait(handle); });
    if (done.wait_for(60s) != std::future_status::ready) {
      access(i).cancelAll({node::ErrorCode::kTimeout, "the test waited 60 s"});
    }
    return done.get();
  }

 private:
  KeySpace space_;
  ShardMap map_;
  PsOptions ps_options_;
  OwnerOptimizer optimizer_;
  std::vector<float> expected_;
  // Reset by the destructor after the nodes shut down, before the cluster destroys them.
  std::unique_ptr<SparseRowAccess> access_[3];
  testsupport::LocalCluster cluster_;
};

// The first key left at home whose home is `owner`.
Key homeKeyOf(const AutoCluster& cluster, NodeId owner) {
  for (Key key = 6; key < kRows; ++key) {
    if (cluster.home(key) == owner) return key;
  }
  ADD_FAILURE() << "no home key of node " << owner;
  return 6;
}

TEST(AutoRowAccess, HomeKeysGoThroughTheClassicPath) {
  AutoCluster cluster(Staleness{Staleness::kInfinite});
  const Key remote = homeKeyOf(cluster, 1);  // node 0 reads it from node 1
  const Key own = homeKeyOf(cluster, 0);
  const RowAccessStats before = cluster.access(0).stats();

  std::vector<float> out(kRowFloats);
  ASSERT_TRUE(cluster.waitFor(0, cluster.access(0).pull(std::vector<Key>{remote}, out)).ok());
  for (size_t j = 0; j < kRowFloats; ++j)
    EXPECT_FLOAT_EQ(out[j], cluster.expected(remote, j));
  RowAccessStats after = cluster.access(0).stats();
  EXPECT_EQ(after.keys_home, before.keys_home + 1);
  EXPECT_EQ(after.keys_remote, before.keys_remote + 1);
  EXPECT_EQ(after.localized, before.localized);

  // A write through node 0 is read by node 2 (the home applied it: SGD, lr 0.5).
  const std::vector<float> grads(kRowFloats, 2.0f);
  ASSERT_TRUE(cluster.waitFor(0, cluster.access(0).push(std::vector<Key>{remote}, grads)).ok());
  cluster.pushed(remote, 2.0f);
  ASSERT_TRUE(cluster.waitFor(2, cluster.access(2).pull(std::vector<Key>{remote}, out)).ok());
  for (size_t j = 0; j < kRowFloats; ++j)
    EXPECT_FLOAT_EQ(out[j], cluster.expected(remote, j));

  // A mixed read (a replicated key, a relocated one, a home key here and one elsewhere) lands
  // every row in its place; the two home keys count as the classic path's.
  const RowAccessStats mixed_before = cluster.access(0).stats();
  std::vector<Key> keys = {1, 4, own, remote};
  std::sort(keys.begin(), keys.end());
  std::vector<float> rows(keys.size() * kRowFloats);
  ASSERT_TRUE(cluster.waitFor(0, cluster.access(0).pull(keys, rows)).ok());
  for (size_t k = 0; k < keys.size(); ++k) {
    for (size_t j = 0; j < kRowFloats; ++j)
      EXPECT_FLOAT_EQ(rows[k * kRowFloats + j], cluster.expected(keys[k], j)) << "key " << keys[k];
  }
  after = cluster.access(0).stats();
  EXPECT_EQ(after.keys_home, mixed_before.keys_home + 2);
  EXPECT_EQ(after.keys_replica, mixed_before.keys_replica + 1);

  // A localize moves only the relocated key; the home key stays where it is.
  std::promise<node::Status> localized;
  cluster.access(0).localize(std::vector<Key>{4, remote},
                             [&](const node::Status& s) { localized.set_value(s); });
  ASSERT_TRUE(localized.get_future().get().ok());
  EXPECT_TRUE(cluster.access(0).isLocal(4));
  EXPECT_FALSE(cluster.access(0).isLocal(remote));
  EXPECT_TRUE(cluster.access(0).isLocal(own));
  EXPECT_TRUE(cluster.access(0).isLocal(1));  // replicated
  EXPECT_EQ(cluster.access(0).stats().localized, after.localized + 1);
}

// Under a bound of 1 a read at clock c waits until every worker reached c - 1 at the key's home.
// The classic workers announce nothing themselves: each clock reaches the other nodes' classic
// servers through the relocation shell's PsClock, or these reads would wait for ever. Every
// node reads and writes a home key of the next node at every clock; the values at the end hold
// every push.
TEST(AutoRowAccess, ClocksReachTheClassicServersThroughTheRelocationShell) {
  AutoCluster cluster(Staleness{1});
  constexpr int kClocks = 6;
  std::vector<std::thread> workers;
  std::vector<node::Status> failures(3);
  for (size_t i = 0; i < 3; ++i) {
    workers.emplace_back([&, i] {
      const Key key = homeKeyOf(cluster, static_cast<NodeId>((i + 1) % 3));
      std::vector<float> out(kRowFloats);
      const std::vector<float> grads(kRowFloats, 1.0f);
      for (int c = 0; c < kClocks; ++c) {
        node::Status s = cluster.waitFor(i, cluster.access(i).pull(std::vector<Key>{key}, out));
        if (s.ok()) s = cluster.waitFor(i, cluster.access(i).push(std::vector<Key>{key}, grads));
        if (!s.ok()) {
          failures[i] = s;
          return;
        }
        cluster.access(i).clock();
      }
    });
  }
  for (auto& w : workers)
    w.join();
  for (size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(failures[i].ok()) << "node " << i << ": " << failures[i].message();
  // The end-of-run read: every worker reached the last clock; node 0 reads all three keys.
  std::vector<Key> keys;
  for (NodeId owner = 0; owner < 3; ++owner)
    keys.push_back(homeKeyOf(cluster, owner));
  std::sort(keys.begin(), keys.end());
  std::vector<float> rows(keys.size() * kRowFloats);
  ASSERT_TRUE(cluster.waitFor(0, cluster.access(0).pullAt(kClocks, keys, rows)).ok());
  for (size_t k = 0; k < keys.size(); ++k) {
    cluster.pushed(keys[k], static_cast<float>(kClocks));
    for (size_t j = 0; j < kRowFloats; ++j)
      EXPECT_FLOAT_EQ(rows[k * kRowFloats + j], cluster.expected(keys[k], j)) << "key " << keys[k];
  }
  // A pull and a push per clock, and node 0's end-of-run read of the three keys.
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(cluster.access(i).stats().keys_home, 2u * kClocks + (i == 0 ? keys.size() : 0))
        << "node " << i;
}

}  // namespace
}  // namespace chorus::ps
