// `chorus report` on canned metrics folders written by hand: the numbers of summary.csv and the
// Markdown table are checked against values worked out from the files, and the plots are drawn.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "report/report.h"
#include "report/run_metrics.h"

namespace chorus::report {
namespace {

namespace fs = std::filesystem;

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("chorus-report-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const fs::path& relative, const std::string& text) {
    fs::create_directories((dir_ / relative).parent_path());
    std::ofstream(dir_ / relative) << text;
  }

  // A consensus node: rounds 0..3 with the given backups, staleness, wait and bytes per round,
  // accuracy evaluated at rounds 1 and 3, and a final line.
  static std::string consensusNode(const std::vector<int>& backups,
                                   const std::vector<double>& staleness, double wait, int bytes,
                                   const std::string& final_fields) {
    std::string text =
        R"({"event":"start","time":0,"mode":"consensus","node":0,"backup":"dynamic",)"
        R"("neighbors":[1]})"
        "\n";
    for (int r = 0; r < 4; ++r) {
      text += "{\"event\":\"round\",\"time\":" + std::to_string(r + 1) +
              ",\"round\":" + std::to_string(r) + ",\"backups\":" + std::to_string(backups[r]) +
              ",\"used\":1,\"used_from\":[1],\"wait_s\":" + std::to_string(wait) +
              ",\"bytes_sent\":" + std::to_string(bytes) +
              ",\"staleness_mean\":" + std::to_string(staleness[r]);
      if (r == 1) text += ",\"test_accuracy\":0.7";
      if (r == 3) text += ",\"test_accuracy\":0.85";
      text += "}\n";
    }
    return text + "{\"event\":\"final\"," + final_fields + "}\n";
  }

  static std::string psNode(double wait_total, const std::string& extra_final) {
    std::string text = R"({"event":"start","time":0,"mode":"ps","node":0,"staleness":2})"
                       "\n";
    for (int c = 0; c < 5; ++c) {
      text += "{\"event\":\"clock\",\"time\":" + std::to_string(c + 1) +
              ",\"clock\":" + std::to_string(c) +
              ",\"loss\":1,\"compute_s\":0.5,\"wait_s\":0.1,\"bytes_sent\":2000,"
              "\"bytes_received\":2000,\"cache_hit_rate\":0.5";
      if (c == 2) text += ",\"test_accuracy\":0.75";
      if (c == 4) text += ",\"test_accuracy\":0.82";
      text += "}\n";
    }
    return text + "{\"event\":\"final\",\"test_accuracy\":0.82,\"clocks\":5,\"seconds\":5," +
           "\"wait_s\":" + std::to_string(wait_total) + extra_final + "}\n";
  }

  // Two seeds of consensus:dynamic, and ps:ssp:2 whose second seed failed.
  void writeCompareFolder() {
    write(
        "runs.jsonl",
        R"({"event":"compare","command":"chorus compare --variants consensus:dynamic,ps:ssp:2",)"
        R"("target_acc":0.8,"variants":"consensus:dynamic,ps:ssp:2"})"
        "\n"
        R"({"event":"run","variant":"consensus:dynamic","seed":1,"dir":"consensus-dynamic/seed-1","status":"ok","error":""})"
        "\n"
        R"({"event":"run","variant":"ps:ssp:2","seed":1,"dir":"ps-ssp-2/seed-1","status":"ok","error":""})"
        "\n"
        R"({"event":"run","variant":"consensus:dynamic","seed":2,"dir":"consensus-dynamic/seed-2","status":"ok","error":""})"
        "\n"
        R"({"event":"run","variant":"ps:ssp:2","seed":2,"dir":"ps-ssp-2/seed-2","status":"failed","error":"node 1 exited with status 1"})"
        "\n");
    // Seed 1: node 0 reaches the target after 2 s; node 1 never does.
    write("consensus-dynamic/seed-1/node-0.jsonl",
          consensusNode({0, 1, 1, 0}, {0, 0.5, 0.5, 0}, 0.1, 1000,
                        R"("test_accuracy":0.86,"rounds":4,"seconds":4,"wait_s":0.4,)"
                        R"("time_to_target":2,"average_accuracy":0.87)"));
    write("consensus-dynamic/seed-1/node-1.jsonl",
          consensusNode({1, 1, 1, 1}, {0, 0, 0, 0}, 0.2, 3000,
                        R"("test_accuracy":0.84,"rounds":4,"seconds":5,"wait_s":1,)"
                        R"("time_to_target":-1)"));
    // Seed 2: the last line of node 1 was cut short when it was killed.
    write("consensus-dynamic/seed-2/node-0.jsonl",
          consensusNode({0, 0, 0, 0}, {0, 0, 0, 0}, 0.1, 500,
                        R"("test_accuracy":0.9,"rounds":4,"seconds":5,"wait_s":0.75,)"
                        R"("time_to_target":4,"average_accuracy":0.91)"));
    write("consensus-dynamic/seed-2/node-1.jsonl",
          consensusNode({1, 0, 0, 0}, {0, 0, 0, 0}, 0.1, 500,
                        R"("test_accuracy":0.9,"rounds":4,"seconds":5,"wait_s":0.75,)"
                        R"("time_to_target":4)") +
              R"({"event":"round","ti)");
    write("ps-ssp-2/seed-1/node-0.jsonl",
          psNode(0.5, R"(,"time_to_target":3,"owner_accuracy":0.83)"));
    write("ps-ssp-2/seed-1/node-1.jsonl", psNode(1.0, R"(,"time_to_target":4)"));
  }

