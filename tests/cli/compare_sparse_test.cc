// `chorus compare` on a sparse model end to end: a small generated knowledge graph trained by
// one node, by PS with two techniques and by sparse gossip on three loopback nodes, reported in
// MRR with the columns that fit; and the target flags and variants that do not fit a model,
// refused with one line before anything runs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/cli/run_command.h"
#include "tests/support/cli_fixture.h"

namespace chorus::testing {
namespace {

namespace fs = std::filesystem;

using testsupport::contains;

using testsupport::readFile;

class CompareSparseTest : public ::testing::Test {
 protected:
  // The planted graph (300 entities: a model can learn which tails fit) and a complete graph of
  // three nodes on loopback ports that were free a moment ago, in a folder of this test's own.
  void SetUp() override {
    testsupport::writePlantedGraphFolder((dir_ / "graphs" / "planted").string());
    topology_ = testsupport::writeCompleteTopology((dir_ / "three.toml").string(), "compare-sparse",
                                                   "ps", freeLoopbackPorts(3));
  }

  CommandResult compare(const std::string& variants, const fs::path& out,
                        std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {chorusBinary(),
                                     "compare",
                                     "--topology",
                                     topology_,
                                     "--variants",
                                     variants,
                                     "--model",
                                     "complex",
                                     "--data",
                                     "planted",
                                     "--data-dir",
                                     (dir_ / "graphs").string(),
                                     "--dim",
                                     "16",
                                     "--negatives",
                                     "16",
                                     "--reg",
                                     "none",
                                     "--init-scale",
                                     "0.1",
                                     "--batch",
                                     "64",
                                     "--epochs",
                                     "3",
                                     "--eval-every-epochs",
                                     "1",
                                     "--out",
                                     out.string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return runCommand(argv, 240);
  }

  static void expectOneLineError(const CommandResult& r, const std::string& part) {
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "chorus: error: ")) << r.err;
    EXPECT_TRUE(contains(r.err, part)) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }

