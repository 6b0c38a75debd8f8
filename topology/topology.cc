// Loading and validating topology files. Every problem in a file is collected (not just the
// first) so that one `chorus topo check` run shows the user everything to fix.
#include "topology/topology.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <system_error>

#include "faults/link_delay.h"
#include "faults/straggler.h"
#include "topology/address.h"
#include "topology/text_guard.h"

namespace chorus::topology {
namespace {

// Larger files are refused before reading: a real cluster file is a few hundred bytes per node.
constexpr std::uintmax_t kMaxFileBytes = 64u << 20;

struct Position {
  int line = 0;
  int column = 0;
};

Position positionOf(const toml::source_region& region) {
  return {static_cast<int>(region.begin.line), static_cast<int>(region.begin.column)};
}

size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> previous(b.size() + 1);
  std::vector<size_t> current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) {
    previous[j] = j;
  }
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t substitute = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitute});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string lowercase(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

std::string joinQuoted(const std::vector<std::string_view>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) {
      out += ", ";
    }
    out += fmt::format("'{}'", words[i]);
  }
  return out;
}

// "did you mean 'x'?" when a known key is close to `key`, else the list of known keys.
std::string unknownKeyFix(std::string_view key, const std::vector<std::string_view>& known) {
  std::string lowered = lowercase(key);
  std::string_view best;
  size_t best_distance = SIZE_MAX;
  for (std::string_view candidate : known) {
    size_t distance = editDistance(lowered, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  // Close, but not a rewrite of the whole (short) key: "x" is no typo of "id".
  if (best_distance <= std::max<size_t>(2, best.size() / 3) && best_distance < best.size()) {
    return fmt::format("did you mean '{}'?", best);
  }
  return fmt::format("remove it; the known keys here are {}", joinQuoted(known));
}

// "0-3, 7, 9-10": compact form of a sorted id list for messages about large clusters.
std::string formatIdSet(const std::vector<uint32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) {
      ++j;
    }
    if (!out.empty()) {
      out += ", ";
    }
    if (j == i) {
      out += std::to_string(ids[i]);
    } else {
      out += fmt::format("{}-{}", ids[i], ids[j]);
    }
    i = j + 1;
  }
  return "{" + out + "}";
}

