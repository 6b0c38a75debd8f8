// Loading and validating topology files: every malformed file gives the expected message at the
// expected line, and nothing else.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "topology/address.h"
#include "topology/text_guard.h"
#include "topology/topology.h"

namespace chorus::topology {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::filesystem::path kData = CHORUS_TOPOLOGY_TEST_DATA;

std::filesystem::path badFile(const std::string& name) {
  return kData / "bad" / name;
}

// The diagnostics of a file that must be refused (loadTopology's error lists them).
std::vector<Diagnostic> diagnosticsOf(const std::string& name) {
  EXPECT_FALSE(loadTopology(badFile(name)).ok()) << name << " was accepted";
  std::vector<Diagnostic> found = diagnoseTopologyFile(badFile(name));
  if (found.empty()) ADD_FAILURE() << name << " was accepted";
  return found;
}

// The value of `result`; a test failure naming its error (and an empty value) without one.
Topology valueOf(node::Result<Topology> result) {
  if (!result.ok()) {
    ADD_FAILURE() << result.message();
    return {};
  }
  return std::move(result).value();
}
Topology parsed(std::string_view text, const std::string& source) {
  return valueOf(parseTopology(text, source));
}

struct Expected {
  int line;
  std::string text;  // must appear in the formatted diagnostic (message or fix)
};

// Every diagnostic matches the expectation at the same index, in order, and no more.
void expectDiagnostics(const std::string& name, const std::vector<Expected>& expected) {
  std::vector<Diagnostic> found = diagnosticsOf(name);
  std::string all;
  for (const Diagnostic& d : found) {
    all += d.format() + "\n";
  }
  ASSERT_EQ(found.size(), expected.size()) << all;
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(all);
    EXPECT_EQ(found[i].line, expected[i].line) << found[i].format();
    EXPECT_THAT(found[i].format(), HasSubstr(expected[i].text));
    EXPECT_EQ(found[i].file, badFile(name).string());
  }
}

TEST(TopologyValidation, SyntaxErrorNamesLineAndColumn) {
  std::vector<Diagnostic> found = diagnosticsOf("syntax_error.toml");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].line, 2);
  EXPECT_GT(found[0].column, 0);
  EXPECT_THAT(found[0].message, HasSubstr("TOML syntax error"));
  EXPECT_THAT(found[0].format(), HasSubstr("syntax_error.toml:2:"));
}

TEST(TopologyValidation, UnknownTopLevelKeySuggestsClosest) {
  expectDiagnostics("unknown_top_level_key.toml",
                    {{0, "missing [cluster] table"},
                     {1, "unknown top-level key 'clustr' (fix: did you mean 'cluster'?)"}});
}

TEST(TopologyValidation, UnknownClusterKeySuggestsClosest) {
  expectDiagnostics("unknown_cluster_key.toml",
                    {{1, "[cluster] has no 'name'"},
                     {2, "unknown key 'nmae' in [cluster] (fix: did you mean 'name'?)"}});
}

TEST(TopologyValidation, UnknownNodeKeySuggestsClosest) {
  expectDiagnostics("unknown_node_key.toml",
                    {{5, "node 0 has no 'neighbors'"},
                     {8, "unknown key 'neighbours' in [[node]] (fix: did you mean 'neighbors'?)"}});
}

TEST(TopologyValidation, MissingClusterTable) {
  expectDiagnostics("missing_cluster.toml", {{0, "missing [cluster] table"}});
  EXPECT_THAT(diagnosticsOf("missing_cluster.toml")[0].format(),
              HasSubstr("missing_cluster.toml: error: missing [cluster] table"));
}

// Nodes would refuse to start with it: the name travels in every (small) handshake frame.
TEST(TopologyValidation, AClusterNameLongerThanTheRuntimeTakesIsRefused) {
  expectDiagnostics("long_cluster_name.toml",
                    {{2, "[cluster] name is 257 bytes long (fix: use at most 256 bytes"}});
}

