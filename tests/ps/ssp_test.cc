#include "ps/ssp.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

namespace chorus::ps {
namespace {

TEST(Staleness, Parses) {
  EXPECT_EQ(Staleness::read("0").value().bound, 0);
  EXPECT_EQ(Staleness::read("bsp").value().bound, 0);
  EXPECT_EQ(Staleness::read("3").value().bound, 3);
  EXPECT_TRUE(Staleness::read("inf").value().infinite());
  EXPECT_TRUE(Staleness::read("async").value().infinite());
  EXPECT_EQ(Staleness::read("inf").value().toString(), "inf");
  for (const char* bad : {"", "-1", "x", "3.5", "1e3"}) {
    EXPECT_FALSE(Staleness::read(bad).ok()) << bad;
  }
}

TEST(WorkerClocks, BspParksUntilEveryoneFinishedTheClock) {
  WorkerClocks clocks({0, 1, 2}, Staleness{0});
  EXPECT_TRUE(clocks.ready(0));
  int released = 0;
  clocks.whenReady(1, [&] { ++released; });  // worker at clock 1 needs all at >= 1
  EXPECT_EQ(released, 0);
  EXPECT_EQ(clocks.laggingBehind(1), (std::vector<WorkerId>{0, 1, 2}));
  EXPECT_FALSE(clocks.advance(0, 1).has_value());
  EXPECT_FALSE(clocks.advance(1, 1).has_value());
  EXPECT_EQ(released, 0);
  EXPECT_EQ(clocks.laggingBehind(1), (std::vector<WorkerId>{2}));
  EXPECT_FALSE(clocks.advance(2, 1).has_value());
  EXPECT_EQ(released, 1);
  EXPECT_EQ(clocks.parked(), 0u);
}

TEST(WorkerClocks, StalenessAllowsReadsAhead) {
  WorkerClocks clocks({0, 1}, Staleness{2});
  EXPECT_TRUE(clocks.ready(2));  // clock 2 - s = 0: nothing required yet
  EXPECT_FALSE(clocks.ready(3));
  WorkerClocks async({0, 1}, Staleness::read("inf").value());
  EXPECT_TRUE(async.ready(1'000'000));
}

TEST(WorkerClocks, RejectsUnknownWorkersAndBackwardClocks) {
  WorkerClocks clocks({0, 1}, Staleness{0});
  EXPECT_EQ(*clocks.advance(7, 1), "clock from unknown worker 7");
  EXPECT_FALSE(clocks.advance(0, 3).has_value());
  EXPECT_EQ(*clocks.advance(0, 2), "clock of worker 0 went backwards: 2 after 3");
  EXPECT_EQ(clocks.clockOf(0), 3);
}

TEST(WorkerClocks, ExcludingADeadWorkerReleasesWhoWaitedForIt) {
  WorkerClocks clocks({0, 1, 2}, Staleness{0});
  clocks.advance(0, 1);
  clocks.advance(1, 1);
  bool released = false;
  clocks.whenReady(1, [&] { released = true; });
  EXPECT_EQ(clocks.exclude(2), 0);
  EXPECT_TRUE(released);
  EXPECT_FALSE(clocks.exclude(2).has_value());  // already out
  clocks.include(2, 1);
  EXPECT_EQ(clocks.minClock(), 1);
}

TEST(WorkerClocks, ReleasesInOrderAndAllowsReentry) {
  WorkerClocks clocks({0, 1}, Staleness{0});
  std::vector<int> order;
  clocks.whenReady(2, [&] { order.push_back(2); });
  clocks.whenReady(1, [&] {
    order.push_back(1);
    // A release may park another pull (re-entrancy).
    clocks.whenReady(3, [&] { order.push_back(3); });
  });
  clocks.advance(0, 5);
  clocks.advance(1, 2);
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  clocks.advance(1, 3);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

// The SSP guarantee over a random schedule: workers advance at random speeds, every read
// is answered only when allowed, and no answered read at clock c misses an update from a
// clock <= c - s - 1 of any worker.
TEST(WorkerClocks, SspGuaranteeHoldsOverRandomSchedules) {
  for (int64_t s : {0, 1, 3}) {
    std::mt19937_64 rng(100 + s);
    const int n = 4;
    std::vector<WorkerId> ids = {0, 1, 2, 3};
    WorkerClocks clocks(ids, Staleness{s});
    std::vector<Clock> worker_clock(n, 0);
    // updates_applied[w] = highest clock of w whose update the owner has applied, + 1.
    std::vector<Clock> applied(n, 0);
    int answered = 0;
    for (int step = 0; step < 4000; ++step) {
      int w = static_cast<int>(rng() % n);
      Clock c = worker_clock[w];
      if (rng() % 2 == 0) {
        // A read at clock c: when answered, check every update <= c - s - 1 is applied.
        clocks.whenReady(c, [&, c] {
          ++answered;
          for (int v = 0; v < n; ++v)
            ASSERT_GE(applied[v], c - s) << "reader clock " << c;
        });
      } else if (c - clocks.minClock() <= s + 1) {
        // Finish iteration c: its update is applied (FIFO), then the clock moves on. A worker
        // never runs further ahead than its own reads allow, as a real worker blocks.
        applied[w] = c + 1;
        worker_clock[w] = c + 1;
        clocks.advance(w, c + 1);
      }
    }
    EXPECT_GT(answered, 500) << "s=" << s;
  }
}

TEST(RowCacheRule, FreshWithinTheBound) {
  RowCacheRule bsp(Staleness{0}), ssp(Staleness{2}), async(Staleness::read("inf").value());
  EXPECT_TRUE(bsp.fresh(5, 5));
  EXPECT_FALSE(bsp.fresh(4, 5));
  EXPECT_TRUE(ssp.fresh(3, 5));
  EXPECT_FALSE(ssp.fresh(2, 5));
  EXPECT_TRUE(async.fresh(0, 1000));
}

}  // namespace
}  // namespace chorus::ps
