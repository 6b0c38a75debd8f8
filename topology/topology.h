// The cluster description that every chorus node is started from (a TOML file; docs/topology.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "faults/link_delay.h"
#include "faults/straggler.h"
#include "node/result.h"

namespace chorus::topology {

// The training modes a topology file's [cluster] names (the default of `chorus node --mode`).
// topology/ sits below the mode registry (modes/, whose sessions are built from a Topology) and
// does not link it; the file's one rule that depends on the mode (in ps mode a file may leave
// out the neighbors: every node is linked to every other) is the file format's. The registry's
// test checks that these are exactly the training modes `--mode` takes, under the same names.
enum class Mode { kConsensus, kPs };
// Every Mode, in the order messages list them.
inline constexpr Mode kFileModes[] = {Mode::kConsensus, Mode::kPs};

// "consensus" or "ps".
const char* modeName(Mode mode);
// The mode named "consensus" or "ps"; nullopt for anything else.
std::optional<Mode> parseMode(std::string_view name);

// Node ids are 0..N-1 (a launcher's rank is a node id); no cluster has more than this many nodes.
inline constexpr uint32_t kMaxNodes = 65536;
// Longest cluster name: the runtime's limit (node::kMaxClusterNameBytes, which keeps handshake
// frames small); cli/ checks that the two agree.
inline constexpr size_t kMaxClusterNameBytes = 256;
// Neighbor-list entries (the sum of the lengths of all neighbor lists) a generator may write, and
// that a ps file without neighbor lists may imply (the complete graph, N x (N - 1)): beyond it a
// file or the graph in memory is hundreds of megabytes, a typo rather than a cluster.
inline constexpr uint64_t kMaxNeighborEntries = 4'000'000;

// One node of the cluster as the file describes it.
struct NodeSpec {
  uint32_t id = 0;
  std::string host;  // an IPv4 address, a host name ("localhost") or an IPv6 literal, no brackets
  uint16_t port = 0;
  // Sorted, unique, symmetric after validation. In ps mode, a file without any neighbors
  // lists loads as the complete graph (every other node), within kMaxNeighborEntries.
  std::vector<uint32_t> neighbors;
  // Optional per-node attributes for experiments (empty when absent), read once where the file
  // is loaded (their text as written in .text).
  faults::StragglerProfile stragglers;  // a straggler profile for this node only
  faults::LinkDelay link_delay;         // "MS[,JITTER_MS]": extra delay of every frame it sends
  double weight = 1.0;                  // > 0; reserved (e.g. a data share): nothing uses it yet
  int line = 0;                         // line of the [[node]] table in the file, 0 when generated

  // "host:port", with an IPv6 host in brackets ("[::1]:7100").
  std::string address() const;
};

struct Topology {
  std::string name;  // [cluster] name
  Mode mode = Mode::kConsensus;
  // [cluster] secret_file: the file holding the cluster's shared secret, as written (a relative
  // path is relative to the topology file's folder: secretPath()); "" when the cluster has none.
  std::string secret_file;
  std::vector<NodeSpec> nodes;  // sorted by id; ids are 0..N-1, so nodes[i].id == i
  std::string source;           // file path it was read from ("" when generated)

  // The node with this id, or nullptr.
  const NodeSpec* find(uint32_t id) const;
  // secret_file resolved against the folder of `source` ("" when there is none).
  std::string secretPath() const;
};

// One problem found in a topology file, with where it is and how to fix it.
struct Diagnostic {
  std::string file;
  int line = 0;    // 1-based; 0 when the problem is not tied to a line
  int column = 0;  // 1-based; 0 when unknown
  std::string message;
  std::string fix;  // a suggestion, may be empty
  // "file:line:col: error: message (fix: ...)".
  std::string format() const;
};

// Reads, parses and validates a topology file. A file that cannot be used is the Result's error
// (kInvalidArgument), whose message lists every diagnostic, one per line, each naming the file,
// line and column; a missing or unreadable file is one such diagnostic too.
node::Result<Topology> loadTopology(const std::filesystem::path& path);

// Parses and validates TOML text; `source_name` is used in diagnostics. Errors as loadTopology().
node::Result<Topology> parseTopology(std::string_view text, const std::string& source_name);

// The diagnostics loadTopology() lists for the file at `path` (empty when it is usable).
std::vector<Diagnostic> diagnoseTopologyFile(const std::filesystem::path& path);

// All problems in the text (empty when it is valid); never throws for bad input.
std::vector<Diagnostic> checkTopology(std::string_view text, const std::string& source_name);

// Graph generators for `chorus topo gen`.
enum class GraphKind { kRing, kTorus, kComplete, kRegular, kExponential, kStar };
struct GenerateOptions {
  GraphKind kind = GraphKind::kRing;
  uint32_t nodes = 4;
  // The machines, in order: node i runs on hosts[i % M] and listens on base_port + i / M (so
  // with one host, node i on base_port + i; with one host per node, every node on base_port).
  std::vector<std::string> hosts{"127.0.0.1"};
  uint16_t base_port = 7100;
  uint32_t degree = 4;  // for kRegular
  uint64_t seed = 1;    // for kRegular
  std::string name;     // cluster name; derived from kind and size when empty
  Mode mode = Mode::kConsensus;
};
// The topology, or an error (kInvalidArgument) with a clear message for impossible parameters
// (e.g. a 3-regular graph on 5 nodes, a torus on a prime number of nodes, a name with a control
// character or invalid UTF-8) and when no connected random regular graph turned up for the seed.
node::Result<Topology> generate(const GenerateOptions& options);
// The kind named "ring", "torus", "complete", "regular", "exponential" or "star"; else nullopt.
std::optional<GraphKind> parseGraphKind(std::string_view name);
// The name parseGraphKind() accepts for `kind`.
const char* graphKindName(GraphKind kind);
// The `chorus topo gen ...` command line that reproduces `options` (for file headers), with the
// host and name quoted for a POSIX shell. The error generate() gives for a name it refuses
// (control characters, invalid UTF-8), which could not stay on one comment line.
node::Result<std::string> generateCommandLine(const GenerateOptions& options);

// Writes a topology as TOML that loadTopology() reads back to an equivalent Topology.
std::string toToml(const Topology& topology);

// True when both describe the same cluster: name, mode and every node's fields except `line`
// (`source` is ignored too).
bool equivalent(const Topology& a, const Topology& b);

// Number of undirected neighbor edges (each symmetric pair counted once).
size_t edgeCount(const Topology& topology);

// The connected components of the neighbor graph, each sorted, ordered by smallest id.
std::vector<std::vector<uint32_t>> connectedComponents(const Topology& topology);

// "N nodes, E edges, mode M, connected": the summary `chorus topo check` prints.
std::string summarize(const Topology& topology);

// What `chorus topo check` reports for one file.
struct FileCheck {
  bool ok = false;
  std::string report;  // "FILE: ok (summary)" or the formatted diagnostics, one per line
};
// Reads and validates one file; never throws for bad or missing files.
FileCheck checkTopologyFile(const std::filesystem::path& path);

// Writes `text` to `path`. An error (kIo) naming the path when the file exists and `overwrite`
// is false, or when it cannot be written.
node::Status writeTopologyFile(const std::filesystem::path& path, std::string_view text,
                               bool overwrite);

}  // namespace chorus::topology
