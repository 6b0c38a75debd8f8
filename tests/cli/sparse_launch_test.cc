// Sparse models in PS mode through the real executable: `chorus launch` of two nodes trains a
// small generated knowledge graph and a small generated rating matrix to the quality `chorus
// train` reaches with the same flags; `chorus node` runs a one-node cluster; bad flags are
// refused before any node starts, naming the flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tests/cli/run_command.h"
#include "tests/support/cli_fixture.h"

namespace chorus::testing {
namespace {

namespace fs = std::filesystem;

using testsupport::contains;

// The planted graph of 300 entities (tests/support/planted_graph.h) in DIR/planted.
void writePlantedGraph(const std::string& dir) {
  testsupport::writePlantedGraphFolder(dir);
}

// A PS topology of `nodes` nodes on free loopback ports.
std::string writeTopology(const TempDir& dir, int nodes) {
  return testsupport::writeCompleteTopology(dir.file("ps" + std::to_string(nodes) + ".toml"),
                                            "sparse-ps-test", "ps", freeLoopbackPorts(nodes));
}

// The first number after `label` in `text` (NaN when absent).
double numberAfter(const std::string& text, const std::string& label) {
  const size_t at = text.find(label);
  if (at == std::string::npos) return std::nan("");
  return std::stod(text.substr(at + label.size()));
}

std::vector<std::string> kgeFlags(const std::string& data_dir) {
  return {"--model",
          "complex",
          "--data",
          "planted",
          "--data-dir",
          data_dir,
          "--dim",
          "32",
          "--negatives",
          "16",
          "--reg",
          "none",
          "--init-scale",
          "0.1",
          "--batch",
          "32",
          "--epochs",
          "12",
          "--eval-every-epochs",
          "6",
          "--seed",
          "3"};
}

// `chorus launch` with no --technique: auto (the default) trains as well as one node.
TEST(ChorusSparsePs, LaunchTrainsAKnowledgeGraphAsWellAsChorusTrain) {
  TempDir dir("chorus-sparse-ps");
  writePlantedGraph(dir.file("graphs/planted"));
  const std::vector<std::string> flags = kgeFlags(dir.file("graphs"));
  std::vector<std::string> train = {chorusBinary(), "train"};
  train.insert(train.end(), flags.begin(), flags.end());
  const CommandResult alone = runCommand(train);
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  const double single = numberAfter(alone.out, "test (filtered, both directions): mrr ");
  ASSERT_GT(single, 0.08) << alone.out;

  std::vector<std::string> launch = {chorusBinary(), "launch", writeTopology(dir, 2), "--out",
                                     dir.file("out")};
  launch.insert(launch.end(), flags.begin(), flags.end());
  const CommandResult cluster = runCommand(launch);
  ASSERT_EQ(cluster.exit_code, 0) << cluster.out << cluster.err;
  const double ps = numberAfter(cluster.out, "test of the owners' model: mrr ");
  EXPECT_NEAR(ps, single, 0.25 * single) << cluster.out;
  EXPECT_TRUE(contains(cluster.out, "node 1: 12 epoch(s)")) << cluster.out;
  // Node 0's metrics: the single-node run's fields, the evaluation epochs, and PS's own.
  std::ifstream metrics(dir.file("out/node-0.jsonl"));
  const std::string lines((std::istreambuf_iterator<char>(metrics)), {});
  EXPECT_TRUE(contains(lines, "\"event\":\"start\"")) << lines;
  EXPECT_TRUE(contains(lines, "\"valid_mrr\"")) << lines;
  for (const char* field : {"\"test_mrr\"", "\"rows_pulled\"", "\"local_share\"", "\"bytes_out\"",
                            "\"keys_remote\"", "\"points_per_s\""}) {
    EXPECT_TRUE(contains(lines, field)) << field;
  }
  // No --technique: auto, the default, chose each key's technique (the relations, in every
  // step of both nodes, are replicated) and says so in the metrics and the final lines.
  EXPECT_TRUE(contains(lines, "\"technique\":\"auto\"")) << lines;
  EXPECT_GT(numberAfter(lines, "\"replicated_keys\":"), 0) << lines;
  EXPECT_TRUE(contains(lines, "\"home_keys\":")) << lines;
  EXPECT_FALSE(contains(lines, "\"replica_digest\":\"0000000000000000\"")) << lines;
  EXPECT_TRUE(contains(cluster.out, "node 1: auto: ")) << cluster.out;
}

// --sample-scheme reaches every node through the run spec: under classic, onlylocal's negatives
// are all this node's rows (none read from the other node), pool's about half; the final lines
// and the metrics say so. (Under auto, the default, this graph's 300 entities are each drawn by
// both nodes several times a clock: all replicated, so every scheme's draws are local.)
TEST(ChorusSparsePs, TheSampleSchemeReachesTheNodesAndItsEffectIsReported) {
  TempDir dir("chorus-sparse-ps");
  writePlantedGraph(dir.file("graphs/planted"));
  std::vector<std::string> flags = kgeFlags(dir.file("graphs"));
  *std::find(flags.begin(), flags.end(), "12") = "2";  // --epochs 2
  for (const std::string scheme : {"onlylocal", "pool"}) {
    std::vector<std::string> launch = {
        chorusBinary(),    "launch", writeTopology(dir, 2), "--out", dir.file("out-" + scheme),
        "--sample-scheme", scheme,   "--log-every",         "10",    "--technique",
        "classic"};
    if (scheme == "pool") launch.insert(launch.end(), {"--sample-reuse", "4"});
    launch.insert(launch.end(), flags.begin(), flags.end());
    const CommandResult r = runCommand(launch);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    for (int node = 0; node < 2; ++node) {
      const std::string prefix = "node " + std::to_string(node) + ": sample scheme " + scheme;
      ASSERT_TRUE(contains(r.out, prefix)) << r.out;
      const size_t at = r.out.find(prefix);
      const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
      const double share = numberAfter(line, "sampled keys, ");
      if (scheme == "onlylocal") {
        EXPECT_EQ(share, 100.0) << line;
        EXPECT_TRUE(contains(line, "local; 0 sampled keys read from other nodes")) << line;
      } else {
        EXPECT_GT(share, 30.0) << r.out;
        EXPECT_LT(share, 70.0) << r.out;
      }
    }
    std::ifstream metrics(dir.file("out-" + scheme + "/node-1.jsonl"));
    const std::string lines((std::istreambuf_iterator<char>(metrics)), {});
    EXPECT_TRUE(contains(lines, "\"sample_scheme\":\"" + scheme + "\"")) << lines;
    if (scheme == "pool") {
      EXPECT_TRUE(contains(lines, "\"sample_reuse\":4")) << lines;
    }
    // The summary's totals, and a "sample" event every 10 clocks (94 clocks here).
    for (const char* field :
         {"\"sampled_local_share\"", "\"sampled_remote_keys\"", "\"event\":\"sample\""}) {
      EXPECT_TRUE(contains(lines, field)) << field << "\n" << lines;
    }
  }
}

// --technique lapse reaches every node through the run spec: the rows move (more than a
// half's share of the accesses local on two nodes), and the metrics name the technique.
TEST(ChorusSparsePs, TheTechniqueReachesTheNodes) {
  TempDir dir("chorus-sparse-lapse");
  writePlantedGraph(dir.file("graphs/planted"));
  std::vector<std::string> flags = kgeFlags(dir.file("graphs"));
  *std::find(flags.begin(), flags.end(), "12") = "2";  // --epochs 2
  std::vector<std::string> launch = {chorusBinary(), "launch",        writeTopology(dir, 2),
                                     "--out",        dir.file("out"), "--technique",
                                     "lapse"};
  launch.insert(launch.end(), flags.begin(), flags.end());
  const CommandResult r = runCommand(launch);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int node = 0; node < 2; ++node) {
    std::ifstream metrics(dir.file("out/node-" + std::to_string(node) + ".jsonl"));
    const std::string lines((std::istreambuf_iterator<char>(metrics)), {});
    EXPECT_TRUE(contains(lines, "\"technique\":\"lapse\"")) << lines;
    EXPECT_TRUE(contains(lines, "\"localized_keys\"")) << lines;
  }
}

// --time-limit, --keep-best and --stragglers reach launched sparse PS nodes through the run spec:
// node 1 straggles 20 ms per clock (its start event names the profile), every node's time is up
// after the first of 4 epochs (so each says so and stops there), and node 0 evaluates with
// model selection on (the first epoch's tables, the only ones there are).
TEST(ChorusSparsePs, TimeLimitKeepBestAndStragglersReachTheNodes) {
  TempDir dir("chorus-sparse-run-options");
  writePlantedGraph(dir.file("graphs/planted"));
  std::vector<std::string> flags = kgeFlags(dir.file("graphs"));
  *std::find(flags.begin(), flags.end(), "12") = "4";  // --epochs 4
  *std::find(flags.begin(), flags.end(), "6") = "1";   // --eval-every-epochs 1
  std::vector<std::string> launch = {chorusBinary(), "launch",        writeTopology(dir, 2),
                                     "--out",        dir.file("out"), "--technique",
                                     "classic",      "--time-limit",  "0.000001",
                                     "--keep-best",  "--stragglers",  "slow:1=1.5"};
  launch.insert(launch.end(), flags.begin(), flags.end());
  const CommandResult r = runCommand(launch);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out + r.err, "node 0: 1 epoch(s)")) << r.out << r.err;
  EXPECT_TRUE(contains(r.out + r.err, "node 1: 1 epoch(s)")) << r.out << r.err;
  for (int node = 0; node < 2; ++node) {
    std::ifstream metrics(dir.file("out/node-" + std::to_string(node) + ".jsonl"));
    const std::string lines((std::istreambuf_iterator<char>(metrics)), {});
    EXPECT_TRUE(contains(lines, "\"stragglers\":\"slow:1=1.5\"")) << lines;
    EXPECT_TRUE(contains(lines, "\"epochs\":1,\"evaluated_epoch\":1")) << lines;
  }
}

