// Injected crashes (crash:NODE@STEP, docs/stragglers.md "Crashes") end to end: a real
// `chorus launch` whose node dies mid-run the way a crashed machine does, in both modes.
#include "faults/crash.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "tests/cli/run_command.h"
#include "tests/support/cli_fixture.h"

namespace chorus::testing {
namespace {

namespace fs = std::filesystem;

using testsupport::contains;

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t nl; (nl = text.find('\n', begin)) != std::string::npos; begin = nl + 1)
    out.push_back(text.substr(begin, nl - begin));
  if (begin < text.size()) out.push_back(text.substr(begin));
  return out;
}

// Whether a line of `text` starts with `prefix` and contains `part`.
bool hasLine(const std::string& text, const std::string& prefix, const std::string& part) {
  for (const std::string& line : lines(text)) {
    if (line.starts_with(prefix) && contains(line, part)) return true;
  }
  return false;
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
    ++n;
  return n;
}

// A complete graph of `nodes` nodes on loopback ports in `mode`; `stragglers` gives some nodes
// their own attribute. Cleans up after itself.
class CrashCluster {
 public:
  // A full mesh, or with `line` a line 0 - 1 - ... - nodes-1.
  CrashCluster(const std::string& name, int nodes, const std::string& mode,
               const std::map<int, std::string>& stragglers = {}, bool line = false)
      : nodes_(nodes) {
    const std::string unique = name + "-" + std::to_string(getpid());
    topology_ = fs::temp_directory_path() / (unique + ".toml");
    out_ = fs::temp_directory_path() / (unique + "-out");
    std::ofstream f(topology_);
    f << "[cluster]\nname = \"" << name << "\"\nmode = \"" << mode << "\"\n";
    const std::vector<uint16_t> ports = freeLoopbackPorts(nodes);
    for (int i = 0; i < nodes; ++i) {
      f << "\n[[node]]\nid = " << i << "\naddress = \"127.0.0.1:" << ports[i]
        << "\"\nneighbors = [";
      for (int j = 0, listed = 0; j < nodes; ++j) {
        if (j != i && (!line || j == i - 1 || j == i + 1)) f << (listed++ > 0 ? ", " : "") << j;
      }
      f << "]\n";
      if (auto it = stragglers.find(i); it != stragglers.end())
        f << "stragglers = \"" << it->second << "\"\n";
    }
  }
  ~CrashCluster() {
    std::error_code ec;
    fs::remove(topology_, ec);
    fs::remove_all(out_, ec);
  }