const char* typeName(toml::node_type type) {
  switch (type) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
    case toml::node_type::time:
    case toml::node_type::date_time:
      return "a date/time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

// One [[node]] table as read, before the cross-node checks.
struct RawNode {
  Position table;
  std::optional<int64_t> id;
  Position id_position;
  std::optional<Endpoint> endpoint;
  Position address_position;
  bool has_neighbors = false;
  std::vector<std::pair<int64_t, Position>> neighbors;  // integer entries only
  faults::StragglerProfile stragglers;
  faults::LinkDelay link_delay;
  double weight = 1.0;
};

const std::vector<std::string_view> kTopLevelKeys = {"cluster", "node"};
const std::vector<std::string_view> kClusterKeys = {"name", "mode", "secret_file"};
const std::vector<std::string_view> kNodeKeys = {"id",         "address",    "neighbors",
                                                 "stragglers", "link_delay", "weight"};

class Validator {
 public:
  explicit Validator(std::string source_name) : source_(std::move(source_name)) {}

  std::optional<Topology> run(std::string_view text) {
    if (const auto problem = checkTopologyText(text)) {
      report({static_cast<int>(problem->line), static_cast<int>(problem->column)}, problem->message,
             problem->fix);
      return std::nullopt;
    }
    toml::table root;
    try {
      root = toml::parse(text, std::string_view{source_});
    } catch (const toml::parse_error& error) {
      Position where = positionOf(error.source());
      report(where, fmt::format("TOML syntax error: {}", error.description()),
             "correct the TOML syntax at this point (strings need double quotes, arrays are "
             "written [1, 2], each key = value on its own line)");
      return std::nullopt;
    }
    for (auto&& [key, value] : root) {
      if (std::find(kTopLevelKeys.begin(), kTopLevelKeys.end(), key.str()) == kTopLevelKeys.end()) {
        report(positionOf(key.source()), fmt::format("unknown top-level key '{}'", key.str()),
               unknownKeyFix(key.str(), kTopLevelKeys));
      }
    }
    readCluster(root);
    readNodes(root);
    if (!raw_nodes_.empty()) {
      checkNodes();
    }
    if (!diagnostics_.empty()) {
      return std::nullopt;
    }
    return build();
  }

  std::vector<Diagnostic> takeDiagnostics() {
    std::stable_sort(diagnostics_.begin(), diagnostics_.end(),
                     [](const Diagnostic& a, const Diagnostic& b) {
                       return std::tie(a.line, a.column) < std::tie(b.line, b.column);
                     });
    return std::move(diagnostics_);
  }

 private:
  void report(Position where, std::string message, std::string fix) {
    diagnostics_.push_back(
        Diagnostic{source_, where.line, where.column, std::move(message), std::move(fix)});
  }

  void wrongType(const toml::node& value, std::string_view what, std::string_view expected,
                 std::string fix) {
    report(positionOf(value.source()),
           fmt::format("{} must be {}, not {}", what, expected, typeName(value.type())),
           std::move(fix));
  }

  // A string attribute of a node that the fault-injection layer reads, read once here by its
  // grammar's reader, so that `topo check` and every command that loads the file refuse a value
  // that would only fail once a node starts. The value read; its default when absent, not a
  // string or bad (the last two reported).
  template <class T>
  T faultAttribute(const toml::table& table, std::string_view key,
                   chorus::node::Result<T> (*read)(std::string_view), std::string wrong_type_fix,
                   std::string bad_value_fix) {
    const toml::node* node = table.get(key);
    if (node == nullptr) return T{};
    const auto* text = node->as_string();
    if (text == nullptr) {
      wrongType(*node, key, "a string", std::move(wrong_type_fix));
      return T{};
    }
    chorus::node::Result<T> value = read(text->get());
    if (!value.ok()) {
      report(positionOf(node->source()), value.message(), std::move(bad_value_fix));
      return T{};
    }
    return std::move(value).value();
  }

  // A node reads only its own stragglers attribute: a slow or crash term there that names
  // another node would never act.
  void checkOwnStragglers(const toml::table& table, const RawNode& raw) {
    for (const uint32_t named : raw.stragglers.namedNodes()) {
      if (named == *raw.id) continue;
      report(positionOf(table.get("stragglers")->source()),
             fmt::format("stragglers \"{}\" of node {} names node {}, and a node's own "
                         "attribute acts on that node only",
                         raw.stragglers.text, *raw.id, named),
             fmt::format("name node {} in it, or put the term in node {}'s stragglers or in "
                         "--stragglers",
                         *raw.id, named));
      return;
    }
  }

  void readCluster(const toml::table& root) {
    const toml::node* cluster_node = root.get("cluster");
    if (cluster_node == nullptr) {
      report({}, "missing [cluster] table",
             "add a [cluster] table with name = \"...\" and mode = \"consensus\" or \"ps\"");
      return;
    }
    cluster_position_ = positionOf(cluster_node->source());
    const toml::table* cluster = cluster_node->as_table();
    if (cluster == nullptr) {
      wrongType(*cluster_node, "'cluster'", "a table",
                "write [cluster] on its own line followed by name = ... and mode = ...");
      return;
    }
    for (auto&& [key, value] : *cluster) {
      if (std::find(kClusterKeys.begin(), kClusterKeys.end(), key.str()) == kClusterKeys.end()) {
        report(positionOf(key.source()), fmt::format("unknown key '{}' in [cluster]", key.str()),
               unknownKeyFix(key.str(), kClusterKeys));
      }
    }
    if (const toml::node* name = cluster->get("name"); name == nullptr) {
      report(cluster_position_, "[cluster] has no 'name'",
             "add name = \"my-cluster\" to [cluster]; nodes refuse peers of another cluster");
    } else if (const auto* text = name->as_string(); text == nullptr) {
      wrongType(*name, "[cluster] name", "a string", "write name = \"my-cluster\"");
    } else if (text->get().empty()) {
      report(positionOf(name->source()), "[cluster] name is empty",
             "give the cluster a non-empty name, e.g. name = \"my-cluster\"");
    } else if (text->get().size() > kMaxClusterNameBytes) {
      report(positionOf(name->source()),
             fmt::format("[cluster] name is {} bytes long", text->get().size()),
             fmt::format("use at most {} bytes: the name travels in every handshake, whose "
                         "frames are kept small",
                         kMaxClusterNameBytes));
    } else {
      name_ = text->get();
    }
    if (const toml::node* mode = cluster->get("mode"); mode == nullptr) {
      report(cluster_position_, "[cluster] has no 'mode'",
             "add mode = \"consensus\" or mode = \"ps\" to [cluster]");
    } else if (const auto* text = mode->as_string(); text == nullptr) {
      wrongType(*mode, "[cluster] mode", "a string", "write mode = \"consensus\" or mode = \"ps\"");
    } else if (auto parsed = parseMode(text->get()); !parsed) {
      report(positionOf(mode->source()), fmt::format("unknown mode '{}'", text->get()),
             "write mode = \"consensus\" or mode = \"ps\"");
    } else {
      mode_ = *parsed;
    }
    if (const toml::node* secret = cluster->get("secret_file"); secret != nullptr) {
      if (const auto* text = secret->as_string(); text == nullptr) {
        wrongType(*secret, "[cluster] secret_file", "a string",
                  "write secret_file = \"lab.secret\" (a path, relative to this file's folder)");
      } else if (text->get().empty()) {
        report(positionOf(secret->source()), "[cluster] secret_file is empty",
               "name the file holding the cluster's secret, or remove the line");
      } else {
        secret_file_ = text->get();
      }
    }
  }

  void readNodes(const toml::table& root) {
    const toml::node* node_entry = root.get("node");
    if (node_entry == nullptr) {
      reportEmpty();
      return;
    }
    const toml::array* array = node_entry->as_array();
    if (array == nullptr) {
      wrongType(*node_entry, "'node'", "an array of tables",
                "write each node as its own [[node]] table (double brackets)");
      return;
    }
    if (array->empty()) {
      reportEmpty();
      return;
    }
    for (const toml::node& element : *array) {
      const toml::table* table = element.as_table();
      if (table == nullptr) {
        wrongType(element, "each 'node' entry", "a table",
                  "write each node as a [[node]] table with id, address and neighbors");
        continue;
      }
      raw_nodes_.push_back(readNode(*table));
    }
  }

  void reportEmpty() {
    report(cluster_position_, "the cluster has no nodes",
           "add a [[node]] table (id, address, neighbors) for every node, or generate a file "
           "with `chorus topo gen ring --nodes 4`");
  }

  RawNode readNode(const toml::table& table) {
    RawNode raw;
    raw.table = positionOf(table.source());
    for (auto&& [key, value] : table) {
      if (std::find(kNodeKeys.begin(), kNodeKeys.end(), key.str()) == kNodeKeys.end()) {
        report(positionOf(key.source()), fmt::format("unknown key '{}' in [[node]]", key.str()),
               unknownKeyFix(key.str(), kNodeKeys));
      }
    }
    if (const toml::node* id = table.get("id"); id == nullptr) {
      report(raw.table, "[[node]] has no 'id'",
             "add id = N; ids number the nodes 0..N-1 in any order");
    } else if (const auto* value = id->as_integer(); value == nullptr) {
      wrongType(*id, "node id", "an integer", "write id = 0 (no quotes)");
    } else {
      raw.id = value->get();
      raw.id_position = positionOf(id->source());
    }
    if (const toml::node* address = table.get("address"); address == nullptr) {
      report(raw.table, "[[node]] has no 'address'",
             "add address = \"host:port\", the address this node listens on, e.g. "
             "\"127.0.0.1:7100\"");
    } else if (const auto* text = address->as_string(); text == nullptr) {
      wrongType(*address, "node address", "a string", "write address = \"127.0.0.1:7100\"");
    } else {
      raw.address_position = positionOf(address->source());
      auto parsed = parseEndpoint(text->get());
      if (auto* problem = std::get_if<AddressProblem>(&parsed)) {
        report(raw.address_position, problem->message, problem->fix);
      } else {
        raw.endpoint = std::get<Endpoint>(parsed);
      }
    }
    if (const toml::node* neighbors = table.get("neighbors"); neighbors != nullptr) {
      raw.has_neighbors = true;
      if (const toml::array* list = neighbors->as_array(); list == nullptr) {
        wrongType(*neighbors, "neighbors", "an array of node ids", "write neighbors = [1, 2]");
      } else {
        for (const toml::node& entry : *list) {
          if (const auto* value = entry.as_integer(); value == nullptr) {
            wrongType(entry, "each neighbor", "an integer node id",
                      "write neighbors as a list of ids, e.g. neighbors = [1, 2]");
          } else {
            raw.neighbors.emplace_back(value->get(), positionOf(entry.source()));
          }
        }
      }
    }
    raw.stragglers = faultAttribute(
        table, "stragglers", &faults::StragglerProfile::read, "write stragglers = \"fixed:20\"",
        "write a profile as in docs/stragglers.md, e.g. stragglers = \"fixed:20\"");
    if (raw.id && !raw.stragglers.empty()) checkOwnStragglers(table, raw);
    raw.link_delay = faultAttribute(
        table, "link_delay", &faults::LinkDelay::read, "write link_delay = \"20\" or \"20,5\"",
        "write milliseconds as in docs/stragglers.md, e.g. link_delay = \"20,5\"");
    if (const toml::node* weight = table.get("weight"); weight != nullptr) {
      std::optional<double> value = weight->is_integer()
                                        ? std::optional<double>(weight->as_integer()->get())
                                        : weight->value_exact<double>();
      if (!value) {
        wrongType(*weight, "weight", "a number", "write weight = 1.0");
      } else if (!std::isfinite(*value) || *value <= 0) {
        report(positionOf(weight->source()), fmt::format("weight {} is not positive", *value),
               "use a finite weight > 0, e.g. weight = 1.0 (the default)");
      } else {
        raw.weight = *value;
      }
    }
    return raw;
  }

  // The nodes seen so far on one port, for the duplicate-address check.
  struct PortUsers {
    const RawNode* first = nullptr;                 // the first node on this port
    const RawNode* wildcard = nullptr;              // the first on 0.0.0.0 or [::]
    std::map<std::string, const RawNode*> by_host;  // ListeningHost::key -> its first node
  };

  // Reports `node` when an earlier node would bind the same socket: the same address however it
  // is written, or the same port where either host is a wildcard (0.0.0.0, [::]), which takes the
  // port on every local address. The first launched node would win and the other fail with
  // EADDRINUSE.
  void checkAddressClash(const RawNode& node, PortUsers& users) {
    const Endpoint& mine = *node.endpoint;
    const ListeningHost host = listeningHostOf(mine.host);
    const RawNode* clash = nullptr;
    if (auto it = users.by_host.find(host.key); it != users.by_host.end()) {
      clash = it->second;
    }
    bool through_wildcard = false;
    // The earliest clashing node: with a wildcard here that is the first node on the port.
    if (const RawNode* wide = host.wildcard ? users.first : users.wildcard;
        wide != nullptr && (clash == nullptr || wide->table.line < clash->table.line)) {
      clash = wide;
      through_wildcard = true;
    }
    if (users.first == nullptr) {
      users.first = &node;
    }
    if (host.wildcard && users.wildcard == nullptr) {
      users.wildcard = &node;
    }
    users.by_host.emplace(host.key, &node);
    if (clash == nullptr) {
      return;
    }
    const std::string written = formatEndpoint(mine.host, mine.port);
    const std::string other = formatEndpoint(clash->endpoint->host, clash->endpoint->port);
    if (!through_wildcard) {
      report(node.address_position,
             fmt::format("duplicate address {} (also used by the node at line {}{})", written,
                         clash->table.line,
                         other == written ? "" : fmt::format(", written {}", other)),
             "give every node its own host:port; on one machine use different ports");
      return;
    }
    std::string wildcard = host.wildcard ? mine.host : clash->endpoint->host;
    if (wildcard.find(':') != std::string::npos) {
      wildcard = "[" + wildcard + "]";
    }
    report(node.address_position,
           fmt::format("address {} clashes with {} of the node at line {} ({} takes port {} on "
                       "every local address)",
                       written, other, clash->table.line, wildcard, mine.port),
           "give these nodes different ports; a node on 0.0.0.0 or [::] is the only one on its "
           "port on that machine");
  }

  // The cross-node rules: id range and uniqueness, unique addresses, neighbor references,
  // symmetry and connectivity.
  void checkNodes() {
    const int64_t count = static_cast<int64_t>(raw_nodes_.size());
    const int64_t max_id = std::min<int64_t>(count, kMaxNodes) - 1;
    std::map<int64_t, const RawNode*> by_id;
    std::map<uint16_t, PortUsers> by_port;
    bool ids_usable = true;
    const bool too_many = count > static_cast<int64_t>(kMaxNodes);
    if (too_many) {
      report({},
             fmt::format("the file has {} nodes, more than the {} a cluster may have", count,
                         kMaxNodes),
             fmt::format("remove {} of them; the ids of a cluster are 0..{}", count - kMaxNodes,
                         max_id));
    }
    for (const RawNode& node : raw_nodes_) {
      if (!node.id) {
        ids_usable = false;
      } else if (*node.id < 0 || *node.id > max_id) {
        ids_usable = false;
        report(node.id_position, fmt::format("node id {} is out of range 0..{}", *node.id, max_id),
               too_many ? fmt::format("a cluster has at most {} nodes, numbered 0..{}", kMaxNodes,
                                      max_id)
                        : fmt::format("number the {} nodes 0..{} (a launcher's rank is a node id)",
                                      count, max_id));
      } else if (auto [it, inserted] = by_id.emplace(*node.id, &node); !inserted) {
        ids_usable = false;
        report(node.id_position,
               fmt::format("duplicate node id {} (also used by the node at line {})", *node.id,
                           it->second->table.line),
               fmt::format("give every node its own id in 0..{}", max_id));
      }
      if (node.endpoint) {
        checkAddressClash(node, by_port[node.endpoint->port]);
      }
    }

    const bool ps_without_edges =
        mode_ == Mode::kPs && std::none_of(raw_nodes_.begin(), raw_nodes_.end(),
                                           [](const RawNode& n) { return n.has_neighbors; });
    if (ps_without_edges) {
      checkImpliedCompleteGraph(count);
      return;  // every pair is linked; build() fills the complete graph
    }

    // Valid neighbor sets by node, for the symmetry and connectivity checks.
    std::map<int64_t, std::set<int64_t>> edges;
    for (const RawNode& node : raw_nodes_) {
      if (!node.has_neighbors) {
        report(node.table,
               node.id ? fmt::format("node {} has no 'neighbors'", *node.id)
                       : std::string("[[node]] has no 'neighbors'"),
               mode_ == Mode::kPs
                   ? "in ps mode give neighbors for every node or for none (none means "
                     "every node is linked to every other)"
                   : "add neighbors = [...]: consensus mode averages with these nodes");
        continue;
      }
      std::set<int64_t> mine;
      for (const auto& [neighbor, where] : node.neighbors) {
        if (node.id && neighbor == *node.id) {
          report(where, fmt::format("node {} lists itself as a neighbor", neighbor),
                 fmt::format("remove {} from its own neighbors", neighbor));
        } else if (neighbor < 0 || neighbor > max_id || (ids_usable && !by_id.count(neighbor))) {
          report(where, fmt::format("neighbor {} does not exist", neighbor),
                 fmt::format("use ids of nodes in this file (0..{})", max_id));
        } else if (!mine.insert(neighbor).second) {
          report(where, fmt::format("neighbor {} is listed twice", neighbor),
                 "list each neighbor once");
        }
      }
      if (node.id) {
        edges[*node.id] = std::move(mine);
      }
    }
    if (!ids_usable) {
      return;  // symmetry and connectivity need every node identified
    }

    for (const RawNode& node : raw_nodes_) {
      if (!node.has_neighbors) {
        continue;
      }
      for (const auto& [neighbor, where] : node.neighbors) {
        const RawNode* other = by_id.count(neighbor) ? by_id.at(neighbor) : nullptr;
        if (other == nullptr || !other->has_neighbors || neighbor == *node.id) {
          continue;
        }
        if (!edges[neighbor].count(*node.id)) {
          report(where,
                 fmt::format("asymmetric edge: node {} lists {} but node {} (line {}) does not "
                             "list {}",
                             *node.id, neighbor, neighbor, other->table.line, *node.id),
                 fmt::format("edges are symmetric: add {} to node {}'s neighbors, or remove {} "
                             "from node {}'s",
                             *node.id, neighbor, neighbor, *node.id));
        }
      }
    }
    checkConnected(edges, by_id);
  }

  // A ps file without neighbor lists means the complete graph, N x (N - 1) entries: 65536 nodes
  // would take tens of gigabytes, so it is held to the generators' cap before build() makes it.
  void checkImpliedCompleteGraph(int64_t count) {
    const auto nodes = static_cast<uint64_t>(count);
    if (nodes * (nodes - 1) <= kMaxNeighborEntries) {
      return;
    }
    uint64_t largest = 1;
    while ((largest + 1) * largest <= kMaxNeighborEntries) {
      ++largest;
    }
    report({},
           fmt::format("in ps mode without neighbor lists the {} nodes form the complete graph, "
                       "{} neighbor entries, more than the {} neighbor entries a topology may have",
                       nodes, nodes * (nodes - 1), kMaxNeighborEntries),
           fmt::format("give every node a neighbors list (any connected graph, e.g. `chorus topo "
                       "gen regular --mode ps`), or use at most {} nodes",
                       largest));
  }

  void checkConnected(const std::map<int64_t, std::set<int64_t>>& edges,
                      const std::map<int64_t, const RawNode*>& by_id) {
    // Union of both directions, so that one missing direction is reported once (as asymmetric).
    std::vector<std::vector<uint32_t>> adjacency(by_id.size());
    for (const auto& [from, targets] : edges) {
      for (int64_t to : targets) {
        if (from < 0 || !by_id.count(to)) {
          continue;
        }
        adjacency[from].push_back(static_cast<uint32_t>(to));
        adjacency[to].push_back(static_cast<uint32_t>(from));
      }
    }
    std::vector<std::vector<uint32_t>> components = componentsOf(adjacency);
    if (components.size() <= 1) {
      return;
    }
    std::string all;
    for (const auto& component : components) {
      if (!all.empty()) {
        all += " and ";
      }
      all += formatIdSet(component);
    }
    for (size_t i = 1; i < components.size(); ++i) {
      const RawNode* first = by_id.at(components[i].front());
      report(first->table,
             fmt::format("the graph is disconnected: nodes {} cannot reach node 0 ({} "
                         "components: {})",
                         formatIdSet(components[i]), components.size(), all),
             fmt::format("link node {} to a node of {} by listing each in the other's neighbors",
                         components[i].front(), formatIdSet(components[0])));
    }
  }

  Topology build() {
    Topology topology;
    topology.name = name_;
    topology.mode = mode_;
    topology.secret_file = secret_file_;
    topology.source = source_;
    const bool complete = std::none_of(raw_nodes_.begin(), raw_nodes_.end(),
                                       [](const RawNode& n) { return n.has_neighbors; });
    for (const RawNode& raw : raw_nodes_) {
      NodeSpec node;
      node.id = static_cast<uint32_t>(*raw.id);
      node.host = raw.endpoint->host;
      node.port = raw.endpoint->port;
      node.stragglers = raw.stragglers;
      node.link_delay = raw.link_delay;
      node.weight = raw.weight;
      node.line = raw.table.line;
      if (complete) {
        for (uint32_t other = 0; other < raw_nodes_.size(); ++other) {
          if (other != node.id) {
            node.neighbors.push_back(other);
          }
        }
      } else {
        for (const auto& entry : raw.neighbors) {
          node.neighbors.push_back(static_cast<uint32_t>(entry.first));
        }
        std::sort(node.neighbors.begin(), node.neighbors.end());
      }
      topology.nodes.push_back(std::move(node));
    }
    std::sort(topology.nodes.begin(), topology.nodes.end(),
              [](const NodeSpec& a, const NodeSpec& b) { return a.id < b.id; });
    return topology;
  }

 public:
  static std::vector<std::vector<uint32_t>> componentsOf(
      const std::vector<std::vector<uint32_t>>& adjacency) {
    std::vector<bool> seen(adjacency.size(), false);
    std::vector<std::vector<uint32_t>> components;
    for (uint32_t start = 0; start < adjacency.size(); ++start) {
      if (seen[start]) {
        continue;
      }
      std::vector<uint32_t> component;
      std::vector<uint32_t> stack = {start};
      seen[start] = true;
      while (!stack.empty()) {
        uint32_t current = stack.back();
        stack.pop_back();
        component.push_back(current);
        for (uint32_t next : adjacency[current]) {
          if (!seen[next]) {
            seen[next] = true;
            stack.push_back(next);
          }
        }
      }
      std::sort(component.begin(), component.end());
      components.push_back(std::move(component));
    }
    return components;
  }

 private:
  std::string source_;
  std::vector<Diagnostic> diagnostics_;
  Position cluster_position_;
  std::string name_;
  Mode mode_ = Mode::kConsensus;
  std::string secret_file_;
  std::vector<RawNode> raw_nodes_;
};

struct Analysis {
  std::optional<Topology> topology;
  std::vector<Diagnostic> diagnostics;
};

Analysis analyze(std::string_view text, const std::string& source_name) {
  Validator validator(source_name);
  Analysis analysis;
  analysis.topology = validator.run(text);
  analysis.diagnostics = validator.takeDiagnostics();
  return analysis;
}

// The file's text, or a diagnostic saying why it cannot be read.
std::variant<std::string, Diagnostic> readFile(const std::filesystem::path& path) {
  const std::string name = path.string();
  auto problem = [&](std::string message, std::string fix) {
    return Diagnostic{name, 0, 0, std::move(message), std::move(fix)};
  };
  std::error_code error;
  std::filesystem::file_status status = std::filesystem::status(path, error);
  if (!std::filesystem::exists(status)) {
    return problem("topology file does not exist",
                   "check the path, or create one with `chorus topo gen ring --nodes 4 -o FILE`");
  }
  if (std::filesystem::is_directory(status)) {
    return problem("is a directory, not a topology file", "name a .toml file");
  }
  std::uintmax_t size = std::filesystem::file_size(path, error);
  if (!error && size > kMaxFileBytes) {
    return problem(
        fmt::format("topology file is {} bytes, more than the {} allowed", size, kMaxFileBytes),
        "check that this is the right file");
  }
  errno = 0;
  std::ifstream stream(path, std::ios::binary);
  if (!stream) {
    int saved = errno;
    return problem(fmt::format("cannot open topology file: {}",
                               std::generic_category().message(saved != 0 ? saved : EIO)),
                   "check that the file is readable");
  }
  std::ostringstream contents;
  contents << stream.rdbuf();
  if (stream.bad()) {
    return problem("cannot read topology file", "check that the file is readable");
  }
  return std::move(contents).str();
}

}  // namespace

