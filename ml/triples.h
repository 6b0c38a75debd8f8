// Reader of knowledge graphs in the usual triple format (train.txt, valid.txt, test.txt; one
// `head<TAB>relation<TAB>tail` per line; optional entities.dict / relations.dict).
// NOTE for the merge: this is the KGE branch's minimal stand-in; the sparse-mf branch owns
// ml/triples.{h,cc} and its version replaces this one.
#pragma once

#include <string>

#include "ml/sparse_data.h"

namespace chorus::ml {

// Reads the three splits of the graph in `dir`. Names are numbered by entities.dict and
// relations.dict (`index<TAB>name`) when present, else by first appearance (train, valid,
// test). Throws DataError naming the file and line on a missing file or a malformed line.
KgData readTriples(const std::string& dir);

}  // namespace chorus::ml