  // `chorus launch` of this cluster on a small synthetic data set, with `extra` options.
  CommandResult launch(const std::vector<std::string>& extra) const {
    std::vector<std::string> argv = {chorusBinary(),
                                     "launch",
                                     topology_.string(),
                                     "--timeout",
                                     "120",
                                     "--data",
                                     "synthetic",
                                     "--synthetic-train",
                                     "2000",
                                     "--synthetic-test",
                                     "200",
                                     "--model",
                                     "softmax",
                                     "--ready-timeout",
                                     "60",
                                     "--out",
                                     out_.string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return runCommand(argv, 180);
  }

  std::string metrics(int id) const {
    return slurp(out_ / ("node-" + std::to_string(id) + ".jsonl"));
  }
  std::string topology() const { return topology_.string(); }
  int nodes() const { return nodes_; }

 private:
  int nodes_;
  fs::path topology_, out_;
};

const std::string kCrashed = "[launch] node 2 crashed as injected (exit status " +
                             std::to_string(faults::kInjectedCrashExitStatus) + ")";

// Under mpirun one crashed rank aborts the whole job unless mpirun is told not to; with the flag
// docs/stragglers.md gives (--mca orte_abort_on_non_zero_status 0) the others train on. The ranks
// take their node ids from OMPI_COMM_WORLD_RANK. Skipped where Open MPI is not installed.
TEST(ChorusCrash, UnderMpirunTheOtherRanksTrainOnWithTheDocumentedFlag) {
  std::string mpirun;
  for (const char* dir : {"/usr/bin", "/usr/local/bin"}) {
    if (fs::exists(fs::path(dir) / "mpirun")) mpirun = (fs::path(dir) / "mpirun").string();
  }
  if (mpirun.empty()) {
    GTEST_SKIP() << "mpirun is not installed (Debian's openmpi-bin; scripts/setup.sh installs it)";
  }
  CrashCluster cluster("crash-mpirun", 3, "consensus");
  CommandResult r = runCommand({mpirun,
                                "--allow-run-as-root",
                                "--oversubscribe",
                                "-np",
                                "3",
                                "--mca",
                                "orte_abort_on_non_zero_status",
                                "0",
                                chorusBinary(),
                                "node",
                                "--topology",
                                cluster.topology(),
                                "--data",
                                "synthetic",
                                "--synthetic-train",
                                "4000",
                                "--synthetic-test",
                                "200",
                                "--model",
                                "mlp",
                                "--hidden",
                                "64",
                                "--rounds",
                                "150",
                                "--eval-every",
                                "0",
                                "--stragglers",
                                "crash:2@5",
                                "--ready-timeout",
                                "60"},
                               180);
  EXPECT_TRUE(contains(r.err, "injected crash of node 2 after step 5")) << r.out << r.err;
  for (const char* id : {"0", "1"}) {
    EXPECT_TRUE(contains(r.out, std::string("node ") + id + ": final test accuracy")) << r.out;
    EXPECT_TRUE(contains(r.out, std::string("node ") + id + ": left the cluster cleanly")) << r.out;
  }
  EXPECT_FALSE(contains(r.out + r.err, "thus causing\nthe job to be terminated")) << r.err;
}

// Node 2 dies after its 10th step; its neighbors see the connection drop (no Leave), go on
// without it, finish every round and name it as departed. The launch succeeds.
TEST(ChorusCrash, ConsensusNeighborsGoOnWithoutTheCrashedNode) {
  CrashCluster cluster("crash-consensus", 4, "consensus");
  CommandResult r =
      cluster.launch({"--rounds", "40", "--eval-every", "20", "--stragglers", "crash:2@10"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, kCrashed)) << r.out;
  EXPECT_TRUE(contains(r.out, "[launch] 3 of 4 node(s) finished cleanly in ")) << r.out;
  EXPECT_TRUE(contains(r.out, " s; node 2 crashed as injected\n")) << r.out;
  EXPECT_TRUE(contains(r.err,
                       "[node 2] chorus: injected crash of node 2 after step 10 "
                       "(stragglers crash:2@10)"))
      << r.err;
  EXPECT_FALSE(contains(r.out, "node 2: final test accuracy")) << r.out;
  EXPECT_FALSE(contains(r.out, "node 2: left the cluster")) << r.out;
  for (int id : {0, 1, 3}) {
    const std::string n = std::to_string(id);
    EXPECT_TRUE(contains(r.out, "[launch] node " + n + " finished")) << r.out;
    const std::string says = fmt::format("[node {}] node {}: ", id, id);
    EXPECT_TRUE(hasLine(r.out, says + "final test accuracy", "after 40 rounds")) << r.out;
    EXPECT_TRUE(contains(r.out, says + "node(s) 2 left before the end")) << r.out;
    // No Leave came: the connection dropped, and the peers saw node 2 go down.
    EXPECT_TRUE(hasLine(r.err, "[node " + n + "] ", "[warning] peer 2 (")) << r.err;
    const std::vector<std::string> written = lines(cluster.metrics(id));
    ASSERT_FALSE(written.empty()) << "node " << id << " wrote no metrics";
    const std::string& final_line = written.back();
    EXPECT_TRUE(contains(final_line, "\"event\":\"final\"")) << final_line;
    EXPECT_TRUE(contains(final_line, "\"departed_peers\":[2]")) << final_line;
  }
  for (const std::string& line : lines(r.err)) {
    EXPECT_FALSE(contains(line, "peer 2 (") && contains(line, ") left:")) << line;
  }
  // Every metrics line of the crashed node was flushed when written: its start line and one
  // line per round it finished, the 9 before the step it died after; no final line.
  const std::string crashed = cluster.metrics(2);
  ASSERT_FALSE(crashed.empty());
  EXPECT_EQ(count(crashed, "\"event\":\"start\""), 1u) << crashed;
  EXPECT_EQ(count(crashed, "\"event\":\"step\""), 9u) << crashed;
  EXPECT_EQ(count(crashed, "\"event\":\"final\""), 0u) << crashed;
  EXPECT_EQ(crashed.back(), '\n');
}

// A line 0 - 1 - 2 - 3 - 4 whose node 2 crashes: nodes 3 and 4 are cut off from node 0. They end
// at once with a line naming what is down and exit 1; with --keep-going (a failed node would
// otherwise stop the launch) node 0 averages 0 and 1 and names the others missing.
TEST(ChorusCrash, ConsensusNodesCutOffFromNodeZeroExitWithAMessage) {
  CrashCluster cluster("crash-split", 5, "consensus", {}, /*line=*/true);
  CommandResult r =
      cluster.launch({"--rounds", "40", "--stragglers", "crash:2@10", "--keep-going"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err,
                       "[node 3] chorus: error: node 3: cut off from node 0: every path to "
                       "it crosses node(s) that are down (2 known here); the final models "
                       "of node(s) 3, 4 are not in the cluster's average"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "[node 4] chorus: error: node 4: cut off from node 0")) << r.err;
  EXPECT_TRUE(contains(r.err, "[launch] node 3 exited with status 1")) << r.err;
  EXPECT_TRUE(contains(r.out, "[node 0] node 0: test accuracy of the average of 2 final models"))
      << r.out;
  const std::vector<std::string> written = lines(cluster.metrics(0));
  ASSERT_FALSE(written.empty());
  EXPECT_TRUE(contains(written.back(), "\"missing_models\":[2,3,4]")) << written.back();
  const std::vector<std::string> cut = lines(cluster.metrics(3));
  ASSERT_FALSE(cut.empty());
  EXPECT_TRUE(contains(cut.back(), "\"cut_off\":true")) << cut.back();
}

// Node 2 (its own topology attribute says so) owned a shard of the keys and was a worker. The
// owners stop waiting for the dead worker after --down-timeout, the workers train on with the
// last values they read of its keys, and every survivor says it was dropped. Also a success.
TEST(ChorusCrash, PsWorkersDropTheCrashedOwnerAfterTheDownTimeoutAndFinish) {
  CrashCluster cluster("crash-ps", 4, "ps", {{2, "crash:2@10"}});
  CommandResult r = cluster.launch(
      {"--rounds", "30", "--eval-every", "0", "--staleness", "1", "--down-timeout", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, kCrashed)) << r.out;
  EXPECT_TRUE(contains(r.err,
                       "[node 2] chorus: injected crash of node 2 after step 10 "
                       "(stragglers crash:2@10)"))
      << r.err;
  for (int id : {0, 1, 3}) {
    const std::string n = std::to_string(id);
    EXPECT_TRUE(contains(r.out, "[launch] node " + n + " finished")) << r.out;
    EXPECT_TRUE(contains(r.out, "node " + n + ": final test accuracy")) << r.out;
    EXPECT_TRUE(
        contains(r.out, fmt::format("[node {}] node {}: node 2 was dropped at clock ", id, id)))
        << r.out;
    EXPECT_TRUE(hasLine(r.err, "[node " + n + "] ", "[warning] peer 2 (")) << r.err;
  }
  EXPECT_TRUE(contains(r.out, "node 0: test accuracy of the model as held by the owners")) << r.out;
  const std::string crashed = cluster.metrics(2);
  EXPECT_EQ(count(crashed, "\"event\":\"step\""), 9u) << crashed;
  EXPECT_EQ(count(crashed, "\"event\":\"final\""), 0u) << crashed;
}

// Bad crash terms are refused before any node starts, from the command line and from the
// topology file, naming the term and the accepted form.
TEST(ChorusCrash, BadCrashTermsAreRefusedBeforeAnyNodeStarts) {
  {
    CrashCluster cluster("crash-bad-flag", 2, "consensus");
    CommandResult r = cluster.launch({"--rounds", "5", "--stragglers", "crash:1@0"});
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_TRUE(contains(r.err,
                         "bad straggler term 'crash:1@0': STEP '0' must be a whole number "
                         "from 1"))
        << r.err;
    EXPECT_TRUE(contains(r.err, "crash:NODE@STEP[,NODE@STEP...]")) << r.err;
    EXPECT_FALSE(contains(r.out, "[launch] node 0 started")) << r.out;
  }
  {
    CrashCluster cluster("crash-bad-attribute", 2, "consensus", {{1, "crash:1@5,1@7"}});
    CommandResult r = cluster.launch({"--rounds", "5"});
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "bad straggler term 'crash:1@5,1@7': node 1 is listed twice"))
        << r.err;
    EXPECT_FALSE(contains(r.out, "[launch] node 0 started")) << r.out;
  }
  {
    // Each is fine alone; together they give node 1 two crash steps.
    CrashCluster cluster("crash-clash", 2, "consensus", {{1, "crash:1@5"}});
    CommandResult r = cluster.launch({"--rounds", "5", "--stragglers", "crash:1@7"});
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "node 1: bad straggler term 'crash:1@7+crash:1@5'")) << r.err;
    EXPECT_FALSE(contains(r.out, "[launch] node 0 started")) << r.out;
  }
}

}  // namespace
}  // namespace chorus::testing