const char* modeName(Mode mode) {
  return mode == Mode::kPs ? "ps" : "consensus";
}

std::optional<Mode> parseMode(std::string_view name) {
  if (name == "consensus") {
    return Mode::kConsensus;
  }
  if (name == "ps") {
    return Mode::kPs;
  }
  return std::nullopt;
}

std::string NodeSpec::address() const {
  return formatEndpoint(host, port);
}

const NodeSpec* Topology::find(uint32_t id) const {
  auto it = std::lower_bound(nodes.begin(), nodes.end(), id,
                             [](const NodeSpec& node, uint32_t value) { return node.id < value; });
  return it != nodes.end() && it->id == id ? &*it : nullptr;
}

std::string Topology::secretPath() const {
  if (secret_file.empty()) return "";
  const std::filesystem::path path(secret_file);
  if (path.is_absolute() || source.empty()) return secret_file;
  return (std::filesystem::path(source).parent_path() / path).string();
}

std::string Diagnostic::format() const {
  std::string where = file;
  if (line > 0) {
    where += fmt::format(":{}", line);
    if (column > 0) {
      where += fmt::format(":{}", column);
    }
  }
  std::string text = fmt::format("{}: error: {}", where, message);
  if (!fix.empty()) {
    text += fmt::format(" (fix: {})", fix);
  }
  return text;
}

