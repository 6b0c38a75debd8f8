// The launcher's process handling, driven with small shell scripts standing in for nodes.
#include "cli/launcher.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "faults/crash.h"

namespace chorus::cli {
namespace {

namespace fs = std::filesystem;

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("chorus-launcher-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes an executable script that is run as `script node --spec F --id I`, so the node id
  // is $5.
  std::string script(const std::string& body) {
    fs::path p = dir_ / "fake-node.sh";
    std::ofstream(p) << "#!/bin/sh\nid=$5\n" << body << "\n";
    fs::permissions(p, fs::perms::owner_all);
    return p.string();
  }

  LaunchResult launch(LaunchOptions options) {
    options.spec_path = "run.spec";
    options.out = [this](std::string_view l) { out_.emplace_back(l); };
    options.err = [this](std::string_view l) { err_.emplace_back(l); };
    return runLaunch(options);
  }

  bool saw(const std::vector<std::string>& lines, const std::string& line) {
    return std::find(lines.begin(), lines.end(), line) != lines.end();
  }

  fs::path dir_;
  std::vector<std::string> out_, err_;
};

TEST_F(LauncherTest, AllNodesSucceedAndOutputIsPrefixed) {
  LaunchOptions o;
  o.binary = script("echo \"hello from $id\"\necho \"warn $id\" >&2");
  o.ids = {0, 1, 2, 3};
  LaunchResult r = launch(o);
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.failures().empty());
  ASSERT_EQ(r.nodes.size(), 4u);
  for (uint32_t id = 0; id < 4; ++id) {
    EXPECT_EQ(r.nodes[id].id, id);
    EXPECT_TRUE(saw(out_, "[node " + std::to_string(id) + "] hello from " + std::to_string(id)));
    EXPECT_TRUE(saw(err_, "[node " + std::to_string(id) + "] warn " + std::to_string(id)));
  }
}

TEST_F(LauncherTest, ANodesOwnLogTagIsNotRepeated) {
  LaunchOptions o;
  o.binary = script(
      "echo \"[13:26:05.586] [node $id] [info] clock 174\" >&2\n"
      "echo \"[13:26:05.586] [node 9] [info] about another node\" >&2");
  o.ids = {3};
  EXPECT_TRUE(launch(o).ok());
  EXPECT_TRUE(saw(err_, "[node 3] [13:26:05.586] [info] clock 174"));
  EXPECT_TRUE(saw(err_, "[node 3] [13:26:05.586] [node 9] [info] about another node"));
}

// The settings travel in the spec: a node's command line names the spec and its id only.
TEST_F(LauncherTest, PassesTheSpecAndTheId) {
  LaunchOptions o;
  o.binary = script("echo \"args: $*\"");
  o.ids = {7};
  EXPECT_TRUE(launch(o).ok());
  EXPECT_TRUE(saw(out_, "[node 7] args: node --spec run.spec --id 7"));
}

TEST_F(LauncherTest, UnterminatedLastLineIsStillShown) {
  LaunchOptions o;
  o.binary = script("printf 'no newline at the end'");
  o.ids = {0};
  EXPECT_TRUE(launch(o).ok());
  EXPECT_TRUE(saw(out_, "[node 0] no newline at the end"));
}

TEST_F(LauncherTest, FailingNodeIsNamed) {
  LaunchOptions o;
  o.binary = script("if [ \"$id\" = 2 ]; then exit 3; fi");
  o.ids = {0, 1, 2, 3};
  LaunchResult r = launch(o);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.failures(), std::vector<std::string>{"node 2 exited with status 3"});
  EXPECT_TRUE(r.nodes[0].ok());
}

TEST_F(LauncherTest, NodeKilledBySignalIsNamed) {
  LaunchOptions o;
  o.binary = script("if [ \"$id\" = 1 ]; then kill -9 $$; fi");
  o.ids = {0, 1};
  LaunchResult r = launch(o);
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.failures().size(), 1u);
  EXPECT_EQ(r.failures()[0].rfind("node 1 killed by signal 9", 0), 0u) << r.failures()[0];
}

TEST_F(LauncherTest, MissingBinaryIsReported) {
  LaunchOptions o;
  o.binary = (dir_ / "no-such-binary").string();
  o.ids = {0, 1};
  LaunchResult r = launch(o);
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.failures().size(), 2u);
  EXPECT_NE(r.failures()[0].find("could not start"), std::string::npos) << r.failures()[0];
}

