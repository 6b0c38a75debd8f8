// `chorus compare` and `chorus report` end to end: a two-variant compare on tiny synthetic data,
// and the bad inputs that must be refused with one clear line before anything runs.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/cli/run_command.h"
#include "tests/support/cli_fixture.h"

namespace chorus::testing {
namespace {

namespace fs = std::filesystem;

using testsupport::contains;

using testsupport::readFile;

class CompareTest : public ::testing::Test {
 protected:
  void SetUp() override { topology_ = writeTopology("three.toml", ""); }

  // A complete graph of three nodes on ports that were free a moment ago; node 1 gets the
  // straggler attribute `node1_stragglers` when it is not empty, and `node1_port` when given.
  std::string writeTopology(const std::string& name, const std::string& node1_stragglers,
                            uint16_t node1_port = 0) {
    std::vector<uint16_t> ports = freeLoopbackPorts(3);
    if (node1_port != 0) ports[1] = node1_port;
    return testsupport::writeCompleteTopology(
        (dir_ / name).string(), "compare-test", "consensus", ports, [&](int i) {
          return i == 1 && !node1_stragglers.empty() ? "stragglers = \"" + node1_stragglers + "\"\n"
                                                     : std::string();
        });
  }

  // A compare of `variants` on tiny synthetic data into `out`, plus `extra` arguments.
  CommandResult compare(const std::string& variants, const fs::path& out,
                        std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {chorusBinary(),
                                     "compare",
                                     "--topology",
                                     topology_,
                                     "--variants",
                                     variants,
                                     "--data",
                                     "synthetic",
                                     "--synthetic-train",
                                     "1500",
                                     "--synthetic-test",
                                     "300",
                                     "--model",
                                     "mlp",
                                     "--hidden",
                                     "16",
                                     "--rounds",
                                     "60",
                                     "--eval-every",
                                     "10",
                                     "--target-acc",
                                     "0.5",
                                     "--out",
                                     out.string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return runCommand(argv, 240);
  }

  // The command failed with status 2 and exactly one error line naming `part`.
  static void expectOneLineError(const CommandResult& r, const std::string& part) {
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "chorus: error: ")) << r.err;
    EXPECT_TRUE(contains(r.err, part)) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }

  testsupport::TestFolder folder_{"chorus-compare"};
  const fs::path dir_ = folder_.path();
  std::string topology_;
};

TEST_F(CompareTest, TwoVariantsRunEndToEndAndTheReportCanBeRebuilt) {
  const fs::path out = dir_ / "cmp";
  CommandResult r = compare("single,consensus:wait-all", out);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[compare] [1/2] single seed 1: starting")) << r.out;
  EXPECT_TRUE(contains(r.out, "[compare] [2/2] consensus:wait-all seed 1: finished in")) << r.out;
  EXPECT_TRUE(contains(r.out, "| single | 1/1 |")) << r.out;

  // Per-run metrics: one node for single, three for the consensus variant.
  EXPECT_TRUE(fs::exists(out / "single/seed-1/node-0.jsonl"));
  EXPECT_FALSE(fs::exists(out / "single/seed-1/node-1.jsonl"));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(
        fs::exists(out / "consensus-wait-all/seed-1" / ("node-" + std::to_string(i) + ".jsonl")));
  }
  // The single variant did the rounds of all three nodes and got the same other options.
  const std::string single_cmd = readFile(out / "single/seed-1/command.txt");
  EXPECT_TRUE(contains(single_cmd, "--rounds 180 --eval-every 30 --seed 1")) << single_cmd;
  EXPECT_TRUE(contains(single_cmd, "--synthetic-train 1500")) << single_cmd;
  // The nodes read the run's settings from its spec, parsed and checked once by compare.
  EXPECT_TRUE(fs::exists(out / "single/seed-1/run.spec"));
  EXPECT_TRUE(fs::exists(out / "consensus-wait-all/seed-1/run.spec"));
  const std::string wait_all_cmd = readFile(out / "consensus-wait-all/seed-1/command.txt");
  EXPECT_TRUE(contains(wait_all_cmd, "--mode consensus --backup wait-all")) << wait_all_cmd;
  EXPECT_TRUE(contains(wait_all_cmd, "--rounds 60 --eval-every 10 --seed 1")) << wait_all_cmd;