namespace {
std::string joinDiagnostics(const std::vector<Diagnostic>& diagnostics) {
  std::string text;
  for (const Diagnostic& diagnostic : diagnostics) {
    if (!text.empty()) {
      text += '\n';
    }
    text += diagnostic.format();
  }
  return text;
}

// Every diagnostic, one per line, as the error of a Result.
node::Status diagnosticsStatus(const std::vector<Diagnostic>& diagnostics) {
  return node::invalidInput(joinDiagnostics(diagnostics));
}
}  // namespace

std::vector<Diagnostic> checkTopology(std::string_view text, const std::string& source_name) {
  return analyze(text, source_name).diagnostics;
}

node::Result<Topology> parseTopology(std::string_view text, const std::string& source_name) {
  Analysis analysis = analyze(text, source_name);
  if (!analysis.topology) return diagnosticsStatus(analysis.diagnostics);
  return std::move(*analysis.topology);
}

node::Result<Topology> loadTopology(const std::filesystem::path& path) {
  auto contents = readFile(path);
  if (auto* problem = std::get_if<Diagnostic>(&contents)) return diagnosticsStatus({*problem});
  return parseTopology(std::get<std::string>(contents), path.string());
}

std::vector<Diagnostic> diagnoseTopologyFile(const std::filesystem::path& path) {
  auto contents = readFile(path);
  if (auto* problem = std::get_if<Diagnostic>(&contents)) return {*problem};
  return checkTopology(std::get<std::string>(contents), path.string());
}