// Bytes Debian's toml++ 3.3 does not handle (a debug assertion, __builtin_unreachable) never
// reach it: they are refused first, at their line and column.
TEST(TopologyValidation, NulInvalidUtf8AndNonAsciiOutsideStringsAreRefusedBeforeParsing) {
  expectDiagnostics("nul_in_header.toml", {{1, "a NUL byte"}});
  EXPECT_EQ(diagnosticsOf("nul_in_header.toml")[0].column, 5);
  expectDiagnostics("latin1_name.toml", {{2, "byte 0xE9 is not UTF-8"}});
  expectDiagnostics("non_ascii_in_array.toml",
                    {{8, "a non-ASCII character outside a string or comment"}});
}

TEST(TopologyText, NonAsciiInsideStringsAndCommentsIsFine) {
  EXPECT_FALSE(
      checkTopologyText("# caf\xc3\xa9\nname = \"caf\xc3\xa9\" # \xca\xa0\n"
                        "x = 'caf\xc3\xa9'\ny = \"\"\"a\n\xc3\xa9\"\"\"\n"
                        "z = \"esc \\\" \xc3\xa9\"\n"));
  const auto problem = checkTopologyText("a = \"x\"\nb = [\xca\xa0]\n");
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->line, 2u);
  EXPECT_EQ(problem->column, 6u);
  EXPECT_EQ(firstInvalidUtf8("ok \xed\xa0\x80"), 3u);  // a surrogate
  EXPECT_EQ(firstInvalidUtf8("ok \xc3\xa9"), std::string_view::npos);
}

TEST(TopologyValidation, MissingNameAndMode) {
  expectDiagnostics("missing_name_and_mode.toml",
                    {{3, "[cluster] has no 'name'"}, {3, "[cluster] has no 'mode'"}});
}

TEST(TopologyValidation, MissingIdAndAddress) {
  expectDiagnostics("missing_id_and_address.toml",
                    {{10, "[[node]] has no 'id'"}, {10, "[[node]] has no 'address'"}});
}

TEST(TopologyValidation, WrongTypes) {
  expectDiagnostics("wrong_types.toml",
                    {{2, "[cluster] name must be a string, not an integer"},
                     {6, "node id must be an integer, not a string"},
                     {7, "node address must be a string, not an integer"},
                     {8, "neighbors must be an array of node ids, not a string"},
                     {9, "weight must be a number, not a string"},
                     {10, "stragglers must be a string, not an integer"},
                     {15, "each neighbor must be an integer node id, not a string"}});
}

TEST(TopologyValidation, BadModeValue) {
  expectDiagnostics("bad_mode.toml", {{3,
                                       "unknown mode 'gossip' (fix: write mode = \"consensus\" "
                                       "or mode = \"ps\")"}});
}

TEST(TopologyValidation, DuplicateIds) {
  expectDiagnostics("duplicate_ids.toml",
                    {{11, "duplicate node id 0 (also used by the node at line 5)"},
                     // The second node, now also id 0, lists 0: reported too.
                     {13, "node 0 lists itself as a neighbor"}});
}

TEST(TopologyValidation, DuplicateAddressesIncludingLocalhost) {
  expectDiagnostics("duplicate_addresses.toml",
                    {{11, "duplicate address 127.0.0.1:7100 (also used by the node at line 5)"},
                     {15,
                      "duplicate address localhost:7100 (also used by the node at line 5, "
                      "written 127.0.0.1:7100)"}});
}

