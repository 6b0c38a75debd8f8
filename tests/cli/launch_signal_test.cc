// Signals and `chorus launch`: the launcher passes SIGTERM / SIGINT on to its nodes once, which
// leave in order and exit 128+N; a node takes a repeated signal without dying of it; and nodes
// whose launcher dies leave too. Runs the real executable.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/cli/run_command.h"

extern char** environ;

namespace chorus::testing {
namespace {

// Reads `fd` until `marker` has appeared (true) or the stream ends / `limit` passes (false).
bool readUntil(int fd, const std::string& marker, std::string& text, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  while (text.find(marker) == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    text.append(buf, static_cast<size_t>(n));
  }
  return true;
}

// A two-node topology file; only node 0 is started, so it waits (up to ten minutes) for node 1.
class SignalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    topology_ = std::filesystem::temp_directory_path() /
                ("launch-signal-" + std::to_string(getpid()) + "-" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".toml");
    const std::vector<uint16_t> ports = freeLoopbackPorts(2);
    std::ofstream(topology_) << "[cluster]\nname = \"sig\"\nmode = \"consensus\"\n\n"
                             << "[[node]]\nid = 0\naddress = \"127.0.0.1:" << ports[0]
                             << "\"\nneighbors = [1]\n\n[[node]]\nid = 1\naddress = \"127.0.0.1:"
                             << ports[1] << "\"\nneighbors = [0]\n";
  }
  void TearDown() override {
    if (out_ >= 0) close(out_);
    std::filesystem::remove(topology_);
  }

  // Starts `chorus ARGS...` with stdout and stderr on one pipe (out_), in its own process
  // group when `own_group` (as a shell starts a job), and waits until node 0 listens.
  pid_t start(std::vector<std::string> args, bool own_group) {
    int out[2];
    EXPECT_EQ(pipe(out), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, out[1], 2);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    if (own_group) {
      posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
      posix_spawnattr_setpgroup(&attributes, 0);
    }
    std::string binary = chorusBinary();
    args.insert(args.begin(), binary);
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    EXPECT_EQ(posix_spawn(&pid, binary.c_str(), &actions, &attributes, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    close(out[1]);
    out_ = out[0];
    // The node is up (and every signal handler installed) once it logs its listener.
    EXPECT_TRUE(readUntil(out_, "listening on", text_, std::chrono::seconds(120))) << text_;
    return pid;
  }
  std::vector<std::string> launchArgs() const {
    return {"launch", topology_.string(), "--ids", "0", "--ready-timeout", "600"};
  }
  // Reads the rest of the output and reaps `pid`; returns its wait status.
  int finish(pid_t pid) {
    readUntil(out_, "\n<end of stream>", text_, std::chrono::seconds(120));
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
  }

  std::filesystem::path topology_;
  int out_ = -1;
  std::string text_;
};

TEST_F(SignalTest, SigtermIsPassedToEveryNode) {
  const pid_t pid = start(launchArgs(), false);
  kill(pid, SIGTERM);
  const int status = finish(pid);
  ASSERT_TRUE(WIFEXITED(status)) << text_;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << text_;
  EXPECT_NE(text_.find("passing it to every node"), std::string::npos) << text_;
  // The node got the signal and ended by it (exit 128 + 15), and the launch says so.
  EXPECT_NE(text_.find("node 0 exited with status 143"), std::string::npos) << text_;
  EXPECT_NE(text_.find("interrupted"), std::string::npos) << text_;
}

// `timeout` and a terminal's Ctrl-C signal the launcher's whole process group, and `timeout`
// signals the launcher itself as well: one interrupt, which each node must get once.
TEST_F(SignalTest, OneInterruptToTheWholeGroupReachesEachNodeOnce) {
  const pid_t pid = start(launchArgs(), true);
  kill(pid, SIGINT);
  kill(-pid, SIGINT);
  const int status = finish(pid);
  ASSERT_TRUE(WIFEXITED(status)) << text_;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT) << text_;
  EXPECT_NE(text_.find("node 0 exited with status 130"), std::string::npos) << text_;
  EXPECT_EQ(text_.find("killed by signal"), std::string::npos) << text_;
  EXPECT_EQ(text_.find("second signal"), std::string::npos) << text_;
}

// A node that is told twice still leaves in order and exits 128+N, not killed by the second.
TEST_F(SignalTest, ANodeSignalledTwiceStillLeavesInOrder) {
  const pid_t pid = start({"node", "--topology", topology_.string(), "--id", "0", "--mode", "ping",
                           "--ready-timeout", "600"},
                          false);
  kill(pid, SIGTERM);
  kill(pid, SIGTERM);
  const int status = finish(pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << ":\n" << text_;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << text_;
}

// Killing the launcher outright (no chance to pass anything on) must not leave its nodes
// running alone: each was told to get SIGTERM when its parent dies.
// A cluster of one node trains alone (compare's single variant); Ctrl-C ends it between two
// steps, as it ends a distributed node, instead of after its last round.
TEST_F(SignalTest, ANodeTrainingAloneStopsOnAnInterrupt) {
  const std::filesystem::path single = topology_.string() + ".single.toml";
  std::ofstream(single) << "[cluster]\nname = \"alone\"\nmode = \"consensus\"\n\n"
                        << "[[node]]\nid = 0\naddress = \"127.0.0.1:" << freeLoopbackPort()
                        << "\"\nneighbors = []\n";
  pid_t pid = start({"node", "--topology", single.string(), "--id", "0", "--data", "synthetic",
                     "--model", "softmax", "--rounds", "100000000"},
                    false);
  kill(pid, SIGINT);
  int status = finish(pid);
  std::filesystem::remove(single);
  ASSERT_TRUE(WIFEXITED(status)) << text_;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT) << text_;
}

TEST_F(SignalTest, NodesLeaveWhenTheLauncherDies) {
  // Orphans are handed to this process, so that it can see how the node ended.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const pid_t launcher = start(launchArgs(), true);
  ASSERT_TRUE(readUntil(out_, "started (pid ", text_, std::chrono::seconds(10))) << text_;
  const size_t at = text_.find("started (pid ") + std::string("started (pid ").size();
  const pid_t node = static_cast<pid_t>(std::stol(text_.substr(at)));
  kill(launcher, SIGKILL);
  int status = 0;
  waitpid(launcher, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  ASSERT_EQ(waitpid(node, &status, 0), node) << text_;
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "node killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
}

}  // namespace
}  // namespace chorus::testing
