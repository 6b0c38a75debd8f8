// Whole-cluster checkpoints end to end (docs/checkpoints.md): a real `chorus launch` writes cuts
// with --checkpoint-every, every node is killed mid-run (an injected crash of every process),
// and `chorus launch --resume DIR` restarts the cluster from the newest complete cut; in the
// deterministic modes (PS under BSP, consensus with wait-all and tau 0) the resumed run ends
// bit-identical to an uninterrupted one. Bad checkpoints are refused with exit 2 naming the file.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
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
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t nl; (nl = text.find('\n', begin)) != std::string::npos; begin = nl + 1)
    out.push_back(text.substr(begin, nl - begin));
  return out;
}

// The text of field `name` in a JSON line (up to the next comma or brace), or "".
std::string field(const std::string& line, const std::string& name) {
  const std::string key = "\"" + name + "\":";
  const size_t at = line.find(key);
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size();
  return line.substr(begin, line.find_first_of(",}", begin) - begin);
}

// Per step, the loss of each step line of a metrics file (a resumed file holds the crashed
// life's lines and the resumed one's: the later line of a step wins), and the final line's test
// loss and accuracy.
struct Trace {
  std::map<int64_t, std::string> loss;
  std::string final_result;
};

Trace traceOf(const std::string& metrics) {
  Trace trace;
  for (const std::string& line : lines(metrics)) {
    if (contains(line, "\"event\":\"step\"")) {
      trace.loss[std::stoll(field(line, "step"))] = field(line, "loss");
    } else if (contains(line, "\"event\":\"final\"")) {
      trace.final_result = field(line, "test_loss") + " " + field(line, "test_accuracy");
    }
  }
  return trace;
}

// Three nodes on loopback, a full mesh, in `mode`; cleans up after itself.
class CheckpointCluster {
 public:
  CheckpointCluster(const std::string& name, const std::string& mode, const std::string& cluster)
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

  // The training flags every run of a test shares.
  std::vector<std::string> training(const std::vector<std::string>& mode_flags) const {
    std::vector<std::string> flags = {"--data",
                                      "synthetic",
                                      "--synthetic-train",
                                      "1500",
                                      "--synthetic-test",
                                      "300",
                                      "--model",
                                      "softmax",
                                      "--rounds",
                                      "30",
                                      "--eval-every",
                                      "0",
                                      "--momentum",
                                      "0.9",
                                      "--seed",
                                      "5",
                                      "--ready-timeout",
                                      "60"};
    flags.insert(flags.end(), mode_flags.begin(), mode_flags.end());
    return flags;
  }

  CommandResult launch(const std::string& out, const std::vector<std::string>& flags) const {
    std::vector<std::string> argv = {chorusBinary(), "launch", topology_, "--timeout",
                                     "120",          "--out",  out};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return runCommand(argv, 180);
  }