TEST(TopologyValidation, DuplicateAddressesCompareLiteralsAsAddresses) {
  const std::string clash = "clashes with ";
  expectDiagnostics(
      "same_socket_spelled_differently.toml",
      {{10,
        "duplicate address [0:0:0:0:0:0:0:1]:17200 (also used by the node at line 5, written "
        "[::1]:17200)"},
       {16, "address 0.0.0.0:17210 " + clash + "127.0.0.1:17210 of the node at line 11"},
       // The earliest of the two it clashes with (line 11 before 0.0.0.0 at line 14).
       {19,
        "duplicate address [::ffff:127.0.0.1]:17210 (also used by the node at line 11, written "
        "127.0.0.1:17210)"},
       {25, "address [::]:17220 " + clash + "node-5.example.org:17220 of the node at line 20"},
       {31,
        "duplicate address node-5.EXAMPLE.org:17221 (also used by the node at line 26, written "
        "NODE-5.example.org:17221)"},
       {34, "address [::2]:17220 " + clash + "[::]:17220 of the node at line 23"}});
}

TEST(TopologyValidation, BadHostPort) {
  expectDiagnostics("bad_addresses.toml",
                    {{7, "address '127.0.0.1' has no port"},
                     {10, "port 'http' in address '127.0.0.1:http' is not a number"},
                     {13, "port 0 in address '127.0.0.1:0' is out of range"},
                     {16, "port 70000 in address '127.0.0.1:70000' is out of range"},
                     {19, "in address ':7100': the host is empty"},
                     {22, "IPv6 host without brackets (fix: write it as [::1]:7100)"},
                     {25, "'300.1.2.3' is not a valid IPv4 address"}});
}

TEST(TopologyValidation, NeighborThatDoesNotExist) {
  expectDiagnostics("missing_neighbor.toml", {{8, "neighbor 9 does not exist"}});
}

TEST(TopologyValidation, SelfLoop) {
  expectDiagnostics("self_loop.toml", {{13, "node 1 lists itself as a neighbor"}});
}

TEST(TopologyValidation, DuplicateNeighbor) {
  expectDiagnostics("duplicate_neighbor.toml", {{8, "neighbor 1 is listed twice"}});
}

TEST(TopologyValidation, AsymmetricEdgeNamesTheFix) {
  expectDiagnostics(
      "asymmetric_edge.toml",
      {{8,
        "asymmetric edge: node 0 lists 2 but node 2 (line 15) does not list 0 (fix: edges are "
        "symmetric: add 0 to node 2's neighbors, or remove 2 from node 0's)"}});
}

TEST(TopologyValidation, DisconnectedGraphNamesComponents) {
  expectDiagnostics("disconnected.toml",
                    {{15,
                      "nodes {2-3} cannot reach node 0 (3 components: {0-1} and {2-3} and "
                      "{4})"},
                     {25, "nodes {4} cannot reach node 0"}});
}

TEST(TopologyValidation, EmptyCluster) {
  expectDiagnostics("empty_cluster.toml", {{1, "the cluster has no nodes"}});
}

TEST(TopologyValidation, NegativeAndTooLargeIds) {
  expectDiagnostics("bad_ids.toml", {{6, "node id -1 is out of range 0..1"},
                                     {10, "node id 7 is out of range 0..1"}});
}

TEST(TopologyValidation, NonPositiveWeight) {
  expectDiagnostics("bad_weight.toml", {{8, "weight 0 is not positive"},
                                        {13, "weight -2.5 is not positive"},
                                        {18, "weight nan is not positive"}});
}

// A profile the fault layer cannot parse is refused with the file, not when the node starts.
TEST(TopologyValidation, BadStragglerProfiles) {
  expectDiagnostics("bad_stragglers.toml",
                    {{8, "bad straggler term 'bogus:1': unknown kind 'bogus'"},
                     {18, "bad straggler term 'fixed:-3': MS must be >= 0 and at most"}});
}

