// `--rejoin` end to end: three real `chorus node` processes train in consensus mode, node 2 is
// killed with SIGKILL (a crashed machine: no Leave, its sockets reset) once it trains, and is
// started again with the same flags plus --rejoin on the same port. It takes a neighbor's model
// (dense) or tables and optimizer state (sparse), runs the rest of the rounds, and every node
// ends cleanly with node 2's final quality near the others'. The peer-level tests
// (SparseConsensus.ARestartedNodeRejoinsWithANeighborsTables, the dense consensus rejoin test)
// check what is taken bit for bit; these check that a user can do it with the CLI.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/cli/run_command.h"
#include "tests/support/planted_graph.h"

extern char** environ;

namespace chorus::testing {
namespace {

using std::chrono::seconds;

// One `chorus node` process whose stdout and stderr (one pipe) a thread reads as they come, so
// that the test can wait for a line without the child ever blocking on a full pipe.
class NodeProcess {
 public:
  explicit NodeProcess(std::vector<std::string> args) {
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, out[1], 2);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    const std::string binary = chorusBinary();
    args.insert(args.begin(), binary);
    std::vector<char*> argv;
    for (std::string& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    const int spawned = posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    if (spawned != 0) {
      close(out[0]);
      throw std::runtime_error("cannot start " + binary);
    }
    reader_ = std::thread([this, fd = out[0]] { readAll(fd); });
  }
  ~NodeProcess() {
    if (!reaped_) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
    reader_.join();
  }
  NodeProcess(const NodeProcess&) = delete;
  NodeProcess& operator=(const NodeProcess&) = delete;

  // Whether `marker` appeared in the output within `limit` (false as well when the output ended
  // without it).
  bool waitFor(const std::string& marker, seconds limit) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, limit, [&] {
      return text_.find(marker) != std::string::npos || ended_;
    }) && text_.find(marker) != std::string::npos;
  }
  // Kills the process outright and reaps it.
  void killHard() {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
  }
  // The exit status once the output ended (within `limit`), or -1 after killing a process that
  // did not end in time or ended by a signal.
  int exitCode(seconds limit) {
    {
      std::unique_lock lock(mu_);
      changed_.wait_for(lock, limit, [&] { return ended_; });
      if (!ended_) kill(pid_, SIGKILL);
    }
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string text() const {
    std::lock_guard lock(mu_);
    return text_;
  }

 private:
  void readAll(int fd) {
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) != 0;) {
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      std::lock_guard lock(mu_);
      text_.append(buf, static_cast<size_t>(n));
      changed_.notify_all();
    }
    close(fd);
    std::lock_guard lock(mu_);
    ended_ = true;
    changed_.notify_all();
  }

  pid_t pid_ = 0;
  bool reaped_ = false;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::string text_;
  bool ended_ = false;
  std::thread reader_;
};

// The first number after `label` in `text` (NaN when absent).
double numberAfter(const std::string& text, const std::string& label) {
  const size_t at = text.find(label);
  if (at == std::string::npos) return std::nan("");
  return std::stod(text.substr(at + label.size()));
}

// A complete graph of three consensus nodes on loopback ports that were free.
std::string writeTopology(const TempDir& dir) {
  const std::string path = dir.file("three.toml");
  std::ofstream out(path);
  out << "[cluster]\nname = \"rejoin-cli\"\nmode = \"consensus\"\n";
  const std::vector<uint16_t> ports = freeLoopbackPorts(3);
  for (int i = 0; i < 3; ++i) {
    out << "\n[[node]]\nid = " << i << "\naddress = \"127.0.0.1:" << ports[i]
        << "\"\nneighbors = [";
    for (int j = 0, listed = 0; j < 3; ++j) {
      if (j != i) out << (listed++ > 0 ? ", " : "") << j;
    }
    out << "]\n";
  }
  return path;
}

// Where the run's time comes from. Every frame waits kLinkDelayMs before it leaves (on every
// node, in both lives), and under wait-all with staleness 0 each round waits for both
// neighbors' models of that round: a round takes at least kLinkDelayMs however fast the machine,
// so the survivors' rounds left after node 2's death (hundreds) outlast its restart (a process
// start, a tiny data set, a redial within 2 s) with seconds to spare even on a quiet machine.
constexpr int kLinkDelayMs = 10;

