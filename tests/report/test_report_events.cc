// Crashes, rejoins and lost updates in a report: read from hand-written metrics files that look
// like what nodes write when a crash:NODE@STEP term fires, when a node rejoins, and when PS
// owners drop a worker; checked in the events, the table, summary.csv, report.md and the
// accuracy plot's script.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "report/json_line.h"
#include "report/report.h"
#include "report/run_events.h"
#include "report/run_metrics.h"
#include "tests/report/report_folder.h"

namespace chorus::report {
namespace {

class ReportEventsTest : public ReportFolderTest {
 protected:
  // A one-run compare folder: VARIANT seed 1 in VARIANT-DIR/seed-1, target 0.8.
  void writeManifest(const std::string& variant, const std::string& run_dir) {
    write("runs.jsonl",
          line(R"("event":"compare","command":"chorus compare","target_acc":0.8,"variants":")" +
               variant + "\"") +
              line(R"("event":"run","variant":")" + variant + R"(","seed":1,"dir":")" + run_dir +
                   R"(","status":"ok","error":"")"));
  }

  // PS clocks first..last at times first+1.., with accuracies at clocks 1, 3 and 5.
  static std::string psClocks(int first, int last, double time_offset = 0) {
    std::string text;
    for (int c = first; c <= last; ++c) {
      std::string more = R"("wait_s":0.1,"bytes_sent":1000)";
      if (c == 1) more += R"(,"test_accuracy":0.5)";
      if (c == 3) more += R"(,"test_accuracy":0.7)";
      if (c == 5) more += R"(,"test_accuracy":0.8)";
      text += stepLine("clock", c, c + 1 - time_offset, more);
    }
    return text;
  }

  static std::string psStart(const std::string& stragglers) {
    return line(R"("event":"start","time":0,"mode":"ps","staleness":0,"stragglers":")" +
                stragglers + "\"");
  }

  static std::vector<std::string> texts(const std::vector<RunEvent>& events) {
    std::vector<std::string> out;
    for (const RunEvent& e : events)
      out.push_back(e.text);
    return out;
  }
};

// PS: node 3 crashes as injected (crash:3@4: clocks 0-2 written, no final line), the owners drop
// it (node 0 at clock 3, node 1 at clock 4) and count the pushes and reads that failed.
TEST_F(ReportEventsTest, AnInjectedPsCrashAndItsLostUpdatesAreInTableCsvReportAndPlot) {
  writeManifest("ps:bsp", "ps-bsp/seed-1");
  write("ps-bsp/seed-1/node-0.jsonl",
        psStart("crash:3@4") + psClocks(0, 5) +
            line(R"("event":"final","test_accuracy":0.82,"clocks":6,"first_clock":0,)"
                 R"("seconds":6.5,"wait_s":1,"time_to_target":6,"failed_pulls":1,)"
                 R"("failed_pushes":2,"finished_peers":[1],"departed_peers":[3],)"
                 R"("lost_updates":[{"node":3,"from_clock":3}],"owner_accuracy":0.81)"));
  write("ps-bsp/seed-1/node-1.jsonl",
        psStart("crash:3@4") + psClocks(0, 5) +
            line(R"("event":"final","test_accuracy":0.8,"clocks":6,"seconds":6.5,"wait_s":1,)"
                 R"("time_to_target":6,"failed_pulls":0,"failed_pushes":3,)"
                 R"("departed_peers":[3],"lost_updates":[{"node":3,"from_clock":4}])"));
  write("ps-bsp/seed-1/node-3.jsonl", psStart("crash:3@4") + psClocks(0, 2));

  const Report report = buildReport(loadReportInput(dir_));
  ASSERT_EQ(report.events.size(), 1u);
  const std::vector<RunEvent>& events = report.events[0];
  ASSERT_EQ(events.size(), 3u) << testing::PrintToString(texts(events));
  EXPECT_EQ(events[0].kind, RunEvent::Kind::kCrash);
  EXPECT_EQ(events[0].node, 3u);
  EXPECT_EQ(events[0].step, 2);
  EXPECT_EQ(events[0].text, "node 3 crashed after step 2, at 3.0 s (injected: crash:3@4)");
  ASSERT_TRUE(events[0].marked());
  EXPECT_DOUBLE_EQ(*events[0].time, 3.0);
  EXPECT_EQ(events[1].kind, RunEvent::Kind::kDropped);
  EXPECT_EQ(events[1].text,
            "PS owners dropped node 3 at steps 3-4: its updates from then on are lost");
  EXPECT_FALSE(events[1].marked());  // its crash is the mark
  EXPECT_EQ(events[2].kind, RunEvent::Kind::kFailedOps);
  EXPECT_EQ(events[2].text,
            "5 pushes (their updates lost) and 1 read failed while an owner was down");

  EXPECT_TRUE(
      contains(markdownTable(report), "| 1 crash, 1 dropped, 5 failed pushes, 1 failed read |"))
      << markdownTable(report);
  const std::string csv = summaryCsv(report);
  EXPECT_TRUE(contains(csv,
                       ",staleness_bound,crashes,rejoins,dropped,failed_pushes,failed_pulls,"
                       "events\n"))
      << csv;
  EXPECT_TRUE(contains(csv,
                       ",0,1,0,1,5,1,\"node 3 crashed after step 2, at 3.0 s (injected: "
                       "crash:3@4); PS owners dropped node 3 at steps 3-4: its updates from "
                       "then on are lost; 5 pushes (their updates lost) and 1 read failed "
                       "while an owner was down\"\n"))
      << csv;

  writeReportFiles(report, dir_);
  const std::string md = read("report.md");
  EXPECT_TRUE(contains(md, "## Events")) << md;
  EXPECT_TRUE(contains(md, "- ps:bsp seed 1: node 3 crashed after step 2, at 3.0 s")) << md;
  // A mark on node 0's curve (50% at 2 s, 70% at 4 s): 60% at the crash's 3 s; a dashed line
  // and the label above the data, in ps:bsp's red.
  const std::string gp = read("plots/accuracy-vs-time.gp");
  EXPECT_TRUE(contains(gp, "$events0 << EOD\n3 60 2\nEOD\n")) << gp;
  EXPECT_TRUE(contains(gp,
                       "set arrow from first 3, graph 0 to first 3, graph 0.965 nohead dt 2 lw 1.5 "
                       "lc rgb \"#d62728\"\n"))
      << gp;
  EXPECT_TRUE(contains(gp, "set label \"node 3 crashed (step 2)\" at first 3, graph 0.965 ")) << gp;
  EXPECT_TRUE(contains(gp, "set offsets 0, 0, graph 0.25, 0\n")) << gp;
  EXPECT_TRUE(contains(gp, "title \"node crashed or stopped (its metrics end)\"")) << gp;
}