// A node's link_delay is checked with the fault layer's parser when the file is loaded, at its
// line; a good one is kept as written.
TEST(TopologyValidation, LinkDelayAttribute) {
  const std::string head = "[cluster]\nname = \"a\"\nmode = \"ps\"\n";
  std::vector<Diagnostic> found =
      checkTopology(head + "[[node]]\nid = 0\naddress = \"h:1\"\nlink_delay = \"20ms\"\n" +
                        "[[node]]\nid = 1\naddress = \"h:2\"\nlink_delay = 20\n" +
                        "[[node]]\nid = 2\naddress = \"h:3\"\nlink_delay = \"20001\"\n",
                    "delays");
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0].line, 7);
  EXPECT_THAT(found[0].message, HasSubstr("bad link delay '20ms'"));
  EXPECT_EQ(found[1].line, 11);
  EXPECT_THAT(found[1].message, HasSubstr("link_delay must be a string, not an integer"));
  EXPECT_EQ(found[2].line, 15);
  EXPECT_THAT(found[2].message, HasSubstr("bad link delay '20001'"));

  Topology topology = parsed(head + "[[node]]\nid = 0\naddress = \"h:1\"\nlink_delay = \"20,5\"\n" +
                                 "[[node]]\nid = 1\naddress = \"h:2\"\n",
                             "delay");
  EXPECT_EQ(topology.nodes[0].link_delay.text, "20,5");
  EXPECT_EQ(topology.nodes[0].link_delay.delay, std::chrono::milliseconds(20));
  EXPECT_EQ(topology.nodes[1].link_delay.text, "");
  EXPECT_TRUE(topology.nodes[1].link_delay.empty());
}

// A node reads only its own stragglers attribute: a slow or crash term in it for another node
// would never act, so it is refused at its line.
TEST(TopologyValidation, AStragglersAttributeNamingAnotherNodeIsRefused) {
  const std::string head = "[cluster]\nname = \"a\"\nmode = \"ps\"\n";
  std::vector<Diagnostic> found = checkTopology(
      head + "[[node]]\nid = 0\naddress = \"h:1\"\nstragglers = \"fixed:2+slow:1=4\"\n" +
          "[[node]]\nid = 1\naddress = \"h:2\"\nstragglers = \"slow:1=4+crash:1@9\"\n",
      "others");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].line, 7);
  EXPECT_THAT(found[0].message,
              HasSubstr("stragglers \"fixed:2+slow:1=4\" of node 0 names node 1"));
  EXPECT_THAT(found[0].fix, HasSubstr("name node 0 in it, or put the term in node 1's stragglers"));
}

TEST(TopologyValidation, NodeWrittenAsSingleTable) {
  expectDiagnostics("node_not_array.toml",
                    {{5,
                      "'node' must be an array of tables, not a table (fix: write each node as "
                      "its own [[node]] table"}});
}

TEST(TopologyValidation, PsModeNeedsNeighborsForAllOrNone) {
  expectDiagnostics("ps_some_neighbors.toml",
                    {{10,
                      "node 1 has no 'neighbors' (fix: in ps mode give neighbors for every "
                      "node or for none"}});
}

TEST(TopologyValidation, AtLeastFifteenMalformedFilesAreAllRefused) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kData / "bad")) {
    FileCheck check = checkTopologyFile(entry.path());
    EXPECT_FALSE(check.ok) << entry.path();
    EXPECT_THAT(check.report, HasSubstr(entry.path().string() + ":")) << check.report;
    ++count;
  }
  EXPECT_GE(count, 15);
}

TEST(TopologyValidation, CheckTopologyReturnsEveryProblemWithoutThrowing) {
  std::vector<Diagnostic> found = checkTopology("[cluster]\nname = \"\"\nmode = 3\n", "inline");
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0].format(),
            "inline:1:1: error: the cluster has no nodes (fix: add a [[node]] table (id, "
            "address, neighbors) for every node, or generate a file with `chorus topo gen ring "
            "--nodes 4`)");
  EXPECT_EQ(found[1].line, 2);
  EXPECT_THAT(found[1].message, HasSubstr("[cluster] name is empty"));
  EXPECT_EQ(found[2].line, 3);
  EXPECT_THAT(found[2].message, HasSubstr("[cluster] mode must be a string, not an integer"));
  EXPECT_TRUE(
      checkTopology(
          toToml(parsed("[cluster]\nname='a'\nmode='ps'\n[[node]]\nid=0\naddress='h:1'\n", "x")),
          "y")
          .empty());
}

