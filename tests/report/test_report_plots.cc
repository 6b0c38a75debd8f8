// The look of a report: a variant's color in every plot, what is drawn without a target, the
// backups plot's moving average, and summary.csv's numbers read back as a script would.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "experiment/variant.h"
#include "report/plots.h"
#include "report/report.h"
#include "tests/report/report_folder.h"

namespace chorus::report {
namespace {

namespace fs = std::filesystem;

class ReportPlotsTest : public ReportFolderTest {
 protected:
  // A consensus node: rounds 0-3 with these backups, accuracy at rounds 1 and 3.
  static std::string consensusNode(const std::vector<int>& backups, const std::string& ttt) {
    std::string text = line(R"("event":"start","time":0,"mode":"consensus","backup":"dynamic")");
    for (int r = 0; r < 4; ++r) {
      std::string more = R"("used":1,"staleness_mean":0,"wait_s":0.1,"bytes_sent":500,"backups":)" +
                         std::to_string(backups[r]);
      if (r == 1) more += R"(,"test_accuracy":0.7)";
      if (r == 3) more += R"(,"test_accuracy":0.85)";
      text += stepLine("round", r, r + 1, more);
    }
    return text + line(R"("event":"final","test_accuracy":0.86,"rounds":4,"seconds":4,)"
                       R"("wait_s":0.4,"time_to_target":)" +
                       ttt + R"(,"departed_peers":[])");
  }

  // A PS node: clocks 0-3 sending `bytes` each, a final line after `seconds`.
  static std::string psNode(const std::string& bytes, const std::string& seconds,
                            const std::string& ttt = "3") {
    std::string text = line(R"("event":"start","time":0,"mode":"ps","staleness":0)");
    for (int c = 0; c < 4; ++c) {
      text += stepLine(
          "clock", c, c + 1,
          R"("wait_s":0.1,"bytes_sent":)" + bytes + (c == 1 ? R"(,"test_accuracy":0.75)" : ""));
    }
    return text + line(R"("event":"final","test_accuracy":0.8604,"clocks":4,"seconds":)" + seconds +
                       R"(,"wait_s":0.4,"time_to_target":)" + ttt +
                       R"(,"failed_pulls":0,"failed_pushes":0,)"
                       R"("lost_updates":[],"departed_peers":[],"owner_accuracy":0.81)");
  }

  // A compare folder in DIR/sub: one seed of each variant (ps:* or consensus:*), two nodes.
  // Without a target (0) the nodes write time_to_target -1, as they do.
  fs::path writeCompare(const std::string& sub, const std::vector<std::string>& variants,
                        const std::string& target) {
    const bool none = target == "0";
    std::string list, runs;
    for (const auto& name : variants) {
      const std::string run_dir = experiment::Variant::read(name).value().dirName() + "/seed-1";
      list += (list.empty() ? "" : ",") + name;
      runs += line(R"("event":"run","variant":")" + name + R"(","seed":1,"dir":")" + run_dir +
                   R"(","status":"ok","error":"")");
      const bool ps = name.starts_with("ps");
      write(fs::path(sub) / run_dir / "node-0.jsonl",
            ps ? psNode("1000", "4", none ? "-1" : "3")
               : consensusNode({0, 1, 1, 0}, none ? "-1" : "2"));
      write(fs::path(sub) / run_dir / "node-1.jsonl",
            ps ? psNode("1000", "4", none ? "-1" : "3")
               : consensusNode({1, 1, 1, 1}, none ? "-1" : "2"));
    }
    write(fs::path(sub) / "runs.jsonl",
          line(R"("event":"compare","command":"chorus compare","target_acc":)" + target +
               R"(,"variants":")" + list + "\"") +
              runs);
    return dir_ / sub;
  }

