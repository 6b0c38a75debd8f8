// Graph generators for `chorus topo gen` and the TOML writer.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <random>
#include <set>
#include <variant>

#include "node/result.h"
#include "topology/address.h"
#include "topology/text_guard.h"
#include "topology/topology.h"

namespace chorus::topology {
namespace {

// Random regular graphs: fresh attempts before giving up on a seed.
constexpr int kRegularAttempts = 1000;

using Adjacency = std::vector<std::set<uint32_t>>;

void link(Adjacency& graph, uint32_t a, uint32_t b) {
  if (a == b) {
    return;
  }
  graph[a].insert(b);
  graph[b].insert(a);
}

// Uniform in [0, bound) from the exactly specified mt19937_64 stream, so a seed gives the same
// graph with every standard library (std::uniform_int_distribution is implementation-defined).
uint64_t uniformBelow(std::mt19937_64& random, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    uint64_t draw = random();
    if (draw >= threshold) {
      return draw % bound;
    }
  }
}

bool isConnected(const Adjacency& graph) {
  if (graph.empty()) {
    return true;
  }
  std::vector<bool> seen(graph.size(), false);
  std::vector<uint32_t> stack = {0};
  seen[0] = true;
  size_t reached = 1;
  while (!stack.empty()) {
    uint32_t current = stack.back();
    stack.pop_back();
    for (uint32_t next : graph[current]) {
      if (!seen[next]) {
        seen[next] = true;
        ++reached;
        stack.push_back(next);
      }
    }
  }
  return reached == graph.size();
}

node::Result<Adjacency> ring(uint32_t n) {
  if (n < 3) {
    return node::invalidInput(
        fmt::format("a ring needs at least 3 nodes, not {} (for 2 nodes use complete)", n));
  }
  Adjacency graph(n);
  for (uint32_t i = 0; i < n; ++i) {
    link(graph, i, (i + 1) % n);
  }
  return graph;
}

// rows x cols with rows the largest divisor of n not above sqrt(n), rows >= 2.
node::Result<Adjacency> torus(uint32_t n) {
  uint32_t rows = 0;
  for (uint32_t candidate = 2; static_cast<uint64_t>(candidate) * candidate <= n; ++candidate) {
    if (n % candidate == 0) {
      rows = candidate;
    }
  }
  if (rows == 0) {
    return node::invalidInput(fmt::format(
        "a 2-D torus needs a node count that is rows x cols with both >= 2; {} is {}", n,
        n < 4 ? "too small (use at least 4)" : "prime (use ring, or a composite count)"));
  }
  const uint32_t cols = n / rows;
  Adjacency graph(n);
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t c = 0; c < cols; ++c) {
      uint32_t id = r * cols + c;
      link(graph, id, r * cols + (c + 1) % cols);
      link(graph, id, ((r + 1) % rows) * cols + c);
    }
  }
  return graph;
}

Adjacency complete(uint32_t n) {
  Adjacency graph(n);
  for (uint32_t a = 0; a < n; ++a) {
    for (uint32_t b = a + 1; b < n; ++b) {
      link(graph, a, b);
    }
  }
  return graph;
}

node::Result<Adjacency> exponential(uint32_t n) {
  if (n < 2) {
    return node::invalidInput("an exponential graph needs at least 2 nodes");
  }
  Adjacency graph(n);
  for (uint32_t i = 0; i < n; ++i) {
    for (uint64_t hop = 1; hop < n; hop *= 2) {
      link(graph, i, static_cast<uint32_t>((i + hop) % n));
      link(graph, i, static_cast<uint32_t>((i + n - hop) % n));
    }
  }
  return graph;
}

node::Result<Adjacency> star(uint32_t n) {
  if (n < 2) {
    return node::invalidInput("a star needs at least 2 nodes");
  }
  Adjacency graph(n);
  for (uint32_t i = 1; i < n; ++i) {
    link(graph, 0, i);
  }
  return graph;
}

