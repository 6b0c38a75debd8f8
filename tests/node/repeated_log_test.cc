// RepeatedLog: the first of a run of like events is logged, the repeats are counted and said at
// most once per interval, and what is left when the run ends.
#include "node/repeated_log.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/node/test_util.h"

namespace chorus::node {
namespace {

using namespace std::chrono_literals;

size_t countOf(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
    ++n;
  return n;
}

TEST(RepeatedLog, OneLineForTheFirstThenOneSummaryPerIntervalAndTheRestAtTheEnd) {
  auto capture = std::make_shared<testing::LogCapture>();
  spdlog::logger log("repeat-test", capture);
  RepeatedLog::Clock::time_point now{};
  {
    RepeatedLog lost(log, spdlog::level::warn, "a push was lost", 10s, [&] { return now; });
    for (int i = 0; i < 100; ++i) {  // one per 0.5 s: 50 s in all
      lost.add("owner 3 is down (" + std::to_string(i) + ")");
      now += 500ms;
    }
    EXPECT_EQ(lost.total(), 100u);
    // The first line and one summary per 10 s, not 100 lines.
    EXPECT_EQ(countOf(capture->all(), "a push was lost"), 5u) << capture->all();
  }
  const std::string all = capture->all();
  EXPECT_NE(all.find("a push was lost: owner 3 is down (0) (repeats are counted"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("(100 in all), the last: owner 3 is down (99)"), std::string::npos) << all;
  EXPECT_EQ(countOf(all, "a push was lost"), 6u) << all;
}

TEST(RepeatedLog, ASingleEventIsOneLineAndNoSummary) {
  auto capture = std::make_shared<testing::LogCapture>();
  spdlog::logger log("repeat-test-1", capture);
  {
    RepeatedLog once(log, spdlog::level::warn, "a push was lost");
    once.add("owner 1 is down");
  }
  EXPECT_EQ(countOf(capture->all(), "a push was lost"), 1u) << capture->all();
}

}  // namespace
}  // namespace chorus::node

namespace chorus::node {
namespace {

TEST(RefusalLog, TheFirstFewOfEachPeerThenOneInEvery) {
  RefusalLog refusals(/*first=*/3, /*every=*/10);
  std::vector<uint64_t> said;
  for (uint64_t n = 1; n <= 30; ++n) {
    if (refusals.count(7)) said.push_back(n);
  }
  EXPECT_EQ(said, (std::vector<uint64_t>{1, 2, 3, 10, 20, 30}));
  EXPECT_TRUE(refusals.count(8)) << "each peer has its own count";
  EXPECT_EQ(refusals.countOf(7), 30u);
  EXPECT_EQ(refusals.countOf(8), 1u);
  EXPECT_EQ(refusals.countOf(9), 0u);
  EXPECT_EQ(refusals.total(), 31u);
}

}  // namespace
}  // namespace chorus::node