// --technique nups through the run spec: three launched nodes replicate the hot keys (the
// relations' rows and the most used entities by the data's pre-scan), reach chorus train's MRR,
// print and record the replicas' share, rounds and age, and every node's replicas end as the
// same bits (the digest in each node's summary).
TEST(ChorusSparsePs, NupsReplicatesTheHotKeysOnEveryNode) {
  TempDir dir("chorus-sparse-nups");
  writePlantedGraph(dir.file("graphs/planted"));
  const std::vector<std::string> flags = kgeFlags(dir.file("graphs"));
  std::vector<std::string> train = {chorusBinary(), "train"};
  train.insert(train.end(), flags.begin(), flags.end());
  const CommandResult alone = runCommand(train);
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  const double single = numberAfter(alone.out, "test (filtered, both directions): mrr ");
  ASSERT_GT(single, 0.08) << alone.out;

  std::vector<std::string> launch = {chorusBinary(),
                                     "launch",
                                     writeTopology(dir, 3),
                                     "--out",
                                     dir.file("out"),
                                     "--technique",
                                     "nups",
                                     "--replicate",
                                     "24",
                                     "--replica-syncs-per-s",
                                     "40",
                                     "--staleness",
                                     "0"};
  launch.insert(launch.end(), flags.begin(), flags.end());
  const CommandResult r = runCommand(launch);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NEAR(numberAfter(r.out, "test of the owners' model: mrr "), single, 0.5 * single) << r.out;
  std::string digest;
  for (int node = 0; node < 3; ++node) {
    const std::string prefix = "node " + std::to_string(node) + ": nups: 24 hot keys replicated";
    EXPECT_TRUE(contains(r.out, prefix)) << r.out;
    std::ifstream metrics(dir.file("out/node-" + std::to_string(node) + ".jsonl"));
    const std::string lines((std::istreambuf_iterator<char>(metrics)), {});
    EXPECT_TRUE(contains(lines, "\"technique\":\"nups\"")) << lines;
    EXPECT_TRUE(contains(lines, "\"replicated_keys\":24")) << lines;
    EXPECT_TRUE(contains(lines, "\"replica_syncs_per_s\":40")) << lines;
    EXPECT_GT(numberAfter(lines, "\"replica_rounds\":"), 0) << lines;
    EXPECT_GT(numberAfter(lines, "\"replica_staleness_max_s\":"), 0) << lines;
    EXPECT_EQ(numberAfter(lines, "\"replica_lost_deltas\":"), 0) << lines;
    const size_t at = lines.find("\"replica_digest\":\"");
    ASSERT_NE(at, std::string::npos) << lines;
    const std::string mine = lines.substr(at + 18, 16);
    if (node == 0) digest = mine;
    EXPECT_EQ(mine, digest) << "node " << node;
    EXPECT_NE(mine, "0000000000000000") << "node " << node << " did not drain";
  }
}

