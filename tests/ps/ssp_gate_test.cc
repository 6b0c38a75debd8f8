// The owner's SSP gate without a network: clock checks, gaps, parked reads, down time-outs,
// BSP's held pushes and a restored view. Time is passed in.
#include "ps/ssp_gate.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace chorus::ps {
namespace {

using namespace std::chrono_literals;
using TimePoint = SspGate::TimePoint;

TEST(SspGate, ChecksSendersAndClocksBeforeAnythingMoves) {
  SspGate gate({0, 1}, GateOptions{.max_clock = 10});
  EXPECT_NE(gate.checkSender(5, 0, "pull")->find("node 5, which is not a worker"),
            std::string::npos);
  EXPECT_NE(gate.checkSender(0, -1, "push")->find("which no run reaches"), std::string::npos);
  EXPECT_NE(gate.checkSender(0, kClockCeiling, "push")->find("which no run reaches"),
            std::string::npos);
  EXPECT_EQ(gate.checkSender(0, 3, "pull"), std::nullopt);
  EXPECT_NE(gate.checkWithinRun(11, "PsClock")->find("outside this run's clocks 0..10"),
            std::string::npos);
  ASSERT_EQ(gate.advance(0, 4).error, std::nullopt);
  EXPECT_NE(gate.checkNotBehind(0, 3, "push")->find("clock going backwards"), std::string::npos);
  EXPECT_EQ(gate.checkNotBehind(0, 4, "push"), std::nullopt);
  EXPECT_NE(gate.advance(0, 2).error->find("went backwards"), std::string::npos);
}

TEST(SspGate, ReadsWaitForTheSlowestCountedWorkerAndReportWhomTheyWaitFor) {
  SspGate gate({0, 1, 2}, GateOptions{.report_every = 5000ms});
  const TimePoint t0{};
  std::vector<int> answered;
  EXPECT_FALSE(gate.whenReady(
      0, [&] { answered.push_back(0); }, t0));
  EXPECT_TRUE(gate.whenReady(
      2, [&] { answered.push_back(2); }, t0));
  EXPECT_TRUE(gate.whenReady(
      1, [&] { answered.push_back(1); }, t0));
  EXPECT_EQ(answered, std::vector<int>{0});
  EXPECT_FALSE(gate.waitReport(t0 + 4s));
  const auto report = gate.waitReport(t0 + 5s);
  ASSERT_TRUE(report);
  EXPECT_EQ(report->parked, 2u);
  EXPECT_EQ(report->needed, 1);
  EXPECT_EQ(report->lagging, (std::vector<WorkerId>{0, 1, 2}));
  EXPECT_FALSE(gate.waitReport(t0 + 6s));  // one report per report_every
  for (WorkerId w : {0u, 1u, 2u})
    gate.advance(w, 1);
  EXPECT_EQ(answered, (std::vector<int>{0, 1}));
  gate.advance(0, 2);
  gate.advance(1, 2);
  // Worker 2 goes down; after its time-out it stops counting and the read is answered.
  EXPECT_TRUE(gate.workerDown(2, true, t0 + 10s));
  EXPECT_TRUE(gate.expire(t0 + 19s).empty());
  const auto excluded = gate.expire(t0 + 20s);
  ASSERT_EQ(excluded.size(), 1u);
  EXPECT_EQ(excluded[0], (std::pair<WorkerId, Clock>{2, 1}));
  EXPECT_EQ(answered, (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(gate.counted(2));
  EXPECT_TRUE(gate.workerUp(2));
  EXPECT_TRUE(gate.counted(2));
  // A finished worker's departure starts no time-out.
  gate.workerFinished(1);
  EXPECT_FALSE(gate.workerDown(1, false, t0 + 30s));
}

TEST(SspGate, BspHoldsPushesUntilTheirClockIsCompleteThenHandsThemOutInOrder) {
  SspGate gate({0, 1}, GateOptions{.bsp = true});
  gate.hold(1, 0, {{1}, {1.0f}});
  gate.hold(0, 0, {{1}, {2.0f}});
  gate.hold(0, 0, {{2}, {3.0f}});
  gate.hold(0, 1, {{1}, {4.0f}});
  EXPECT_TRUE(gate.takeDue().empty());
  gate.advance(0, 2);
  EXPECT_TRUE(gate.takeDue().empty());  // worker 1 is still in clock 0
  gate.advance(1, 1);
  auto due = gate.takeDue();
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].first, 0);
  ASSERT_EQ(due[0].second.size(), 3u);
  // Worker order, then arrival order within a worker's clock.
  EXPECT_EQ(due[0].second[0].grads[0], 2.0f);
  EXPECT_EQ(due[0].second[1].grads[0], 3.0f);
  EXPECT_EQ(due[0].second[2].grads[0], 1.0f);
  gate.advance(1, 2);
  due = gate.takeDue();
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].first, 1);
  EXPECT_TRUE(gate.takeDue().empty());
}

