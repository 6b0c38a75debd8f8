// The metrics files say `step` for a training step in every mode (run::kStepName); files written
// before said `round` (consensus, single) or `clock` (PS). `chorus report` reads both: the same
// runs written in either vocabulary give the same report, byte for byte.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "report/report.h"
#include "report/run_metrics.h"
#include "tests/report/report_folder.h"

namespace chorus::report {
namespace {

// `text` with the mode's old step word (`round` or `clock`) replaced by `step` where the metrics
// use it: the step events and their field, the target's and the rejoin's field, the final
// line's count and first step. `read_clock` (a PS read's clock, not a step) stays.
std::string toStepNames(std::string text, const std::string& word) {
  const std::vector<std::pair<std::string, std::string>> names = {
      {"\"event\":\"" + word + "\"", "\"event\":\"step\""},
      {"\"" + word + "\":", "\"step\":"},
      {"\"" + word + "s\":", "\"steps\":"},
      {"\"first_" + word + "\":", "\"first_step\":"}};
  for (const auto& [from, to] : names) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
      text.replace(at, from.size(), to);
      at += to.size();
    }
  }
  return text;
}

class ReportStepNamesTest : public ReportFolderTest {
 protected:
  // A compare folder of one consensus and one PS run (a crash, a rejoin, a target), each node
  // file given in the old vocabulary and written through `convert`.
  template <class Convert>
  void writeRuns(const std::string& root, Convert convert) {
    write(root + "/runs.jsonl",
          line(R"("event":"compare","command":"chorus compare","target_acc":0.8,)"
               R"("variants":"consensus:dynamic,ps:bsp")") +
              line(R"("event":"run","variant":"consensus:dynamic","seed":1,)"
                   R"("dir":"consensus-dynamic/seed-1","status":"ok","error":"")") +
              line(R"("event":"run","variant":"ps:bsp","seed":1,"dir":"ps-bsp/seed-1",)"
                   R"("status":"ok","error":"")"));
    const std::string consensus_start =
        line(R"("event":"start","time":0,"mode":"consensus","node":0,"backup":"dynamic",)"
             R"("shard_samples":100,"stragglers":"none")");
    std::string rounds;
    for (int r = 0; r < 4; ++r) {
      rounds += stepLine("round", r, r + 1,
                         R"("backups":1,"used":1,"wait_s":0.2,"bytes_sent":500,)"
                         R"("staleness_mean":0.5)" +
                             std::string(r == 2 ? R"(,"test_accuracy":0.81)" : ""));
    }
    write(root + "/consensus-dynamic/seed-1/node-0.jsonl",
          convert(consensus_start + rounds +
                      line(R"("event":"target","time":3,"round":2,"test_accuracy":0.81,)"
                           R"("seconds":3)") +
                      line(R"("event":"final","time":4,"test_accuracy":0.84,"rounds":4,)"
                           R"("first_round":0,"seconds":4,"wait_s":0.8,"time_to_target":3,)"
                           R"("average_accuracy":0.85,"departed_peers":[1])"),
                  "round"));
    write(root + "/consensus-dynamic/seed-1/node-1.jsonl",
          convert(consensus_start + stepLine("round", 0, 1, R"("backups":0,"wait_s":0.1)") +
                      stepLine("round", 1, 2, R"("backups":0,"wait_s":0.1)"),
                  "round"));
    const std::string ps_start =
        line(R"("event":"start","time":0,"mode":"ps","node":0,"staleness":0,)"
             R"("shard_samples":100,"stragglers":"none")");
    std::string clocks;
    for (int c = 0; c < 6; ++c) {
      clocks += stepLine("clock", c, c + 1,
                         R"("wait_s":0.1,"bytes_sent":1000)" +
                             std::string(c == 3 ? R"(,"test_accuracy":0.7)" : ""));
    }
    write(root + "/ps-bsp/seed-1/node-0.jsonl",
          convert(ps_start + clocks +
                      line(R"("event":"final","test_accuracy":0.82,"clocks":6,"seconds":6.5,)"
                           R"("wait_s":1,"time_to_target":-1,"failed_pulls":0,)"
                           R"("failed_pushes":0,"departed_peers":[],)"
                           R"("lost_updates":[{"node":2,"from_clock":2,"to_clock":4}])"),
                  "clock"));
    write(root + "/ps-bsp/seed-1/node-2.jsonl",
          convert(ps_start + stepLine("clock", 0, 1) + stepLine("clock", 1, 2) + ps_start +
                      line(R"("event":"rejoin","time":0.1,"from":0,"clock":4,"read_clock":3)") +
                      stepLine("clock", 4, 1) + stepLine("clock", 5, 2) +
                      line(R"("event":"final","test_accuracy":0.8,"clocks":6,"first_clock":4,)"
                           R"("seconds":2,"wait_s":0.2,"time_to_target":-1,"failed_pulls":0,)"
                           R"("failed_pushes":0,"departed_peers":[],"lost_updates":[])"),
                  "clock"));
  }
};