// One attempt at a simple d-regular graph: pair up half-edges (d per node) at random, skipping
// pairs that would make a loop or a double edge. Returns false when it gets stuck.
bool pairHalfEdges(uint32_t n, uint32_t d, std::mt19937_64& random, Adjacency& graph) {
  graph.assign(n, {});
  std::vector<uint32_t> half_edges;
  half_edges.reserve(static_cast<size_t>(n) * d);
  for (uint32_t i = 0; i < n; ++i) {
    half_edges.insert(half_edges.end(), d, i);
  }
  auto usable = [&](size_t i, size_t j) {
    return half_edges[i] != half_edges[j] && !graph[half_edges[i]].count(half_edges[j]);
  };
  while (!half_edges.empty()) {
    size_t first = 0;
    size_t second = 0;
    bool found = false;
    for (int tries = 0; tries < 100 && !found; ++tries) {
      first = uniformBelow(random, half_edges.size());
      second = uniformBelow(random, half_edges.size());
      found = first != second && usable(first, second);
    }
    // Near the end few half-edges remain and random tries may miss the last usable pair.
    for (size_t i = 0; !found && half_edges.size() <= 64 && i < half_edges.size(); ++i) {
      for (size_t j = i + 1; !found && j < half_edges.size(); ++j) {
        if (usable(i, j)) {
          first = i;
          second = j;
          found = true;
        }
      }
    }
    if (!found) {
      return false;
    }
    link(graph, half_edges[first], half_edges[second]);
    // Remove the higher index first so that the lower one stays valid.
    for (size_t index : {std::max(first, second), std::min(first, second)}) {
      half_edges[index] = half_edges.back();
      half_edges.pop_back();
    }
  }
  return true;
}

node::Result<Adjacency> regular(uint32_t n, uint32_t d, uint64_t seed) {
  if (n < 2) {
    return node::invalidInput(fmt::format(
        "a random regular graph needs at least 2 nodes, not {} (for 1 node use complete)", n));
  }
  if (d == 0 || d >= n) {
    // Degree 1 joins 2 nodes; on more, a 1-regular graph is never connected (checked below).
    const uint32_t lowest = n == 2 ? 1 : 2;
    return node::invalidInput(fmt::format(
        "a {}-regular graph on {} nodes is impossible: the degree must be {}", d, n,
        lowest == n - 1 ? std::to_string(lowest) : fmt::format("{}..{}", lowest, n - 1)));
  }
  if ((static_cast<uint64_t>(n) * d) % 2 != 0) {
    return node::invalidInput(
        fmt::format("a {}-regular graph on {} nodes is impossible: nodes x degree ({}) must be "
                    "even; change --degree or --nodes",
                    d, n, static_cast<uint64_t>(n) * d));
  }
  if (d == 1 && n > 2) {
    return node::invalidInput(fmt::format(
        "a 1-regular graph on {} nodes is a set of separate pairs, never connected; use "
        "--degree 2 or more",
        n));
  }
  if (d == n - 1) {
    return complete(n);  // the only (n-1)-regular graph
  }
  std::mt19937_64 random(seed);
  Adjacency graph;
  if (d == 2) {
    // The connected 2-regular graphs are exactly the Hamiltonian cycles: shuffle and close.
    std::vector<uint32_t> order(n);
    for (uint32_t i = 0; i < n; ++i) {
      order[i] = i;
    }
    for (uint32_t i = n - 1; i > 0; --i) {
      std::swap(order[i], order[uniformBelow(random, i + 1)]);
    }
    graph.assign(n, {});
    for (uint32_t i = 0; i < n; ++i) {
      link(graph, order[i], order[(i + 1) % n]);
    }
    return graph;
  }
  for (int attempt = 0; attempt < kRegularAttempts; ++attempt) {
    if (pairHalfEdges(n, d, random, graph) && isConnected(graph)) {
      return graph;
    }
  }
  return node::invalidInput(
      fmt::format("found no connected simple {}-regular graph on {} nodes in {} attempts with "
                  "seed {}; try another --seed",
                  d, n, kRegularAttempts, seed));
}