TEST(TopologyValidation, DuplicateKeyIsASyntaxError) {
  std::vector<Diagnostic> found =
      checkTopology("[cluster]\nname = \"a\"\nname = \"b\"\nmode = \"ps\"\n", "dup");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].line, 3);
  EXPECT_THAT(found[0].message, HasSubstr("TOML syntax error"));
  EXPECT_THAT(found[0].message, HasSubstr("name"));
}

TEST(TopologyValidation, FarOffKeysListTheKnownOnes) {
  std::vector<Diagnostic> found = checkTopology(
      "[cluster]\nname = \"a\"\nmode = \"ps\"\n[[node]]\nid = 0\naddress = \"h:1\"\nx = 1\n",
      "far");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].line, 7);
  EXPECT_EQ(found[0].fix,
            "remove it; the known keys here are 'id', 'address', 'neighbors', 'stragglers', "
            "'link_delay', 'weight'");
}

// [cluster] secret_file names the cluster's secret; a relative path is relative to the file.
TEST(TopologyValidation, SecretFileIsReadRelativeToTheTopologysFolder) {
  const std::string text =
      "[cluster]\nname = \"a\"\nmode = \"ps\"\nsecret_file = \"lab.secret\"\n"
      "[[node]]\nid = 0\naddress = \"h:1\"\n";
  Topology topology = parsed(text, "/etc/chorus/lab.toml");
  EXPECT_EQ(topology.secret_file, "lab.secret");
  EXPECT_EQ(topology.secretPath(), "/etc/chorus/lab.secret");
  topology.secret_file = "/run/keys/lab.secret";
  EXPECT_EQ(topology.secretPath(), "/run/keys/lab.secret");
  EXPECT_TRUE(equivalent(parsed(toToml(topology), "round-trip"), topology));
  EXPECT_EQ(parsed("[cluster]\nname = \"a\"\nmode = \"ps\"\n[[node]]\nid = 0\n"
                   "address = \"h:1\"\n",
                   "none")
                .secretPath(),
            "");

  std::vector<Diagnostic> found = checkTopology(
      "[cluster]\nname = \"a\"\nmode = \"ps\"\nsecret_file = 7\n[[node]]\nid = 0\n"
      "address = \"h:1\"\n",
      "typed");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].line, 4);
  EXPECT_THAT(found[0].format(), HasSubstr("[cluster] secret_file"));
  found = checkTopology(
      "[cluster]\nname = \"a\"\nmode = \"ps\"\nsecret_file = \"\"\n[[node]]\nid = 0\n"
      "address = \"h:1\"\n",
      "empty");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_THAT(found[0].format(), HasSubstr("[cluster] secret_file is empty"));
}

TEST(TopologyValidation, TopologyErrorListsEveryDiagnostic) {
  const node::Result<Topology> loaded = loadTopology(badFile("bad_ids.toml"));
  ASSERT_FALSE(loaded.ok()) << "accepted";
  const std::string& what = loaded.message();
  EXPECT_THAT(what, HasSubstr("bad_ids.toml:6:6: error: node id -1"));
  EXPECT_THAT(what, HasSubstr("\n" + badFile("bad_ids.toml").string() + ":10:6: error: node id 7"));
}

