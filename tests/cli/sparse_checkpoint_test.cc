// Whole-cluster checkpoints of sparse PS runs end to end (docs/checkpoints.md, "Sparse runs"): a
// real `chorus launch` of three nodes writes a cut every two epochs; the cluster is restarted with
// `--resume DIR` from what a cluster stopped after its last cut leaves (the uninterrupted run's
// folder; with one node's part of the newest cut removed, as when the cluster died while writing
// it), and ends as the uninterrupted run did: bit for bit under classic and BSP, within a stated
// tolerance under lapse. Bad checkpoints are refused with exit 2 naming the file.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "tests/cli/run_command.h"

namespace chorus::testing {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The text of field `name` in a JSON line (up to the next comma or brace), or "".
std::string field(const std::string& line, const std::string& name) {
  const std::string key = "\"" + name + "\":";
  const size_t at = line.find(key);
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size();
  return line.substr(begin, line.find_first_of(",}", begin) - begin);
}

// Per epoch, the loss of the epoch lines of a metrics file (a resumed file holds both lives'
// lines: the later line of an epoch wins), and the summary's test RMSE (node 0).
struct Trace {
  std::map<int64_t, std::string> loss;
  std::string test_rmse;
};

Trace traceOf(const std::string& metrics) {
  Trace trace;
  size_t begin = 0;
  for (size_t nl; (nl = metrics.find('\n', begin)) != std::string::npos; begin = nl + 1) {
    const std::string line = metrics.substr(begin, nl - begin);
    if (contains(line, "\"event\":\"epoch\"")) {
      trace.loss[std::stoll(field(line, "epoch"))] = field(line, "loss");
    } else if (contains(line, "\"event\":\"summary\"")) {
      trace.test_rmse = field(line, "test_rmse");
    }
  }
  return trace;
}

// Three nodes on loopback, a full mesh, in `mode`, named `cluster`.
class SparseCluster {
 public:
  SparseCluster(const std::string& name, const std::string& cluster, const std::string& mode = "ps")
      : dir_(name) {
    topology_ = dir_.file("cluster.toml");
    std::ofstream f(topology_);
    f << "[cluster]\nname = \"" << cluster << "\"\nmode = \"" << mode << "\"\n";
    const std::vector<uint16_t> ports = freeLoopbackPorts(3);
    for (int i = 0; i < 3; ++i) {
      f << "\n[[node]]\nid = " << i << "\naddress = \"127.0.0.1:" << ports[i]
        << "\"\nneighbors = [";
      for (int j = 0, listed = 0; j < 3; ++j) {
        if (j != i) f << (listed++ > 0 ? ", " : "") << j;
      }
      f << "]\n";
    }
  }

