// Small knowledge graphs with a planted structure, for the sparse tests that must not need
// /work/shared or WN18RR: entities fall into groups, and relation r links an entity of group g
// to entities of group (g + r + 1) mod groups, so that a model can learn which tails fit.
#pragma once

#include <cstdint>
#include <string>

#include "ml/sparse_data.h"

namespace chorus::testsupport {

struct PlantedGraphOptions {
  size_t entities = 300;
  size_t relations = 4;
  size_t groups = 10;
  size_t train = 3000;
  size_t valid = 200;
  size_t test = 200;
  uint64_t seed = 5;
};

// The graph (entity names "e<i>", relation names "r<i>"); distinct triples in each split.
ml::KgData makePlantedGraph(const PlantedGraphOptions& options);

// Writes `graph` as DIR/train.txt, valid.txt and test.txt (head<TAB>relation<TAB>tail names, the
// format ml::readTriples reads), creating DIR.
void writeTripleFolder(const std::string& dir, const ml::KgData& graph);

}  // namespace chorus::testsupport