// PS: node 2 is killed (no crash term) after clock 1 and rejoins at clock 4; the owners lost its
// clocks 2-3. The rejoin is placed on the plot where node 0 was at clock 4.
TEST_F(ReportEventsTest, AKilledNodesRejoinAndItsLostClocksAreEvents) {
  writeManifest("ps:bsp", "ps-bsp/seed-1");
  write("ps-bsp/seed-1/node-0.jsonl",
        psStart("none") + psClocks(0, 5) +
            line(R"("event":"final","test_accuracy":0.82,"clocks":6,"seconds":6.5,"wait_s":1,)"
                 R"("time_to_target":6,"failed_pulls":0,"failed_pushes":0,"departed_peers":[],)"
                 R"("lost_updates":[{"node":2,"from_clock":2,"to_clock":4}])"));
  write("ps-bsp/seed-1/node-2.jsonl",
        psStart("none") + psClocks(0, 1) + psStart("none") +
            line(R"("event":"rejoin","time":0.1,"from":0,"clock":4,"read_clock":3)") +
            psClocks(4, 5, 4) +
            line(R"("event":"final","test_accuracy":0.8,"clocks":6,"first_clock":4,)"
                 R"("seconds":2,"wait_s":0.2,"time_to_target":-1,"failed_pulls":0,)"
                 R"("failed_pushes":0,"departed_peers":[],"lost_updates":[])"));
  const Report report = buildReport(loadReportInput(dir_));
  const std::vector<RunEvent>& events = report.events[0];
  EXPECT_EQ(texts(events), (std::vector<std::string>{
                               "node 2 stopped after step 1, at 2.0 s, with no final line "
                               "(killed, or crashed)",
                               "node 2's updates of steps 2-3 are lost (it rejoined at step 4)",
                               "node 2 rejoined at step 4",
                           }));
  ASSERT_EQ(events.size(), 3u);
  ASSERT_TRUE(events[2].marked());
  EXPECT_DOUBLE_EQ(*events[2].time, 5.0);  // node 0 logged clock 4 at 5 s
  EXPECT_TRUE(contains(markdownTable(report), "| 1 crash, 1 rejoin |")) << markdownTable(report);
  EXPECT_TRUE(contains(summaryCsv(report), ",0,1,1,0,0,0,\"node 2 stopped")) << summaryCsv(report);
  writePlots(report, dir_);
  const std::string gp = read("plots/accuracy-vs-time.gp");
  // Its stop (at 2 s, its own clock) and its rejoin: next to each other, in two label rows.
  EXPECT_TRUE(contains(gp, "$events0 << EOD\n2 50 2\n5 75 6\nEOD\n")) << gp;
  EXPECT_TRUE(contains(gp, "set label \"node 2 stopped (step 1)\" at first 2, graph 0.965 ")) << gp;
  EXPECT_TRUE(contains(gp, "set label \"node 2 rejoined (step 4)\" at first 5, graph 0.92 ")) << gp;
  EXPECT_TRUE(contains(gp, "title \"node rejoined\"")) << gp;
}

