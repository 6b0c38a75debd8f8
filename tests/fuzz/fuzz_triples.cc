// The knowledge-graph reader on untrusted files. The input holds up to five files separated by
// a line "~~~": train.txt, valid.txt, test.txt, entities.dict, relations.dict (a file that is
// empty in the input is left out, so both the dictionary and the first-appearance paths run).
// A DataError is the documented answer to a bad graph.
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "fuzz_support.h"
#include "ml/dataset.h"
#include "ml/triples.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  static const char* const kNames[] = {"train.txt", "valid.txt", "test.txt", "entities.dict",
                                       "relations.dict"};
  auto parts = chorus::fuzz::splitParts<5>(chorus::fuzz::asText(data, size), "\n~~~\n");
  const fs::path& dir = chorus::fuzz::scratchDir();
  for (size_t i = 0; i < parts.size(); ++i) {
    fs::remove(dir / kNames[i]);
    if (i < 3 || !parts[i].empty()) chorus::fuzz::writeFile(dir / kNames[i], parts[i]);
  }
  try {
    auto graph = chorus::ml::readTriples(dir.string());
    // Every id the reader hands out must index its tables.
    for (const auto* split : {&graph.train, &graph.valid, &graph.test}) {
      for (const auto& t : *split) {
        if (t.head >= graph.entities() || t.tail >= graph.entities() ||
            t.relation >= graph.relations())
          __builtin_trap();
      }
    }
  } catch (const chorus::ml::DataError&) {
  }
  return 0;
}