// The three nodes: starts them with `flags`, kills node 2 once `training` is in its output,
// starts it again with --rejoin, and waits for every node to end. Output on failure says what
// each node printed.
struct RejoinRun {
  std::string before;                 // node 2's first life
  std::vector<std::string> out{3};    // each node's output (node 2: its second life)
  std::vector<int> exit{-2, -2, -2};  // exit statuses

  void run(const std::string& topology, const std::vector<std::string>& flags,
           const std::string& training) {
    auto args = [&](int id, bool rejoin) {
      std::vector<std::string> a = {"node",
                                    "--topology",
                                    topology,
                                    "--id",
                                    std::to_string(id),
                                    "--mode",
                                    "consensus",
                                    "--backup",
                                    "wait-all",
                                    "--staleness",
                                    "0",
                                    "--link-delay",
                                    std::to_string(kLinkDelayMs),
                                    "--ready-timeout",
                                    "120"};
      a.insert(a.end(), flags.begin(), flags.end());
      if (rejoin) a.push_back("--rejoin");
      return a;
    };
    std::vector<std::unique_ptr<NodeProcess>> nodes;
    for (int id = 0; id < 3; ++id)
      nodes.push_back(std::make_unique<NodeProcess>(args(id, false)));
    const bool trained = nodes[2]->waitFor(training, seconds(180));
    nodes[2]->killHard();
    before = nodes[2]->text();
    ASSERT_TRUE(trained) << "node 2 never printed '" << training << "':\n" << before;
    nodes[2] = std::make_unique<NodeProcess>(args(2, true));
    for (int id = 0; id < 3; ++id) {
      exit[id] = nodes[id]->exitCode(seconds(240));
      out[id] = nodes[id]->text();
    }
  }
  // Nodes 0 and 1 saw node 2 go down (its sockets closed with the process: no heartbeat
  // time-out is needed on loopback) and, at the end, do not count it as departed (`departed`:
  // the line that would name it).
  void expectTheSurvivorsTookNodeTwoBack(const std::string& departed) const {
    for (int id = 0; id < 2; ++id) {
      EXPECT_NE(out[id].find(fmt::format("[node {}] [warning] peer 2 (", id)), std::string::npos)
          << out[id];
      EXPECT_EQ(out[id].find(departed), std::string::npos) << out[id];
    }
  }
  std::string all() const {
    return fmt::format(
        "--- node 0:\n{}\n--- node 1:\n{}\n--- node 2, first life:\n{}\n--- node 2, "
        "rejoined:\n{}",
        out[0], out[1], before, out[2]);
  }
};