TEST_F(ReportStepNamesTest, FilesWithStepAndWithRoundOrClockGiveTheSameReport) {
  writeRuns("old", [](std::string text, const std::string&) { return text; });
  writeRuns("new", &toStepNames);
  // The conversion did its work: no old step word is left where the metrics name a step.
  const std::string ps_new = read("new/ps-bsp/seed-1/node-2.jsonl");
  EXPECT_FALSE(contains(ps_new, "\"clock\"") || contains(ps_new, "\"clocks\"") ||
               contains(ps_new, "first_clock"))
      << ps_new;
  EXPECT_TRUE(contains(ps_new, R"("event":"step")") && contains(ps_new, R"("read_clock":3)"))
      << ps_new;

  const Report old_report = buildReport(loadReportInput(dir_ / "old"));
  const Report new_report = buildReport(loadReportInput(dir_ / "new"));
  ASSERT_EQ(new_report.metrics.size(), 2u);
  EXPECT_EQ(new_report.metrics[0].nodes[0].steps.size(), 4u);
  EXPECT_EQ(new_report.metrics[1].nodes[1].lives, 2);
  EXPECT_EQ(new_report.metrics[1].nodes[1].last_life_first_step, 4);
  EXPECT_DOUBLE_EQ(new_report.runs[1].steps_per_s, (6.0 / 6.5 + 2.0 / 2) / 2);
  EXPECT_EQ(summaryCsv(new_report), summaryCsv(old_report));
  EXPECT_EQ(markdownTable(new_report), markdownTable(old_report));
  EXPECT_TRUE(contains(summaryCsv(new_report), "node 2 stopped")) << summaryCsv(new_report);
  ASSERT_EQ(new_report.events.size(), old_report.events.size());
  for (size_t run = 0; run < new_report.events.size(); ++run) {
    ASSERT_EQ(new_report.events[run].size(), old_report.events[run].size());
    for (size_t e = 0; e < new_report.events[run].size(); ++e)
      EXPECT_EQ(new_report.events[run][e].text, old_report.events[run][e].text);
  }
  EXPECT_EQ(new_report.warnings, old_report.warnings);
  // The progress line of a running compare reads both as well.
  const auto old_progress = readProgress(dir_ / "old/ps-bsp/seed-1/node-0.jsonl");
  const auto new_progress = readProgress(dir_ / "new/ps-bsp/seed-1/node-0.jsonl");
  ASSERT_TRUE(old_progress && new_progress);
  EXPECT_EQ(new_progress->step, 5);
  EXPECT_EQ(new_progress->step, old_progress->step);
  EXPECT_EQ(new_progress->test_accuracy, old_progress->test_accuracy);
}

// A sparse model's `step` lines (every --log-every steps, counting the steps done) are not the
// training loop's: a file without the loop's start event keeps them out of the steps, as when
// they were the only `step` lines.
TEST_F(ReportStepNamesTest, ASparseModelsStepLinesAreNotLoopSteps) {
  write("sparse/node-0.jsonl",
        line(R"("event":"start","time":0,"mode":"ps","train_points":1000,"shard_points":500)") +
            line(R"("event":"step","time":1,"epoch":1,"step":100,"loss":0.5)") +
            line(R"("event":"final","test_accuracy":0)"));
  const RunMetrics metrics = readRunFolder(dir_ / "sparse");
  ASSERT_EQ(metrics.nodes.size(), 1u);
  EXPECT_TRUE(metrics.nodes[0].steps.empty());
}

}  // namespace
}  // namespace chorus::report
