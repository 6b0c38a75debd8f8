// The `chorus` executable end to end: help, bad input, and whole clusters through the launcher.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/run_spec.h"
#include "tests/cli/run_command.h"
#include "tests/support/cli_fixture.h"

namespace chorus::testing {
namespace {

using testsupport::contains;

TEST(ChorusCli, HelpListsEveryCommand) {
  CommandResult r = runCommand({chorusBinary(), "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* cmd : {"node", "launch", "topo", "train", "compare", "report"}) {
    EXPECT_TRUE(contains(r.out, cmd)) << "missing " << cmd << " in:\n" << r.out;
  }
}

// The options of a training command and their defaults, as its --help shows them: CLI11 prints
// "  --lr FLOAT:FLOAT in [0 - 100]=0.05"; an option without a default maps to "".
std::map<std::string, std::string> helpDefaults(const std::string& command) {
  CommandResult r = runCommand({chorusBinary(), command, "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, std::string> defaults;
  std::istringstream lines(r.out);
  std::string line;
  // Options start two spaces in; wrapped descriptions (which may begin with a flag) further.
  const std::regex option(R"(^  (--[a-z0-9-]+)(\s+\S+)?)");
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, option)) continue;
    const std::string type = m[2].matched ? m[2].str() : "";
    const size_t eq = type.rfind('=');
    defaults[m[1]] = eq == std::string::npos ? "" : type.substr(eq + 1);
  }
  return defaults;
}

// One default per training option, whichever command trains: a distributed run with default
// flags trains the same optimizer as the single-node baseline it is compared with.
TEST(ChorusCli, TrainingOptionsHaveOneDefaultInEveryCommand) {
  const auto train = helpDefaults("train");
  // The training options of the image models: every training command takes each of them.
  // (--shard is the distributed commands' alone: one node holds the whole training set.)
  const std::vector<std::string> dense = {
      "--data",         "--data-dir",      "--synthetic-train", "--synthetic-test",
      "--model",        "--hidden",        "--dropout",         "--limit",
      "--no-normalize", "--rounds",        "--epochs",          "--batch",
      "--lr",           "--momentum",      "--nesterov",        "--weight-decay",
      "--schedule",     "--warmup-epochs", "--step-epochs",     "--gamma",
      "--augment",      "--crop-padding",  "--no-flip",         "--seed",
      "--stragglers",   "--eval-every",    "--target-acc",      "--out",
      "--save",         "--resume",        "--confusion"};
  for (const std::string command : {"node", "compare"}) {
    const auto other = helpDefaults(command);
    for (const std::string& flag : dense) {
      EXPECT_TRUE(train.count(flag)) << "chorus train has no " << flag;
      EXPECT_TRUE(other.count(flag)) << "chorus " << command << " has no " << flag;
    }
    for (const char* flag :
         {"--data", "--model", "--epochs", "--batch", "--lr", "--momentum", "--weight-decay",
          "--schedule", "--warmup-epochs", "--gamma", "--seed", "--dropout", "--limit",
          "--crop-padding", "--rounds", "--target-acc"}) {
      ASSERT_TRUE(train.count(flag)) << "chorus train has no " << flag;
      ASSERT_TRUE(other.count(flag)) << "chorus " << command << " has no " << flag;
      EXPECT_EQ(train.at(flag), other.at(flag)) << flag << " in chorus " << command;
    }
    // Every training option of chorus train exists there too, but the sparse workloads' (matrix
    // factorization and knowledge-graph embeddings train on one node only so far).
    const std::set<std::string> single_node_only = {
        "--help", "--log-every",
        // matrix factorization
        "--data-file", "--test-share", "--mf-rows", "--mf-cols", "--mf-cells", "--mf-planted-rank",
        "--zipf-row", "--zipf-col", "--noise-sigma", "--write-data", "--rank",
        // knowledge-graph embeddings
        "--dim", "--negatives", "--loss", "--adversarial-temperature", "--adagrad-initial",
        "--time-limit", "--reciprocal", "--share-negatives", "--keep-best", "--eval-every-epochs",
        // both sparse families
        "--reg", "--reg-weight", "--optimizer", "--init-scale"};
    for (const auto& [flag, value] : train) {
      if (single_node_only.count(flag) > 0) continue;
      EXPECT_TRUE(other.count(flag)) << "chorus " << command << " has no " << flag;
    }
  }
}

// A mistyped command or flag is refused as before, with the nearest known name.
TEST(ChorusCli, ATypoGetsTheNearestName) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"lauch", "x.toml"}, "chorus: did you mean 'launch' (for 'lauch')?"},
      {{"train", "--epoch", "3"}, "chorus: did you mean --epochs (for --epoch)?"},
      {{"node", "--topolgy", "x.toml"}, "chorus: did you mean --topology (for --topolgy)?"},
      {{"launch", "../examples/none.toml", "--epoch", "3"}, ""},  // no file: that error first
  };
  for (const auto& [args, hint] : cases) {
    std::vector<std::string> argv = {chorusBinary()};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = runCommand(argv);
    EXPECT_EQ(r.exit_code, 2) << args[0] << r.err;
    if (!hint.empty()) {
      EXPECT_TRUE(contains(r.err, hint)) << r.err;
    }
  }
}