  static bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  }

  fs::path dir_;
};

TEST_F(ReportTest, SummarizesARunFromItsNodeFiles) {
  writeCompareFolder();
  RunMetrics metrics = readRunFolder(dir_ / "consensus-dynamic/seed-1");
  ASSERT_EQ(metrics.nodes.size(), 2u);
  EXPECT_EQ(metrics.nodes[0].steps.size(), 4u);
  RunSummary s = summarizeRun(metrics);
  EXPECT_EQ(s.nodes, 2);
  EXPECT_DOUBLE_EQ(*s.time_to_target, 2.0);
  EXPECT_DOUBLE_EQ(*s.final_accuracy, 0.86);
  EXPECT_DOUBLE_EQ(*s.model_accuracy, 0.87);
  EXPECT_DOUBLE_EQ(s.steps, 4);
  EXPECT_DOUBLE_EQ(s.steps_per_s, (4.0 / 4 + 4.0 / 5) / 2);
  EXPECT_DOUBLE_EQ(s.wait_share, (0.4 / 4 + 1.0 / 5) / 2);
  EXPECT_DOUBLE_EQ(s.bytes_sent_per_node, (4000.0 + 12000.0) / 2);
  EXPECT_DOUBLE_EQ(*s.mean_backups, 6.0 / 8);
  EXPECT_DOUBLE_EQ(*s.mean_staleness, 1.0 / 8);
  EXPECT_EQ(variantNameOf(metrics), "consensus:dynamic");

  RunMetrics cut = readRunFolder(dir_ / "consensus-dynamic/seed-2");
  ASSERT_EQ(cut.warnings.size(), 1u);
  EXPECT_TRUE(contains(cut.warnings[0], "node-1.jsonl:7: not a JSON object")) << cut.warnings[0];

  RunSummary ps = summarizeRun(readRunFolder(dir_ / "ps-ssp-2/seed-1"));
  EXPECT_DOUBLE_EQ(*ps.time_to_target, 3.0);
  EXPECT_DOUBLE_EQ(*ps.model_accuracy, 0.83);
  EXPECT_DOUBLE_EQ(ps.steps, 5);
  EXPECT_DOUBLE_EQ(ps.steps_per_s, 1.0);
  EXPECT_DOUBLE_EQ(ps.wait_share, (0.5 / 5 + 1.0 / 5) / 2);
  EXPECT_DOUBLE_EQ(ps.bytes_sent_per_node, 10000);
  EXPECT_FALSE(ps.mean_backups.has_value());
  EXPECT_EQ(ps.staleness_bound, "2");
}