// Sparse consensus (ComplEx on a planted graph): node 2 takes a neighbor's tables and AdaGrad
// sums, says at which round, and its replica ends as good as the others'.
TEST(ChorusRejoin, ASparseConsensusNodeKilledMidRunRejoinsWithANeighborsTables) {
  TempDir dir("chorus-rejoin-sparse");
  testsupport::writeTripleFolder(dir.file("graphs/planted"), testsupport::makePlantedGraph({}));
  // 1000 triples per node in batches of 32: 32 rounds per epoch, 960 in all.
  const std::vector<std::string> flags = {
      "--model",      "complex", "--data",      "planted", "--data-dir", dir.file("graphs"),
      "--dim",        "32",      "--negatives", "16",      "--reg",      "none",
      "--init-scale", "0.1",     "--batch",     "32",      "--epochs",   "30",
      "--seed",       "3"};
  RejoinRun r;
  r.run(writeTopology(dir), flags, "epoch 1/30:");
  if (::testing::Test::HasFatalFailure()) return;
  for (int id = 0; id < 3; ++id)
    EXPECT_EQ(r.exit[id], 0) << "node " << id << "\n" << r.all();
  r.expectTheSurvivorsTookNodeTwoBack("neighbor(s) 2 left before the end");
  const std::string& rejoined = r.out[2];
  EXPECT_TRUE(r.before.find("rejoining") == std::string::npos) << r.before;
  // It took the tables after a neighbor's round r (at least the last of the epoch node 2 had
  // finished: under wait-all with staleness 0 no neighbor was more than a round behind it) and
  // ran r + 1 .. the end, the same rounds as the others.
  const double per_epoch = numberAfter(r.out[0], "rounds (");
  const double rounds = numberAfter(r.out[0], "node 0: 30 epoch(s), ");
  ASSERT_GT(per_epoch, 0) << r.out[0];
  EXPECT_EQ(rounds, 30 * per_epoch) << r.out[0];
  const double took = numberAfter(rejoined, "rejoining: took node ");
  EXPECT_TRUE(took == 0 || took == 1) << rejoined;
  const double first = numberAfter(rejoined, "node 2: rejoined at round ");
  EXPECT_GE(first, per_epoch - 1) << rejoined;
  EXPECT_LT(first, rounds) << rejoined;
  EXPECT_NE(rejoined.find(
                fmt::format("node 2: rejoined at round {} with a neighbor's tables and optimizer "
                            "state\n",
                            first)),
            std::string::npos)
      << rejoined;
  EXPECT_EQ(numberAfter(rejoined, "node 2: 30 epoch(s), "), rounds) << rejoined;
  EXPECT_NE(rejoined.find("node 2: left the cluster cleanly"), std::string::npos) << rejoined;
  // Each replica's test MRR: node 2's is within a quarter of the others' (the peer-level ring
  // test holds replicas within 15% of node 0's), and all learned the planted structure.
  std::vector<double> mrr;
  for (int id = 0; id < 3; ++id) {
    mrr.push_back(numberAfter(r.out[id], fmt::format("node {}: test of its replica: mrr ", id)));
    EXPECT_GT(mrr[id], 0.08) << "node " << id << "\n" << r.all();
  }
  const double others = (mrr[0] + mrr[1]) / 2;
  EXPECT_NEAR(mrr[2], others, 0.25 * others) << r.all();
}

// Dense consensus (softmax on synthetic data): node 2 takes a neighbor's model after its round
// r, runs the rounds after it, and its final accuracy is near the others'. Node 0 averages all
// three final models.
TEST(ChorusRejoin, ADenseConsensusNodeKilledMidRunRejoinsWithANeighborsModel) {
  TempDir dir("chorus-rejoin-dense");
  const std::vector<std::string> flags = {
      "--data",  "synthetic", "--synthetic-train", "3000", "--synthetic-test", "600",
      "--model", "softmax",   "--rounds",          "900",  "--eval-every",     "20",
      "--seed",  "3"};
  RejoinRun r;
  r.run(writeTopology(dir), flags, "round 19: loss ");
  if (::testing::Test::HasFatalFailure()) return;
  for (int id = 0; id < 3; ++id)
    EXPECT_EQ(r.exit[id], 0) << "node " << id << "\n" << r.all();
  r.expectTheSurvivorsTookNodeTwoBack("node(s) 2 left before the end");
  const std::string& rejoined = r.out[2];
  const std::string took = "rejoining: took node ";
  const size_t at = rejoined.find(took);
  ASSERT_NE(at, std::string::npos) << rejoined;
  const double neighbor = numberAfter(rejoined, took);
  EXPECT_TRUE(neighbor == 0 || neighbor == 1) << rejoined;
  const double after = numberAfter(rejoined.substr(at), "'s model after round ");
  EXPECT_GE(after, 19) << rejoined;
  EXPECT_LT(after, 899) << rejoined;
  EXPECT_NE(rejoined.find(fmt::format("joining at round {}", after + 1)), std::string::npos)
      << rejoined;
  EXPECT_NE(rejoined.find("node 2: left the cluster cleanly"), std::string::npos) << rejoined;
  // Final test accuracy of each node's model (in percent), and node 0's average of all three.
  std::vector<double> acc;
  for (int id = 0; id < 3; ++id) {
    acc.push_back(numberAfter(r.out[id], fmt::format("node {}: final test accuracy ", id)));
    EXPECT_NE(r.out[id].find("after 900 rounds"), std::string::npos) << r.out[id];
  }
  EXPECT_GT(acc[0], 50) << r.all();
  EXPECT_NEAR(acc[2], (acc[0] + acc[1]) / 2, 5) << r.all();
  EXPECT_NE(r.out[0].find("node 0: test accuracy of the average of 3 final models"),
            std::string::npos)
      << r.all();
}

}  // namespace
}  // namespace chorus::testing
