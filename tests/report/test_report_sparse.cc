// The report of sparse models' runs, from hand-written metrics files in the sparse trainer's
// format (docs/sparse-ps.md and docs/sparse-consensus.md, "Metrics"): MRR and Hits@10 or RMSE
// instead of accuracy, the time to a target in node 0's evaluations, PS's local accesses,
// consensus's rows per round, and the quality plot.
#include <gtest/gtest.h>

#include <string>

#include "report/report.h"
#include "report/run_metrics.h"
#include "report/sparse_table.h"
#include "tests/report/report_folder.h"

namespace chorus::report {
namespace {

class ReportSparseTest : public ReportFolderTest {
 protected:
  // Node `id`'s file of a sparse run: its start line, an `epoch` line per epoch at 2, 4, 6 ...
  // seconds (node 0 with valid_mrr = `mrr[e]` at the evaluation epochs, each evaluation 0.5 s),
  // and its summary with `train_seconds` and `wait_seconds`.
  static std::string kgeNode(int id, const std::string& start_fields,
                             const std::vector<double>& mrr, const std::string& summary_fields,
                             double train_seconds = 6, double wait_seconds = 1.5) {
    std::string text = line(R"("event":"start","time":0,"model":"complex dim=8","train_points":)"
                            R"(100,"seed":3,"node":)" +
                            std::to_string(id) + "," + start_fields);
    for (size_t e = 0; e < mrr.size(); ++e) {
      std::string fields = R"("event":"epoch","time":)" + std::to_string(2.0 * (e + 1)) +
                           R"(,"epoch":)" + std::to_string(e + 1) + R"(,"step":10)";
      if (id == 0 && e + 1 < mrr.size()) {
        fields += R"(,"valid_mrr":)" + std::to_string(mrr[e]) +
                  R"(,"valid_hits@10":0.5,"eval_seconds":0.5)";
      }
      text += line(fields);
    }
    std::string summary = R"("event":"summary","time":)" + std::to_string(2.0 * mrr.size() + 0.5) +
                          R"(,"epochs":3,"evaluated_epoch":3,"steps":30,"train_seconds":)" +
                          std::to_string(train_seconds) + R"(,"wait_seconds":)" +
                          std::to_string(wait_seconds) + R"(,"bytes_out":2000000,)" +
                          summary_fields;
    if (id == 0) {
      summary += R"(,"valid_mrr":)" + std::to_string(mrr.back()) +
                 R"(,"valid_hits@10":0.6,"test_mrr":0.41,"test_hits@10":0.62,)"
                 R"("valid_eval_seconds":0.25,"test_eval_seconds":0.25)";
    }
    return text + line(summary);
  }