uint64_t neighborEntries(const GenerateOptions& options) {
  uint64_t n = options.nodes;
  switch (options.kind) {
    case GraphKind::kComplete:
      return n * (n - 1);
    case GraphKind::kStar:
      return 2 * (n - 1);
    case GraphKind::kRegular:
      return n * std::min<uint64_t>(options.degree, n);
    case GraphKind::kExponential: {
      uint64_t hops = 0;
      for (uint64_t hop = 1; hop < n; hop *= 2) {
        ++hops;
      }
      return n * 2 * hops;
    }
    case GraphKind::kRing:
    case GraphKind::kTorus:
      return n * 4;
  }
  return n * n;
}

// TOML basic string with the escapes the spec requires.
std::string tomlString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          out += fmt::format("\\u{:04X}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// True when `text` is well-formed UTF-8, as a TOML file must be.
bool isUtf8(std::string_view text) {
  return firstInvalidUtf8(text) == std::string_view::npos;
}

// Why `name` cannot be a generated cluster's name (ok when it can). It is written
// into a TOML string and into the header comment, where a newline would end the comment and turn
// the rest of the name into TOML, and a TOML file must be UTF-8.
node::Status checkClusterName(std::string_view name) {
  for (size_t i = 0; i < name.size(); ++i) {
    const auto byte = static_cast<unsigned char>(name[i]);
    if (byte < 0x20 || byte == 0x7f) {
      return node::invalidInput(
          fmt::format("the cluster name has a control character (byte 0x{:02X} at offset {}); "
                      "use printable characters only",
                      byte, i));
    }
  }
  if (!isUtf8(name)) {
    return node::invalidInput(
        "the cluster name is not valid UTF-8 (a topology file is UTF-8 text)");
  }
  return {};
}

// `text` as one POSIX shell word: as is when no shell treats any of its characters specially,
// else in single quotes (a quote inside becomes '\'').
std::string shellWord(std::string_view text) {
  const bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string_view("@%+=:,./_-").find(c) != std::string_view::npos;
  });
  if (plain) {
    return std::string(text);
  }
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace

std::optional<GraphKind> parseGraphKind(std::string_view name) {
  for (GraphKind kind : {GraphKind::kRing, GraphKind::kTorus, GraphKind::kComplete,
                         GraphKind::kRegular, GraphKind::kExponential, GraphKind::kStar}) {
    if (name == graphKindName(kind)) {
      return kind;
    }
  }
  return std::nullopt;
}

const char* graphKindName(GraphKind kind) {
  switch (kind) {
    case GraphKind::kRing:
      return "ring";
    case GraphKind::kTorus:
      return "torus";
    case GraphKind::kComplete:
      return "complete";
    case GraphKind::kRegular:
      return "regular";
    case GraphKind::kExponential:
      return "exponential";
    case GraphKind::kStar:
      return "star";
  }
  return "ring";
}

node::Result<Topology> generate(const GenerateOptions& options) {
  const uint32_t n = options.nodes;
  if (n == 0) {
    return node::invalidInput("a topology needs at least 1 node");
  }
  if (n > kMaxNodes) {
    return node::invalidInput(
        fmt::format("{} nodes is more than the {} a cluster may have", n, kMaxNodes));
  }
  if (options.base_port == 0) {
    return node::invalidInput("the base port must be 1..65535 (0 would pick random ports)");
  }
  const uint32_t per_host = (n + std::max<uint32_t>(1, options.hosts.size()) - 1) /
                            std::max<uint32_t>(1, options.hosts.size());
  if (static_cast<uint32_t>(options.base_port) + per_host - 1 > 65535) {
    return node::invalidInput(
        fmt::format("ports {}..{} for {} nodes{} go past 65535; use a base port of at most {}",
                    options.base_port, static_cast<uint32_t>(options.base_port) + per_host - 1,
                    per_host, options.hosts.size() > 1 ? " per host" : "", 65536 - per_host));
  }
  if (neighborEntries(options) > kMaxNeighborEntries) {
    return node::invalidInput(
        fmt::format("a {} graph on {} nodes has more than {} neighbor entries; use fewer nodes "
                    "or a sparser kind",
                    graphKindName(options.kind), n, kMaxNeighborEntries));
  }
  if (options.hosts.empty()) return node::invalidInput("no host given");
  std::vector<std::string> hosts;
  for (const std::string& given : options.hosts) {
    auto host = checkHost(given);
    if (auto* problem = std::get_if<AddressProblem>(&host)) {
      return node::invalidInput(
          fmt::format("host '{}': {} ({})", given, problem->message, problem->fix));
    }
    hosts.push_back(std::get<std::string>(host));
  }
  const auto machines = static_cast<uint32_t>(hosts.size());
  if (node::Status name = checkClusterName(options.name); !name.ok()) return name;

  node::Result<Adjacency> built = node::invalidInput("unknown graph kind");
  switch (options.kind) {
    case GraphKind::kRing:
      built = ring(n);
      break;
    case GraphKind::kTorus:
      built = torus(n);
      break;
    case GraphKind::kComplete:
      built = complete(n);
      break;
    case GraphKind::kRegular:
      built = regular(n, options.degree, options.seed);
      break;
    case GraphKind::kExponential:
      built = exponential(n);
      break;
    case GraphKind::kStar:
      built = star(n);
      break;
  }
  if (!built.ok()) return built.status();
  const Adjacency& graph = *built;

  Topology topology;
  topology.name =
      options.name.empty() ? fmt::format("{}{}", graphKindName(options.kind), n) : options.name;
  topology.mode = options.mode;
  for (uint32_t i = 0; i < n; ++i) {
    NodeSpec node;
    node.id = i;
    node.host = hosts[i % machines];
    node.port = static_cast<uint16_t>(options.base_port + i / machines);
    node.neighbors.assign(graph[i].begin(), graph[i].end());
    topology.nodes.push_back(std::move(node));
  }
  return topology;
}

