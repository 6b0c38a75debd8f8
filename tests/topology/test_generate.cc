// Generators yield valid, connected, symmetric graphs with the expected degrees; their TOML reads
// back unchanged; the shipped example files all pass the checker.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "topology/topology.h"

namespace chorus::topology {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The value of `result`; a test failure naming its error (and an empty value) without one.
template <class T>
T valueOf(node::Result<T> result) {
  if (!result.ok()) {
    ADD_FAILURE() << result.message();
    return T{};
  }
  return std::move(result).value();
}
Topology made(const GenerateOptions& options) {
  return valueOf(generate(options));
}
Topology parsed(std::string_view text, const std::string& source) {
  return valueOf(parseTopology(text, source));
}
Topology loaded(const std::filesystem::path& path) {
  return valueOf(loadTopology(path));
}
std::string commandLine(const GenerateOptions& options) {
  return valueOf(generateCommandLine(options));
}
// What generate() said when it refused `options` ("accepted" when it did not).
std::string refusal(const GenerateOptions& options) {
  node::Result<Topology> result = generate(options);
  return result.ok() ? std::string("accepted") : result.message();
}

GenerateOptions optionsFor(GraphKind kind, uint32_t nodes) {
  GenerateOptions options;
  options.kind = kind;
  options.nodes = nodes;
  options.base_port = 9000;
  return options;
}

// Checks the generated graph independently of the validator, then runs it through the validator
// via its TOML text and requires an equivalent result.
void expectValidGraph(const Topology& topology) {
  const uint32_t n = static_cast<uint32_t>(topology.nodes.size());
  for (uint32_t i = 0; i < n; ++i) {
    const NodeSpec& node = topology.nodes[i];
    EXPECT_EQ(node.id, i);
    EXPECT_TRUE(std::is_sorted(node.neighbors.begin(), node.neighbors.end()));
    EXPECT_EQ(std::adjacent_find(node.neighbors.begin(), node.neighbors.end()),
              node.neighbors.end())
        << "duplicate neighbor of " << i;
    for (uint32_t neighbor : node.neighbors) {
      ASSERT_LT(neighbor, n);
      EXPECT_NE(neighbor, i) << "self-loop";
      const auto& back = topology.nodes[neighbor].neighbors;
      EXPECT_TRUE(std::binary_search(back.begin(), back.end(), i))
          << i << " -> " << neighbor << " is not symmetric";
    }
  }
  EXPECT_EQ(connectedComponents(topology).size(), 1u);
  Topology reread = parsed(toToml(topology), "generated");
  EXPECT_TRUE(equivalent(reread, topology));
}

std::vector<size_t> degrees(const Topology& topology) {
  std::vector<size_t> out;
  for (const NodeSpec& node : topology.nodes) {
    out.push_back(node.neighbors.size());
  }
  return out;
}

TEST(TopologyGenerate, RingHasDegreeTwo) {
  for (uint32_t n : {3u, 4u, 5u, 8u, 16u, 101u}) {
    SCOPED_TRACE(n);
    Topology topology = made(optionsFor(GraphKind::kRing, n));
    expectValidGraph(topology);
    EXPECT_EQ(degrees(topology), std::vector<size_t>(n, 2));
    EXPECT_EQ(edgeCount(topology), n);
    EXPECT_EQ(topology.nodes[0].neighbors, (std::vector<uint32_t>{1, n - 1}));
  }
}

TEST(TopologyGenerate, TorusIsAsSquareAsPossible) {
  // nodes -> degree: sides of length 2 give one link in that dimension, longer sides two.
  const std::map<uint32_t, size_t> expected = {{4, 2},  {6, 3},  {8, 3},  {9, 4},
                                               {12, 4}, {16, 4}, {24, 4}, {64, 4}};
  for (const auto& [n, degree] : expected) {
    SCOPED_TRACE(n);
    Topology topology = made(optionsFor(GraphKind::kTorus, n));
    expectValidGraph(topology);
    EXPECT_EQ(degrees(topology), std::vector<size_t>(n, degree));
  }
  // 16 = 4 x 4: node 5 (row 1, col 1) touches 1, 4, 6 and 9.
  Topology sixteen = made(optionsFor(GraphKind::kTorus, 16));
  EXPECT_EQ(sixteen.nodes[5].neighbors, (std::vector<uint32_t>{1, 4, 6, 9}));
  EXPECT_EQ(sixteen.nodes[0].neighbors, (std::vector<uint32_t>{1, 3, 4, 12}));
}

TEST(TopologyGenerate, TorusRefusesPrimeAndTinyCounts) {
  for (uint32_t n : {2u, 3u, 7u, 13u}) {
    EXPECT_THAT(refusal(optionsFor(GraphKind::kTorus, n)), HasSubstr("rows x cols with both >= 2"))
        << n;
  }
}

TEST(TopologyGenerate, CompleteLinksEveryPair) {
  for (uint32_t n : {1u, 2u, 4u, 9u, 16u}) {
    SCOPED_TRACE(n);
    Topology topology = made(optionsFor(GraphKind::kComplete, n));
    expectValidGraph(topology);
    EXPECT_EQ(degrees(topology), std::vector<size_t>(n, n - 1));
    EXPECT_EQ(edgeCount(topology), static_cast<size_t>(n) * (n - 1) / 2);
  }
}

TEST(TopologyGenerate, ExponentialLinksPowersOfTwo) {
  for (uint32_t n : {2u, 4u, 8u, 16u, 64u}) {
    SCOPED_TRACE(n);
    Topology topology = made(optionsFor(GraphKind::kExponential, n));
    expectValidGraph(topology);
    // Hops 1, 2, ..., n/2 both ways; the two n/2 hops meet at the same node.
    size_t log2 = 0;
    while ((1u << log2) < n) {
      ++log2;
    }
    EXPECT_EQ(degrees(topology), std::vector<size_t>(n, 2 * log2 - 1));
  }
  Topology twelve = made(optionsFor(GraphKind::kExponential, 12));
  expectValidGraph(twelve);
  // 0 +/- 1, 2, 4, 8 (mod 12) = {1, 11, 2, 10, 4, 8, 8, 4}.
  EXPECT_EQ(twelve.nodes[0].neighbors, (std::vector<uint32_t>{1, 2, 4, 8, 10, 11}));
}

TEST(TopologyGenerate, StarHasOneCenter) {
  for (uint32_t n : {2u, 5u, 16u}) {
    SCOPED_TRACE(n);
    Topology topology = made(optionsFor(GraphKind::kStar, n));
    expectValidGraph(topology);
    std::vector<size_t> expected(n, 1);
    expected[0] = n - 1;
    EXPECT_EQ(degrees(topology), expected);
  }
}

TEST(TopologyGenerate, RegularHasDegreeDAndIsConnected) {
  const std::vector<std::pair<uint32_t, uint32_t>> cases = {
      {4, 3}, {8, 4}, {16, 4}, {10, 3}, {30, 2}, {2, 1}, {50, 8}, {64, 16}, {200, 6}};
  for (const auto& [n, d] : cases) {
    SCOPED_TRACE(testing::Message() << n << " nodes, degree " << d);
    GenerateOptions options = optionsFor(GraphKind::kRegular, n);
    options.degree = d;
    options.seed = 42;
    Topology topology = made(options);
    expectValidGraph(topology);
    EXPECT_EQ(degrees(topology), std::vector<size_t>(n, d));
  }
}

TEST(TopologyGenerate, RegularIsDeterministicPerSeed) {
  GenerateOptions options = optionsFor(GraphKind::kRegular, 16);
  options.degree = 4;
  options.seed = 7;
  Topology first = made(options);
  Topology again = made(options);
  EXPECT_TRUE(equivalent(first, again));
  bool some_seed_differs = false;
  for (uint64_t seed = 8; seed < 12; ++seed) {
    options.seed = seed;
    some_seed_differs = some_seed_differs || !equivalent(first, made(options));
  }
  EXPECT_TRUE(some_seed_differs);
}

TEST(TopologyGenerate, RegularRefusesImpossibleDegrees) {
  auto message = [](uint32_t n, uint32_t d) -> std::string {
    GenerateOptions options = optionsFor(GraphKind::kRegular, n);
    options.degree = d;
    return refusal(options);
  };
  EXPECT_THAT(message(5, 3), HasSubstr("nodes x degree (15) must be even"));
  EXPECT_THAT(message(4, 4), HasSubstr("the degree must be 2..3"));
  EXPECT_THAT(message(4, 0), HasSubstr("the degree must be 2..3"));
  EXPECT_THAT(message(6, 1), HasSubstr("never connected"));
  // One node has no regular graph of any degree; the message says so instead of "1..0".
  EXPECT_THAT(message(1, 4), HasSubstr("a random regular graph needs at least 2 nodes"));
  EXPECT_THAT(message(1, 4), Not(HasSubstr("1..0")));
  EXPECT_THAT(message(2, 4), ::testing::EndsWith("the degree must be 1"));
  EXPECT_THAT(message(3, 3), ::testing::EndsWith("the degree must be 2"));
}

TEST(TopologyGenerate, RefusesBadSizesPortsAndHosts) {
  auto message = [](GenerateOptions options) -> std::string { return refusal(options); };
  GenerateOptions options = optionsFor(GraphKind::kRing, 8);
  options.base_port = 65530;
  EXPECT_THAT(message(options), HasSubstr("ports 65530..65537 for 8 nodes go past 65535; use a "
                                          "base port of at most 65528"));
  options.base_port = 65528;
  EXPECT_EQ(made(options).nodes.back().port, 65535);
  options.base_port = 0;
  EXPECT_THAT(message(options), HasSubstr("base port must be 1..65535"));
  options = optionsFor(GraphKind::kRing, 2);
  EXPECT_THAT(message(options), HasSubstr("a ring needs at least 3 nodes"));
  options = optionsFor(GraphKind::kComplete, 0);
  EXPECT_THAT(message(options), HasSubstr("at least 1 node"));
  options = optionsFor(GraphKind::kComplete, 5000);
  options.base_port = 1;
  EXPECT_THAT(message(options), HasSubstr("more than 4000000 neighbor entries"));
  options = optionsFor(GraphKind::kRing, 4);
  options.hosts = {"not a host"};
  EXPECT_THAT(message(options), HasSubstr("'not a host' is not a valid host name"));
}

// One host per machine: node i on host i mod M, port base + i / M.
TEST(TopologyGenerate, SeveralHostsTakeTheNodesInTurn) {
  GenerateOptions options = optionsFor(GraphKind::kRing, 6);
  options.hosts = {"10.0.0.1", "10.0.0.2", "node-c"};
  options.base_port = 7100;
  Topology topology = made(options);
  std::vector<std::string> addresses;
  for (const auto& node : topology.nodes)
    addresses.push_back(node.address());
  EXPECT_EQ(addresses, (std::vector<std::string>{"10.0.0.1:7100", "10.0.0.2:7100", "node-c:7100",
                                                 "10.0.0.1:7101", "10.0.0.2:7101", "node-c:7101"}));
  EXPECT_THAT(commandLine(options), HasSubstr("--host 10.0.0.1,10.0.0.2,node-c"));
  options.hosts = {"10.0.0.1", "bad host"};
  EXPECT_THAT(refusal(options), HasSubstr("host 'bad host'"));
  // Ports per host, not per node, are what must fit.
  options = optionsFor(GraphKind::kRing, 4);
  options.hosts = {"a", "b", "c", "d"};
  options.base_port = 65535;
  EXPECT_EQ(made(options).nodes.back().address(), "d:65535");
}

TEST(TopologyGenerate, HostNameModeAndPortsAreApplied) {
  GenerateOptions options = optionsFor(GraphKind::kRing, 4);
  options.hosts = {"[::1]"};
  options.base_port = 7200;
  options.mode = Mode::kPs;
  Topology topology = made(options);
  EXPECT_EQ(topology.name, "ring4");
  EXPECT_EQ(topology.mode, Mode::kPs);
  EXPECT_EQ(topology.nodes[3].address(), "[::1]:7203");
  options.name = "my \"quoted\" \\ cluster";
  Topology named = made(options);
  Topology reread = parsed(toToml(named), "named");
  EXPECT_EQ(reread.name, options.name);
  EXPECT_TRUE(equivalent(reread, named));
}

TEST(TopologyGenerate, OptionalAttributesRoundTrip) {
  Topology topology = made(optionsFor(GraphKind::kComplete, 3));
  topology.nodes[0].stragglers = faults::StragglerProfile::read("fixed:20").value();
  topology.nodes[1].link_delay = faults::LinkDelay::read("20,5").value();
  topology.nodes[1].weight = 3.0;
  topology.nodes[2].weight = 0.1;
  std::string text = toToml(topology);
  EXPECT_THAT(text, HasSubstr("weight = 3.0\n"));
  EXPECT_THAT(text, HasSubstr("stragglers = \"fixed:20\"\n"));
  EXPECT_THAT(text, HasSubstr("link_delay = \"20,5\"\n"));
  EXPECT_TRUE(equivalent(parsed(text, "attributes"), topology));
}

TEST(TopologyGenerate, KindNamesRoundTrip) {
  for (GraphKind kind : {GraphKind::kRing, GraphKind::kTorus, GraphKind::kComplete,
                         GraphKind::kRegular, GraphKind::kExponential, GraphKind::kStar}) {
    EXPECT_EQ(parseGraphKind(graphKindName(kind)), kind);
  }
  EXPECT_EQ(parseGraphKind("hypercube"), std::nullopt);
  EXPECT_EQ(parseMode("ps"), Mode::kPs);
  EXPECT_EQ(parseMode("PS"), std::nullopt);
}

TEST(TopologyGenerate, NamesWithControlCharactersOrBadUtf8AreRefused) {
  for (std::string name : {std::string("lab\n[cluster]"), std::string("tab\there"),
                           std::string("nul\0x", 5), std::string("del\x7f"), std::string("cr\r")}) {
    GenerateOptions options = optionsFor(GraphKind::kRing, 3);
    options.name = name;
    EXPECT_THAT(refusal(options), HasSubstr("the cluster name has a control character"));
  }
  GenerateOptions options = optionsFor(GraphKind::kRing, 3);
  options.name = "bad \xff utf-8";
  EXPECT_FALSE(generate(options).ok());
  // Printable text of any script is fine, and reads back.
  options.name = "lab \"A\" \\ caf\xc3\xa9 #1 's";
  Topology named = made(options);
  EXPECT_EQ(parsed(toToml(named), "named").name, options.name);
}

TEST(TopologyGenerate, CommandLineIsShellQuoted) {
  GenerateOptions options = optionsFor(GraphKind::kRing, 3);
  options.name = "a b";
  EXPECT_THAT(commandLine(options), HasSubstr(" --name 'a b' "));
  options.name = "it's $HOME";
  EXPECT_THAT(commandLine(options), HasSubstr(" --name 'it'\\''s $HOME' "));
  options.name = "plain-name_1.x";
  options.hosts = {"[::1]"};
  EXPECT_THAT(commandLine(options), HasSubstr(" --host '[::1]' --name plain-name_1.x "));
}

TEST(TopologyGenerate, CommandLineReproducesOptions) {
  GenerateOptions options = optionsFor(GraphKind::kRegular, 8);
  options.degree = 4;
  options.seed = 3;
  EXPECT_EQ(commandLine(options),
            "chorus topo gen regular --nodes 8 --degree 4 --seed 3 --base-port 9000 --host "
            "127.0.0.1 --mode consensus");
}

class TemporaryDirectory {
 public:
  TemporaryDirectory() {
    std::string pattern = (std::filesystem::temp_directory_path() / "chorus-topo-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TemporaryDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

TEST(TopologyWrite, RefusesToOverwriteUnlessAsked) {
  TemporaryDirectory directory;
  const std::filesystem::path file = directory.path() / "ring.toml";
  const std::string ring = toToml(made(optionsFor(GraphKind::kRing, 4)));
  ASSERT_TRUE(writeTopologyFile(file, ring, false).ok());
  EXPECT_TRUE(checkTopologyFile(file).ok);
  const node::Status overwrote = writeTopologyFile(file, "junk", false);
  ASSERT_FALSE(overwrote.ok()) << "overwrote";
  EXPECT_THAT(overwrote.message(), HasSubstr(file.string() + " already exists; pass --force"));
  EXPECT_TRUE(equivalent(loaded(file), made(optionsFor(GraphKind::kRing, 4))));
  EXPECT_TRUE(writeTopologyFile(file, toToml(made(optionsFor(GraphKind::kStar, 4))), true).ok());
  EXPECT_TRUE(equivalent(loaded(file), made(optionsFor(GraphKind::kStar, 4))));
  EXPECT_FALSE(writeTopologyFile(directory.path() / "missing" / "x.toml", ring, false).ok());
}

TEST(TopologyExamples, EveryShippedFilePassesTheCheck) {
  const std::filesystem::path folder = CHORUS_EXAMPLE_TOPOLOGIES;
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (entry.path().extension() != ".toml") {
      continue;
    }
    names.insert(entry.path().filename().string());
    FileCheck check = checkTopologyFile(entry.path());
    EXPECT_TRUE(check.ok) << check.report;
  }
  for (const char* kind : {"ring", "torus", "regular", "complete"}) {
    for (int n : {4, 8, 16}) {
      EXPECT_TRUE(names.count(std::string(kind) + std::to_string(n) + ".toml"))
          << kind << n << ".toml is missing";
    }
  }
  ASSERT_TRUE(names.count("demo4.toml"));
  Topology demo = loaded(folder / "demo4.toml");
  EXPECT_EQ(demo.mode, Mode::kConsensus);
  ASSERT_EQ(demo.nodes.size(), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(demo.nodes[i].address(), "127.0.0.1:" + std::to_string(7300 + i));
    EXPECT_EQ(demo.nodes[i].neighbors.size(), 3u);
  }
}

TEST(TopologyExamples, ShippedFilesUseDistinctPorts) {
  std::map<std::string, std::string> owner;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(CHORUS_EXAMPLE_TOPOLOGIES))) {
    if (entry.path().extension() != ".toml") {
      continue;
    }
    for (const NodeSpec& node : loaded(entry.path()).nodes) {
      auto [it, inserted] = owner.emplace(node.address(), entry.path().filename().string());
      EXPECT_TRUE(inserted) << node.address() << " is used by " << it->second << " and "
                            << entry.path().filename();
    }
  }
}

}  // namespace
}  // namespace chorus::topology
