// `chorus launch` passes SIGTERM on to its nodes, which leave in order, and says it was
// interrupted. Runs the real executable.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
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

TEST(ChorusLaunch, SigtermIsPassedToEveryNode) {
  // Two nodes in the file, only node 0 started: it waits (up to ten minutes) for node 1.
  auto topo = std::filesystem::temp_directory_path() /
              ("launch-signal-" + std::to_string(getpid()) + ".toml");
  std::ofstream(topo) << "[cluster]\nname = \"sig\"\nmode = \"consensus\"\n\n"
                      << "[[node]]\nid = 0\naddress = \"127.0.0.1:" << freeLoopbackPort()
                      << "\"\nneighbors = [1]\n\n[[node]]\nid = 1\naddress = \"127.0.0.1:"
                      << freeLoopbackPort() << "\"\nneighbors = [0]\n";
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, out[1], 2);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::string binary = chorusBinary(), path = topo.string();
  std::vector<std::string> args = {binary, "launch", path, "--ids", "0", "--ready-timeout", "600"};
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);

  std::string text;
  // The node is up (and the launcher's handlers installed) once the node logs its listener.
  bool started = readUntil(out[0], "listening on", text, std::chrono::seconds(120));
  EXPECT_TRUE(started) << text;
  kill(pid, SIGTERM);
  readUntil(out[0], "\n<end of stream>", text, std::chrono::seconds(120));
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  std::filesystem::remove(topo);

  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 1) << text;
  EXPECT_NE(text.find("passing it to every node"), std::string::npos) << text;
  // The node got the signal and ended by it (exit 128 + 15), and the launch says so.
  EXPECT_NE(text.find("node 0 exited with status 143"), std::string::npos) << text;
  EXPECT_NE(text.find("interrupted"), std::string::npos) << text;
}

}  // namespace
}  // namespace chorus::testing
