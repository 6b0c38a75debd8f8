// The end-of-run wait both distributed modes share.
#include "run/membership.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

namespace chorus::run {
namespace {

using namespace std::chrono_literals;

spdlog::logger quietLogger() {
  return spdlog::logger("settle-test", std::make_shared<spdlog::sinks::null_sink_mt>());
}

TEST(Membership, SortsMembersIntoFinishedDepartedAndUnsettledAtTheTimeOut) {
  Membership members(0, {0, 1, 2, 3});
  EXPECT_EQ(members.others(), (std::vector<uint32_t>{1, 2, 3}));
  members.finished(1);
  members.down(2);
  SettleOptions options;
  options.timeout = 50ms;
  options.report_every = 10ms;
  auto log = quietLogger();
  const PeerSettlement s = members.settle(options, log);
  EXPECT_EQ(s.finished, std::vector<uint32_t>{1});
  EXPECT_EQ(s.departed, std::vector<uint32_t>{2});
  EXPECT_EQ(s.unsettled, std::vector<uint32_t>{3});
}

TEST(Membership, DoesTheCallersWorkWhileWaitingAndReturnsWhenTheLastMemberFinished) {
  Membership members(0, {0, 7});
  int requests = 1, answered = 0;  // the caller's state, under the membership's lock
  SettleOptions options;
  options.timeout = 60s;
  options.has_work = [&] { return requests > 0; };
  // The work runs with the lock released; answering the request is what lets member 7 finish.
  options.work = [&] {
    {
      auto lock = members.lock();
      --requests;
      ++answered;
    }
    members.finished(7);
  };
  auto log = quietLogger();
  const PeerSettlement s = members.settle(options, log);
  EXPECT_EQ(s.finished, std::vector<uint32_t>{7});
  EXPECT_TRUE(s.unsettled.empty());
  EXPECT_EQ(answered, 1);
}

TEST(Membership, StopEndsTheWaitAtOnce) {
  Membership members(0, {0, 4});
  members.stop();
  SettleOptions options;
  options.timeout = 60s;
  auto log = quietLogger();
  const PeerSettlement s = members.settle(options, log);
  EXPECT_EQ(s.unsettled, std::vector<uint32_t>{4});
}

// A member that came back up is no longer counted as departed.
TEST(Membership, UpUndoesDown) {
  Membership members(3, {1, 3});
  members.down(1);
  EXPECT_TRUE(members.isDown(1));
  members.up(1);
  EXPECT_FALSE(members.isDown(1));
  EXPECT_TRUE(members.downPeers().empty());
}

}  // namespace
}  // namespace chorus::run