TEST(TopologyValidation, MissingFileIsATopologyErrorNamingThePath) {
  const std::filesystem::path missing = kData / "no_such_file.toml";
  const node::Result<Topology> loaded = loadTopology(missing);
  ASSERT_FALSE(loaded.ok()) << "accepted";
  const std::vector<Diagnostic> diagnostics = diagnoseTopologyFile(missing);
  ASSERT_EQ(diagnostics.size(), 1u);
  EXPECT_EQ(diagnostics[0].file, missing.string());
  EXPECT_THAT(loaded.message(),
              HasSubstr(missing.string() + ": error: topology file does not exist"));
  const node::Result<Topology> folder = loadTopology(kData);
  ASSERT_FALSE(folder.ok()) << "accepted a directory";
  EXPECT_THAT(folder.message(), HasSubstr("is a directory"));
  FileCheck check = checkTopologyFile(missing);
  EXPECT_FALSE(check.ok);
  EXPECT_THAT(check.report, HasSubstr("does not exist"));
}

TEST(TopologyValidation, PsModeWithoutNeighborsIsComplete) {
  Topology topology = valueOf(loadTopology(kData / "good" / "ps_implicit_complete.toml"));
  EXPECT_EQ(topology.name, "shards");
  EXPECT_EQ(topology.mode, Mode::kPs);
  EXPECT_EQ(topology.source, (kData / "good" / "ps_implicit_complete.toml").string());
  ASSERT_EQ(topology.nodes.size(), 3u);
  // Sorted by id whatever the file order.
  EXPECT_EQ(topology.nodes[0].id, 0u);
  EXPECT_EQ(topology.nodes[0].host, "localhost");
  EXPECT_EQ(topology.nodes[0].weight, 2.0);
  EXPECT_EQ(topology.nodes[0].line, 11);
  EXPECT_EQ(topology.nodes[1].host, "node-1.example.org");
  EXPECT_EQ(topology.nodes[1].weight, 0.5);
  EXPECT_EQ(topology.nodes[2].host, "::1");
  EXPECT_EQ(topology.nodes[2].port, 7102);
  EXPECT_EQ(topology.nodes[2].address(), "[::1]:7102");
  EXPECT_EQ(topology.nodes[2].stragglers.text, "fixed:20");
  ASSERT_EQ(topology.nodes[2].stragglers.terms.size(), 1u);  // read once, where the file is
  EXPECT_EQ(topology.nodes[0].neighbors, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(topology.nodes[2].neighbors, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(edgeCount(topology), 3u);
  ASSERT_NE(topology.find(1), nullptr);
  EXPECT_EQ(topology.find(1)->port, 7101);
  EXPECT_EQ(topology.find(3), nullptr);
  EXPECT_EQ(summarize(topology), "3 nodes, 3 edges, mode ps, connected");
  // Written back with explicit neighbors, it reads back the same.
  EXPECT_TRUE(equivalent(parsed(toToml(topology), "round-trip"), topology));
}

// A ps file of `nodes` nodes without neighbor lists, node i on 10.x.y.z:7100 (z = i % 256...).
std::string psFileWithoutNeighbors(uint32_t nodes) {
  std::string text = "[cluster]\nname = \"big\"\nmode = \"ps\"\n";
  for (uint32_t id = 0; id < nodes; ++id) {
    text += "\n[[node]]\nid = " + std::to_string(id) + "\naddress = \"10." +
            std::to_string(id >> 16) + "." + std::to_string((id >> 8) & 255) + "." +
            std::to_string(id & 255) + ":7100\"\n";
  }
  return text;
}

TEST(TopologyValidation, ImplicitCompleteGraphIsCappedLikeTheGenerators) {
  // 2001 x 2000 neighbor entries is just past the 4,000,000 a generator may write: refused before
  // the graph is built (65536 nodes would need tens of gigabytes).
  std::vector<Diagnostic> found = checkTopology(psFileWithoutNeighbors(2001), "big.toml");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].file, "big.toml");
  EXPECT_THAT(found[0].message, HasSubstr("2001 nodes"));
  EXPECT_THAT(found[0].message, HasSubstr("4000000 neighbor entries"));
  EXPECT_THAT(found[0].fix, HasSubstr("give every node a neighbors list"));
  EXPECT_THAT(found[0].fix, HasSubstr("at most 2000 nodes"));
  // 2000 x 1999 is within the cap and still loads as the complete graph.
  Topology largest = parsed(psFileWithoutNeighbors(2000), "largest.toml");
  EXPECT_EQ(edgeCount(largest), 2000u * 1999u / 2u);
}