// A node that rejoined ran only the clocks (or rounds) after the one it took up: its rate
// counts those, not the clock it reached.
TEST_F(ReportTest, ARejoinedNodesRateCountsOnlyWhatItRan) {
  write("ps/node-0.jsonl", psNode(0.5, ""));
  write("ps/node-1.jsonl",
        R"({"event":"final","test_accuracy":0.8,"clocks":5,"first_clock":3,"seconds":1,)"
        R"("wait_s":0})"
        "\n");
  EXPECT_DOUBLE_EQ(summarizeRun(readRunFolder(dir_ / "ps")).steps_per_s, (5.0 / 5 + 2.0 / 1) / 2);
  write("consensus/node-0.jsonl",
        consensusNode({0, 0, 0, 0}, {0, 0, 0, 0}, 0.1, 500,
                      R"("test_accuracy":0.9,"rounds":4,"seconds":4,"wait_s":0.4)"));
  write("consensus/node-1.jsonl",
        R"({"event":"final","test_accuracy":0.9,"rounds":4,"first_round":3,"seconds":1,)"
        R"("wait_s":0})"
        "\n");
  EXPECT_DOUBLE_EQ(summarizeRun(readRunFolder(dir_ / "consensus")).steps_per_s,
                   (4.0 / 4 + 1.0 / 1) / 2);
}

// A node file that cannot be stat'ed (here a symlink to itself) is skipped with a warning: it
// made directory_entry::is_regular_file() throw out of buildReport, which promises not to.
TEST_F(ReportTest, ANodeFileThatIsASymlinkLoopIsSkippedWithAWarning) {
  write("run/node-0.jsonl", psNode(0.5, ""));
  fs::create_symlink("node-1.jsonl", dir_ / "run" / "node-1.jsonl");
  RunMetrics metrics;
  ASSERT_NO_THROW(metrics = readRunFolder(dir_ / "run"));
  ASSERT_EQ(metrics.nodes.size(), 1u);
  EXPECT_EQ(metrics.nodes[0].node, 0u);
  ASSERT_EQ(metrics.warnings.size(), 1u);
  EXPECT_TRUE(contains(metrics.warnings[0], "node-1.jsonl: cannot tell what it is"))
      << metrics.warnings[0];
  Report report;
  ASSERT_NO_THROW(report = buildReport(loadReportInput(dir_ / "run")));
  ASSERT_EQ(report.runs.size(), 1u);
  EXPECT_TRUE(report.runs[0].ok()) << report.runs[0].error;
}

// A round or clock number outside [0, 2^53) was converted to int64 (undefined for 1e300): such a
// line is skipped with a warning, and the progress reader skips it too.
TEST_F(ReportTest, AStepNumberOutOfRangeIsSkipped) {
  write("run/node-0.jsonl", R"({"event":"start","time":0,"mode":"ps","node":0,"staleness":1e300})"
                            "\n"
                            R"({"event":"clock","time":1,"clock":0,"test_accuracy":0.5})"
                            "\n"
                            R"({"event":"clock","time":2,"clock":1e300})"
                            "\n"
                            R"({"event":"clock","time":3,"clock":-1})"
                            "\n"
                            R"({"event":"clock","time":4,"clock":9007199254740992})"
                            "\n");
  RunMetrics metrics = readRunFolder(dir_ / "run");
  ASSERT_EQ(metrics.nodes.size(), 1u);
  ASSERT_EQ(metrics.nodes[0].steps.size(), 1u);
  EXPECT_EQ(metrics.nodes[0].steps[0].step, 0);
  EXPECT_EQ(metrics.nodes[0].staleness, "1e+300");
  ASSERT_EQ(metrics.warnings.size(), 3u);
  EXPECT_TRUE(contains(metrics.warnings[0], "node-0.jsonl:3: clock 1e+300 is not a step number"))
      << metrics.warnings[0];
  EXPECT_TRUE(contains(metrics.warnings[1], "node-0.jsonl:4: clock -1 is not a step number"))
      << metrics.warnings[1];
  EXPECT_DOUBLE_EQ(summarizeRun(metrics).steps, 1);
  const std::optional<Progress> progress = readProgress(dir_ / "run" / "node-0.jsonl");
  ASSERT_TRUE(progress.has_value());
  EXPECT_EQ(progress->step, 0);
  EXPECT_DOUBLE_EQ(progress->time, 1);
}