  const std::string csv = readFile(out / "summary.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3) << csv;
  EXPECT_TRUE(contains(csv, "\nsingle,1,ok,,1,")) << csv;
  EXPECT_TRUE(contains(csv, "\nconsensus:wait-all,1,ok,,3,")) << csv;
  const std::string md = readFile(out / "report.md");
  EXPECT_TRUE(contains(md, "| consensus:wait-all | 1/1 |")) << md;
  for (const char* png : {"accuracy-vs-time.png", "time-to-target.png", "backups-per-round.png"}) {
    EXPECT_GT(fs::file_size(out / "plots" / png), 1000u) << png;
  }

  // `chorus report` rebuilds the same table from the folder.
  fs::remove(out / "report.md");
  fs::remove(out / "plots" / "time-to-target.png");
  CommandResult rep = runCommand({chorusBinary(), "report", out.string()}, 120);
  ASSERT_EQ(rep.exit_code, 0) << rep.out << rep.err;
  EXPECT_EQ(readFile(out / "report.md"), md);
  EXPECT_TRUE(fs::exists(out / "plots" / "time-to-target.png"));
  EXPECT_TRUE(contains(rep.out, "| consensus:wait-all | 1/1 |")) << rep.out;

  // ... and from the --out folder of a single run.
  CommandResult one =
      runCommand({chorusBinary(), "report", (out / "consensus-wait-all/seed-1").string()});
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  EXPECT_TRUE(contains(one.out, "| consensus:wait-all | 1/1 |")) << one.out;
  EXPECT_TRUE(fs::exists(out / "consensus-wait-all/seed-1/report.md"));

  // An existing compare folder is replaced only with --force.
  CommandResult again = compare("single", out);
  expectOneLineError(again, "exists; choose another or add --force");
  // A bare flag reaches the nodes bare, an option with its value.
  CommandResult forced = compare("single", out, {"--force", "--no-flip", "--schedule", "cosine"});
  ASSERT_EQ(forced.exit_code, 0) << forced.out << forced.err;
  EXPECT_FALSE(fs::exists(out / "consensus-wait-all"));
  const std::string forced_cmd = readFile(out / "single/seed-1/command.txt");
  EXPECT_TRUE(contains(forced_cmd, "--schedule cosine")) << forced_cmd;
  EXPECT_TRUE(contains(forced_cmd, "--no-flip --")) << forced_cmd;
}

TEST_F(CompareTest, AFailedVariantIsReportedAndTheOthersStillRun) {
  const fs::path out = dir_ / "cmp";
  // Node 1 takes a second per step: the 60-round consensus run cannot end within the run
  // time-out, while the single variant (node 0's attributes) needs well under a second.
  topology_ = writeTopology("slow1.toml", "fixed:1000");
  CommandResult r = compare("consensus:wait-all,single", out, {"--run-timeout", "8"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "consensus:wait-all seed 1: FAILED after")) << r.out;
  EXPECT_TRUE(contains(r.out, "--run-timeout passed")) << r.out;
  EXPECT_TRUE(contains(r.out, "single seed 1: finished in")) << r.out;
  EXPECT_TRUE(contains(r.err, "chorus: error: 1 of 2 run(s) failed (consensus:wait-all seed 1)"))
      << r.err;
  const std::string csv = readFile(out / "summary.csv");
  EXPECT_TRUE(contains(csv, "\nconsensus:wait-all,1,failed,")) << csv;
  EXPECT_TRUE(contains(csv, "\nsingle,1,ok,")) << csv;
  const std::string md = readFile(out / "report.md");
  EXPECT_TRUE(contains(md, "## Failed runs\n\n- consensus:wait-all seed 1: ")) << md;
}

// A node that fails names the cause in the run's failure line, and the run ends at once
// instead of leaving the other nodes to wait for it until their --ready-timeout.
TEST_F(CompareTest, AFailedRunSaysWhatTheFailingNodeSaid) {
  // Node 1's address is not this machine's (192.0.2.1, TEST-NET-1): node 1 cannot listen and
  // exits with status 3. (A port taken by this test no longer does it: every run of a compare
  // takes ports that are free when it starts, RunsTakePortsThatAreFreeNotTheFilesOnes.)
  {
    std::ofstream f(topology_);
    f << "[cluster]\nname = \"compare-test\"\nmode = \"consensus\"\n";
    for (int i = 0; i < 3; ++i) {
      f << "\n[[node]]\nid = " << i << "\naddress = \"" << (i == 1 ? "192.0.2.1" : "127.0.0.1")
        << ":" << 7000 + i << "\"\nneighbors = [" << (i + 1) % 3 << ", " << (i + 2) % 3 << "]\n";
    }
  }
  const fs::path out = dir_ / "cmp";
  CommandResult r = compare("consensus:wait-all", out);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "consensus:wait-all seed 1: FAILED after")) << r.out;
  EXPECT_TRUE(contains(r.out, "([node 1] chorus: error: ")) << r.out;
  EXPECT_TRUE(contains(r.out, "node 1 exited with status 3")) << r.out;
  const std::string csv = readFile(out / "summary.csv");
  EXPECT_TRUE(contains(csv, "[node 1] chorus: error: ")) << csv;
}