TEST(TopologyValidation, TooManyNodesSaysAtMost65536) {
  std::vector<Diagnostic> found = checkTopology(psFileWithoutNeighbors(65537), "huge.toml");
  std::string all;
  for (const Diagnostic& d : found) {
    all += d.format() + "\n";
  }
  EXPECT_THAT(all, HasSubstr("huge.toml: error: the file has 65537 nodes, more than the 65536 a "
                             "cluster may have"));
  EXPECT_THAT(all, HasSubstr("node id 65536 is out of range 0..65535 (fix: a cluster has at most "
                             "65536 nodes"));
  EXPECT_THAT(all, Not(HasSubstr("number the 65537 nodes")));
}

TEST(TopologyValidation, SingleNodeConsensusClusterIsValid) {
  FileCheck check = checkTopologyFile(kData / "good" / "single_node.toml");
  EXPECT_TRUE(check.ok) << check.report;
  EXPECT_EQ(check.report, (kData / "good" / "single_node.toml").string() +
                              ": ok (1 nodes, 0 edges, mode consensus, connected)");
}

TEST(TopologyValidation, MutatedFilesNeverThrowAndAlwaysExplain) {
  GenerateOptions options;
  options.kind = GraphKind::kTorus;
  options.nodes = 8;
  const std::string valid = toToml(valueOf(generate(options)));
  const std::string alphabet = "[]=\"',.#:-0123456789abcdefghijklmnopqrstuvwxyz \n";
  std::mt19937_64 random(20261121);
  int refused = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string text = valid;
    const int edits = 1 + static_cast<int>(random() % 4);
    for (int edit = 0; edit < edits; ++edit) {
      const size_t at = random() % text.size();
      const char replacement = alphabet[random() % alphabet.size()];
      switch (random() % 3) {
        case 0:
          text.erase(at, 1);
          break;
        case 1:
          text.insert(at, 1, replacement);
          break;
        default:
          text[at] = replacement;
      }
    }
    std::vector<Diagnostic> found;
    ASSERT_NO_THROW(found = checkTopology(text, "mutated")) << text;
    for (const Diagnostic& diagnostic : found) {
      EXPECT_EQ(diagnostic.file, "mutated");
      EXPECT_FALSE(diagnostic.message.empty());
      EXPECT_GE(diagnostic.line, 0);
    }
    if (found.empty()) {
      EXPECT_TRUE(parseTopology(text, "mutated").ok()) << text;
    } else {
      ++refused;
    }
  }
  EXPECT_GT(refused, 1000);  // most random edits break something, and are reported
}

TEST(TopologyValidation, DiagnosticFormat) {
  EXPECT_EQ((Diagnostic{"f.toml", 3, 7, "bad thing", "do this"}).format(),
            "f.toml:3:7: error: bad thing (fix: do this)");
  EXPECT_EQ((Diagnostic{"f.toml", 3, 0, "bad thing", ""}).format(), "f.toml:3: error: bad thing");
  EXPECT_EQ((Diagnostic{"f.toml", 0, 0, "bad thing", "x"}).format(),
            "f.toml: error: bad thing (fix: x)");
}