TEST(ChorusCli, UnknownCommandIsAnError) {
  CommandResult r = runCommand({chorusBinary(), "frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_FALSE(r.err.empty());
}

// A flag the parser refuses exits 2 with the flag named, like the checks chorus makes itself;
// asking for help or the version is not an error.
TEST(ChorusCli, BadFlagsExitTwoAndNameTheFlag) {
  // Each case: the command line after `chorus`, and what its error must say.
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"train", "--lr", "-1"}, "--lr"},
      {{"node", "--mode", "sometimes"}, "--mode"},
      {{"train", "--no-such-flag"}, "--no-such-flag"},
      // Numbers that must be >= 0 or > 0 say so in a few words (CLI11's own check printed the
      // whole range of a double).
      {{"node", "--down-timeout", "-3"}, "--down-timeout: must be >= 0, not -3"},
      {{"node", "--ready-timeout", "0"}, "--ready-timeout: must be > 0, not 0"},
      {{"node", "--linger", "soon"}, "--linger: 'soon' is not a number"},
      {{"node", "--write-slice-packets", "5000"}, "--write-slice-packets"},
      {{"node", "--secret-file", "/nonexistent/secret"}, "--secret-file"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv{chorusBinary()};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = runCommand(argv);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, message)) << r.err;
    EXPECT_FALSE(contains(r.err, "179769313")) << r.err;
  }
  EXPECT_EQ(runCommand({chorusBinary(), "train", "--help"}).exit_code, 0);
  EXPECT_EQ(runCommand({chorusBinary(), "--version"}).exit_code, 0);
}

TEST(ChorusCli, LaunchRefusesAMissingTopologyFile) {
  CommandResult r = runCommand({chorusBinary(), "launch", "/nonexistent/cluster.toml"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "/nonexistent/cluster.toml")) << r.err;
}

TEST(ChorusLaunch, RejoinOnEveryNodeIsRefusedWithWhatToDo) {
  const auto topo =
      std::filesystem::temp_directory_path() / ("rejoin-all-" + std::to_string(getpid()) + ".toml");
  ASSERT_EQ(runCommand({chorusBinary(), "topo", "gen", "complete", "--nodes", "3", "-o",
                        topo.string(), "--force"})
                .exit_code,
            0);
  CommandResult r = runCommand(
      {chorusBinary(), "launch", topo.string(), "--mode", "ps", "--data", "synthetic", "--rejoin"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--rejoin on every node of " + topo.string())) << r.err;
  EXPECT_TRUE(contains(r.err, "--ids 2 --rejoin")) << r.err;
  std::filesystem::remove(topo);
}

// A loopback TCP socket bound to a port the kernel picked. Kept open it occupies the port;
// closed, the port is (almost certainly) free for a node to take.
class PortReservation {
 public:
  explicit PortReservation(bool listen_on_it = false) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) ADD_FAILURE() << "bind";
    socklen_t len = sizeof addr;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    if (listen_on_it) listen(fd_, 16);
  }
  ~PortReservation() { release(); }
  void release() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// `n` distinct loopback ports that were free a moment ago (run_command.h).
std::vector<uint16_t> freePorts(int n) {
  return freeLoopbackPorts(static_cast<size_t>(n));
}

// Writes a complete-graph topology over the given ports and returns its path.
std::string writeCluster(const std::string& name, const std::vector<uint16_t>& ports) {
  auto path =
      std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()) + ".toml");
  std::ofstream f(path);
  f << "[cluster]\nname = \"" << name << "\"\nmode = \"consensus\"\n";
  for (size_t i = 0; i < ports.size(); ++i) {
    f << "\n[[node]]\nid = " << i << "\naddress = \"127.0.0.1:" << ports[i] << "\"\nneighbors = [";
    bool first = true;
    for (size_t j = 0; j < ports.size(); ++j) {
      if (j == i) continue;
      f << (first ? "" : ", ") << j;
      first = false;
    }
    f << "]\n";
  }
  return path.string();
}