// --sample-scheme under --technique lapse (the sampling primitives read, localize and ask
// locality through the relocation shell): onlylocal's negatives are all rows held here, none
// read from the other node; preloc's move here and train.
TEST(ChorusSparsePs, TheSampleSchemesRunUnderLapse) {
  TempDir dir("chorus-sparse-lapse-sampling");
  writePlantedGraph(dir.file("graphs/planted"));
  std::vector<std::string> flags = kgeFlags(dir.file("graphs"));
  *std::find(flags.begin(), flags.end(), "12") = "2";  // --epochs 2
  for (const std::string scheme : {"onlylocal", "preloc"}) {
    std::vector<std::string> launch = {
        chorusBinary(), "launch", writeTopology(dir, 2), "--out", dir.file("out-" + scheme),
        "--technique",  "lapse",  "--sample-scheme",     scheme};
    launch.insert(launch.end(), flags.begin(), flags.end());
    const CommandResult r = runCommand(launch);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    for (int node = 0; node < 2; ++node) {
      const std::string prefix = "node " + std::to_string(node) + ": sample scheme " + scheme;
      ASSERT_TRUE(contains(r.out, prefix)) << r.out;
      const size_t at = r.out.find(prefix);
      const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
      if (scheme == "onlylocal") {
        EXPECT_EQ(numberAfter(line, "sampled keys, "), 100.0) << line;
        EXPECT_TRUE(contains(line, "local; 0 sampled keys read from other nodes")) << line;
      }
      std::ifstream metrics(dir.file("out-" + scheme + "/node-" + std::to_string(node) + ".jsonl"));
      const std::string lines((std::istreambuf_iterator<char>(metrics)), {});
      EXPECT_TRUE(contains(lines, "\"technique\":\"lapse\"")) << lines;
      EXPECT_TRUE(contains(lines, "\"sample_scheme\":\"" + scheme + "\"")) << lines;
      EXPECT_TRUE(contains(lines, "\"failed_pulls\":0")) << lines;
    }
  }
}