TEST(TopologyAddress, AcceptsIpv4HostNamesAndBracketedIpv6) {
  auto parse = [](std::string_view text) { return parseEndpoint(text); };
  auto v4 = parse("10.1.2.3:7100");
  ASSERT_TRUE(std::holds_alternative<Endpoint>(v4));
  EXPECT_EQ(std::get<Endpoint>(v4).host, "10.1.2.3");
  EXPECT_EQ(std::get<Endpoint>(v4).port, 7100);
  auto v6 = parse("[fe80::1]:65535");
  ASSERT_TRUE(std::holds_alternative<Endpoint>(v6));
  EXPECT_EQ(std::get<Endpoint>(v6).host, "fe80::1");
  EXPECT_EQ(std::get<Endpoint>(v6).port, 65535);
  EXPECT_TRUE(std::holds_alternative<Endpoint>(parse("localhost:1")));
  EXPECT_TRUE(std::holds_alternative<Endpoint>(parse("gpu-07.cluster.local:7100")));
  EXPECT_EQ(formatEndpoint("::1", 7), "[::1]:7");
  EXPECT_EQ(formatEndpoint("h", 7), "h:7");
}

TEST(TopologyAddress, RefusesMalformedAddresses) {
  for (std::string_view bad : {"", "host", "host:", ":80", "host:65536", "host:0", "host:-1",
                               "host:12345678", "[::1]", "[::1", "[zz::]:80", "bad_host:80",
                               "-lead:80", "a..b:80", "1.2.3:80", "[::1]x80", "a b:80"}) {
    auto parsed = parseEndpoint(bad);
    ASSERT_TRUE(std::holds_alternative<AddressProblem>(parsed)) << "accepted '" << bad << "'";
    EXPECT_FALSE(std::get<AddressProblem>(parsed).fix.empty()) << bad;
  }
}

TEST(TopologyAddress, PortMayHaveLeadingZeros) {
  auto parsed = parseEndpoint("127.0.0.1:007100");
  ASSERT_TRUE(std::holds_alternative<Endpoint>(parsed)) << std::get<AddressProblem>(parsed).message;
  EXPECT_EQ(std::get<Endpoint>(parsed).port, 7100);
  // Out of range however many digits it has, and never "not a number".
  for (std::string_view text : {"127.0.0.1:065536", "127.0.0.1:99999999999999999999999"}) {
    auto refused = parseEndpoint(text);
    ASSERT_TRUE(std::holds_alternative<AddressProblem>(refused)) << text;
    EXPECT_THAT(std::get<AddressProblem>(refused).message, HasSubstr("is out of range")) << text;
  }
  auto zero = parseEndpoint("127.0.0.1:0000");
  ASSERT_TRUE(std::holds_alternative<AddressProblem>(zero));
  EXPECT_THAT(std::get<AddressProblem>(zero).message, HasSubstr("port 0000 in address"));
}

TEST(TopologyAddress, BracketsAreForIpv6Only) {
  for (std::string_view text : {"[127.0.0.1]:7100", "[localhost]:7101"}) {
    auto parsed = parseEndpoint(text);
    ASSERT_TRUE(std::holds_alternative<AddressProblem>(parsed)) << "accepted " << text;
    EXPECT_THAT(std::get<AddressProblem>(parsed).message, HasSubstr("brackets are for IPv6"));
  }
  EXPECT_THAT(std::get<AddressProblem>(parseEndpoint("[127.0.0.1]:7100")).fix,
              HasSubstr("write it as 127.0.0.1:7100"));
  auto host = checkHost("[localhost]");
  ASSERT_TRUE(std::holds_alternative<AddressProblem>(host)) << "accepted [localhost]";
  ASSERT_TRUE(std::holds_alternative<std::string>(checkHost("[::1]")));
  EXPECT_EQ(std::get<std::string>(checkHost("[::1]")), "::1");
}

TEST(TopologyAddress, JunkAfterTheBracketIsNamed) {
  auto parsed = parseEndpoint("[::1]x:7100");
  ASSERT_TRUE(std::holds_alternative<AddressProblem>(parsed));
  EXPECT_THAT(std::get<AddressProblem>(parsed).message, HasSubstr("unexpected 'x:7100' after ']'"));
  EXPECT_THAT(std::get<AddressProblem>(parseEndpoint("[::1]")).message, HasSubstr("has no port"));
}

}  // namespace
}  // namespace chorus::topology