  // A CSV as a script reads it: quoted fields may hold commas and doubled quotes.
  static std::vector<std::vector<std::string>> parseCsv(const std::string& text) {
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> row;
    std::string field;
    bool quoted = false;
    for (size_t i = 0; i < text.size(); ++i) {
      const char c = text[i];
      if (quoted) {
        if (c != '"') {
          field += c;
        } else if (i + 1 < text.size() && text[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          quoted = false;
        }
      } else if (c == '"') {
        quoted = true;
      } else if (c == ',' || c == '\n') {
        row.push_back(field);
        field.clear();
        if (c == '\n') {
          rows.push_back(row);
          row.clear();
        }
      } else {
        field += c;
      }
    }
    return rows;
  }
};

TEST_F(ReportPlotsTest, AVariantsStyleDependsOnlyOnItsName) {
  EXPECT_EQ(variantStyle("single").rgb, 0x1f77b4u);
  EXPECT_EQ(variantStyle("ps:bsp").rgb, 0xd62728u);
  EXPECT_EQ(variantStyle("ps:ssp:2").rgb, 0x2ca02cu);
  EXPECT_EQ(variantStyle("consensus:wait-all").rgb, 0xff7f0eu);
  EXPECT_EQ(variantStyle("consensus:dynamic").rgb, 0x9467bdu);
  // The known variants of one compare are told apart by color.
  const std::vector<std::string> known = {"single",
                                          "ps:bsp",
                                          "ps:ssp:1",
                                          "ps:ssp:2",
                                          "ps:ssp:3",
                                          "ps:async",
                                          "consensus:wait-all",
                                          "consensus:dynamic",
                                          "consensus:dynamic:0.5",
                                          "consensus:static:1",
                                          "consensus:static:2",
                                          "consensus:deadline:0.9"};
  std::set<uint32_t> colors;
  for (const auto& name : known)
    colors.insert(variantStyle(name).rgb);
  EXPECT_EQ(colors.size(), known.size());
  // Any other name hashes to the same style every time (FNV-1a, not std::hash).
  const VariantStyle other = variantStyle("my-experiment");
  EXPECT_EQ(other.rgb, variantStyle("my-experiment").rgb);
  EXPECT_EQ(other.point_type, variantStyle("my-experiment").point_type);
}

// consensus:dynamic is the second variant of one compare and the only one of another: the same
// purple in the accuracy, time-to-target and backups plots of both.
TEST_F(ReportPlotsTest, AVariantKeepsItsColorFromOneReportToTheNext) {
  for (const auto& [sub, variants] : std::map<std::string, std::vector<std::string>>{
           {"a", {"ps:bsp", "consensus:dynamic"}}, {"b", {"consensus:dynamic"}}}) {
    const fs::path folder = writeCompare(sub, variants, "0.8");
    writeReportFiles(buildReport(loadReportInput(folder)), folder);
    const std::string accuracy = read(fs::path(sub) / "plots/accuracy-vs-time.gp");
    EXPECT_TRUE(contains(accuracy, "lc rgb \"#9467bd\" pt 7 ps 0.6 title \"consensus:dynamic\""))
        << sub << "\n"
        << accuracy;
    // The bar's color column: 0x9467bd.
    const std::string ttt = read(fs::path(sub) / "plots/time-to-target.gp");
    EXPECT_TRUE(contains(ttt, " 9725885\n")) << sub << "\n" << ttt;
    const std::string backups = read(fs::path(sub) / "plots/backups-per-round.gp");
    EXPECT_TRUE(contains(backups, "lc rgb \"#9467bd\" title \"consensus:dynamic\"")) << backups;
    EXPECT_TRUE(contains(backups, "lc rgb \"#809467bd\" notitle")) << backups;
  }
}

// compare without --target-acc writes target_acc 0: no time-to-target plot (an old one is
// removed), no target columns, no "not reached".
TEST_F(ReportPlotsTest, WithoutATargetNothingIsSaidAboutReachingIt) {
  const fs::path folder = writeCompare("", {"ps:bsp", "consensus:dynamic"}, "0");
  write("plots/time-to-target.png", "stale");
  const Report report = buildReport(loadReportInput(folder));
  EXPECT_FALSE(hasTarget(report));
  const PlotSet plots = writeReportFiles(report, folder);
  ASSERT_EQ(plots.pngs.size(), 2u);
  EXPECT_EQ(plots.pngs[0].filename(), "accuracy-vs-time.png");
  EXPECT_EQ(plots.pngs[1].filename(), "backups-per-round.png");
  EXPECT_TRUE(plots.skipped.empty());
  EXPECT_FALSE(fs::exists(folder / "plots/time-to-target.png"));

  const std::string table = markdownTable(report);
  EXPECT_FALSE(contains(table, "reached")) << table;
  EXPECT_FALSE(contains(table, "time to")) << table;
  EXPECT_TRUE(contains(table, "| ps:bsp | 1/1 | 86.04% | 81.00% |")) << table;
  const std::string md = read("report.md");
  EXPECT_FALSE(contains(md, "time-to-target")) << md;
  EXPECT_FALSE(contains(md, "time to")) << md;
  EXPECT_FALSE(contains(read("plots/accuracy-vs-time.gp"), "dt 2 lc rgb \"black\" title"));
  // summary.csv keeps its columns, empty.
  EXPECT_TRUE(contains(summaryCsv(report), "\nps:bsp,1,ok,,2,,,0.8604,0.81,4,"))
      << summaryCsv(report);

  // With a target, the columns and the plot are there.
  const fs::path with = writeCompare("with", {"ps:bsp"}, "0.8");
  const Report targeted = buildReport(loadReportInput(with));
  EXPECT_TRUE(contains(markdownTable(targeted), "| ps:bsp | 1/1 | 1/1 | 3.00 |"))
      << markdownTable(targeted);
  EXPECT_EQ(writeReportFiles(targeted, with).pngs.size(), 2u);
  EXPECT_TRUE(fs::exists(with / "plots/time-to-target.png"));
}

TEST_F(ReportPlotsTest, TheBackupsPlotDrawsAMovingAverageAndSaysWhatBiIs) {
  EXPECT_EQ(movingAverage({0, 0, 3, 3, 0, 0}, 3), (std::vector<double>{0, 1, 2, 2, 1, 0}));
  EXPECT_EQ(movingAverage({4, 2}, 25), (std::vector<double>{3, 3}));
  EXPECT_TRUE(movingAverage({}, 25).empty());

  const fs::path folder = writeCompare("", {"consensus:dynamic"}, "0.8");
  writePlots(buildReport(loadReportInput(folder)), folder);
  const std::string gp = read("plots/backups-per-round.gp");
  // Per round: mean over nodes ({0,1,1,0} and {1,1,1,1}); the 25-round window holds all four.
  EXPECT_TRUE(contains(gp, "$b0 << EOD\n0 0.5 0.75\n1 1 0.75\n2 1 0.75\n3 0.5 0.75\nEOD\n")) << gp;
  EXPECT_TRUE(contains(gp, "$b0 using 1:3 with lines lw 3")) << gp;
  EXPECT_TRUE(contains(gp, "set ylabel \"backup workers per round (neighbors not waited for)\""))
      << gp;
  EXPECT_TRUE(contains(gp, "Backup workers b_i per round: the neighbors node i did not wait for"))
      << gp;
  EXPECT_TRUE(contains(gp, "title \"thick: moving average over 25 rounds\"")) << gp;
  EXPECT_FALSE(contains(gp, "ylabel \"backup workers b_i\"")) << gp;
}

// Bytes were written as 6.63774e+08: a script reading summary.csv back got a rounded number.
TEST_F(ReportPlotsTest, SummaryCsvWritesCountsAsWholeNumbersAndReadsBack) {
  // Nodes 0 and 1 send 165943608 and 165943609 bytes per clock: 663774432 and 663774436, mean
  // 663774434.
  write("node-0.jsonl", psNode("165943608", "31.260819294"));
  write("node-1.jsonl", psNode("165943609", "31.260819294"));
  const Report report = buildReport(loadReportInput(dir_));
  const std::vector<std::vector<std::string>> rows = parseCsv(summaryCsv(report));
  ASSERT_EQ(rows.size(), 2u);
  std::map<std::string, std::string> run;
  ASSERT_EQ(rows[0].size(), rows[1].size());
  for (size_t i = 0; i < rows[0].size(); ++i)
    run[rows[0][i]] = rows[1][i];
  EXPECT_EQ(run["bytes_sent_per_node"], "663774434");
  EXPECT_EQ(run["steps"], "4");
  EXPECT_EQ(run["nodes"], "2");
  EXPECT_EQ(run["final_accuracy"], "0.8604");
  EXPECT_EQ(std::strtod(run["seconds"].c_str(), nullptr), 31.260819294);
  EXPECT_NEAR(std::strtod(run["steps_per_s"].c_str(), nullptr), 4 / 31.260819294, 1e-14);
  EXPECT_EQ(run["failed_pushes"], "0");
  EXPECT_EQ(run["crashes"], "0");
  EXPECT_EQ(run["events"], "");
  for (const std::string& field : rows[1]) {
    EXPECT_EQ(field.find("e+"), std::string::npos) << field;
  }
}

}  // namespace
}  // namespace chorus::report