// --sample-scheme under --technique nups: the replicated hot keys are local on every node, the
// others while this node holds them, so onlylocal reads no sampled row from the other node and
// pool trains through the same seam.
TEST(ChorusSparsePs, TheSampleSchemesRunUnderNups) {
  TempDir dir("chorus-sparse-nups-sampling");
  writePlantedGraph(dir.file("graphs/planted"));
  std::vector<std::string> flags = kgeFlags(dir.file("graphs"));
  *std::find(flags.begin(), flags.end(), "12") = "2";  // --epochs 2
  for (const std::string scheme : {"onlylocal", "pool"}) {
    std::vector<std::string> launch = {
        chorusBinary(), "launch", writeTopology(dir, 2), "--out", dir.file("out-" + scheme),
        "--technique",  "nups",   "--replicate",         "24",    "--sample-scheme",
        scheme};
    launch.insert(launch.end(), flags.begin(), flags.end());
    const CommandResult r = runCommand(launch);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    for (int node = 0; node < 2; ++node) {
      const std::string prefix = "node " + std::to_string(node) + ": sample scheme " + scheme;
      ASSERT_TRUE(contains(r.out, prefix)) << r.out;
      const size_t at = r.out.find(prefix);
      const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
      if (scheme == "onlylocal") {
        EXPECT_TRUE(contains(line, "local; 0 sampled keys read from other nodes")) << line;
      }
      std::ifstream metrics(dir.file("out-" + scheme + "/node-" + std::to_string(node) + ".jsonl"));
      const std::string lines((std::istreambuf_iterator<char>(metrics)), {});
      EXPECT_TRUE(contains(lines, "\"technique\":\"nups\"")) << lines;
      EXPECT_TRUE(contains(lines, "\"failed_pulls\":0")) << lines;
    }
  }
}