// The mean staleness is per model mixed in: a round that mixed no model (used 0, logged with a
// staleness_mean of 0) does not pull it down, and a round that mixed two counts twice.
TEST_F(ReportTest, MeanStalenessIsWeightedByTheModelsMixed) {
  auto round = [](int r, int used, double staleness) {
    return "{\"event\":\"round\",\"time\":" + std::to_string(r + 1) +
           ",\"round\":" + std::to_string(r) + ",\"backups\":0,\"used\":" + std::to_string(used) +
           ",\"staleness_mean\":" + std::to_string(staleness) + "}\n";
  };
  const std::string start = R"({"event":"start","time":0,"mode":"consensus","backup":"dynamic"})"
                            "\n";
  write("run/node-0.jsonl", start + round(0, 2, 1.5) + round(1, 0, 0) + round(2, 1, 0));
  // A round line without `used` (not written by chorus) says nothing about how many models.
  write("run/node-1.jsonl", start + round(0, 1, 3) + round(1, 0, 0) +
                                R"({"event":"round","time":3,"round":2,"staleness_mean":9})"
                                "\n");
  const RunSummary s = summarizeRun(readRunFolder(dir_ / "run"));
  ASSERT_TRUE(s.mean_staleness.has_value());
  EXPECT_DOUBLE_EQ(*s.mean_staleness, (1.5 * 2 + 0 * 1 + 3 * 1) / 4.0);
  // No model mixed at all: no staleness to report.
  write("none/node-0.jsonl", start + round(0, 0, 0));
  write("none/node-1.jsonl", start + round(0, 0, 0));
  EXPECT_FALSE(summarizeRun(readRunFolder(dir_ / "none")).mean_staleness.has_value());
}

