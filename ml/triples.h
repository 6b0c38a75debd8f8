// Knowledge-graph triples in the usual format of link-prediction benchmarks (WN18RR, FB15k-237,
// Wikidata5M, or a user's own graph): a folder with train.txt, valid.txt and test.txt, one
// `head<TAB>relation<TAB>tail` per line, and optionally entities.dict and relations.dict
// (`index<TAB>name` per line). Every file may also be gzip-compressed (`train.txt.gz`, ...).
#pragma once

#include <string>

#include "ml/sparse_data.h"

namespace chorus::ml {

// Reads the graph in `dir`. With both dictionaries, ids are their indices and every entity and
// relation of every split must be in them; without them (both absent), ids are given in order of
// first appearance in train, then valid, then test. Blank lines are skipped. `name` is the
// folder's name, `source` the folder. Throws DataError naming the file and line: a line without
// exactly three tab-separated fields, an empty field, a name missing from a dictionary, a
// dictionary index that is repeated, not a number or leaves a gap, a repeated dictionary name,
// only one of the two dictionaries, an empty split, a damaged gzip stream, more than 2^32 - 1
// entities.
KgData readTriples(const std::string& dir);

// The folder of the knowledge graph `name` (wn18rr) by the data-set location rules of
// findDataDir(), then readTriples() on it.
KgData loadKnowledgeGraph(const std::string& name, const std::string& dataDir);

}  // namespace chorus::ml