size_t edgeCount(const Topology& topology) {
  size_t endpoints = 0;
  for (const NodeSpec& node : topology.nodes) {
    endpoints += node.neighbors.size();
  }
  return endpoints / 2;
}

std::vector<std::vector<uint32_t>> connectedComponents(const Topology& topology) {
  // Positions, not ids, index the adjacency so that any id set works.
  std::vector<std::vector<uint32_t>> adjacency(topology.nodes.size());
  std::map<uint32_t, uint32_t> position_of;
  for (uint32_t i = 0; i < topology.nodes.size(); ++i) {
    position_of[topology.nodes[i].id] = i;
  }
  for (uint32_t i = 0; i < topology.nodes.size(); ++i) {
    for (uint32_t neighbor : topology.nodes[i].neighbors) {
      auto it = position_of.find(neighbor);
      if (it == position_of.end()) {
        continue;
      }
      adjacency[i].push_back(it->second);
      adjacency[it->second].push_back(i);
    }
  }
  std::vector<std::vector<uint32_t>> components = Validator::componentsOf(adjacency);
  for (auto& component : components) {
    for (uint32_t& entry : component) {
      entry = topology.nodes[entry].id;
    }
    std::sort(component.begin(), component.end());
  }
  std::sort(components.begin(), components.end());
  return components;
}

