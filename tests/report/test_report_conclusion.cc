// The conclusion `chorus compare` and `chorus report` print after the table (report/conclusion.h):
// which variant reached the target first and why. On hand-made evidence for each way a variant
// can win, and end to end on hand-written metrics files of a PS comparison (BSP, SSP, async).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "report/conclusion.h"
#include "report/report.h"
#include "tests/report/report_folder.h"

namespace chorus::report {
namespace {

VariantEvidence evidence(const std::string& variant, const std::string& bound,
                         std::optional<double> time, double rate, double wait,
                         std::optional<double> updates, double bytes = 1e6) {
  VariantEvidence v;
  v.variant = variant;
  v.ok_runs = 3;
  v.reached = time ? 3 : 0;
  v.time_to_target = time;
  if (time) v.fastest = v.slowest = time;
  v.steps_per_s = rate;
  v.wait_share = wait;
  v.updates_to_target = updates;
  v.bytes_per_node = bytes;
  v.staleness_bound = bound;
  return v;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Conclusion, SspBeatingBothEndsOnWhatAnUpdateIsWorth) {
  const std::string text = conclusionText(
      {evidence("ps:bsp", "0", 60, 5.6, 0.52, 2400), evidence("ps:ssp:3", "3", 40, 9.7, 0.24, 3100),
       evidence("ps:async", "inf", 50, 12.3, 0.03, 5000)},
      "97.0%");
  EXPECT_TRUE(contains(text,
                       "ps:ssp:3 reached 97.0% first, in 40.0 s (median of 3 runs), 1.25x "
                       "sooner than ps:async (50.0 s) and 1.50x sooner than ps:bsp (60.0 s)."))
      << text;
  // Against async (the runner-up) it ran slower but needed fewer updates.
  EXPECT_TRUE(contains(text,
                       "It won on what an update is worth: ps:ssp:3 needed 3100 updates "
                       "against 5000 (bound 3 against no bound), at a lower pace"))
      << text;
  EXPECT_TRUE(contains(text,
                       "Bounded staleness beat both ends: ps:ssp:3 was 1.25x sooner than "
                       "async and 1.50x sooner than BSP."))
      << text;
  EXPECT_FALSE(contains(text, "short of")) << text;  // 1.5x >= the issue's 1.3x
}

TEST(Conclusion, AsyncWinningOnPaceDespiteMoreUpdates) {
  const std::string text = conclusionText({evidence("ps:bsp", "0", 53.5, 5.65, 0.52, 2403),
                                           evidence("ps:ssp:3", "3", 45, 9.71, 0.24, 3185),
                                           evidence("ps:async", "inf", 36, 12.28, 0.03, 3833)},
                                          "97.0%");
  EXPECT_TRUE(contains(text, "ps:async reached 97.0% first, in 36.0 s")) << text;
  EXPECT_TRUE(contains(text,
                       "It won on pace: ps:async ran 12.3 steps/s per node against 9.71, "
                       "106.5 updates/s over all its nodes against 70.8, waiting 3% of its "
                       "time against 24%; that outweighed needing more "
                       "updates to get there, 3833 updates against 3185"))
      << text;
  EXPECT_TRUE(contains(text,
                       "Bounded staleness did not beat both ends: async was 1.25x sooner "
                       "than ps:ssp:3, which was 1.19x sooner than BSP."))
      << text;
}

// One node against a cluster (the sparse demo's single against ps:classic): a cluster node
// runs far fewer steps per second than the lone node, yet its four nodes together outpace it.
// The conclusion must say it won on pace over the whole job, not that nothing separates them.
TEST(Conclusion, AClusterOutpacingOneNodeWinsOnTheWholeJobsPace) {
  const std::string text = conclusionText({evidence("single", "", 0.76, 682, 0, 170),
                                           evidence("ps:classic", "2", 0.63, 101.6, 0.82, 257)},
                                          "MRR 0.250");
  EXPECT_TRUE(contains(text, "ps:classic reached MRR 0.250 first")) << text;
  EXPECT_TRUE(contains(text,
                       "It won on pace: ps:classic ran 101.6 steps/s per node against 682.0, "
                       "407.9 updates/s over all its nodes against 223.7"))
      << text;
  EXPECT_FALSE(contains(text, "Neither pace")) << text;
}

TEST(Conclusion, BspWinningOnExactUpdates) {
  const std::string text = conclusionText(
      {evidence("ps:bsp", "0", 80, 3.8, 0.7, 2400), evidence("ps:ssp:3", "3", 88, 3.9, 0.68, 2800),
       evidence("ps:async", "inf", 100, 4, 0.6, 3900)},
      "97.0%");
  EXPECT_TRUE(contains(text,
                       "It won on what an update is worth: ps:bsp needed 2400 updates "
                       "against 2800 (bound 0 against bound 3), at a lower pace (3.80 "
                       "steps/s per node against 3.90, 30.0 updates/s over all its nodes "
                       "against 31.8"))
      << text;
  EXPECT_TRUE(contains(text,
                       "Bounded staleness did not beat both ends: BSP was 1.10x sooner than "
                       "ps:ssp:3."))
      << text;
}

TEST(Conclusion, LevelVariantsAreCalledLevelAndOverlappingSeedsSaid) {
  std::vector<VariantEvidence> variants = {evidence("ps:ssp:3", "3", 39.5, 9.7, 0.24, 3185),
                                           evidence("ps:async", "inf", 39.4, 12.3, 0.03, 3833)};
  std::string text = conclusionText(variants, "97.0%");
  EXPECT_TRUE(contains(text, "ps:async and ps:ssp:3 reached 97.0% level, in 39.4 s and 39.5 s"))
      << text;
  EXPECT_FALSE(contains(text, "won")) << text;

  variants = {evidence("a", "", 30, 1, 0.1, 100), evidence("b", "", 36, 1.2, 0.1, 120)};
  variants[0].slowest = 40;
  variants[1].fastest = 28;
  text = conclusionText(variants, "90.0%");
  EXPECT_TRUE(contains(text,
                       "a reached 90.0% first, in 30.0 s (median of 3 runs), 1.20x sooner "
                       "than b (36.0 s). Their seeds overlap (a took up to 40.0 s, b as "
                       "little as 28.0 s)."))
      << text;
  // Not PS: no bound to name, and no map sentence.
  EXPECT_FALSE(contains(text, "map")) << text;
}

TEST(Conclusion, TheMapSentenceSaysWhetherTheBoundBeatBothEnds) {
  // Level with async (the transient-straggler pass of docs/ps-experiment.md).
  std::string text = conclusionText({evidence("ps:bsp", "0", 53.5, 5.65, 0.52, 2403),
                                     evidence("ps:ssp:3", "3", 39.5, 9.71, 0.24, 3185),
                                     evidence("ps:async", "inf", 39.4, 12.28, 0.03, 3833)},
                                    "97.0%");
  EXPECT_TRUE(contains(text,
                       "Bounded staleness did not beat both ends: ps:ssp:3 was level with "
                       "async, 1.35x sooner than BSP."))
      << text;
  // Ahead of both, but less than 1.3x ahead of BSP.
  text = conclusionText({evidence("ps:bsp", "0", 48, 5.65, 0.52, 2403),
                         evidence("ps:ssp:3", "3", 40, 9.71, 0.24, 3185),
                         evidence("ps:async", "inf", 44, 12.28, 0.03, 4400)},
                        "97.0%");
  EXPECT_TRUE(contains(text,
                       "Bounded staleness beat both ends: ps:ssp:3 was 1.10x sooner than "
                       "async and 1.20x sooner than BSP, short of the 1.3x over BSP"))
      << text;
}

TEST(Conclusion, VariantsThatMissedTheTarget) {
  std::string text =
      conclusionText({evidence("ps:ssp:3", "3", std::nullopt, 9, 0.2, std::nullopt),
                      evidence("ps:async", "inf", std::nullopt, 12, 0.03, std::nullopt)},
                     "97.0%");
  EXPECT_TRUE(contains(text,
                       "no variant reached 97.0% in at least half of its runs "
                       "(ps:ssp:3 (0/3), ps:async (0/3) reached it)"))
      << text;
  text = conclusionText({evidence("ps:bsp", "0", 50, 5, 0.5, 2400),
                         evidence("ps:async", "inf", std::nullopt, 12, 0.03, std::nullopt)},
                        "97.0%");
  EXPECT_TRUE(contains(text,
                       "ps:bsp reached 97.0% first, in 50.0 s (median of 3 runs). "
                       "ps:async (0/3) did not reach it"))
      << text;
  EXPECT_EQ(conclusionText({}, "97.0%"), "");
}

class ConclusionFromMetrics : public ReportFolderTest {
 protected:
  // One node's file: steps every `interval` seconds up to 20 s (1000 bytes each), test accuracy
  // 0.9 (the target) first at `target_time`, and a final line.
  static std::string node(const std::string& bound, double interval, double target_time,
                          double wait) {
    std::string text = line(R"("event":"start","time":0,"mode":"ps","staleness":")" + bound +
                            R"(","shard_samples":100)");
    int steps = 0;
    for (double t = interval; t <= 20 + 1e-9; t += interval, ++steps) {
      std::string more = R"("wait_s":0.1,"bytes_sent":1000)";
      if (std::abs(t - target_time) < 1e-9) more += R"(,"test_accuracy":0.9)";
      text += stepLine("step", steps, t, more);
    }
    text += line(R"("event":"final","time":20.5,"test_accuracy":0.92,"steps":)" +
                 std::to_string(steps) + R"(,"seconds":20,"wait_s":)" + std::to_string(wait) +
                 R"(,"time_to_target":)" + std::to_string(target_time));
    return text;
  }
};

TEST_F(ConclusionFromMetrics, APsComparisonWhereSspWinsIsExplainedFromTheFiles) {
  write("runs.jsonl",
        line(R"("event":"compare","command":"chorus compare","target_acc":0.9,)"
             R"("variants":"ps:bsp,ps:ssp:2,ps:async")") +
            line(R"("event":"run","variant":"ps:bsp","seed":1,"dir":"bsp","status":"ok")") +
            line(R"("event":"run","variant":"ps:ssp:2","seed":1,"dir":"ssp","status":"ok")") +
            line(R"("event":"run","variant":"ps:async","seed":1,"dir":"async","status":"ok")"));
  for (const char* id : {"0", "1"}) {
    write(std::string("bsp/node-") + id + ".jsonl", node("0", 1.0, 10, 10));
    write(std::string("ssp/node-") + id + ".jsonl", node("2", 0.5, 6, 4));
    write(std::string("async/node-") + id + ".jsonl", node("inf", 0.4, 8, 1));
  }
  const Report report = buildReport(loadReportInput(dir_));
  const std::vector<VariantEvidence> evidence = gatherEvidence(report);
  ASSERT_EQ(evidence.size(), 3u);
  // Updates: both nodes' steps up to node 0's target; bytes: per node until then.
  EXPECT_EQ(evidence[0].updates_to_target, 20);  // 1 s steps to 10 s
  EXPECT_EQ(evidence[1].updates_to_target, 24);  // 0.5 s steps to 6 s
  EXPECT_EQ(evidence[2].updates_to_target, 40);  // 0.4 s steps to 8 s
  EXPECT_DOUBLE_EQ(evidence[1].bytes_per_node, 12000);
  EXPECT_FALSE(evidence[1].bytes_whole_run);
  EXPECT_DOUBLE_EQ(evidence[2].steps_per_s, 2.5);
  EXPECT_DOUBLE_EQ(evidence[1].wait_share, 0.2);

  const std::string text = conclusion(report);
  EXPECT_TRUE(contains(text,
                       "Conclusion: ps:ssp:2 reached 90.0% first, in 6.00 s (one run), "
                       "1.33x sooner than ps:async (8.00 s) and 1.67x sooner than ps:bsp "
                       "(10.0 s)."))
      << text;
  EXPECT_TRUE(contains(text, "ps:ssp:2 needed 24 updates against 40 (bound 2 against no bound)"))
      << text;
  EXPECT_TRUE(contains(text,
                       "A node of ps:ssp:2 sent 12.0 kB until node 0 reached the target, "
                       "against 20.0 kB for ps:async."))
      << text;
  // report.md has it between the table and how to read it.
  const std::string md = reportMarkdown(report, PlotSet{});
  const size_t at = md.find(text);
  ASSERT_NE(at, std::string::npos) << md;
  EXPECT_LT(md.find("| ps:async |"), at);
  EXPECT_GT(md.find("How to read it"), at);
}

TEST_F(ConclusionFromMetrics, NoTargetNoConclusion) {
  write("run/node-0.jsonl", node("2", 0.5, -1, 4));
  const Report report = buildReport(loadReportInput(dir_ / "run"));
  EXPECT_EQ(conclusion(report), "");
}

}  // namespace
}  // namespace chorus::report
