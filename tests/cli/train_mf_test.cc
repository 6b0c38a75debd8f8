// `chorus train --model mf` end to end: a small generated run reaches the noise-floor target and
// writes its data and metrics; bad flags and bad rating files fail with the flag or file:line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/cli/run_command.h"
#include "tests/support/cli_fixture.h"

namespace chorus::testing {
namespace {

namespace fs = std::filesystem;

using testsupport::contains;

TEST(ChorusTrainMf, SmallGeneratedRunMeetsTheTargetAndWritesItsData) {
  TempDir dir("chorus-train-mf");
  CommandResult r = runCommand({chorusBinary(),
                                "train",
                                "--model",
                                "mf",
                                "--mf-rows",
                                "300",
                                "--mf-cols",
                                "200",
                                "--mf-cells",
                                "60000",
                                "--mf-planted-rank",
                                "4",
                                "--rank",
                                "4",
                                "--epochs",
                                "15",
                                "--batch",
                                "100",
                                "--seed",
                                "7",
                                "--write-data",
                                dir.file("data"),
                                "--out",
                                dir.file("m")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "(target <= 1.05: met)")) << r.out;
  EXPECT_TRUE(contains(r.err, "skew of rows (users): 300 keys")) << r.err;
  EXPECT_TRUE(contains(r.err, "skew of columns (items): 200 keys")) << r.err;
  EXPECT_TRUE(fs::file_size(dir.file("data/train.csv")) > 0);
  std::ifstream metrics(dir.file("m/node-0.jsonl"));
  std::string line, last;
  while (std::getline(metrics, line))
    last = line;
  EXPECT_TRUE(contains(last, "\"event\":\"summary\"")) << last;
  EXPECT_TRUE(contains(last, "\"target_met\":true")) << last;
  // The written training part reads back through --data ratings (its own 10% test split).
  r = runCommand({chorusBinary(), "train", "--model", "mf", "--data", "ratings", "--data-file",
                  dir.file("data/train.csv"), "--rank", "4", "--epochs", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "noise floor unknown")) << r.out;
}

TEST(ChorusTrainMf, BadFlagsAndFilesAreRefused) {
  TempDir dir("chorus-train-mf");
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string says;
  };
  std::ofstream(dir.file("bad.csv")) << "user,item,rating\n1,2,3\n1,2,x\n";
  const Case cases[] = {
      {{"--model", "mf", "--momentum", "0.5"}, 2, "--momentum does not apply to --model mf"},
      {{"--model", "mf", "--data", "mnist"}, 2, "--model mf trains on --data zipf-mf"},
      {{"--data", "zipf-mf"}, 2, "--data zipf-mf needs --model mf"},
      {{"--model", "mlp", "--rank", "8"}, 2, "--rank applies to --model mf only"},
      {{"--model", "mf", "--data", "ratings", "--data-file", dir.file("bad.csv"), "--mf-rows", "5"},
       2,
       "--mf-rows applies to --data zipf-mf only"},
      {{"--model", "mf", "--data", "ratings"}, 2, "--data ratings needs --data-file"},
      {{"--model", "mf", "--mf-rows", "0"}, 2, "--mf-rows must be in"},
      {{"--model", "mf", "--mf-cells", "100000000000000"}, 2, "lower --mf-cells"},
      {{"--model", "mf", "--optimizer", "adam"}, 2, "--optimizer"},
      {{"--model", "mf", "--data", "ratings", "--data-file", dir.file("bad.csv")},
       1,
       "bad.csv:3: rating 'x' is not a finite number"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {chorusBinary(), "train"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    const CommandResult r = runCommand(argv);
    EXPECT_EQ(r.exit_code, c.code) << c.says << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, c.says)) << "expected \"" << c.says << "\" in:\n" << r.err;
  }
}

// --eval-every counts steps; the knowledge-graph models count epochs with --eval-every-epochs,
// and read the old spelling as epochs for one release, saying so.
TEST(ChorusTrain, EvalEveryCountsStepsAndTheKgeModelsHaveTheirOwnFlag) {
  TempDir dir("chorus-eval-every");
  fs::create_directories(dir.file("tiny"));
  std::ofstream(dir.file("tiny/train.txt")) << "a\tr\tb\nb\tr\tc\nc\tr\ta\na\ts\tc\n";
  std::ofstream(dir.file("tiny/valid.txt")) << "a\tr\tc\n";
  std::ofstream(dir.file("tiny/test.txt")) << "b\tr\ta\n";
  const std::vector<std::string> kge = {chorusBinary(), "train", "--model",     "complex",
                                        "--data",       "tiny",  "--data-dir",  dir.file(""),
                                        "--dim",        "4",     "--epochs",    "2",
                                        "--batch",      "2",     "--negatives", "2"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> argv = kge;
    argv.insert(argv.end(), more.begin(), more.end());
    return runCommand(argv);
  };
  CommandResult r = with({"--eval-every-epochs", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_FALSE(contains(r.err, "deprecated")) << r.err;
  r = with({"--eval-every", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.err,
                       "--eval-every for the knowledge-graph models is deprecated and goes in the "
                       "next release: write --eval-every-epochs 1"))
      << r.err;
  r = with({"--eval-every", "1", "--eval-every-epochs", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "give --eval-every-epochs alone")) << r.err;

  r = runCommand({chorusBinary(), "train", "--model", "softmax", "--data", "synthetic",
                  "--eval-every-epochs", "2"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--eval-every-epochs applies to the knowledge-graph models only"))
      << r.err;
  r = runCommand({chorusBinary(), "train", "--model", "mf", "--eval-every", "3"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--eval-every does not apply to --model mf")) << r.err;
}

}  // namespace
}  // namespace chorus::testing