TEST_F(CompareTest, ModeOptionsReachOnlyThatModesNodes) {
  const fs::path out = dir_ / "cmp";
  // Both runs must succeed: a node refuses an option of the other mode, so a PS option that
  // reached a consensus node (or the other way round) would fail its run.
  // The shared secret and the link delay go to every node, whatever its mode.
  const fs::path secret = dir_ / "secret";
  std::ofstream(secret) << "compare's secret\n";
  fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write);
  CommandResult r = compare("ps:async,consensus:wait-all", out,
                            {"--owner-momentum", "push", "--key-floats", "64", "--skip-gap", "3",
                             "--secret-file", secret.string(), "--link-delay", "2,1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* run : {"ps-async/seed-1", "consensus-wait-all/seed-1"}) {
    const std::string log = readFile(out / run / "output.log");
    // Each of the three nodes says it listens for peers that prove the secret.
    size_t listening = 0;
    for (size_t at = log.find("peers must prove the shared secret"); at != std::string::npos;
         at = log.find("peers must prove the shared secret", at + 1)) {
      ++listening;
    }
    EXPECT_EQ(listening, 3u) << run << ":\n" << log;
    const std::string command = readFile(out / run / "command.txt");
    EXPECT_TRUE(contains(command, "--secret-file " + secret.string())) << run;
    EXPECT_TRUE(contains(command, "--link-delay 2,1")) << run;
  }
  const std::string ps_cmd = readFile(out / "ps-async/seed-1/command.txt");
  EXPECT_TRUE(contains(ps_cmd, "--owner-momentum push")) << ps_cmd;
  EXPECT_TRUE(contains(ps_cmd, "--key-floats 64")) << ps_cmd;
  EXPECT_FALSE(contains(ps_cmd, "--skip-gap")) << ps_cmd;
  const std::string consensus_cmd = readFile(out / "consensus-wait-all/seed-1/command.txt");
  EXPECT_TRUE(contains(consensus_cmd, "--skip-gap 3")) << consensus_cmd;
  EXPECT_FALSE(contains(consensus_cmd, "--owner-momentum")) << consensus_cmd;
  EXPECT_FALSE(contains(consensus_cmd, "--key-floats")) << consensus_cmd;
  // The compare's own command line keeps them, so that it can be rerun.
  EXPECT_TRUE(contains(readFile(out / "runs.jsonl"), "--skip-gap 3"))
      << readFile(out / "runs.jsonl");
}