// A node that rejoined appends a new life to its file, whose `time` and `seconds` restart at 0.
// Its rate and waiting share are its last life's; its time to target counts only when the first
// life reached it (the time the node was down is in no file).
TEST_F(ReportTest, ARejoinedNodesFileIsSplitIntoLives) {
  auto clock = [](int c, double time, double wait) {
    return "{\"event\":\"clock\",\"time\":" + std::to_string(time) +
           ",\"clock\":" + std::to_string(c) + ",\"wait_s\":" + std::to_string(wait) + "}\n";
  };
  const std::string ps_start = R"({"event":"start","time":0,"mode":"ps","staleness":2})"
                               "\n";
  // Node 1: clocks 0-3 in 4 s, killed; rejoined at clock 4 and ran clocks 4-9 in 3 s, killed.
  std::string node1 = ps_start;
  for (int c = 0; c < 4; ++c)
    node1 += clock(c, c + 1, 0.1);
  node1 += ps_start + R"({"event":"rejoin","time":0.2,"from":0,"clock":4,"read_clock":3})"
                      "\n";
  for (int c = 4; c < 10; ++c)
    node1 += clock(c, 0.5 * (c - 3), 0.3);
  write("ps/node-0.jsonl", psNode(0.5, ""));
  write("ps/node-1.jsonl", node1);
  RunMetrics ps = readRunFolder(dir_ / "ps");
  EXPECT_EQ(ps.nodes[1].lives, 2);
  EXPECT_EQ(ps.nodes[1].last_life_first_step, 4);
  ASSERT_EQ(ps.warnings.size(), 1u);
  EXPECT_TRUE(contains(ps.warnings[0], "node-1.jsonl: node 1 rejoined (2 lives")) << ps.warnings[0];
  RunSummary s = summarizeRun(ps);
  EXPECT_DOUBLE_EQ(s.steps_per_s, (5.0 / 5 + 6.0 / 3) / 2);
  EXPECT_DOUBLE_EQ(s.wait_share, (0.5 / 5 + 1.8 / 3) / 2);
  EXPECT_DOUBLE_EQ(s.bytes_sent_per_node, 10000.0 / 2);  // node 1's lines carry no bytes

  // Node 0 (the reference) of a consensus run: rounds 0-1 with an accuracy at round 1, killed;
  // rejoined at round 2, reached the target at round 3 (2 s into its second life), finished.
  const std::string consensus_start =
      R"({"event":"start","time":0,"mode":"consensus","node":0,"backup":"dynamic"})"
      "\n";
  auto round = [](int r, double time, const std::string& extra) {
    return "{\"event\":\"round\",\"time\":" + std::to_string(time) +
           ",\"round\":" + std::to_string(r) + ",\"wait_s\":0.1" + extra + "}\n";
  };
  const std::string life0 =
      consensus_start + round(0, 1, "") + round(1, 2, R"(,"test_accuracy":0.6)");
  const std::string life1 =
      consensus_start + round(2, 1, "") + round(3, 2, R"(,"test_accuracy":0.8)") +
      R"({"event":"target","time":2,"round":3,"test_accuracy":0.8,"seconds":2})"
      "\n" +
      round(4, 3, "") + round(5, 4, "") +
      R"({"event":"final","time":4,"test_accuracy":0.85,"rounds":6,"first_round":2,)"
      R"("seconds":4,"wait_s":0.4,"time_to_target":2})"
      "\n";
  const std::string node1_final = R"("test_accuracy":0.9,"rounds":4,"seconds":4,"wait_s":0.4)";
  write("late/node-0.jsonl", life0 + life1);
  write("late/node-1.jsonl", consensusNode({0, 0, 0, 0}, {0, 0, 0, 0}, 0.1, 500, node1_final));
  RunMetrics late = readRunFolder(dir_ / "late");
  s = summarizeRun(late);
  EXPECT_FALSE(s.time_to_target.has_value()) << *s.time_to_target;
  EXPECT_DOUBLE_EQ(s.steps, 4);
  EXPECT_DOUBLE_EQ(s.seconds, 4);
  EXPECT_DOUBLE_EQ(*s.final_accuracy, 0.85);
  ASSERT_EQ(late.warnings.size(), 2u);
  EXPECT_TRUE(contains(late.warnings[1], "node 0 reached the target only after it rejoined"))
      << late.warnings[1];

  // The first life reached the target after 1.5 s: that is the time since the run's start, not
  // the second life's 2 s.
  const std::string early_life0 =
      consensus_start + round(0, 1, R"(,"test_accuracy":0.8)") +
      R"({"event":"target","time":1.5,"round":0,"test_accuracy":0.8,"seconds":1.5})"
      "\n" +
      round(1, 2, "");
  write("early/node-0.jsonl", early_life0 + life1);
  write("early/node-1.jsonl", consensusNode({0, 0, 0, 0}, {0, 0, 0, 0}, 0.1, 500, node1_final));
  RunMetrics early = readRunFolder(dir_ / "early");
  s = summarizeRun(early);
  ASSERT_TRUE(s.time_to_target.has_value());
  EXPECT_DOUBLE_EQ(*s.time_to_target, 1.5);
  EXPECT_EQ(early.warnings.size(), 1u);  // the rejoin only

  // The accuracy plot draws the first life only: the second's clock restarts at 0.
  writePlots(buildReport(loadReportInput(dir_ / "late")), dir_ / "late");
  std::ifstream gp(dir_ / "late" / "plots" / "accuracy-vs-time.gp");
  const std::string script((std::istreambuf_iterator<char>(gp)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(script, "$run0 << EOD\n2 60\nEOD\n")) << script;
}

// Without node-0.jsonl the lowest id present is the reference node: the report says which
// instead of calling it node 0.
TEST_F(ReportTest, AMissingNodeZeroNamesTheRealReferenceNode) {
  write("node-2.jsonl", psNode(0.5, R"(,"time_to_target":3)"));
  write("node-3.jsonl", psNode(0.5, R"(,"time_to_target":4)"));
  RunMetrics metrics = readRunFolder(dir_);
  ASSERT_EQ(metrics.warnings.size(), 1u);
  EXPECT_TRUE(contains(metrics.warnings[0],
                       "no node-0.jsonl; node 2 (the lowest id present) is the reference node"))
      << metrics.warnings[0];
  EXPECT_EQ(summarizeRun(metrics).reference_node, 2u);
  Report report = buildReport(loadReportInput(dir_));
  ASSERT_EQ(report.warnings.size(), 1u);
  const PlotSet plots = writeReportFiles(report, dir_);
  const std::string md = reportMarkdown(report, plots);
  EXPECT_TRUE(contains(md, "ps:ssp:2 seed 0 uses node 2")) << md;
  std::ifstream gp(dir_ / "plots" / "accuracy-vs-time.gp");
  const std::string script((std::istreambuf_iterator<char>(gp)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(script, "Test accuracy (reference node)")) << script;
  EXPECT_FALSE(contains(script, "node 0")) << script;
}

TEST_F(ReportTest, CompareFolderGivesTheExpectedCsvTableAndPlots) {
  writeCompareFolder();
  ReportInput input = loadReportInput(dir_);
  EXPECT_EQ(input.command, "chorus compare --variants consensus:dynamic,ps:ssp:2");
  EXPECT_DOUBLE_EQ(*input.target_acc, 0.8);
  ASSERT_EQ(input.runs.size(), 4u);
  Report report = buildReport(input);
  ASSERT_EQ(report.variants.size(), 2u);
  const VariantSummary& dyn = report.variants[0];
  EXPECT_EQ(dyn.variant, "consensus:dynamic");
  EXPECT_EQ(dyn.ok_runs, 2);
  EXPECT_EQ(dyn.reached, 2);
  EXPECT_DOUBLE_EQ(*dyn.ttt_median, 3.0);
  EXPECT_DOUBLE_EQ(*dyn.ttt_min, 2.0);
  EXPECT_DOUBLE_EQ(*dyn.ttt_max, 4.0);
  EXPECT_DOUBLE_EQ(*dyn.final_accuracy, 0.88);
  EXPECT_EQ(report.variants[1].ok_runs, 1);
  EXPECT_EQ(report.variants[1].runs, 2);
  EXPECT_EQ(report.warnings.size(), 1u);  // the cut line of seed 2

  const std::string csv = summaryCsv(report);
  EXPECT_TRUE(contains(csv, "variant,seed,status,error,nodes,reached_target,time_to_target_s,"))
      << csv;
  EXPECT_TRUE(contains(
      csv, "consensus:dynamic,1,ok,,2,1,2,0.86,0.87,4,4,0.9,0.15,8000,0.75,0.125,,0,0,0,,,\n"))
      << csv;
  // No events; PS counts empty where the final lines have none (files older than the counts).
  EXPECT_TRUE(contains(csv, "ps:ssp:2,1,ok,,2,1,3,0.82,0.83,5,5,1,0.15,10000,,,2,0,0,0,,,\n"))
      << csv;
  EXPECT_TRUE(contains(csv, "ps:ssp:2,2,failed,node 1 exited with status 1,0,0,")) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5);

  const std::string table = markdownTable(report);
  EXPECT_TRUE(contains(table, "| time to 80.0% (s), median [min, max] |")) << table;
  EXPECT_TRUE(contains(table,
                       "| consensus:dynamic | 2/2 | 2/2 | 3.00 [2.00, 4.00] | 88.00% | 89.00% | "
                       "0.85 | 15% | 5.0 kB | 0.44 | 0.06 (mean) |"))
      << table;
  EXPECT_TRUE(contains(table,
                       "| ps:ssp:2 | 1/2 | 1/1 | 3.00 | 82.00% | 83.00% | 1.00 | 15% | 10.0 kB | "
                       "— | bound 2 |"))
      << table;

  PlotSet plots = writeReportFiles(report, dir_);
  ASSERT_EQ(plots.pngs.size(), 3u);
  for (const char* name : {"accuracy-vs-time", "time-to-target", "backups-per-round"}) {
    const fs::path png = dir_ / "plots" / (std::string(name) + ".png");
    ASSERT_TRUE(fs::exists(png)) << png;
    EXPECT_GT(fs::file_size(png), 1000u) << png;
    std::ifstream in(png, std::ios::binary);
    char magic[4] = {};
    in.read(magic, 4);
    EXPECT_EQ(std::string(magic + 1, 3), "PNG") << png;
    EXPECT_TRUE(fs::exists(dir_ / "plots" / (std::string(name) + ".gp")));
  }
  std::ifstream md(dir_ / "report.md");
  std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(text, table)) << text;
  EXPECT_TRUE(contains(text, "![time-to-target](plots/time-to-target.png)")) << text;
  EXPECT_TRUE(contains(text, "- ps:ssp:2 seed 2: node 1 exited with status 1")) << text;
  EXPECT_TRUE(fs::exists(dir_ / "summary.csv"));
}