node::Result<std::string> generateCommandLine(const GenerateOptions& options) {
  // A newline would end the header comment it goes into.
  if (node::Status name = checkClusterName(options.name); !name.ok()) return name;
  std::string line =
      fmt::format("chorus topo gen {} --nodes {}", graphKindName(options.kind), options.nodes);
  if (options.kind == GraphKind::kRegular) {
    line += fmt::format(" --degree {} --seed {}", options.degree, options.seed);
  }
  line += fmt::format(" --base-port {} --host {}", options.base_port,
                      shellWord(fmt::format("{}", fmt::join(options.hosts, ","))));
  if (!options.name.empty()) {
    line += fmt::format(" --name {}", shellWord(options.name));
  }
  line += fmt::format(" --mode {}", modeName(options.mode));
  return line;
}

std::string toToml(const Topology& topology) {
  std::string out = fmt::format("[cluster]\nname = {}\nmode = {}\n", tomlString(topology.name),
                                tomlString(modeName(topology.mode)));
  if (!topology.secret_file.empty()) {
    out += fmt::format("secret_file = {}\n", tomlString(topology.secret_file));
  }
  for (const NodeSpec& node : topology.nodes) {
    out += fmt::format("\n[[node]]\nid = {}\naddress = {}\nneighbors = [{}]\n", node.id,
                       tomlString(node.address()), fmt::join(node.neighbors, ", "));
    if (!node.stragglers.text.empty()) {
      out += fmt::format("stragglers = {}\n", tomlString(node.stragglers.text));
    }
    if (!node.link_delay.text.empty()) {
      out += fmt::format("link_delay = {}\n", tomlString(node.link_delay.text));
    }
    if (node.weight != 1.0) {
      // Shortest text that reads back to the same double; TOML needs a '.' or exponent.
      std::string weight = fmt::format("{}", node.weight);
      if (weight.find_first_of(".eE") == std::string::npos) {
        weight += ".0";
      }
      out += fmt::format("weight = {}\n", weight);
    }
  }
  return out;
}

bool equivalent(const Topology& a, const Topology& b) {
  if (a.name != b.name || a.mode != b.mode || a.secret_file != b.secret_file ||
      a.nodes.size() != b.nodes.size()) {
    return false;
  }
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const NodeSpec& x = a.nodes[i];
    const NodeSpec& y = b.nodes[i];
    if (x.id != y.id || x.host != y.host || x.port != y.port || x.neighbors != y.neighbors ||
        x.stragglers.text != y.stragglers.text || x.link_delay.text != y.link_delay.text ||
        x.weight != y.weight) {
      return false;
    }
  }
  return true;
}

}  // namespace chorus::topology