TEST_F(CompareTest, FlagsTheVariantNameSetsAreRefused) {
  expectOneLineError(compare("ps:bsp", dir_ / "d", {"--staleness", "3"}),
                     "--staleness cannot be given to compare: the variant name sets it");
  expectOneLineError(compare("consensus:dynamic", dir_ / "e", {"--backup", "static:1"}),
                     "--backup cannot be given to compare");
  // A mode option's own checks apply in compare too, before anything runs.
  CommandResult bad = compare("ps:bsp", dir_ / "f", {"--key-floats", "0"});
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  EXPECT_TRUE(contains(bad.err, "--key-floats: Value 0 not in range")) << bad.err;
  EXPECT_FALSE(fs::exists(dir_ / "d"));
  EXPECT_FALSE(fs::exists(dir_ / "f"));
}

TEST_F(CompareTest, ASecretFileNoNodeCouldUseIsRefusedBeforeAnyRun) {
  const fs::path secret = dir_ / "empty-secret";
  std::ofstream(secret) << "\n";
  expectOneLineError(compare("ps:bsp", dir_ / "g", {"--secret-file", secret.string()}),
                     "--secret-file: secret file " + secret.string() + " is empty");
  EXPECT_FALSE(fs::exists(dir_ / "g"));
}

TEST_F(CompareTest, ALinkDelayNoNodeCouldUseIsRefusedBeforeAnyRun) {
  expectOneLineError(compare("ps:bsp", dir_ / "h", {"--link-delay", "-3"}),
                     "--link-delay: bad link delay '-3'");
  expectOneLineError(compare("ps:bsp", dir_ / "h", {"--link-delay", "4000,600"}),
                     "--link-delay 4000,600: delay plus jitter must stay below 4500 ms");
  expectOneLineError(compare("ps:bsp", dir_ / "h", {"--link-loss", "0.9"}),
                     "--link-loss: bad link loss '0.9'");
  expectOneLineError(compare("ps:bsp", dir_ / "h", {"--link-delay", "3500", "--link-loss", "0.1"}),
                     "--link-delay 3500 plus --link-loss 0.1: delay plus jitter plus 7 "
                     "retransmission time-outs must stay below 4500 ms");
  EXPECT_FALSE(fs::exists(dir_ / "h"));
}

// A crash the profile injects is part of the experiment: the run finishes with the other
// nodes, counts as ok, and its result line says which node crashed.
TEST_F(CompareTest, AnInjectedCrashIsNamedAndTheRunStillCounts) {
  CommandResult r = compare("consensus:wait-all", dir_ / "crash", {"--stragglers", "crash:2@20"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "consensus:wait-all seed 1: finished in ")) << r.out;
  EXPECT_TRUE(contains(r.out, "; node 2 crashed as injected")) << r.out;
  EXPECT_FALSE(contains(r.out, "FAILED")) << r.out;
  // The report finds the crash in node 2's metrics file: rounds 0-18 written, no final line.
  const fs::path out = dir_ / "crash";
  const std::string md = readFile(out / "report.md");
  EXPECT_TRUE(contains(md, "- consensus:wait-all seed 1: node 2 crashed after step 18, at ")) << md;
  EXPECT_TRUE(contains(md, " s (injected: crash:2@20)")) << md;
  EXPECT_TRUE(contains(md, "| 1 crash")) << md;
  EXPECT_TRUE(contains(readFile(out / "summary.csv"), ",\"node 2 crashed after step 18, at "));
  EXPECT_TRUE(contains(readFile(out / "plots" / "accuracy-vs-time.gp"),
                       "set label \"node 2 crashed (step 18)\" at first "));
}