TEST_F(ReportTest, ALaunchFolderIsOneRunNamedAfterItsMode) {
  write("node-0.jsonl", psNode(0.5, R"(,"time_to_target":-1)"));
  write("node-1.jsonl", psNode(0.5, R"(,"time_to_target":-1)"));
  ReportInput input = loadReportInput(dir_);
  ASSERT_EQ(input.runs.size(), 1u);
  EXPECT_EQ(input.runs[0].variant, "ps:ssp:2");
  EXPECT_FALSE(input.target_acc.has_value());
  Report report = buildReport(input);
  const std::string table = markdownTable(report);
  // A launch folder records no target, and no node reached one: no target columns or plot.
  EXPECT_TRUE(contains(table, "| ps:ssp:2 | 1/1 | 82.00% |")) << table;
  EXPECT_FALSE(contains(table, "not reached")) << table;
  PlotSet plots = writeReportFiles(report, dir_);
  // No consensus run: no backup plot, and the report says why.
  EXPECT_EQ(plots.pngs.size(), 1u);
  ASSERT_EQ(plots.skipped.size(), 1u);
  EXPECT_FALSE(fs::exists(dir_ / "plots" / "time-to-target.png"));
}

// A launch folder has no manifest to say its seed: the nodes' start events do.
TEST_F(ReportTest, ALaunchFolderTakesItsSeedFromTheStartEvent) {
  write("node-0.jsonl", R"({"event":"start","time":0,"mode":"ps","staleness":2,"seed":7})"
                        "\n");
  ReportInput input = loadReportInput(dir_);
  ASSERT_EQ(input.runs.size(), 1u);
  EXPECT_EQ(input.runs[0].seed, 7u);
}

