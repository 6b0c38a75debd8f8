#include "tests/support/planted_graph.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <tuple>

#include "ml/rng.h"

namespace chorus::testsupport {

ml::KgData makePlantedGraph(const PlantedGraphOptions& o) {
  ml::KgData graph;
  graph.name = "planted";
  graph.source = "generated";
  for (size_t e = 0; e < o.entities; ++e)
    graph.entityNames.push_back("e" + std::to_string(e));
  for (size_t r = 0; r < o.relations; ++r)
    graph.relationNames.push_back("r" + std::to_string(r));
  ml::Rng rng(o.seed);
  std::set<std::tuple<uint32_t, uint32_t, uint32_t>> used;
  const size_t perGroup = o.entities / o.groups;
  auto fill = [&](std::vector<ml::Triple>& split, size_t count) {
    while (split.size() < count) {
      const auto head = static_cast<uint32_t>(rng.below(o.entities));
      const auto relation = static_cast<uint32_t>(rng.below(o.relations));
      const size_t group = ((head / perGroup) + relation + 1) % o.groups;
      const auto tail = static_cast<uint32_t>(group * perGroup + rng.below(perGroup));
      if (!used.insert({head, relation, tail}).second) continue;
      split.push_back({head, relation, tail});
    }
  };
  fill(graph.train, o.train);
  fill(graph.valid, o.valid);
  fill(graph.test, o.test);
  return graph;
}

void writeTripleFolder(const std::string& dir, const ml::KgData& graph) {
  std::filesystem::create_directories(dir);
  auto write = [&](const char* file, const std::vector<ml::Triple>& split) {
    std::ofstream out(std::filesystem::path(dir) / file);
    for (const ml::Triple& t : split) {
      out << graph.entityNames[t.head] << '\t' << graph.relationNames[t.relation] << '\t'
          << graph.entityNames[t.tail] << '\n';
    }
    if (!out) throw std::runtime_error(std::string("cannot write ") + dir + "/" + file);
  };
  write("train.txt", graph.train);
  write("valid.txt", graph.valid);
  write("test.txt", graph.test);
}

}  // namespace chorus::testsupport