std::string summarize(const Topology& topology) {
  size_t components = connectedComponents(topology).size();
  return fmt::format(
      "{} nodes, {} edges, mode {}, {}", topology.nodes.size(), edgeCount(topology),
      modeName(topology.mode),
      components <= 1 ? std::string("connected") : fmt::format("{} components", components));
}

FileCheck checkTopologyFile(const std::filesystem::path& path) {
  auto contents = readFile(path);
  if (auto* problem = std::get_if<Diagnostic>(&contents)) {
    return {false, problem->format()};
  }
  Analysis analysis = analyze(std::get<std::string>(contents), path.string());
  if (!analysis.topology) {
    return {false, joinDiagnostics(analysis.diagnostics)};
  }
  return {true, fmt::format("{}: ok ({})", path.string(), summarize(*analysis.topology))};
}

node::Status writeTopologyFile(const std::filesystem::path& path, std::string_view text,
                               bool overwrite) {
  // "x" (C11) makes creation exclusive, so a file appearing meanwhile is not clobbered either.
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), overwrite ? "w" : "wx"),
                                             &std::fclose);
  if (!file) {
    int saved = errno;
    if (saved == EEXIST) {
      return node::Status(node::ErrorCode::kIo,
                          fmt::format("{} already exists; pass --force to replace it or choose "
                                      "another -o",
                                      path.string()));
    }
    return node::Status(node::ErrorCode::kIo, fmt::format("cannot write {}: {}", path.string(),
                                                          std::generic_category().message(saved)));
  }
  if (std::fwrite(text.data(), 1, text.size(), file.get()) != text.size() ||
      std::fflush(file.get()) != 0) {
    int saved = errno;
    return node::Status(node::ErrorCode::kIo, fmt::format("cannot write {}: {}", path.string(),
                                                          std::generic_category().message(saved)));
  }
  return {};
}

}  // namespace chorus::topology
