// Sparse, skewed data sets: knowledge-graph triples (WN18RR and any graph in the usual triple
// format) and rating matrices (MovieLens-style files, or Zipf-skewed ratings generated from a
// planted low-rank model). These are the work whose parameters are embedding rows: each data
// point reads and writes a few rows of large tables.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace chorus::ml {

// One fact of a knowledge graph, as dense ids: entities and relations are numbered from 0.
struct Triple {
  uint32_t head = 0;
  uint32_t relation = 0;
  uint32_t tail = 0;
  friend bool operator==(const Triple&, const Triple&) = default;
};

// A knowledge graph split into train / valid / test. Ids index entityNames / relationNames.
struct KgData {
  std::string name;    // e.g. "wn18rr"
  std::string source;  // the folder it was read from
  std::vector<std::string> entityNames;
  std::vector<std::string> relationNames;
  std::vector<Triple> train, valid, test;

  // Number of entities (rows of the entity table).
  size_t entities() const { return entityNames.size(); }
  // Number of relations (rows of the relation table).
  size_t relations() const { return relationNames.size(); }
};

// One revealed cell of a rating matrix.
struct Rating {
  uint32_t row = 0;  // user
  uint32_t col = 0;  // item
  float value = 0.0f;
};

// A rating matrix split into a training and a held-out test set.
struct RatingsData {
  std::string name;    // "zipf-mf" or the file's name
  std::string source;  // the file, or "generated(seed=...)"
  uint64_t rows = 0;
  uint64_t cols = 0;
  std::vector<Rating> train, test;
  // Generated data: the sigma of the Gaussian noise added to the planted model, which is the
  // lowest test RMSE any model can expect. Read files: NaN (unknown).
  double noiseSigma = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace chorus::ml