// A model chunk that no node's frame limit accepts would close every connection each round.
TEST(ChorusCli, ModelChunksLargerThanTheFrameLimitAreRefused) {
  const std::string topo = writeCluster("chunk-limit", {PortReservation().port(), 1});
  CommandResult r = runCommand({chorusBinary(), "node", "--topology", topo, "--id", "0", "--mode",
                                "consensus", "--data", "synthetic", "--max-frame-mib", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err,
                       "--chunk-floats 262144 sends model chunks of 1048576 bytes plus an "
                       "envelope, more than --max-frame-mib 1 accepts"))
      << r.err;
  std::filesystem::remove(topo);
}

TEST(ChorusLaunch, FourNodesConnectExchangeAndExitCleanly) {
  const std::vector<uint16_t> ports = freePorts(4);
  std::string topo = writeCluster("launch-ok", ports);
  CommandResult r = runCommand(
      {chorusBinary(), "launch", topo, "--mode", "ping", "--pings", "5", "--ready-timeout", "60"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[launch] all 4 node(s) finished cleanly")) << r.out;
  for (int i = 0; i < 4; ++i) {
    std::string id = std::to_string(i);
    EXPECT_TRUE(
        contains(r.out, "[node " + id + "] node " + id + ": ping exchange verified with 3 peers"))
        << r.out;
    EXPECT_TRUE(contains(r.out, "[launch] node " + id + " finished")) << r.out;
  }
  std::filesystem::remove(topo);
}

// Every node proves the cluster's secret to every other; a secret file that holds nothing is
// refused before the node starts, naming the file.
TEST(ChorusLaunch, EveryNodeProvesTheSharedSecretAndAnEmptySecretFileIsRefused) {
  const std::vector<uint16_t> ports = freePorts(3);
  std::string topo = writeCluster("launch-secret", ports);
  const auto secret =
      std::filesystem::temp_directory_path() / ("secret-" + std::to_string(getpid()));
  std::ofstream(secret) << "correct horse battery staple\n";
  std::filesystem::permissions(
      secret, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  CommandResult r = runCommand({chorusBinary(), "launch", topo, "--mode", "ping", "--ready-timeout",
                                "60", "--secret-file", secret.string()});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[launch] all 3 node(s) finished cleanly")) << r.out;
  EXPECT_FALSE(contains(r.out + r.err, "may be read by other users")) << r.out << r.err;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(contains(r.out + r.err, "[node " + std::to_string(i) + "]")) << r.out;
  }
  EXPECT_TRUE(contains(r.out + r.err, "members; peers must prove the shared secret)")) << r.out;

  // The same secret named by the topology file, relative to its folder.
  {
    std::string text;
    {
      std::ifstream in(topo);
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    const std::string cluster_line = "mode = \"consensus\"\n";
    text.replace(text.find(cluster_line), cluster_line.size(),
                 cluster_line + "secret_file = \"" + secret.filename().string() + "\"\n");
    std::ofstream(topo, std::ios::trunc) << text;
  }
  r = runCommand({chorusBinary(), "launch", topo, "--mode", "ping", "--ready-timeout", "60"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out + r.err, "members; peers must prove the shared secret)")) << r.out;

  std::ofstream(secret, std::ios::trunc) << "\n";
  r = runCommand({chorusBinary(), "node", "--topology", topo, "--id", "0", "--mode", "ping",
                  "--secret-file", secret.string()});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "secret file " + secret.string() + " is empty")) << r.err;
  std::filesystem::remove(secret);
  std::filesystem::remove(topo);
}

// --link-delay holds every frame back: a ping's round trip crosses the link twice. Values the
// runtime could not live with are refused before the node starts, naming the flag.
TEST(ChorusLaunch, LinkDelayLengthensEveryRoundTripAndBadValuesAreRefused) {
  const std::vector<uint16_t> ports = freePorts(2);
  std::string topo = writeCluster("launch-delay", ports);
  CommandResult r = runCommand({chorusBinary(), "launch", topo, "--mode", "ping", "--pings", "3",
                                "--ready-timeout", "60", "--link-delay", "30,5"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  // "rtt min/mean/max A/B/C us", once per node and peer.
  int lines = 0;
  for (size_t at = r.out.find("rtt min/mean/max "); at != std::string::npos;
       at = r.out.find("rtt min/mean/max ", at + 1)) {
    const double min_us = std::stod(r.out.substr(at + std::string("rtt min/mean/max ").size()));
    EXPECT_GE(min_us, 60'000) << r.out;
    ++lines;
  }
  EXPECT_EQ(lines, 2) << r.out;
  r = runCommand({chorusBinary(), "node", "--topology", topo, "--id", "0", "--mode", "ping",
                  "--link-delay", "30ms"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--link-delay: bad link delay '30ms'")) << r.err;
  r = runCommand({chorusBinary(), "node", "--topology", topo, "--id", "0", "--mode", "ping",
                  "--link-delay", "900", "--peer-timeout-ms", "1000"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "later than --peer-timeout-ms 1000; raise --peer-timeout-ms"))
      << r.err;
  std::filesystem::remove(topo);
}

// --link-loss delays a lost frame by a retransmission time-out and loses nothing: every ping is
// answered, and the nodes say how many frames they sent again.
TEST(ChorusLaunch, LinkLossLosesNothingAndSaysWhatItHeldBack) {
  const std::vector<uint16_t> ports = freePorts(2);
  std::string topo = writeCluster("launch-loss", ports);
  // Two nodes, about 50 frames each way: no loss at all has probability 0.8^100, about 2e-10.
  CommandResult r = runCommand({chorusBinary(), "launch", topo, "--mode", "ping", "--pings", "20",
                                "--ready-timeout", "60", "--link-loss", "0.2,20"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[node 0]   peer 1: 20 of 20 pongs verified")) << r.out;
  EXPECT_TRUE(contains(r.out, "[node 1]   peer 0: 20 of 20 pongs verified")) << r.out;
  EXPECT_TRUE(contains(r.out, "frames out lost and sent again (--link-loss)")) << r.out;
  r = runCommand({chorusBinary(), "launch", topo, "--mode", "ping", "--link-loss", "1%"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--link-loss: bad link loss '1%'")) << r.err;
  // 1 + 2 + 4 time-outs of 700 ms cannot fit below the 5 s peer time-out with a heartbeat.
  r = runCommand({chorusBinary(), "launch", topo, "--mode", "ping", "--link-loss", "0.01,700"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err,
                       "--link-loss 0.01,700: delay plus jitter plus 7 retransmission time-outs "
                       "must stay below 4500 ms"))
      << r.err;
  std::filesystem::remove(topo);
}

// A node's link_delay attribute holds back what that node sends: every round trip on its links
// crosses it once. With --link-delay the two add up, and the launch checks the sum for every
// node before it starts any.
TEST(ChorusLaunch, ANodesLinkDelayAttributeSlowsItsLinks) {
  const std::vector<uint16_t> ports = freePorts(3);
  std::string topo = writeCluster("launch-node-delay", ports);
  std::ofstream(topo, std::ios::app) << "link_delay = \"40\"\n";  // the last table: node 2
  CommandResult r = runCommand(
      {chorusBinary(), "launch", topo, "--mode", "ping", "--pings", "3", "--ready-timeout", "60"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // "[node I]   peer J: ... rtt min/mean/max A/B/C us": every pair with node 2 in it.
  int slow_links = 0;
  for (size_t at = r.out.find("rtt min/mean/max "); at != std::string::npos;
       at = r.out.find("rtt min/mean/max ", at + 1)) {
    const size_t line = r.out.rfind("[node ", at);
    const std::string head = r.out.substr(line, at - line);
    if (head.rfind("[node 2]", 0) != 0 && !contains(head, "peer 2:")) continue;
    EXPECT_GE(std::stod(r.out.substr(at + std::string("rtt min/mean/max ").size())), 40'000)
        << head;
    ++slow_links;
  }
  EXPECT_EQ(slow_links, 4) << r.out;
  r = runCommand({chorusBinary(), "launch", topo, "--mode", "ping", "--link-delay", "470",
                  "--peer-timeout-ms", "1000"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--link-delay 470 plus node 2's link_delay \"40\" in " + topo +
                                  ": delay plus jitter must stay below 500 ms"))
      << r.err;
  EXPECT_FALSE(contains(r.out + r.err, "[node ")) << r.out << r.err;
  std::filesystem::remove(topo);
}

// Inputs that could only fail later (two copies of a node fighting over its port, pings no
// frame may carry) are refused at once, with status 2.
TEST(ChorusLaunch, DuplicateIdsAndPingsLargerThanAFrameAreRefused) {
  const std::vector<uint16_t> ports = freePorts(2);
  std::string topo = writeCluster("launch-refuse", ports);
  CommandResult r = runCommand({chorusBinary(), "launch", topo, "--ids", "0,0", "--mode", "ping"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--ids: node 0 is given twice")) << r.err;
  r = runCommand({chorusBinary(), "node", "--topology", topo, "--id", "0", "--mode", "ping",
                  "--payload-bytes", "2000000", "--max-frame-mib", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err,
                       "--payload-bytes 2000000 plus a frame's envelope is more than "
                       "--max-frame-mib 1 accepts"))
      << r.err;
  std::filesystem::remove(topo);
}

// The options launch passes on are the same for every node: a bad one, or a data set that is
// not there, is refused once, with status 2, before any node starts (it used to come back from
// every node, as a failed launch).
TEST(ChorusLaunch, ABadNodeOptionIsRefusedOnceBeforeAnyNodeStarts) {
  const std::vector<uint16_t> ports = freePorts(3);
  std::string topo = writeCluster("launch-badopt", ports);
  // Each case: the options after the topology file, and what the one error must say.
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--mode", "ps", "--no-such-flag"}, "--no-such-flag"},
      {{"--mode", "ps", "--staleness", "-2"}, "bad staleness '-2'"},
      {{"--mode", "consensus", "--backup", "sometimes"}, "bad backup rule 'sometimes'"},
      {{"--mode", "ping", "--link-delay", "30ms"}, "--link-delay: bad link delay '30ms'"},
      {{"--mode", "ps", "--momentum", "nan"}, "--momentum"},
      {{"--mode", "ps", "--data", "mnist", "--data-dir", "/nonexistent/data"},
       "data set 'mnist' not found"},
      {{"--id", "1"}, "--id: chorus launch passes each node the topology file and its id"},
      {{"--mode", "ps", "--stragglers", "fixed:1+slow:3=4"},
       "--stragglers fixed:1+slow:3=4: names node 3, which is not in " + topo +
           " (its ids are 0 "
           "to 2)"},
      {{"--topology=" + topo}, "--topology: chorus launch passes each node"},
      {{"--spec", "x.spec"}, "--spec: chorus launch passes each node"},
      // One bound for both modes; consensus mode needs a finite one.
      {{"--mode", "consensus", "--staleness", "async"},
       "--staleness inf: consensus mode needs a bound from 0 to 1000000 rounds"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv{chorusBinary(), "launch", topo};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = runCommand(argv);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, message)) << r.err;
    // One error line, and no node was started.
    EXPECT_EQ(r.err.find("chorus: error:"), r.err.rfind("chorus: error:")) << r.err;
    EXPECT_FALSE(contains(r.out + r.err, "[node ")) << r.out << r.err;
    EXPECT_FALSE(contains(r.out, "starting")) << r.out;
  }
  std::filesystem::remove(topo);
}

// `chorus node --spec FILE --id N`, as launch and compare start their nodes: the spec holds every
// setting, so no other flag is taken beside it, and a file that is not a spec is named.
TEST(ChorusNode, ARunSpecHoldsEverySettingAndABadOneIsNamed) {
  const std::string topo = writeCluster("spec-node", freePorts(1));
  const std::string spec = topo + ".spec";
  cli::NodeArgs args;
  args.topology = topo;
  args.mode = "ping";
  args.linger_s = 0;
  ASSERT_TRUE(cli::writeRunSpec(args, spec).ok());
  CommandResult r = runCommand({chorusBinary(), "node", "--spec", spec, "--id", "0"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "node 0 of cluster \"spec-node\" (1 nodes)")) << r.out;

  r = runCommand({chorusBinary(), "node", "--spec", spec, "--id", "0", "--pings", "5"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--pings: --spec " + spec + " holds every setting of the node"))
      << r.err;

  std::ofstream(spec) << "--mode ping\n";
  r = runCommand({chorusBinary(), "node", "--spec", spec, "--id", "0"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--spec " + spec + ": not a chorus run spec")) << r.err;

  r = runCommand({chorusBinary(), "node", "--id", "0", "--mode", "ping"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--topology FILE is required (or --spec FILE")) << r.err;
  std::filesystem::remove(spec);
  std::filesystem::remove(topo);
}

TEST(ChorusLaunch, ANodeThatFailsIsNamedAndTheLaunchFails) {
  std::vector<uint16_t> ports = freePorts(3);
  // Node 3's port is taken by someone else: it cannot listen, and the others never complete
  // their handshake with it.
  PortReservation taken(/*listen_on_it=*/true);
  ports.push_back(taken.port());
  std::string topo = writeCluster("launch-fail", ports);
  CommandResult r =
      runCommand({chorusBinary(), "launch", topo, "--mode", "ping", "--ready-timeout", "3"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "node 3 exited with status 3")) << r.err;
  EXPECT_TRUE(contains(r.err, "chorus: error: launch of " + topo)) << r.err;
  std::filesystem::remove(topo);
}

// Two machines started by hand with different options: before, the cluster hung; now the node
// that dials stops at once naming the first difference, and the other says why it still waits.
TEST(ChorusNode, NodesStartedWithOtherOptionsAreRefusedNamingTheDifference) {
  const std::string topo = writeCluster("run-mismatch", freePorts(2));
  const std::vector<std::string> common = {"--topology",      topo, "--data",      "synthetic",
                                           "--rounds",        "5",  "--model",     "softmax",
                                           "--ready-timeout", "4",  "--log-level", "warn"};
  CommandResult second;
  std::thread acceptor([&] {
    std::vector<std::string> argv = {chorusBinary(), "node", "--id", "1", "--lr", "0.1"};
    argv.insert(argv.end(), common.begin(), common.end());
    second = runCommand(argv, 60);
  });
  std::vector<std::string> argv = {chorusBinary(), "node", "--id", "0"};
  argv.insert(argv.end(), common.begin(), common.end());
  CommandResult first;
  // Node 1 may not listen yet: node 0 retries the dial until it meets node 1's refusal.
  first = runCommand(argv, 60);
  acceptor.join();
  EXPECT_EQ(first.exit_code, 4) << first.out << first.err;
  EXPECT_TRUE(contains(first.err,
                       "node 1 refused this node: node 0 runs with lr=0.05, node 1 "
                       "with lr=0.1"))
      << first.err;
  EXPECT_EQ(second.exit_code, 4) << second.out << second.err;
  EXPECT_TRUE(contains(second.err, "node 0 runs with lr=0.05")) << second.err;
  EXPECT_TRUE(contains(second.err, "--ready-timeout")) << second.err;
  std::filesystem::remove(topo);
}

// The first "step" event's loss in a metrics file.
double firstRoundLoss(const std::filesystem::path& file) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (!contains(line, "\"event\":\"step\"")) continue;
    const size_t at = line.find("\"loss\":");
    if (at != std::string::npos) return std::stod(line.substr(at + 7));
  }
  ADD_FAILURE() << "no round event in " << file;
  return 0;
}

// chorus train's options exist in chorus node: the nodes of a launch start from chorus train's
// checkpoint (--resume) and print their confusion matrix (--confusion); chorus train writes the
// metrics folder every node writes (--out DIR).
TEST(ChorusLaunch, NodesResumeFromATrainCheckpointAndPrintTheirConfusionMatrix) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("launch-resume-" + std::to_string(getpid()));
  const std::string checkpoint = (dir / "train.ckpt").string();
  const std::vector<std::string> work = {"--data",  "synthetic",        "--synthetic-train",
                                         "1000",    "--synthetic-test", "200",
                                         "--model", "softmax"};
  std::vector<std::string> train = {
      chorusBinary(), "train",    "--epochs", "1",
      "--save",       checkpoint, "--out",    (dir / "train").string()};
  train.insert(train.end(), work.begin(), work.end());
  CommandResult trained = runCommand(train);
  ASSERT_EQ(trained.exit_code, 0) << trained.out << trained.err;
  EXPECT_TRUE(contains(trained.out, "saved the model to " + checkpoint)) << trained.out;
  const double fresh_loss = firstRoundLoss(dir / "train" / "node-0.jsonl");

  const std::vector<uint16_t> ports = freePorts(2);
  const std::string topo = writeCluster("launch-resume", ports);
  std::vector<std::string> launch = {
      chorusBinary(), "launch",   topo,          "--rounds", "5",
      "--resume",     checkpoint, "--confusion", "--out",    (dir / "launch").string()};
  launch.insert(launch.end(), work.begin(), work.end());
  CommandResult r = runCommand(launch, 120);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const std::string id : {"0", "1"}) {
    EXPECT_TRUE(contains(r.out, "node " + id + ": confusion matrix (rows: true label")) << r.out;
    const auto metrics = dir / "launch" / ("node-" + id + ".jsonl");
    // The trained model's first loss is far below an untrained one's (ln 10 = 2.3).
    EXPECT_LT(firstRoundLoss(metrics), 0.8 * fresh_loss) << id;
    std::ifstream in(metrics);
    std::string line, last;
    while (std::getline(in, line))
      last = line;
    EXPECT_TRUE(contains(last, "\"confusion\":[")) << last;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove(topo);
}

TEST(ChorusLaunch, PsModeTrainsAndNodeZeroReportsTheOwnersModel) {
  const std::vector<uint16_t> ports = freePorts(3);
  std::string topo = writeCluster("launch-ps", ports);
  const auto out =
      std::filesystem::temp_directory_path() / ("launch-ps-" + std::to_string(getpid()));
  CommandResult r = runCommand({chorusBinary(),
                                "launch",
                                topo,
                                "--mode",
                                "ps",
                                "--staleness",
                                "1",
                                "--data",
                                "synthetic",
                                "--synthetic-train",
                                "3000",
                                "--synthetic-test",
                                "300",
                                "--model",
                                "softmax",
                                "--rounds",
                                "60",
                                "--eval-every",
                                "20",
                                "--ready-timeout",
                                "60",
                                "--out",
                                out.string(),
                                "--save",
                                (out / "owners.ckpt").string()});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[launch] all 3 node(s) finished cleanly")) << r.out;
  EXPECT_TRUE(contains(r.out, "node 0: test accuracy of the model as held by the owners")) << r.out;
  // --save: node 0 writes the owners' model, and chorus train takes it up.
  EXPECT_TRUE(contains(r.out, "node 0: saved the final model to ")) << r.out;
  CommandResult resumed =
      runCommand({chorusBinary(), "train", "--data", "synthetic", "--synthetic-train", "3000",
                  "--synthetic-test", "300", "--model", "softmax", "--epochs", "1", "--resume",
                  (out / "owners.ckpt").string()});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  for (int i = 0; i < 3; ++i) {
    std::string id = std::to_string(i);
    EXPECT_TRUE(contains(r.out, "node " + id + ": final test accuracy")) << r.out;
    EXPECT_TRUE(std::filesystem::exists(out / ("node-" + id + ".jsonl")));
  }
  std::filesystem::remove_all(out);
  std::filesystem::remove(topo);
}

// A learning rate that blows the model up ends every node with one clear line each: what
// happened, when, and what to change, with the node named once.
TEST(ChorusLaunch, DivergenceEndsTheRunWithAClearErrorInBothModes) {
  for (const std::string mode : {"consensus", "ps"}) {
    SCOPED_TRACE(mode);
    const std::vector<uint16_t> ports = freePorts(2);
    std::string topo = writeCluster("launch-diverge-" + mode, ports);
    CommandResult r = runCommand({chorusBinary(),
                                  "launch",
                                  topo,
                                  "--mode",
                                  mode,
                                  "--data",
                                  "synthetic",
                                  "--synthetic-train",
                                  "600",
                                  "--synthetic-test",
                                  "100",
                                  "--model",
                                  "mlp",
                                  "--lr",
                                  "100",
                                  "--momentum",
                                  "0.99",
                                  "--rounds",
                                  "200",
                                  "--ready-timeout",
                                  "60"});
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "training diverged")) << r.err;
    EXPECT_TRUE(contains(r.err, "lower --lr")) << r.err;
    EXPECT_FALSE(contains(r.err, "node 0: node 0:")) << r.err;
    EXPECT_FALSE(contains(r.err, "node 1: node 1:")) << r.err;
    std::filesystem::remove(topo);
  }
}

// The learning-rate schedule and augmentation flags reach the training loop of both modes: the
// start line records them and the per-round rate follows the cosine from --lr down to ~0.
TEST(ChorusLaunch, ScheduleAndAugmentationReachBothModes) {
  for (const std::string mode : {"consensus", "ps"}) {
    SCOPED_TRACE(mode);
    const std::vector<uint16_t> ports = freePorts(2);
    std::string topo = writeCluster("launch-schedule-" + mode, ports);
    const auto out = std::filesystem::temp_directory_path() /
                     ("launch-schedule-" + mode + "-" + std::to_string(getpid()));
    CommandResult r = runCommand({chorusBinary(),
                                  "launch",
                                  topo,
                                  "--mode",
                                  mode,
                                  "--data",
                                  "synthetic",
                                  "--synthetic-train",
                                  "600",
                                  "--synthetic-test",
                                  "100",
                                  "--model",
                                  "mlp",
                                  "--lr",
                                  "0.08",
                                  "--schedule",
                                  "cosine",
                                  "--augment",
                                  "--rounds",
                                  "40",
                                  "--eval-every",
                                  "0",
                                  "--ready-timeout",
                                  "60",
                                  "--out",
                                  out.string()});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    std::ifstream metrics(out / "node-1.jsonl");
    std::string line;
    std::vector<double> rates;
    bool started = false;
    while (std::getline(metrics, line)) {
      if (contains(line, "\"event\":\"start\"")) {
        EXPECT_TRUE(contains(line, "\"schedule\":\"cosine\"")) << line;
        EXPECT_TRUE(contains(line, "\"augment\":true")) << line;
        started = true;
      }
      const size_t at = line.find("\"lr\":");
      if (at != std::string::npos && !contains(line, "\"event\":\"start\"")) {
        rates.push_back(std::stod(line.substr(at + 5)));
      }
    }
    EXPECT_TRUE(started);
    ASSERT_EQ(rates.size(), 40u);
    EXPECT_DOUBLE_EQ(rates.front(), 0.08);
    EXPECT_NEAR(rates[20], 0.04, 1e-9);
    EXPECT_LT(rates.back(), 0.001);
    std::filesystem::remove_all(out);
    std::filesystem::remove(topo);
  }
}

TEST(ChorusNode, ABadStalenessIsRejectedBeforeAnythingStarts) {
  std::string topo = writeCluster("ps-bad-flag", {PortReservation().port()});
  CommandResult r = runCommand({chorusBinary(), "node", "--topology", topo, "--id", "0", "--mode",
                                "ps", "--staleness", "-1", "--data", "synthetic"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--staleness")) << r.err;
  std::filesystem::remove(topo);
}

}  // namespace
}  // namespace chorus::testing