TEST(SspGate, AJumpIsAGapUnlessTheClockIsARestoredView) {
  SspGate gate({0, 1}, GateOptions{});
  gate.advance(0, 1);
  gate.advance(0, 2);
  const auto jump = gate.advance(0, 7);
  ASSERT_TRUE(jump.gap);
  EXPECT_EQ(jump.gap->from, 2);
  EXPECT_EQ(jump.gap->to, 7);

  // A rejoined owner takes another owner's view: requests below it are no replay until the
  // worker's own announcement confirms its clock, and the first jump is no gap.
  SspGate fresh({0, 1}, GateOptions{});
  fresh.restore({{0, 30, true}, {1, 28, false}});
  EXPECT_EQ(fresh.clockOf(0), 30);
  EXPECT_TRUE(fresh.counted(1));  // who the helper counted is not taken over
  EXPECT_EQ(fresh.checkNotBehind(0, 29, "push"), std::nullopt);
  EXPECT_FALSE(fresh.advance(0, 29).gap);
  EXPECT_EQ(fresh.clockOf(0), 30);
  EXPECT_FALSE(fresh.advance(0, 34).gap);
  EXPECT_NE(fresh.checkNotBehind(0, 33, "push"), std::nullopt);
}

// A rejoining node takes the workers' clocks from a peer's PsCatchupReply: an impostor's
// INT64_MAX, a negative clock, a clock past the run, a stranger or a worker named twice is
// refused before any clock moves.
TEST(SspGate, ARestoredViewMustHoldClocksThisRunCanHave) {
  SspGate gate({0, 1}, GateOptions{.max_clock = 11});
  EXPECT_EQ(gate.checkViews({{0, 11, true}, {1, 0, false}}), std::nullopt);
  EXPECT_EQ(gate.checkViews({}), std::nullopt);
  auto refused = [&](const std::vector<WorkerView>& views, const std::string& why) {
    const std::optional<std::string> error = gate.checkViews(views);
    ASSERT_TRUE(error.has_value()) << why;
    EXPECT_NE(error->find(why), std::string::npos) << *error;
  };
  refused({{0, 3, true}, {1, INT64_MAX, true}}, "worker node 1 at clock 9223372036854775807");
  refused({{0, -1, true}}, "outside this run's clocks 0..11");
  refused({{0, 12, true}}, "worker node 0 at clock 12, outside this run's clocks 0..11");
  refused({{7, 1, true}}, "node 7, which is not a worker of this run");
  refused({{0, 1, true}, {0, 2, true}}, "two clocks for worker node 0");
  // Without a run limit the ceiling still holds.
  SspGate unlimited({0}, GateOptions{});
  EXPECT_NE(unlimited.checkViews({{0, kClockCeiling, true}}), std::nullopt);
  EXPECT_EQ(unlimited.checkViews({{0, kClockCeiling - 1, true}}), std::nullopt);
  EXPECT_EQ(gate.clockOf(1), 0);
}

TEST(SspGate, AFirstRequestFromAHighClockShowsARunningJob) {
  SspGate gate({0, 1}, GateOptions{});
  EXPECT_EQ(gate.startedLate(0, 1, 1), std::nullopt);  // every worker announces clock 1 first
  EXPECT_EQ(gate.startedLate(0, 0, 0), std::nullopt);
  EXPECT_EQ(gate.startedLate(0, 57, 0), std::optional<bool>(true));
  gate.workerDown(1, /*dropped=*/true, TimePoint{});
  EXPECT_EQ(gate.startedLate(1, 57, 0), std::optional<bool>(false));
  gate.advance(0, 1);
  EXPECT_EQ(gate.startedLate(0, 57, 0), std::nullopt);
}

}  // namespace
}  // namespace chorus::ps
