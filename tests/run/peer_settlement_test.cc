// The end-of-run wait both modes share.
#include "run/peer_settlement.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

namespace chorus::run {
namespace {

using namespace std::chrono_literals;

spdlog::logger quietLogger() {
  return spdlog::logger("settle-test", std::make_shared<spdlog::sinks::null_sink_mt>());
}

TEST(SettlePeers, SortsMembersIntoFinishedDepartedAndUnsettledAtTheTimeOut) {
  std::mutex mu;
  std::condition_variable changed;
  std::set<uint32_t> done{1}, down{2};
  bool stopped = false;
  SettleOptions options;
  options.timeout = 50ms;
  options.report_every = 10ms;
  auto log = quietLogger();
  std::unique_lock lock(mu);
  const PeerSettlement s = settlePeers(lock, changed, {1, 2, 3}, done, down, stopped, options, log);
  EXPECT_EQ(s.finished, std::vector<uint32_t>{1});
  EXPECT_EQ(s.departed, std::vector<uint32_t>{2});
  EXPECT_EQ(s.unsettled, std::vector<uint32_t>{3});
}

TEST(SettlePeers, DoesTheCallersWorkWhileWaitingAndReturnsWhenTheLastMemberFinished) {
  std::mutex mu;
  std::condition_variable changed;
  std::set<uint32_t> done, down;
  bool stopped = false;
  int requests = 1, answered = 0;
  SettleOptions options;
  options.timeout = 60s;
  options.has_work = [&] { return requests > 0; };
  // The work runs with the lock released; answering the request is what lets member 7 finish.
  options.work = [&] {
    std::lock_guard guard(mu);
    --requests;
    ++answered;
    done.insert(7);
  };
  auto log = quietLogger();
  std::unique_lock lock(mu);
  const PeerSettlement s = settlePeers(lock, changed, {7}, done, down, stopped, options, log);
  EXPECT_EQ(s.finished, std::vector<uint32_t>{7});
  EXPECT_TRUE(s.unsettled.empty());
  EXPECT_EQ(answered, 1);
}

TEST(SettlePeers, StopEndsTheWaitAtOnce) {
  std::mutex mu;
  std::condition_variable changed;
  std::set<uint32_t> done, down;
  bool stopped = true;
  SettleOptions options;
  options.timeout = 60s;
  auto log = quietLogger();
  std::unique_lock lock(mu);
  const PeerSettlement s = settlePeers(lock, changed, {4}, done, down, stopped, options, log);
  EXPECT_EQ(s.unsettled, std::vector<uint32_t>{4});
}

}  // namespace
}  // namespace chorus::run