TEST(ChorusSparsePs, ANodeAloneAndALaunchedPairFactorizeLikeChorusTrain) {
  TempDir dir("chorus-sparse-ps");
  const std::vector<std::string> flags = {
      "--model",    "mf",    "--mf-rows",         "400", "--mf-cols", "200",
      "--mf-cells", "30000", "--mf-planted-rank", "4",   "--rank",    "4",
      "--epochs",   "6",     "--batch",           "200", "--seed",    "2"};
  std::vector<std::string> train = {chorusBinary(), "train"};
  train.insert(train.end(), flags.begin(), flags.end());
  const CommandResult alone = runCommand(train);
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  const double single = numberAfter(alone.out, "test: RMSE ");
  ASSERT_LT(single, 0.6) << alone.out;

  std::vector<std::string> node = {chorusBinary(),        "node", "--topology",
                                   writeTopology(dir, 1), "--id", "0"};
  node.insert(node.end(), flags.begin(), flags.end());
  const CommandResult one = runCommand(node);
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  EXPECT_NEAR(numberAfter(one.out, "test of the owners' model: rmse "), single, 0.1 * single)
      << one.out;

  // Classic under BSP: the pair's result must not depend on how the machine schedules the two
  // processes. Under SSP or auto's timed replica syncs a starved node reads staler rows, and on a
  // loaded machine the RMSE drifted 16% from one run to the next.
  std::vector<std::string> launch = {
      chorusBinary(), "launch", writeTopology(dir, 2), "--technique", "classic",
      "--staleness",  "0"};
  launch.insert(launch.end(), flags.begin(), flags.end());
  const CommandResult two = runCommand(launch);
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  EXPECT_NEAR(numberAfter(two.out, "test of the owners' model: rmse "), single, 0.1 * single)
      << two.out;
}

// --bandwidth in sparse PS mode (docs/managed-comm.md, "Sparse rows"): two launched nodes with
// a budget, a bound of 2 and links of 5 ms train MF as chorus train does, every node pushes rows
// and reads a good share of its rows from the pushed copy, and the metrics say so.
TEST(ChorusSparsePs, ManagedCommunicationServesRowsOnLaunchedNodes) {
  TempDir dir("chorus-sparse-managed");
  const std::vector<std::string> flags = {
      "--model",    "mf",    "--mf-rows",         "400", "--mf-cols", "200",
      "--mf-cells", "30000", "--mf-planted-rank", "4",   "--rank",    "4",
      "--epochs",   "6",     "--batch",           "200", "--seed",    "2"};
  std::vector<std::string> train = {chorusBinary(), "train"};
  train.insert(train.end(), flags.begin(), flags.end());
  const CommandResult alone = runCommand(train);
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  const double single = numberAfter(alone.out, "test: RMSE ");
  std::vector<std::string> launch = {chorusBinary(), "launch",        writeTopology(dir, 2),
                                     "--out",        dir.file("out"), "--mode",
                                     "ps",           "--staleness",   "2",
                                     "--bandwidth",  "100",           "--technique",
                                     "classic",      "--link-delay",  "5"};
  launch.insert(launch.end(), flags.begin(), flags.end());
  const CommandResult two = runCommand(launch);
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  EXPECT_NEAR(numberAfter(two.out, "test of the owners' model: rmse "), single, 0.15 * single)
      << two.out;
  for (int node = 0; node < 2; ++node) {
    std::ifstream metrics(dir.file("out/node-" + std::to_string(node) + ".jsonl"));
    const std::string lines((std::istreambuf_iterator<char>(metrics)), {});
    EXPECT_TRUE(contains(lines, "\"bandwidth_mbps\":100")) << lines;
    ASSERT_TRUE(contains(lines, "\"cache_hit_rate\":")) << lines;
    EXPECT_GT(numberAfter(lines, "\"cache_hit_rate\":"), 0.3) << lines;
    EXPECT_GT(numberAfter(lines, "\"managed_rows_received\":"), 0) << lines;
    EXPECT_TRUE(contains(lines, "\"managed_refused\":0")) << lines;
  }
}