// Consensus: the crashed node's neighbors list it in departed_peers; there are no PS counts, and
// summary.csv leaves them empty rather than 0.
TEST_F(ReportEventsTest, AConsensusCrashIsADepartureWithoutPsCounts) {
  writeManifest("consensus:dynamic", "consensus-dynamic/seed-1");
  const std::string start =
      line(R"("event":"start","time":0,"mode":"consensus","backup":"dynamic",)"
           R"("stragglers":"shifted-exp:5,15+crash:1@3")");
  std::string rounds;
  for (int r = 0; r < 4; ++r) {
    rounds += stepLine("round", r, r + 1,
                       R"("backups":0,"used":1,"test_accuracy":0.)" + std::to_string(5 + r));
  }
  write("consensus-dynamic/seed-1/node-0.jsonl",
        start + rounds +
            line(R"("event":"final","test_accuracy":0.85,"rounds":4,"seconds":4,"wait_s":0,)"
                 R"("time_to_target":4,"finished_peers":[],"departed_peers":[1])"));
  // Crashed after its 3rd step: rounds 0 and 1 written.
  write("consensus-dynamic/seed-1/node-1.jsonl",
        start + stepLine("round", 0, 1, R"("backups":0)") + stepLine("round", 1, 2));
  const Report report = buildReport(loadReportInput(dir_));
  EXPECT_EQ(texts(report.events[0]),
            (std::vector<std::string>{
                "node 1 crashed after step 1, at 2.0 s (injected: crash:1@3)",
                "the others went on without node 1 (it left before the end)",
            }));
  EXPECT_TRUE(contains(markdownTable(report), "| 1 crash, 1 dropped |")) << markdownTable(report);
  EXPECT_TRUE(contains(summaryCsv(report), ",1,0,1,,,\"node 1 crashed after step 1"))
      << summaryCsv(report);
}

// A node whose file ends early without reaching its crash term was not the injected crash; a
// cut last line (killed while writing) is still skipped with a warning, as before.
// A lost_updates item of another shape is skipped with a warning too.
TEST_F(ReportEventsTest, AStopBeforeTheCrashStepIsNotCalledTheInjectedCrash) {
  write("node-0.jsonl", psStart("crash:1@10") + psClocks(0, 3) +
                            line(R"("event":"final","test_accuracy":0.8,"clocks":4,"seconds":4,)"
                                 R"("lost_updates":[7,{"node":1}])"));
  write("node-1.jsonl", psStart("crash:1@10") + psClocks(0, 1) + R"({"event":"clock","ti)");
  const Report report = buildReport(loadReportInput(dir_));
  ASSERT_EQ(report.warnings.size(), 3u);
  EXPECT_TRUE(contains(report.warnings[0],
                       "node-0.jsonl:6: a lost_updates item without node and from_clock (7)"))
      << report.warnings[0];
  EXPECT_TRUE(contains(report.warnings[1], "without node and from_clock ({\"node\":1})"))
      << report.warnings[1];
  EXPECT_TRUE(contains(report.warnings[2], "node-1.jsonl:4: not a JSON object"))
      << report.warnings[2];
  EXPECT_EQ(texts(report.events[0]),
            (std::vector<std::string>{"node 1 stopped after step 1, at 2.0 s, with no final line "
                                      "(killed, or crashed; not at its crash:1@10 step)"}));
  EXPECT_EQ(runEvents(readRunFolder(dir_)).size(), 1u);
  EXPECT_EQ(eventCountsText(EventCounts{}), "—");
}

// departed_peers and lost_updates are arrays: of numbers (consensus writes "[1, 2]" with spaces)
// and of objects.
TEST(JsonArray, ItemsOfANestedArrayAreRead) {
  const JsonObject object = JsonObject::parse(
      R"({"ids":[1, 2 ,3],"lost":[{"node":3,"from_clock":9}, {"x":[1]}],"empty":[],"s":"a"})");
  const auto ids = object.array("ids");
  ASSERT_TRUE(ids.has_value());
  ASSERT_EQ(ids->size(), 3u);
  EXPECT_DOUBLE_EQ((*ids)[2].number, 3);
  const auto lost = object.array("lost");
  ASSERT_TRUE(lost.has_value());
  ASSERT_EQ(lost->size(), 2u);
  EXPECT_EQ((*lost)[0].kind, JsonValue::Kind::kNested);
  EXPECT_EQ((*lost)[0].text, R"({"node":3,"from_clock":9})");
  EXPECT_EQ((*lost)[1].text, R"({"x":[1]})");
  EXPECT_TRUE(object.array("empty")->empty());
  EXPECT_FALSE(object.array("s").has_value());
  EXPECT_FALSE(object.array("missing").has_value());
}

}  // namespace
}  // namespace chorus::report