  // A small generated rating matrix, factorized for 6 epochs.
  static std::vector<std::string> training(const std::vector<std::string>& extra) {
    std::vector<std::string> flags = {"--model",
                                      "mf",
                                      "--mf-rows",
                                      "300",
                                      "--mf-cols",
                                      "150",
                                      "--mf-cells",
                                      "12000",
                                      "--mf-planted-rank",
                                      "4",
                                      "--rank",
                                      "4",
                                      "--epochs",
                                      "6",
                                      "--batch",
                                      "100",
                                      "--seed",
                                      "7",
                                      "--log-every",
                                      "1",
                                      "--ready-timeout",
                                      "60",
                                      "--checkpoint-every",
                                      "2"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return flags;
  }

  CommandResult launch(const std::string& out, const std::vector<std::string>& flags) const {
    std::vector<std::string> argv = {chorusBinary(), "launch", topology_, "--timeout",
                                     "120",          "--out",  out};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return runCommand(argv, 180);
  }

  // One node alone, its cuts (were it to run) in a folder of its own.
  CommandResult node(int id, const std::vector<std::string>& flags) const {
    std::vector<std::string> argv = {chorusBinary(),
                                     "node",
                                     "--topology",
                                     topology_,
                                     "--id",
                                     std::to_string(id),
                                     "--checkpoint-dir",
                                     dir_.file("node-cuts")};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return runCommand(argv, 60);
  }

  std::string file(const std::string& name) const { return dir_.file(name); }

 private:
  TempDir dir_;
  std::string topology_;
};

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// `flags` with the value of `flag` (given once) set to `value`.
std::vector<std::string> with(std::vector<std::string> flags, const std::string& flag,
                              const std::string& value) {
  auto it = std::find(flags.begin(), flags.end(), flag);
  EXPECT_TRUE(it != flags.end() && it + 1 != flags.end()) << flag;
  if (it != flags.end() && it + 1 != flags.end()) *(it + 1) = value;
  return flags;
}

// Runs uninterrupted (cuts 2 and 4 written), then resumes the cluster from a copy of its cut
// folder: from cut 4, or from cut 2 when node 2's part of cut 4 is removed (a cluster that died
// while writing it). Returns the two runs' traces per node.
struct Runs {
  std::vector<Trace> whole, resumed;
  int64_t cut = 0;
  std::string resume_err;
};

Runs runAndResume(const std::string& name, const std::vector<std::string>& technique,
                  bool drop_last_cut, const std::string& mode = "ps") {
  SparseCluster cluster("chorus-sparse-ckpt-" + name, "sparse-ckpt-" + name, mode);
  const std::vector<std::string> flags = SparseCluster::training(technique);
  const std::string whole = cluster.file("whole"), cuts = cluster.file("cuts"),
                    resumed = cluster.file("resumed");
  Runs runs;
  CommandResult a = cluster.launch(whole, flags);
  EXPECT_EQ(a.exit_code, 0) << a.out << a.err;
  if (a.exit_code != 0) return runs;
  // The cuts went to --out's checkpoints/ (the default folder): 2 and 4, not 6 (the run's end).
  EXPECT_TRUE(fs::exists(whole + "/checkpoints/cut-4/node-2.ckpt")) << a.err;
  EXPECT_FALSE(fs::exists(whole + "/checkpoints/cut-6")) << a.err;
  // What a cluster killed during epoch 5 leaves: cuts 2 and 4, written atomically (a node killed
  // while writing leaves only a temporary file, which nothing reads).
  fs::copy(whole + "/checkpoints", cuts, fs::copy_options::recursive);
  std::ofstream(cuts + "/cut-4/node-1.ckpt.tmp.12345") << "half a file";
  runs.cut = 4;
  if (drop_last_cut) {
    fs::remove(cuts + "/cut-4/node-2.ckpt");
    runs.cut = 2;
  }
  CommandResult c =
      cluster.launch(resumed, plus(flags, {"--checkpoint-dir", cuts, "--resume", cuts}));
  EXPECT_EQ(c.exit_code, 0) << c.out << c.err;
  runs.resume_err = c.err;
  EXPECT_TRUE(contains(c.err, fmt::format("resuming from cut {}", runs.cut))) << c.err;
  if (drop_last_cut) {
    EXPECT_TRUE(contains(
        c.err, "cut 4 in " + cuts + "/cut-4 is incomplete: node(s) 2 did not finish it; skipped"))
        << c.err;
  }
  for (int id = 0; id < 3; ++id) {
    const std::string metrics = fmt::format("node-{}.jsonl", id);
    runs.whole.push_back(traceOf(slurp(whole + "/" + metrics)));
    runs.resumed.push_back(traceOf(slurp(resumed + "/" + metrics)));
  }
  return runs;
}

TEST(SparseClusterCheckpoint, ClassicUnderBspResumesBitIdentical) {
  const Runs runs = runAndResume("classic", {"--technique", "classic", "--staleness", "0"}, true);
  ASSERT_EQ(runs.whole.size(), 3u);
  ASSERT_FALSE(runs.whole[0].test_rmse.empty());
  EXPECT_EQ(runs.resumed[0].test_rmse, runs.whole[0].test_rmse);
  for (int id = 0; id < 3; ++id) {
    for (int64_t epoch = runs.cut + 1; epoch <= 6; ++epoch) {
      ASSERT_TRUE(runs.resumed[id].loss.count(epoch)) << "node " << id << " epoch " << epoch;
      EXPECT_EQ(runs.resumed[id].loss.at(epoch), runs.whole[id].loss.at(epoch))
          << "node " << id << " epoch " << epoch;
    }
  }
}

// Sparse consensus with wait-all and tau 0: every round mixes exactly the neighbors' shares of
// that round, and a cut holds the tables, AdaGrad's sums and the gossip's send state, so the
// resumed run is the uninterrupted one, bit for bit.
TEST(SparseClusterCheckpoint, ConsensusWaitAllResumesBitIdentical) {
  const Runs runs =
      runAndResume("consensus", {"--backup", "wait-all", "--staleness", "0", "--cold-every", "3"},
                   true, "consensus");
  ASSERT_EQ(runs.whole.size(), 3u);
  ASSERT_FALSE(runs.whole[0].test_rmse.empty());
  EXPECT_EQ(runs.resumed[0].test_rmse, runs.whole[0].test_rmse);
  for (int id = 0; id < 3; ++id) {
    for (int64_t epoch = runs.cut + 1; epoch <= 6; ++epoch) {
      ASSERT_TRUE(runs.resumed[id].loss.count(epoch)) << "node " << id << " epoch " << epoch;
      EXPECT_EQ(runs.resumed[id].loss.at(epoch), runs.whole[id].loss.at(epoch))
          << "node " << id << " epoch " << epoch;
    }
  }
}

// Under lapse the rows move, and the pushes to a row that several workers use within a clock are
// applied in the order they arrive (AdaGrad's step depends on it), so two runs of the same seed
// differ in the last bits anyway; a resumed run must end as good as an uninterrupted one: within
// 5% of its test RMSE (two uninterrupted runs differ by well under 1% here).
TEST(SparseClusterCheckpoint, LapseResumesToTheSameQuality) {
  const Runs runs = runAndResume("lapse", {"--technique", "lapse"}, false);
  ASSERT_EQ(runs.whole.size(), 3u);
  ASSERT_FALSE(runs.whole[0].test_rmse.empty());
  ASSERT_FALSE(runs.resumed[0].test_rmse.empty());
  const double whole = std::stod(runs.whole[0].test_rmse);
  const double resumed = std::stod(runs.resumed[0].test_rmse);
  EXPECT_NEAR(resumed, whole, 0.05 * whole);
  EXPECT_LT(whole, 0.9);
  for (int id = 0; id < 3; ++id) {
    EXPECT_TRUE(runs.resumed[id].loss.count(5) && runs.resumed[id].loss.count(6)) << id;
  }
}

// One node's view of a bad checkpoint folder: `chorus node` refuses it before it listens.
TEST(SparseClusterCheckpoint, BadCheckpointsAreRefusedNamingTheFile) {
  SparseCluster cluster("chorus-sparse-ckpt-bad", "sparse-ckpt-bad");
  const std::vector<std::string> flags =
      with(SparseCluster::training({"--technique", "classic"}), "--epochs", "5");
  const std::string cuts = cluster.file("cuts");
  CommandResult a = cluster.launch(cluster.file("out"), plus(flags, {"--checkpoint-dir", cuts}));
  ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
  const std::string own = cuts + "/cut-4/node-1.ckpt";
  const std::string good = slurp(own);
  auto refused = [&](const std::vector<std::string>& run_flags, const std::string& says) {
    CommandResult r = cluster.node(1, plus(run_flags, {"--resume", cuts}));
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, says)) << r.err;
    std::ofstream(own, std::ios::binary | std::ios::trunc) << good;
  };
  std::ofstream(own, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() / 2);
  refused(flags, own + ": node checkpoint is");
  std::string flipped = good;
  flipped[flipped.size() - 12] ^= 4;
  std::ofstream(own, std::ios::binary | std::ios::trunc) << flipped;
  refused(flags, own + ": node checkpoint checksum mismatch");
  fs::copy_file(cuts + "/cut-4/node-0.ckpt", own, fs::copy_options::overwrite_existing);
  refused(flags, own + ": holds node 0's state, not node 1's");
  // Another model (rank 8), another batch (other clocks per epoch).
  refused(with(flags, "--rank", "8"), "resume with the --model");
  refused(with(flags, "--batch", "50"), own + ": written by a run of");
  // Another cluster's folder: the same nodes under another name.
  SparseCluster other("chorus-sparse-ckpt-other", "another");
  {
    CommandResult r = other.node(1, plus(flags, {"--resume", cuts}));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err,
                         "written by cluster \"sparse-ckpt-bad\", and this is cluster "
                         "\"another\""))
        << r.err;
  }
  // A dense run's cut folder (its model is softmax's): refused as another model's.
  const std::string dense = cluster.file("dense");
  CommandResult d = cluster.launch(cluster.file("dense-out"), {"--data",
                                                               "synthetic",
                                                               "--synthetic-train",
                                                               "600",
                                                               "--synthetic-test",
                                                               "100",
                                                               "--model",
                                                               "softmax",
                                                               "--rounds",
                                                               "6",
                                                               "--eval-every",
                                                               "0",
                                                               "--staleness",
                                                               "0",
                                                               "--seed",
                                                               "7",
                                                               "--checkpoint-every",
                                                               "4",
                                                               "--checkpoint-dir",
                                                               dense,
                                                               "--ready-timeout",
                                                               "60"});
  ASSERT_EQ(d.exit_code, 0) << d.out << d.err;
  {
    CommandResult r = cluster.node(1, plus(flags, {"--resume", dense}));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, dense + "/cut-4/node-")) << r.err;
    EXPECT_TRUE(contains(r.err, "for model 'softmax")) << r.err;
  }
  // What a cut does not hold yet is refused before anything starts.
  for (const auto& [extra, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--technique", "nups"}, "nups's replicas are not written into a cut yet"},
           {{"--technique", "auto"}, "auto's replicas are not written into a cut yet"},
           {{"--save", cluster.file("model.ckpt")}, "--save does not apply to --model mf"},
       }) {
    std::vector<std::string> run_flags = SparseCluster::training({});
    run_flags.insert(run_flags.end(), extra.begin(), extra.end());
    CommandResult r = cluster.node(1, run_flags);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, says)) << r.err;
  }
  CommandResult f = cluster.node(1, plus(flags, {"--resume", own}));
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_TRUE(contains(f.err, "--resume " + own + ": not a folder")) << f.err;
}

}  // namespace
}  // namespace chorus::testing