TEST_F(LauncherTest, FailFastStopsTheOthers) {
  LaunchOptions o;
  // Node 0 fails at once; the others would wait for ten minutes.
  o.binary = script("if [ \"$id\" = 0 ]; then exit 1; fi\nexec sleep 600");
  o.ids = {0, 1, 2};
  o.fail_fast = true;
  LaunchResult r = launch(o);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.nodes[0].exit_status, 1);
  EXPECT_EQ(r.nodes[1].term_signal, SIGTERM);
  EXPECT_EQ(r.nodes[2].term_signal, SIGTERM);
}

TEST_F(LauncherTest, TimeoutStopsEveryNode) {
  LaunchOptions o;
  o.binary = script("exec sleep 600");
  o.ids = {0, 1};
  o.timeout = std::chrono::milliseconds(200);
  LaunchResult r = launch(o);
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.nodes[0].term_signal, SIGTERM);
  EXPECT_EQ(r.nodes[1].term_signal, SIGTERM);
}

TEST_F(LauncherTest, NodeIgnoringSigtermIsKilledAfterGrace) {
  LaunchOptions o;
  // An ignored signal stays ignored across exec, so this sleep cannot be ended by SIGTERM.
  o.binary = script("trap '' TERM\nexec sleep 600");
  o.ids = {0};
  o.timeout = std::chrono::milliseconds(100);
  o.kill_grace = std::chrono::milliseconds(200);
  LaunchResult r = launch(o);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.nodes[0].term_signal, SIGKILL);
}

// A node that ends with the injected-crash status did what the experiment asked: it is named,
// it is no failure, and --fail-fast does not stop the others, who go on without it.
TEST_F(LauncherTest, AnInjectedCrashIsNamedAndIsNoFailure) {
  const std::string crashed = std::to_string(faults::kInjectedCrashExitStatus);
  LaunchOptions o;
  // Node 2 writes its pid and crashes; the others end only once the launcher has reaped it (a
  // zombie still answers kill -0), so they are still running when its exit is handled.
  o.binary = script("pidfile=" + (dir_ / "pid-2").string() + "\n" +
                    "if [ \"$id\" = 2 ]; then echo $$ > $pidfile.tmp; mv $pidfile.tmp $pidfile; "
                    "exit " +
                    crashed +
                    "; fi\n"
                    "n=0; while [ ! -s $pidfile ] || kill -0 $(cat $pidfile) 2>/dev/null; do\n"
                    "  n=$((n+1)); [ $n -gt 6000 ] && exit 9; sleep 0.01\n"
                    "done\n"
                    "echo \"$id saw node 2 gone\"");
  o.ids = {0, 1, 2, 3};
  o.fail_fast = true;
  LaunchResult r = launch(o);
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.failures().empty()) << r.failures()[0];
  EXPECT_EQ(r.injectedCrashes(), std::vector<std::string>{"node 2 crashed as injected"});
  ASSERT_EQ(r.nodes.size(), 4u);
  EXPECT_TRUE(r.nodes[2].crashedAsInjected());
  EXPECT_FALSE(r.nodes[2].failed());
  EXPECT_FALSE(r.nodes[2].ok());
  EXPECT_EQ(r.nodes[2].describe(), "crashed as injected (exit status " + crashed + ")");
  EXPECT_TRUE(saw(out_, "[launch] node 2 crashed as injected (exit status " + crashed + ")"));
  for (uint32_t id : {0u, 1u, 3u}) {
    EXPECT_TRUE(r.nodes[id].ok()) << id << ": " << r.nodes[id].describe();
    EXPECT_TRUE(
        saw(out_, "[node " + std::to_string(id) + "] " + std::to_string(id) + " saw node 2 gone"));
  }
  for (const auto& line : err_)
    EXPECT_EQ(line.find("--fail-fast"), std::string::npos) << line;
}

// Only the injected-crash status is excused: another failure next to it still fails the launch,
// and a node killed by a signal is no injected crash.
TEST_F(LauncherTest, OtherFailuresNextToAnInjectedCrashStillFail) {
  LaunchOptions o;
  o.binary = script("case $id in 0) exit " + std::to_string(faults::kInjectedCrashExitStatus) +
                    ";; 1) exit 1;; 2) kill -9 $$;; esac");
  o.ids = {0, 1, 2, 3};
  LaunchResult r = launch(o);
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.failures().size(), 2u);
  EXPECT_EQ(r.failures()[0], "node 1 exited with status 1");
  EXPECT_EQ(r.failures()[1].rfind("node 2 killed by signal 9", 0), 0u) << r.failures()[1];
  EXPECT_EQ(r.injectedCrashes(), std::vector<std::string>{"node 0 crashed as injected"});
  EXPECT_TRUE(r.nodes[3].ok());
  EXPECT_FALSE(r.nodes[2].crashedAsInjected());
}

}  // namespace
}  // namespace chorus::cli