// --mf-schedule rotation through the run spec (docs/orion.md): two launched nodes train by Orion's
// rotation, reach chorus train's RMSE, record the schedule and report the plan and barriers.
TEST(ChorusSparsePs, RotationTrainsMfOnLaunchedNodes) {
  TempDir dir("chorus-sparse-rotation");
  const std::vector<std::string> flags = {
      "--model",    "mf",    "--mf-rows",         "400", "--mf-cols", "200",
      "--mf-cells", "30000", "--mf-planted-rank", "4",   "--rank",    "4",
      "--epochs",   "6",     "--batch",           "200", "--seed",    "2"};
  std::vector<std::string> train = {chorusBinary(), "train"};
  train.insert(train.end(), flags.begin(), flags.end());
  const CommandResult alone = runCommand(train);
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  const double single = numberAfter(alone.out, "test: RMSE ");
  std::vector<std::string> launch = {chorusBinary(), "launch",        writeTopology(dir, 2),
                                     "--out",        dir.file("out"), "--mf-schedule",
                                     "rotation"};
  launch.insert(launch.end(), flags.begin(), flags.end());
  const CommandResult two = runCommand(launch);
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  EXPECT_NEAR(numberAfter(two.out, "test of the owners' model: rmse "), single, 0.1 * single)
      << two.out;
  EXPECT_TRUE(contains(two.out, "rotation: 2x2 blocks of ")) << two.out;
  EXPECT_TRUE(contains(two.out, "11 sub-epoch hand-offs")) << two.out;  // 6 epochs x 2 - 1
  for (int node = 0; node < 2; ++node) {
    std::ifstream metrics(dir.file("out/node-" + std::to_string(node) + ".jsonl"));
    const std::string lines((std::istreambuf_iterator<char>(metrics)), {});
    EXPECT_TRUE(contains(lines, "\"schedule\":\"rotation\"")) << lines;
    EXPECT_TRUE(contains(lines, "\"rotation_sync\":\"hand-off\"")) << lines;
    EXPECT_TRUE(contains(lines, "\"technique\":\"lapse\"")) << lines;
  }
  // rotation-barrier: the all-worker barrier; the same serial model, to the last printed digit.
  std::vector<std::string> barrier = {
      chorusBinary(),      "launch",        writeTopology(dir, 2), "--out",
      dir.file("barrier"), "--mf-schedule", "rotation-barrier"};
  barrier.insert(barrier.end(), flags.begin(), flags.end());
  const CommandResult b = runCommand(barrier);
  ASSERT_EQ(b.exit_code, 0) << b.out << b.err;
  EXPECT_TRUE(contains(b.out, "11 sub-epoch barriers")) << b.out;
  EXPECT_EQ(numberAfter(b.out, "test of the owners' model: rmse "),
            numberAfter(two.out, "test of the owners' model: rmse "))
      << b.out;
}

TEST(ChorusSparsePs, RotationIsRefusedWhereItCannotWork) {
  TempDir dir("chorus-sparse-rotation");
  const std::string topology = writeTopology(dir, 2);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--model", "complex", "--mf-schedule", "rotation"},
       "--mf-schedule rotation applies to --model mf"},
      {{"--model", "mf", "--mf-schedule", "rotation", "--technique", "nups"},
       "--mf-schedule rotation moves whole column blocks by relocation and runs with --technique "
       "lapse, not nups (a replicated hot column"},
      {{"--model", "mf", "--mf-schedule", "rotation", "--technique", "classic"},
       "runs with --technique lapse, not classic"},
      {{"--model", "mf", "--mf-schedule", "rotation", "--staleness", "2"},
       "--staleness does not apply to --mf-schedule rotation"},
      {{"--mode", "consensus", "--model", "mf", "--mf-schedule", "rotation"},
       "--mf-schedule rotation is a PS mode schedule"},
      {{"--model", "mlp", "--mf-schedule", "rotation"},
       "--mf-schedule does not apply to --model mlp"},
      {{"--model", "mf", "--mf-schedule", "orion"}, "--mf-schedule: orion not in {data-parallel,"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> argv = {chorusBinary(), "launch", topology};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const CommandResult r = runCommand(argv, 60);
    EXPECT_EQ(r.exit_code, 2) << message << "\n" << r.out << r.err;
    EXPECT_TRUE(contains(r.err, message)) << r.err;
    EXPECT_FALSE(contains(r.out, "[node 0]")) << "a node started: " << r.out;
  }
}