// The demo's profile names node 2 of 3; single is node 0 alone and runs with node 0's terms.
TEST_F(CompareTest, SingleTakesNode0sStragglerTermsAndSaysSo) {
  CommandResult r = compare("single", dir_ / "single", {"--stragglers", "fixed:1+slow:2=3"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out,
                       "single runs node 0 alone, so it takes node 0's straggler terms: "
                       "fixed:1 (of --stragglers fixed:1+slow:2=3)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "| single | 1/1 |")) << r.out;
  EXPECT_TRUE(contains(readFile(dir_ / "single" / "single" / "seed-1" / "command.txt"),
                       "--stragglers fixed:1 "));
}

TEST_F(CompareTest, StragglersNamingANodeTheClusterDoesNotHaveAreRefused) {
  expectOneLineError(compare("ps:bsp", dir_ / "s", {"--stragglers", "crash:7@3"}),
                     "--stragglers crash:7@3: names node 7, which is not in");
  EXPECT_FALSE(fs::exists(dir_ / "s"));
}

// Every port the topology file names is taken (by this test, listening) while the compare runs:
// each run still starts, on ports that were free when it started, and its own topology copy
// says which. (On the file's ports, every node would fail to listen: exit 3.)
TEST_F(CompareTest, RunsTakePortsThatAreFreeNotTheFilesOnes) {
  std::vector<int> taken;
  std::vector<uint16_t> ports;
  while (taken.size() < 3) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(freeLoopbackPort());
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 4) != 0) {
      close(fd);  // taken since: draw another
      continue;
    }
    taken.push_back(fd);
    ports.push_back(ntohs(addr.sin_port));
  }
  {
    std::ofstream f(topology_);
    f << "[cluster]\nname = \"compare-test\"\nmode = \"consensus\"\n";
    for (int i = 0; i < 3; ++i) {
      f << "\n[[node]]\nid = " << i << "\naddress = \"127.0.0.1:" << ports[i] << "\"\nneighbors = ["
        << (i + 1) % 3 << ", " << (i + 2) % 3 << "]\n";
    }
  }
  const fs::path out = dir_ / "ports";
  CommandResult r = compare("single,consensus:wait-all", out);
  for (const int fd : taken)
    close(fd);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "| consensus:wait-all | 1/1 |")) << r.out;
  const std::string run_topology = readFile(out / "consensus-wait-all/seed-1/topology.toml");
  const std::string single_topology = readFile(out / "single/seed-1/single.toml");
  EXPECT_TRUE(contains(run_topology, "[[node]]")) << run_topology;
  for (const uint16_t port : ports) {
    const std::string address = "127.0.0.1:" + std::to_string(port) + "\"";
    EXPECT_FALSE(contains(run_topology, address)) << run_topology;
    EXPECT_FALSE(contains(single_topology, address)) << single_topology;
  }
  EXPECT_TRUE(contains(readFile(out / "consensus-wait-all/seed-1/command.txt"),
                       (out / "consensus-wait-all/seed-1/topology.toml").string()));
}

TEST_F(CompareTest, UnknownVariantIsRefused) {
  expectOneLineError(compare("single,ps:sometimes", dir_ / "a"), "unknown variant 'ps:sometimes'");
  EXPECT_FALSE(fs::exists(dir_ / "a"));
}

TEST_F(CompareTest, MissingTopologyIsRefused) {
  CommandResult r =
      runCommand({chorusBinary(), "compare", "--topology", (dir_ / "nope.toml").string(),
                  "--variants", "single", "--data", "synthetic", "--out", (dir_ / "b").string()});
  expectOneLineError(r, "nope.toml: no such file");
  EXPECT_FALSE(fs::exists(dir_ / "b"));
}

TEST_F(CompareTest, MissingDataSetIsRefused) {
  CommandResult r = runCommand({chorusBinary(), "compare", "--topology", topology_, "--variants",
                                "single", "--data", "mnist", "--data-dir",
                                (dir_ / "no-data").string(), "--out", (dir_ / "c").string()});
  expectOneLineError(r, "data set 'mnist' not found");
  EXPECT_FALSE(fs::exists(dir_ / "c"));
}

TEST_F(CompareTest, ExistingFolderThatIsNotACompareFolderIsNeverReplaced) {
  fs::create_directories(dir_ / "mine");
  std::ofstream(dir_ / "mine" / "notes.txt") << "keep me\n";
  expectOneLineError(compare("single", dir_ / "mine"), "add --force");
  expectOneLineError(compare("single", dir_ / "mine", {"--force"}), "not a chorus compare folder");
  EXPECT_TRUE(fs::exists(dir_ / "mine" / "notes.txt"));
}

}  // namespace
}  // namespace chorus::testing