  void writeKgeCompare(const std::string& target_fields) {
    write("runs.jsonl",
          line(R"("event":"compare","command":"chorus compare --model complex","target_acc":0,)" +
               target_fields + R"("variants":"ps:lapse,consensus:wait-all")") +
              line(R"("event":"run","variant":"ps:lapse","seed":1,"dir":"ps-lapse/seed-1",)"
                   R"("status":"ok","error":"")") +
              line(R"("event":"run","variant":"consensus:wait-all","seed":1,)"
                   R"("dir":"consensus-wait-all/seed-1","status":"ok","error":"")"));
    // Node 1 trained as node 0 did (6 s, 1.5 s of it waiting) and was held up by node 0's two
    // evaluations between epochs (0.5 s each): its file says 7 s, 2.5 s of them waiting.
    for (int id = 0; id < 2; ++id) {
      const double train = id == 0 ? 6 : 7, wait = id == 0 ? 1.5 : 2.5;
      write("ps-lapse/seed-1/node-" + std::to_string(id) + ".jsonl",
            kgeNode(id, R"("mode":"ps","technique":"lapse","staleness":"1")", {0.1, 0.3, 0.35},
                    id == 0 ? R"("local_share":0.8)" : R"("local_share":0.6)", train, wait));
      write(
          "consensus-wait-all/seed-1/node-" + std::to_string(id) + ".jsonl",
          kgeNode(id, R"("mode":"consensus","exchange":"sparse","backup":"wait-all")",
                  {0.05, 0.2, 0.32},
                  R"("rows_per_round":)" + std::to_string(100 + 20 * id) + R"(,"max_staleness":0)",
                  train, wait));
    }
  }
};

TEST_F(ReportSparseTest, TheTableShowsMrrHitsAndEachModesOwnColumns) {
  writeKgeCompare(R"("target_metric":"mrr","target":0.3,)");
  const Report report = buildReport(loadReportInput(dir_));
  ASSERT_TRUE(report.input.quality_target.has_value());
  EXPECT_TRUE(isSparseReport(report));
  EXPECT_EQ(targetName(report), "MRR 0.300");
  ASSERT_EQ(report.runs.size(), 2u);
  // PS reached 0.3 at its second evaluation (epoch 2, written at 4 s after two evaluations of
  // 0.5 s: 3 s of training); gossip only in the summary line after the last epoch (0.32,
  // written at 6.5 s after 1.5 s of evaluations).
  ASSERT_TRUE(report.runs[0].time_to_target.has_value());
  EXPECT_DOUBLE_EQ(*report.runs[0].time_to_target, 3.0);
  EXPECT_DOUBLE_EQ(*report.runs[1].time_to_target, 5.0);
  EXPECT_DOUBLE_EQ(*report.runs[0].local_share, 0.7);  // mean over the nodes
  EXPECT_FALSE(report.runs[0].rows_per_round.has_value());
  EXPECT_DOUBLE_EQ(*report.runs[1].rows_per_round, 110);
  // 30 steps in 6 s of training on both nodes: node 1's wait for node 0's evaluations is left
  // out of its time and its waiting.
  EXPECT_DOUBLE_EQ(report.runs[0].steps_per_s, 5.0);
  EXPECT_DOUBLE_EQ(report.runs[0].wait_share, 0.25);
  EXPECT_DOUBLE_EQ(report.runs[1].steps_per_s, 5.0);
  EXPECT_DOUBLE_EQ(report.runs[1].wait_share, 0.25);
  EXPECT_DOUBLE_EQ(report.runs[0].bytes_sent_per_node, 2e6);
  // A sparse run's summary line is its end: no node "stopped with no final line".
  EXPECT_TRUE(report.events[0].empty());
  const std::string table = markdownTable(report);
  EXPECT_TRUE(contains(table,
                       "| variant | runs ok | reached MRR 0.300 | time to MRR 0.300 (s), "
                       "median [min, max] | test MRR | test Hits@10 | steps / s | waiting "
                       "share | sent per node | local accesses | rows per round | "
                       "staleness | events |"))
      << table;
  EXPECT_TRUE(contains(table,
                       "| ps:lapse | 1/1 | 1/1 | 3.00 | 0.4100 | 0.6200 | 5.00 | 25% | "
                       "2.0 MB | 70% | — | bound 1 | — |"))
      << table;
  EXPECT_TRUE(contains(table,
                       "| consensus:wait-all | 1/1 | 1/1 | 5.00 | 0.4100 | 0.6200 | 5.00 "
                       "| 25% | 2.0 MB | — | 110 | max 0 | — |"))
      << table;
  const std::string csv = summaryCsv(report);
  EXPECT_TRUE(contains(csv, ",mrr,0.41,0.62,0.7,\n")) << csv;
  EXPECT_TRUE(contains(csv, ",mrr,0.41,0.62,,110\n")) << csv;
  const std::string md = reportMarkdown(report, PlotSet{});
  EXPECT_TRUE(contains(md, "- **local accesses**: PS")) << md;
  EXPECT_FALSE(contains(md, "final accuracy")) << md;
}

// The other nodes of a bounded run wait while node 0 evaluates between epochs (on WN18RR for
// seconds, longer than their epoch): that wait is node 0's evaluating, which node 0's own time
// leaves out, so theirs leaves it out too, at most the time they waited. A run without a bound
// (async) has nobody waiting for node 0, and keeps its times as they are.
TEST_F(ReportSparseTest, TheOtherNodesWaitForNodeZerosEvaluationsIsLeftOut) {
  const auto run = [&](const std::string& dir, const std::string& staleness, double train,
                       double wait) {
    const std::string start =
        R"("mode":"ps","technique":"classic","staleness":")" + staleness + R"(")";
    write(dir + "/node-0.jsonl", kgeNode(0, start, {0.1, 0.3, 0.35}, R"("local_share":0.5)"));
    write(dir + "/node-1.jsonl",
          kgeNode(1, start, {0.1, 0.3, 0.35}, R"("local_share":0.5)", train, wait));
    return buildReport(loadReportInput(dir_ / dir)).runs.at(0);
  };
  // Node 0: 30 steps in 6 s, 1.5 s waiting; two evaluations of 0.5 s between its epochs.
  const RunSummary held = run("held", "2", 7, 2.5);  // node 1 held up for the 1 s: left out
  EXPECT_DOUBLE_EQ(held.steps_per_s, 5.0);
  EXPECT_DOUBLE_EQ(held.wait_share, 0.25);
  // Node 1 waited 0.4 s in all: at most that is left out (6.1 s of training, no waiting).
  const RunSummary short_wait = run("short", "2", 6.5, 0.4);
  EXPECT_DOUBLE_EQ(short_wait.steps_per_s, (5.0 + 30 / 6.1) / 2);
  EXPECT_DOUBLE_EQ(short_wait.wait_share, 0.25 / 2);
  // Async: node 1's times as its file has them.
  const RunSummary async = run("async", "inf", 7, 2.5);
  EXPECT_DOUBLE_EQ(async.steps_per_s, (5.0 + 30 / 7.0) / 2);
  EXPECT_DOUBLE_EQ(async.wait_share, (0.25 + 2.5 / 7) / 2);
  // The folder's reading notes say so.
  EXPECT_TRUE(contains(sparseReadingNotes(buildReport(loadReportInput(dir_ / "held"))),
                       "held up by node 0's evaluations is left out"));
}

TEST_F(ReportSparseTest, WithoutATargetAndFromALaunchFolderTheColumnsStay) {
  writeKgeCompare("");
  Report report = buildReport(loadReportInput(dir_));
  EXPECT_FALSE(hasTarget(report));
  EXPECT_FALSE(report.runs[0].time_to_target.has_value());
  EXPECT_FALSE(contains(markdownTable(report), "reached")) << markdownTable(report);
  // One run's folder: its variant is named from the start line.
  const Report one = buildReport(loadReportInput(dir_ / "ps-lapse/seed-1"));
  ASSERT_EQ(one.runs.size(), 1u);
  EXPECT_TRUE(contains(markdownTable(one), "| 0.4100 | 0.6200 |")) << markdownTable(one);
}

TEST_F(ReportSparseTest, MatrixFactorizationIsReportedInRmseAndLowerReachesTheTarget) {
  write("runs.jsonl",
        line(R"("event":"compare","command":"c","target_acc":0,"target_metric":"rmse",)"
             R"("target":0.9,"variants":"single")") +
            line(R"("event":"run","variant":"single","seed":1,"dir":"single/seed-1",)"
                 R"("status":"ok","error":"")"));
  write("single/seed-1/node-0.jsonl",
        line(R"("event":"start","time":0,"model":"mf","train_points":50,"mode":"consensus",)"
             R"("node":0)") +
            line(R"("event":"epoch","time":1,"epoch":1,"test_rmse":1.2)") +
            line(R"("event":"epoch","time":2,"epoch":2,"test_rmse":0.85)") +
            line(R"("event":"summary","time":3,"steps":20,"train_seconds":2.5,"wait_seconds":0,)"
                 R"("bytes_out":0,"test_rmse":0.8,"rows_per_round":0)"));
  const Report report = buildReport(loadReportInput(dir_));
  ASSERT_TRUE(report.runs[0].time_to_target.has_value());
  EXPECT_DOUBLE_EQ(*report.runs[0].time_to_target, 2.0);
  EXPECT_EQ(targetName(report), "RMSE 0.900");
  const std::string table = markdownTable(report);
  EXPECT_TRUE(contains(table, "| test RMSE | steps / s |")) << table;
  EXPECT_FALSE(contains(table, "Hits@10")) << table;
  // One node alone: no rows per round to show.
  EXPECT_TRUE(contains(table, "| single | 1/1 | 1/1 | 2.00 | 0.8000 | 8.00 | 0% | 0 | — | — | — |"))
      << table;
}

// A sparse compare whose runs all failed (no metrics at all) still gets the sparse table: the
// manifest's MRR target says what was trained.
TEST_F(ReportSparseTest, ACompareWhoseRunsAllFailedKeepsTheSparseTable) {
  write("runs.jsonl",
        line(R"("event":"compare","command":"c","target_acc":0,"target_metric":"mrr",)"
             R"("target":0.3,"variants":"ps:lapse")") +
            line(R"("event":"run","variant":"ps:lapse","seed":1,"dir":"ps-lapse/seed-1",)"
                 R"("status":"failed","error":"node 0 exited with status 3")"));
  const Report report = buildReport(loadReportInput(dir_));
  EXPECT_TRUE(isSparseReport(report));
  EXPECT_TRUE(contains(markdownTable(report), "| ps:lapse | 0/1 | 0/0 | — | — | — |"))
      << markdownTable(report);
}

TEST_F(ReportSparseTest, TheQualityPlotDrawsEachRunsEvaluationsAndTheTarget) {
  writeKgeCompare(R"("target_metric":"mrr","target":0.3,)");
  const Report report = buildReport(loadReportInput(dir_));
  const PlotSet plots = writeReportFiles(report, dir_);
  ASSERT_FALSE(plots.pngs.empty());
  EXPECT_EQ(plots.pngs[0].filename(), "quality-vs-time.png");
  const std::string gp = read("plots/quality-vs-time.gp");
  EXPECT_TRUE(contains(gp, "set ylabel \"valid MRR\"")) << gp;
  EXPECT_TRUE(contains(gp, "Valid MRR (node 0) against wall time")) << gp;
  // PS's evaluations: epochs 1 and 2, then the summary's, at node 0's training seconds.
  EXPECT_TRUE(contains(gp, "$run0 << EOD\n1.5 0.1\n3 0.3\n5 0.35\nEOD")) << gp;
  EXPECT_TRUE(
      contains(gp, "set xlabel \"seconds of node 0's training (its evaluations left out)\""))
      << gp;
  EXPECT_TRUE(contains(gp, "0.3 with lines dt 2 lc rgb \"black\" title \"MRR 0.300\"")) << gp;
  EXPECT_TRUE(contains(read("report.md"), "![quality-vs-time](plots/quality-vs-time.png)"));
}

}  // namespace
}  // namespace chorus::report