  testsupport::TestFolder folder_{"chorus-compare-sparse"};
  const fs::path dir_ = folder_.path();
  std::string topology_;
};

TEST_F(CompareSparseTest, TechniquesAndGossipRunAndAreReportedInMrr) {
  const fs::path out = dir_ / "kge";
  // A target every variant reaches at its first evaluation: a trained model beats a random one.
  const CommandResult r = compare("single,ps:classic,ps:lapse:ssp:1,consensus:wait-all", out,
                                  {"--target", "0.02", "--log-every", "5", "--cold-every", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[compare] [3/4] ps:lapse:ssp:1 seed 1: finished in")) << r.out;
  EXPECT_TRUE(contains(r.out, "MRR 0.020 reached after")) << r.out;

  // The nodes got what their variant sets, and their mode's flags only.
  const std::string lapse = readFile(out / "ps-lapse-ssp-1/seed-1/command.txt");
  EXPECT_TRUE(contains(lapse, "--mode ps --staleness 1 --technique lapse")) << lapse;
  EXPECT_FALSE(contains(lapse, "--cold-every")) << lapse;
  EXPECT_FALSE(contains(lapse, "--eval-every ")) << lapse;
  const std::string classic = readFile(out / "ps-classic/seed-1/command.txt");
  EXPECT_TRUE(contains(classic, "--mode ps --technique classic")) << classic;
  EXPECT_TRUE(contains(classic, "--log-every 5")) << classic;
  const std::string gossip = readFile(out / "consensus-wait-all/seed-1/command.txt");
  EXPECT_TRUE(contains(gossip, "--cold-every 2")) << gossip;
  EXPECT_FALSE(contains(gossip, "--technique")) << gossip;

  const std::string md = readFile(out / "report.md");
  EXPECT_TRUE(contains(md,
                       "| variant | runs ok | reached MRR 0.020 | time to MRR 0.020 (s), "
                       "median [min, max] | test MRR | test Hits@10 | steps / s |"))
      << md;
  EXPECT_FALSE(contains(md, "final accuracy")) << md;
  // Every variant reached the target; PS rows have a local share and a bound, the gossip row
  // its rows per round.
  for (const char* v : {"single", "ps:classic", "ps:lapse:ssp:1", "consensus:wait-all"}) {
    EXPECT_TRUE(contains(md, std::string("| ") + v + " | 1/1 | 1/1 |")) << v << "\n" << md;
  }
  const std::string csv = readFile(out / "summary.csv");
  std::istringstream rows(csv);
  std::string header, row;
  std::getline(rows, header);
  EXPECT_TRUE(contains(header,
                       ",quality_metric,final_quality,final_hits10,local_share,"
                       "rows_per_round"))
      << header;
  int seen = 0;
  while (std::getline(rows, row)) {
    ++seen;
    EXPECT_TRUE(contains(row, ",mrr,0.")) << row;
    const bool ps = row.starts_with("ps:");
    const bool gossip_row = row.starts_with("consensus:");
    // The last two fields: local share (PS) and rows per round (consensus).
    const std::string tail = row.substr(row.rfind(',', row.rfind(',') - 1));
    EXPECT_EQ(tail.size() > 2 && tail[1] != ',', ps) << row;
    EXPECT_EQ(tail.back() != ',', gossip_row) << row;
  }
  EXPECT_EQ(seen, 4) << csv;
  EXPECT_GT(fs::file_size(out / "plots" / "quality-vs-time.png"), 1000u);
  EXPECT_GT(fs::file_size(out / "plots" / "time-to-target.png"), 1000u);
  // `chorus report` rebuilds the same table from the folder (the target from the manifest).
  const CommandResult again = runCommand({chorusBinary(), "report", out.string()});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(readFile(out / "report.md"), md);
}

// Matrix factorization on generated Zipf ratings: reported in test RMSE, where lower reaches the
// target, with no Hits@10 column; ps:auto (each key's technique chosen from the nodes' row blocks)
// runs beside classic.
TEST_F(CompareSparseTest, MatrixFactorizationIsReportedInRmse) {
  const fs::path out = dir_ / "mf";
  const CommandResult r =
      runCommand({chorusBinary(),  "compare",
                  "--topology",    topology_,
                  "--variants",    "single,ps:classic,ps:auto,consensus:dynamic",
                  "--model",       "mf",
                  "--mf-rows",     "600",
                  "--mf-cols",     "200",
                  "--mf-cells",    "20000",
                  "--epochs",      "3",
                  "--target-rmse", "5",
                  "--out",         out.string()},
                 240);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "RMSE 5.000 reached after")) << r.out;
  const std::string md = readFile(out / "report.md");
  EXPECT_TRUE(contains(md, "| test RMSE | steps / s |")) << md;
  EXPECT_FALSE(contains(md, "Hits@10")) << md;
  for (const char* v : {"single", "ps:classic", "ps:auto", "consensus:dynamic"}) {
    EXPECT_TRUE(contains(md, std::string("| ") + v + " | 1/1 | 1/1 |")) << v << "\n" << md;
  }
  // The nodes train on the model's own default data.
  EXPECT_TRUE(contains(readFile(out / "ps-classic/seed-1/command.txt"), "--data zipf-mf"));
  EXPECT_TRUE(contains(readFile(out / "ps-auto/seed-1/command.txt"), "--technique auto"));
  // ps:auto's workers take the ratings of their row block (Zipf rows: blocks of unequal size);
  // a gossip node the seed's i.i.d. share, whatever the PS default technique is.
  const auto shardSizes = [&](const std::string& variant) {
    std::vector<long> sizes;
    for (int id = 0; id < 3; ++id) {
      const std::string text =
          readFile(out / variant / "seed-1" / ("node-" + std::to_string(id) + ".jsonl"));
      const size_t at = text.find("\"shard_points\":");
      EXPECT_NE(at, std::string::npos) << variant << " node " << id;
      if (at != std::string::npos) sizes.push_back(std::stol(text.substr(at + 15)));
    }
    return sizes;
  };
  const std::vector<long> gossip = shardSizes("consensus-dynamic");
  ASSERT_EQ(gossip.size(), 3u);
  EXPECT_LE(*std::max_element(gossip.begin(), gossip.end()) -
                *std::min_element(gossip.begin(), gossip.end()),
            1)
      << gossip[0] << " " << gossip[1] << " " << gossip[2];
  const std::vector<long> blocks = shardSizes("ps-auto");
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_GT(*std::max_element(blocks.begin(), blocks.end()) -
                *std::min_element(blocks.begin(), blocks.end()),
            1)
      << blocks[0] << " " << blocks[1] << " " << blocks[2];
  EXPECT_GT(fs::file_size(out / "plots" / "quality-vs-time.png"), 1000u);
}

// ps:rotation (Orion's schedule, docs/orion.md) beside a data-parallel variant on Zipf MF: its
// nodes get --mf-schedule rotation and it is reported like the others.
TEST_F(CompareSparseTest, RotationRunsBesideDataParallelOnMatrixFactorization) {
  const fs::path out = dir_ / "rotation";
  const CommandResult r = runCommand({chorusBinary(),  "compare",
                                      "--topology",    topology_,
                                      "--variants",    "ps:classic,ps:rotation",
                                      "--model",       "mf",
                                      "--mf-rows",     "600",
                                      "--mf-cols",     "200",
                                      "--mf-cells",    "20000",
                                      "--epochs",      "3",
                                      "--target-rmse", "5",
                                      "--out",         out.string()},
                                     240);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[compare] [2/2] ps:rotation seed 1: finished in")) << r.out;
  const std::string command = readFile(out / "ps-rotation/seed-1/command.txt");
  EXPECT_TRUE(contains(command, "--mode ps --mf-schedule rotation")) << command;
  EXPECT_FALSE(contains(command, "--staleness")) << command;
  const std::string md = readFile(out / "report.md");
  EXPECT_TRUE(contains(md, "| ps:rotation | 1/1 | 1/1 |")) << md;
  // Refused before any run: another model, a bound, the flag itself.
  expectOneLineError(compare("ps:rotation", dir_ / "a"),
                     "--variants: ps:rotation does not apply to --model complex: rotation is "
                     "Orion's schedule");
  expectOneLineError(compare("ps:rotation:ssp:1", dir_ / "b"), "ps:rotation takes no bound");
  expectOneLineError(compare("ps:classic", dir_ / "c", {"--mf-schedule", "rotation"}),
                     "--mf-schedule cannot be given to compare: the variant name sets it: "
                     "ps:rotation");
  for (const char* folder : {"a", "b", "c"})
    EXPECT_FALSE(fs::exists(dir_ / folder)) << folder;
}

TEST_F(CompareSparseTest, TargetsThatDoNotFitTheModelAreRefused) {
  expectOneLineError(compare("single", dir_ / "a", {"--target-acc", "0.8"}),
                     "--target-acc does not fit --model complex: it reports MRR; use --target-mrr");
  expectOneLineError(compare("single", dir_ / "b", {"--target-rmse", "0.8"}),
                     "--target-rmse does not fit --model complex");
  expectOneLineError(compare("single", dir_ / "c", {"--target-mrr", "0.3", "--target", "0.3"}),
                     "--target-mrr and --target: give one target");
  expectOneLineError(compare("single", dir_ / "d", {"--target", "1.5"}),
                     "--target 1.5: a target in MRR must be a fraction in (0, 1]");
  // The image models' side: an MRR target on the mlp.
  const CommandResult mlp = runCommand(
      {chorusBinary(), "compare", "--topology", topology_, "--variants", "single", "--data",
       "synthetic", "--model", "mlp", "--target-mrr", "0.3", "--out", (dir_ / "e").string()});
  expectOneLineError(mlp, "--target-mrr does not fit --model mlp: it reports test accuracy");
  for (const char* folder : {"a", "b", "c", "d", "e"})
    EXPECT_FALSE(fs::exists(dir_ / folder)) << folder;
}

TEST_F(CompareSparseTest, VariantsAndFlagsThatDoNotFitTheModelAreRefused) {
  // A technique manages a sparse model's rows: not the mlp's.
  const CommandResult mlp = runCommand(
      {chorusBinary(), "compare", "--topology", topology_, "--variants", "ps:bsp,ps:lapse",
       "--data", "synthetic", "--model", "mlp", "--rounds", "10", "--out", (dir_ / "a").string()});
  expectOneLineError(mlp, "--variants: ps:lapse does not apply to --model mlp");
  expectOneLineError(compare("ps:classic", dir_ / "b", {"--rounds", "10"}),
                     "--rounds does not apply to --model complex");
  expectOneLineError(compare("ps:lapse", dir_ / "c", {"--technique", "classic"}),
                     "--technique cannot be given to compare: the variant name sets it");
  expectOneLineError(compare("ps:lapse:ssp", dir_ / "d"), "variant 'ps:lapse:ssp'");
  // A flag the nodes of one variant refuse is found before the first run: one node alone takes
  // no stragglers.
  const CommandResult stragglers =
      compare("single,ps:classic", dir_ / "e", {"--stragglers", "fixed:1"});
  EXPECT_EQ(stragglers.exit_code, 2) << stragglers.out << stragglers.err;
  EXPECT_TRUE(contains(stragglers.err, "variant single: --stragglers does not apply"))
      << stragglers.err;
  EXPECT_FALSE(contains(stragglers.out, "starting")) << stragglers.out;
  for (const char* folder : {"a", "b", "c", "d", "e"})
    EXPECT_FALSE(fs::exists(dir_ / folder)) << folder;
}

}  // namespace
}  // namespace chorus::testing
