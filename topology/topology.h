// The cluster description that every chorus node is started from (a TOML file; docs/topology.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace chorus::topology {

enum class Mode { kConsensus, kPs };

// "consensus" or "ps".
const char* modeName(Mode mode);

// One node of the cluster as the file describes it.
struct NodeSpec {
  uint32_t id = 0;
  std::string host;   // as written: an IPv4 address, "localhost" or an IPv6 literal
  uint16_t port = 0;
  std::vector<uint32_t> neighbors;  // sorted, unique, symmetric after validation
  // Optional per-node attributes for experiments (empty / unset when absent).
  std::string stragglers;          // a straggler profile string for this node only
  double weight = 1.0;             // relative weight (e.g. data share); > 0
  int line = 0;                    // line of the [[node]] table in the file, 0 when generated
};

struct Topology {
  std::string name;  // [cluster] name
  Mode mode = Mode::kConsensus;
  std::vector<NodeSpec> nodes;  // sorted by id
  std::string source;           // file path it was read from ("" when generated)

  // The node with this id, or nullptr.
  const NodeSpec* find(uint32_t id) const;
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

// Thrown when a topology file cannot be used; what() lists every diagnostic, one per line.
class TopologyError : public std::runtime_error {
 public:
  explicit TopologyError(std::vector<Diagnostic> diagnostics);
  const std::vector<Diagnostic>& diagnostics() const { return diagnostics_; }

 private:
  std::vector<Diagnostic> diagnostics_;
};

// Reads, parses and validates a topology file. Throws TopologyError naming the file, line and
// column of each problem; a missing or unreadable file is a TopologyError too.
Topology loadTopology(const std::filesystem::path& path);

// Parses and validates TOML text; `source_name` is used in diagnostics.
Topology parseTopology(std::string_view text, const std::string& source_name);

// All problems in the text (empty when it is valid); never throws for bad input.
std::vector<Diagnostic> checkTopology(std::string_view text, const std::string& source_name);

// Graph generators for `chorus topo gen`.
enum class GraphKind { kRing, kTorus, kComplete, kRegular, kExponential, kStar };
struct GenerateOptions {
  GraphKind kind = GraphKind::kRing;
  uint32_t nodes = 4;
  std::string host = "127.0.0.1";
  uint16_t base_port = 7100;  // node i listens on base_port + i
  uint32_t degree = 4;        // for kRegular
  uint64_t seed = 1;          // for kRegular
  std::string name;           // cluster name; derived from kind and size when empty
  Mode mode = Mode::kConsensus;
};
// Throws std::invalid_argument with a clear message for impossible parameters
// (e.g. a 3-regular graph on 5 nodes, a torus on a prime number of nodes).
Topology generate(const GenerateOptions& options);
std::optional<GraphKind> parseGraphKind(std::string_view name);

// Writes a topology as TOML that loadTopology() reads back to an equal Topology.
std::string toToml(const Topology& topology);

}  // namespace chorus::topology