TEST(ChorusSparsePs, BadFlagsAreRefusedBeforeAnyNodeStarts) {
  TempDir dir("chorus-sparse-ps");
  const std::string topology = writeTopology(dir, 2);
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--model", "complex", "--rejoin"},
       "--rejoin does not apply to --model complex (a sparse PS node cannot rejoin yet"},
      {{"--model", "complex", "--cold-every", "4"},
       "--cold-every does not apply to --model complex (the flags of sparse gossip"},
      {{"--model", "mlp", "--dense-exchange"}, "--dense-exchange does not apply to --model mlp"},
      {{"--mode", "consensus", "--model", "mf", "--staleness", "inf"},
       "--staleness inf: consensus mode needs a bound"},
      {{"--model", "complex", "--momentum", "0.9"}, "--momentum does not apply to --model complex"},
      {{"--model", "mf", "--dim", "8"}, "--dim does not apply to --model mf"},
      {{"--model", "distmult", "--rank", "8"}, "--rank does not apply to --model distmult"},
      {{"--model", "complex", "--data", "mnist"}, "--data mnist is not a knowledge graph"},
      {{"--model", "mlp", "--data", "wn18rr"}, "--data wn18rr is not a data set of --model mlp"},
      {{"--model", "mf", "--epochs", "1.5"}, "--epochs 1.5: a sparse model trains whole epochs"},
      {{"--model", "mf", "--keep-best"}, "--keep-best does not apply to --model mf"},
      {{"--mode", "consensus", "--model", "complex", "--time-limit", "5"},
       "--time-limit does not apply to --model complex (a time limit is not implemented in "
       "sparse consensus runs yet"},
      {{"--model", "mf", "--key-floats", "8"}, "--key-floats does not apply to --model mf"},
      {{"--model", "complex", "--negatives", "x"}, "--negatives must be 'all' or a count"},
      {{"--model", "mf", "--data", "ratings"}, "--data ratings needs --data-file FILE"},
      {{"--model", "complex", "--data", "nosuch"}, "knowledge graph 'nosuch' not found"},
      {{"--model", "mf", "--sample-scheme", "pool"},
       "--sample-scheme does not apply to --model mf"},
      {{"--model", "mlp", "--sample-scheme", "naive"},
       "--sample-scheme does not apply to --model mlp"},
      {{"--model", "complex", "--sample-scheme", "nosuch"},
       "--sample-scheme must be naive, preloc, pool, postpone or onlylocal, not 'nosuch'"},
      {{"--model", "complex", "--sample-scheme", "naive", "--sample-reuse", "4"},
       "--sample-reuse applies to --sample-scheme pool and postpone, not naive"},
      {{"--model", "complex", "--sample-scheme", "pool", "--sample-reuse", "0"},
       "--sample-reuse must be in [1, 1000000]"},
      {{"--model", "complex", "--sample-reuse", "4"},
       "--sample-reuse needs --sample-scheme pool or postpone"},
      {{"--model", "complex", "--negatives", "all", "--sample-scheme", "naive"},
       "--sample-scheme does not apply with --negatives all"},
      {{"--mode", "consensus", "--model", "distmult", "--sample-scheme", "naive"},
       "--sample-scheme does not apply to --model distmult (the sampling schemes draw the "
       "negatives through PS mode's primitives"},
      {{"--model", "complex", "--technique", "auto", "--replicate", "10"},
       "--replicate N sets nups's hot-set size; --technique auto chooses each key's technique "
       "itself"},
      {{"--model", "complex", "--replicate", "10"},
       "--replicate N sets nups's hot-set size; --technique auto chooses each key's technique "
       "itself"},
      {{"--model", "complex", "--technique", "nosuch"},
       "--technique nosuch: unknown technique (auto, classic, lapse or nups)"},
      {{"--model", "complex", "--technique", "classic", "--replicate", "10"},
       "--replicate applies to --technique nups only (this run's is classic)"},
      {{"--model", "complex", "--technique", "lapse", "--replica-syncs-per-s", "5"},
       "--replica-syncs-per-s applies to --technique nups or auto only (this run's is lapse)"},
      {{"--model", "complex", "--technique", "nups", "--replicate", "10", "--replica-bytes",
        "4096"},
       "--replicate N and --replica-bytes both choose the hot set: give one"},
      {{"--model", "complex", "--technique", "nups", "--replica-syncs-per-s", "2000"},
       "--replica-syncs-per-s: Value 2000 not in range"},
      {{"--model", "complex", "--technique", "nups", "--replicate", "-3"},
       "--replicate: Value -3 not in range"},
      {{"--model", "mlp", "--replicate", "4"}, "--replicate does not apply to --model mlp"},
      {{"--mode", "consensus", "--model", "complex", "--replica-bytes", "4096"},
       "--replica-bytes does not apply to --model complex (--technique nups replicates hot rows "
       "in PS mode"},
      {{"--model", "mlp", "--technique", "lapse"}, "--technique does not apply to --model mlp"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {chorusBinary(), "launch", topology};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    const CommandResult r = runCommand(argv, 60);
    EXPECT_EQ(r.exit_code, 2) << c.message << "\n" << r.out << r.err;
    EXPECT_TRUE(contains(r.err, c.message)) << r.err;
    EXPECT_FALSE(contains(r.out, "[node 0]")) << "a node started: " << r.out;
  }
  // chorus node refuses the same, alone.
  const CommandResult node =
      runCommand({chorusBinary(), "node", "--topology", topology, "--id", "0", "--mode",
                  "consensus", "--model", "mf", "--skip-gap", "2"},
                 60);
  EXPECT_EQ(node.exit_code, 2);
  EXPECT_TRUE(contains(node.err, "--skip-gap does not apply to --model mf")) << node.err;
}