  CommandResult node(int id, const std::vector<std::string>& flags) const {
    std::vector<std::string> argv = {chorusBinary(), "node", "--topology",
                                     topology_,      "--id", std::to_string(id)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return runCommand(argv, 60);
  }

  std::string file(const std::string& name) const { return dir_.file(name); }
  std::string topology() const { return topology_; }

 private:
  TempDir dir_;
  std::string topology_;
};

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Runs `flags` uninterrupted, then crashed on every node after cut 20 and resumed from the
// checkpoint folder (cut 20, or cut 10 when node 2's part of cut 20 is removed before the
// resume), and expects every node's losses from the resumed cut on and its final test result
// to be bit-identical.
void expectResumeIsIdentical(const std::string& mode, const std::vector<std::string>& mode_flags,
                             bool drop_last_cut) {
  CheckpointCluster cluster("chorus-ckpt-" + mode, mode, "ckpt-" + mode);
  const std::vector<std::string> flags = cluster.training(mode_flags);
  const std::string whole = cluster.file("whole"), cuts = cluster.file("cuts"),
                    broken = cluster.file("broken");

  CommandResult a = cluster.launch(whole, plus(flags, {"--checkpoint-every", "10"}));
  ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
  // The uninterrupted run wrote its cuts under --out (the default folder).
  EXPECT_TRUE(fs::exists(whole + "/checkpoints/cut-20/node-2.ckpt")) << a.err;

  // Every node dies during its 25th step: cuts 10 and 20 are complete.
  CommandResult b =
      cluster.launch(broken, plus(flags, {"--checkpoint-every", "10", "--checkpoint-dir", cuts,
                                          "--stragglers", "crash:0@25,1@25,2@25"}));
  // (launch counts injected crashes as expected: docs/stragglers.md)
  for (int id = 0; id < 3; ++id) {
    EXPECT_TRUE(contains(b.out, fmt::format("[launch] node {} crashed as injected", id))) << b.out;
  }
  ASSERT_TRUE(fs::exists(cuts + "/cut-20/node-0.ckpt"));
  ASSERT_FALSE(fs::exists(cuts + "/cut-30"));
  int64_t resumed_cut = 20;
  if (drop_last_cut) {
    fs::remove(cuts + "/cut-20/node-2.ckpt");
    resumed_cut = 10;
  }

  CommandResult c = cluster.launch(
      broken,
      plus(flags, {"--checkpoint-every", "10", "--checkpoint-dir", cuts, "--resume", cuts}));
  ASSERT_EQ(c.exit_code, 0) << c.out << c.err;
  EXPECT_TRUE(contains(c.err, fmt::format("resuming from cut {}", resumed_cut))) << c.err;
  if (drop_last_cut) {
    EXPECT_TRUE(contains(c.err, "cut 20 in " + cuts +
                                    "/cut-20 is incomplete: node(s) 2 did not "
                                    "finish it; skipped"))
        << c.err;
  }
  for (int id = 0; id < 3; ++id) {
    const std::string name = fmt::format("node-{}.jsonl", id);
    const Trace whole_trace = traceOf(slurp(whole + "/" + name));
    const Trace resumed_trace = traceOf(slurp(broken + "/" + name));
    ASSERT_FALSE(whole_trace.final_result.empty());
    EXPECT_EQ(resumed_trace.final_result, whole_trace.final_result) << "node " << id;
    for (int64_t step = resumed_cut; step < 30; ++step) {
      ASSERT_TRUE(resumed_trace.loss.count(step)) << "node " << id << " step " << step;
      EXPECT_EQ(resumed_trace.loss.at(step), whole_trace.loss.at(step))
          << "node " << id << " step " << step;
    }
  }
}

TEST(ClusterCheckpoint, PsUnderBspResumesBitIdentical) {
  expectResumeIsIdentical("ps", {"--staleness", "0", "--key-floats", "7"}, false);
}

TEST(ClusterCheckpoint, ConsensusWaitAllResumesBitIdenticalFromTheLastCompleteCut) {
  expectResumeIsIdentical("consensus", {"--staleness", "0", "--backup", "wait-all"}, true);
}

// One node's view of a bad checkpoint folder: `chorus node` refuses it before it listens.
TEST(ClusterCheckpoint, BadCheckpointsAreRefusedNamingTheFile) {
  CheckpointCluster cluster("chorus-ckpt-bad", "ps", "ckpt-bad");
  const std::vector<std::string> flags = cluster.training({"--staleness", "0"});
  const std::string cuts = cluster.file("cuts");
  CommandResult a = cluster.launch(
      cluster.file("out"), plus(flags, {"--checkpoint-every", "10", "--checkpoint-dir", cuts}));
  ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
  const std::string own = cuts + "/cut-20/node-1.ckpt";
  const std::string good = slurp(own);
  auto refused = [&](const std::vector<std::string>& extra, const std::string& says) {
    CommandResult r = cluster.node(1, plus(plus(flags, {"--resume", cuts}), extra));
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, says)) << r.err;
    std::ofstream(own, std::ios::binary | std::ios::trunc) << good;
  };
  std::ofstream(own, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() / 2);
  refused({}, own + ": node checkpoint is");
  std::string flipped = good;
  flipped[flipped.size() - 12] ^= 4;
  std::ofstream(own, std::ios::binary | std::ios::trunc) << flipped;
  refused({}, own + ": node checkpoint checksum mismatch");
  fs::copy_file(cuts + "/cut-20/node-0.ckpt", own, fs::copy_options::overwrite_existing);
  refused({}, own + ": holds node 0's state, not node 1's");
  std::vector<std::string> mlp = flags;
  std::replace(mlp.begin(), mlp.end(), std::string("softmax"), std::string("mlp"));
  {
    CommandResult r = cluster.node(1, plus(mlp, {"--resume", cuts, "--hidden", "8"}));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "resume with the --model")) << r.err;
  }
  refused({"--key-floats", "3"}, own + ": written with 4096 floats per key");
  // Another cluster's folder: the same nodes under another name.
  CheckpointCluster other("chorus-ckpt-other", "ps", "another");
  CommandResult r = other.node(1, plus(flags, {"--resume", cuts}));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "written by cluster \"ckpt-bad\", and this is cluster \"another\""))
      << r.err;
}

}  // namespace
}  // namespace chorus::testing
