// `chorus topo gen|check` end to end through the real executable: output, exit codes, and the
// refusal to overwrite.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "topology/topology.h"

namespace chorus::topology {
namespace {

using ::testing::HasSubstr;

const std::filesystem::path kChorus = CHORUS_EXECUTABLE;
const std::filesystem::path kData = CHORUS_TOPOLOGY_TEST_DATA;

std::string slurp(const std::filesystem::path& path) {
  std::ifstream stream(path);
  std::ostringstream text;
  text << stream.rdbuf();
  return text.str();
}

struct CommandResult {
  int status = -1;
  std::string out;
  std::string err;
};

class TopoCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kChorus)) << kChorus << " is not built";
    std::string pattern = (std::filesystem::temp_directory_path() / "chorus-cli-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    directory_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    if (!directory_.empty()) std::filesystem::remove_all(directory_, ignored);
  }

  // Runs `chorus ARGS` (ARGS already shell-quoted) and collects its exit status and output.
  CommandResult chorus(const std::string& arguments) {
    const std::filesystem::path out = directory_ / "stdout";
    const std::filesystem::path err = directory_ / "stderr";
    std::string command = "'" + kChorus.string() + "' " + arguments + " >'" + out.string() +
                          "' 2>'" + err.string() + "'";
    int raw = std::system(command.c_str());
    CommandResult run;
    run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    run.out = slurp(out);
    run.err = slurp(err);
    return run;
  }

  std::filesystem::path directory_;
};

TEST_F(TopoCommand, GenWritesAFileThatChecksOk) {
  CommandResult run = chorus("topo gen ring --nodes 4 --base-port 7700");
  ASSERT_EQ(run.status, 0) << run.err;
  GenerateOptions options;
  options.kind = GraphKind::kRing;
  options.nodes = 4;
  options.base_port = 7700;
  const node::Result<Topology> printed = parseTopology(run.out, "stdout");
  const node::Result<Topology> made = generate(options);
  ASSERT_TRUE(printed.ok() && made.ok()) << run.out;
  EXPECT_TRUE(equivalent(*printed, *made)) << run.out;
  EXPECT_THAT(run.out, HasSubstr("# chorus topo gen ring --nodes 4 --base-port 7700"));
}

TEST_F(TopoCommand, GenRefusesToOverwriteWithoutForce) {
  const std::string file = (directory_ / "t.toml").string();
  ASSERT_EQ(chorus("topo gen star --nodes 5 -o '" + file + "'").status, 0);
  const std::string first = slurp(file);
  CommandResult again = chorus("topo gen ring --nodes 5 -o '" + file + "'");
  EXPECT_EQ(again.status, 1);
  EXPECT_THAT(again.err, HasSubstr("chorus: error: " + file + " already exists; pass --force"));
  EXPECT_EQ(slurp(file), first);
  CommandResult forced = chorus("topo gen ring --nodes 5 -o '" + file + "' --force");
  EXPECT_EQ(forced.status, 0) << forced.err;
  EXPECT_THAT(forced.err, HasSubstr("wrote " + file + " (5 nodes, 5 edges"));
  const node::Result<Topology> written = loadTopology(file);
  ASSERT_TRUE(written.ok()) << written.message();
  EXPECT_EQ(written->name, "ring5");
}

TEST_F(TopoCommand, GenExplainsImpossibleRequests) {
  CommandResult torus = chorus("topo gen torus --nodes 7");
  EXPECT_EQ(torus.status, 1);
  EXPECT_THAT(torus.err, HasSubstr("chorus: error: cannot generate a torus topology"));
  EXPECT_THAT(torus.err, HasSubstr("7 is prime"));
  CommandResult regular = chorus("topo gen regular --nodes 5 --degree 3");
  EXPECT_EQ(regular.status, 1);
  EXPECT_THAT(regular.err, HasSubstr("must be even"));
  CommandResult degree = chorus("topo gen ring --nodes 5 --degree 3");
  EXPECT_EQ(degree.status, 2);
  EXPECT_THAT(degree.err, HasSubstr("--degree and --seed apply only to `regular` graphs"));
  CommandResult kind = chorus("topo gen hypercube --nodes 5");
  EXPECT_NE(kind.status, 0);
  EXPECT_THAT(kind.err, HasSubstr("hypercube not in"));
  EXPECT_TRUE(kind.out.empty());
}

TEST_F(TopoCommand, GenRefusesANameThatWouldBreakTheFile) {
  const std::filesystem::path file = directory_ / "nl.toml";
  // A newline would end the header comment and make "[cluster]" a second table.
  CommandResult run = chorus("topo gen ring -n 3 --name \"$(printf 'lab\\n[cluster]')\" -o '" +
                             file.string() + "'");
  EXPECT_EQ(run.status, 1);
  EXPECT_THAT(run.err, HasSubstr("the cluster name has a control character"));
  EXPECT_FALSE(std::filesystem::exists(file));
}

TEST_F(TopoCommand, GenHeaderReproducesTheFile) {
  CommandResult first = chorus("topo gen ring -n 3 --host '[::1]' --name \"it's a \\\"lab\\\"\"");
  ASSERT_EQ(first.status, 0) << first.err;
  const node::Result<Topology> named = parseTopology(first.out, "stdout");
  ASSERT_TRUE(named.ok()) << named.message();
  EXPECT_EQ(named->name, "it's a \"lab\"");
  // The header's first line, run through the shell again, writes the same file.
  const std::string header = first.out.substr(0, first.out.find('\n'));
  ASSERT_THAT(header, ::testing::StartsWith("# chorus "));
  CommandResult again = chorus(header.substr(std::string("# chorus ").size()));
  ASSERT_EQ(again.status, 0) << header << "\n" << again.err;
  EXPECT_EQ(again.out, first.out);
}

TEST_F(TopoCommand, CheckReportsEveryFile) {
  const std::string good = (directory_ / "good.toml").string();
  ASSERT_EQ(chorus("topo gen torus --nodes 8 -o '" + good + "'").status, 0);
  const std::string bad = (kData / "bad" / "asymmetric_edge.toml").string();
  CommandResult run = chorus("topo check '" + good + "' '" + bad + "'");
  EXPECT_EQ(run.status, 1);
  EXPECT_EQ(run.out, good + ": ok (8 nodes, 12 edges, mode consensus, connected)\n");
  EXPECT_THAT(run.err, HasSubstr(bad + ":8:17: error: asymmetric edge: node 0 lists 2"));
  EXPECT_THAT(run.err, HasSubstr("chorus: error: 1 of 2 topology files failed the check"));
  CommandResult ok = chorus("topo check '" + good + "'");
  EXPECT_EQ(ok.status, 0) << ok.err;
}

TEST_F(TopoCommand, HelpDescribesTheOptions) {
  CommandResult gen = chorus("topo gen --help");
  EXPECT_EQ(gen.status, 0);
  for (const char* option : {"--nodes", "--base-port", "--host", "--degree", "--seed", "--name",
                             "--mode", "--output", "--force"}) {
    EXPECT_THAT(gen.out, HasSubstr(option));
  }
  CommandResult check = chorus("topo check --help");
  EXPECT_EQ(check.status, 0);
  EXPECT_THAT(check.out, HasSubstr("Exits 1 when any file has an error"));
}

}  // namespace
}  // namespace chorus::topology