// Consensus mode for a sparse model (docs/sparse-consensus.md): a launched ring of three trains
// the planted graph near chorus train's MRR, node 0 evaluates at the evaluation epochs and the
// end, and the metrics carry the rows and bytes of every round; the dense exchange of the same
// run sends several times the bytes.
TEST(ChorusSparseConsensus, LaunchTrainsAKnowledgeGraphWithFewerBytesThanTheDenseExchange) {
  TempDir dir("chorus-sparse-consensus");
  writePlantedGraph(dir.file("graphs/planted"));
  std::vector<std::string> flags = kgeFlags(dir.file("graphs"));
  flags.insert(flags.end(), {"--share-negatives", "--mode", "consensus", "--backup", "wait-all",
                             "--staleness", "0", "--cold-every", "4"});
  std::vector<std::string> train = {chorusBinary(), "train"};
  for (const std::string& f : kgeFlags(dir.file("graphs")))
    train.push_back(f);
  train.push_back("--share-negatives");
  const CommandResult alone = runCommand(train);
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  const double single = numberAfter(alone.out, "test (filtered, both directions): mrr ");
  ASSERT_GT(single, 0.08) << alone.out;

  double bytes[2] = {0, 0};
  for (int dense = 0; dense < 2; ++dense) {
    const std::string out = dir.file(dense ? "dense" : "sparse");
    std::vector<std::string> launch = {chorusBinary(), "launch", writeTopology(dir, 3), "--out",
                                       out};
    launch.insert(launch.end(), flags.begin(), flags.end());
    if (dense) launch.push_back("--dense-exchange");
    const CommandResult r = runCommand(launch);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const double mrr = numberAfter(r.out, "test of its replica: mrr ");
    EXPECT_NEAR(mrr, single, 0.35 * single) << r.out;
    EXPECT_TRUE(contains(r.out, "node 2: 12 epoch(s)")) << r.out;
    // Every node evaluates its own replica (the others on the final split only).
    EXPECT_TRUE(contains(r.out, "node 2: test of its replica: mrr ")) << r.out;
    EXPECT_FALSE(contains(r.out, "node 2: valid of its replica")) << r.out;
    std::ifstream metrics(out + "/node-0.jsonl");
    const std::string lines((std::istreambuf_iterator<char>(metrics)), {});
    for (const char* field :
         {"\"event\":\"round\"", "\"rows_sent\"", "\"share_bytes\"", "\"bytes_sent\"",
          "\"valid_mrr\"", "\"test_mrr\"", "\"rows_per_round\"", "\"bytes_per_round\""}) {
      EXPECT_TRUE(contains(lines, field)) << field;
    }
    EXPECT_TRUE(contains(lines, dense ? "\"exchange\":\"dense\"" : "\"exchange\":\"sparse\""));
    const size_t at = lines.find("\"bytes_per_round\":");
    ASSERT_NE(at, std::string::npos);
    bytes[dense] = std::stod(lines.substr(at + 18));
  }
  EXPECT_GT(bytes[0], 0);
  EXPECT_LT(bytes[0] * 2, bytes[1]) << "sparse " << bytes[0] << " dense " << bytes[1];
}

}  // namespace
}  // namespace chorus::testing