TEST_F(ReportTest, PsStalenessSpellingsNameTheVariant) {
  write("a/node-0.jsonl", R"({"event":"start","mode":"ps","staleness":"inf"})"
                          "\n");
  write("b/node-0.jsonl", R"({"event":"start","mode":"ps","staleness":0})"
                          "\n");
  write("c/node-0.jsonl", R"({"event":"start","mode":"ps","staleness":-1})"
                          "\n");
  EXPECT_EQ(variantNameOf(readRunFolder(dir_ / "a")), "ps:async");
  EXPECT_EQ(variantNameOf(readRunFolder(dir_ / "b")), "ps:bsp");
  EXPECT_EQ(variantNameOf(readRunFolder(dir_ / "c")), "ps:async");
  write("d/node-0.jsonl", R"({"event":"start","mode":"ps","staleness":"3"})"
                          "\n");
  EXPECT_EQ(variantNameOf(readRunFolder(dir_ / "d")), "ps:ssp:3");
}

TEST_F(ReportTest, UnusableFoldersAreClearErrors) {
  auto message = [](const fs::path& folder) {
    try {
      loadReportInput(folder);
    } catch (const ReportError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_TRUE(contains(message(dir_ / "missing"), "missing: no such folder"));
  EXPECT_TRUE(contains(message(dir_), "neither a compare folder"));
  write("runs.jsonl", "{\"event\":\"compare\",\"target_acc\":0.5}\nnot json\n{\"event\":\"x\"}\n");
  EXPECT_TRUE(contains(message(dir_), "runs.jsonl:2: not a JSON object")) << message(dir_);
  write("runs.jsonl", R"({"event":"run","variant":"single","seed":1,"dir":"s"})"
                      "\n");
  EXPECT_TRUE(contains(message(dir_), "no header line")) << message(dir_);
}

TEST_F(ReportTest, ARunWhoseFolderIsGoneIsReportedAsFailed) {
  write(
      "runs.jsonl",
      R"({"event":"compare","command":"","target_acc":0.9,"variants":"single"})"
      "\n"
      R"({"event":"run","variant":"single","seed":1,"dir":"single/seed-1","status":"ok","error":""})"
      "\n");
  Report report = buildReport(loadReportInput(dir_));
  ASSERT_EQ(report.runs.size(), 1u);
  EXPECT_FALSE(report.runs[0].ok());
  EXPECT_TRUE(contains(report.runs[0].error, "no such folder"));
  EXPECT_TRUE(contains(markdownTable(report), "| single | 0/1 | 0/0 | — |"));
  // Plots still come out (empty axes say "failed"), so the folder is complete.
  EXPECT_EQ(writeReportFiles(report, dir_).pngs.size(), 1u);
}

TEST_F(ReportTest, MissingGnuplotIsAClearError) {
  writeCompareFolder();
  Report report = buildReport(loadReportInput(dir_));
  try {
    writePlots(report, dir_, (dir_ / "no-such-gnuplot").string());
    FAIL() << "no error";
  } catch (const ReportError& e) {
    EXPECT_TRUE(contains(e.what(), "not found")) << e.what();
  }
}

}  // namespace
}  // namespace chorus::report
