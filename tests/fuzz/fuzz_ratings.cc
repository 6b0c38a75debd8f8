// The rating-file reader (CSV with or without a header, the "::" form, raw or gzip) on untrusted
// bytes. A DataError is the documented answer to a bad file.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "ml/dataset.h"
#include "ml/ratings.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::fuzz::MemFile file({data, size});
  try {
    auto ratings = chorus::ml::readRatings(file.path(), 0.2, 7);
    for (const auto* part : {&ratings.train, &ratings.test}) {
      for (const auto& r : *part) {
        if (r.row >= ratings.rows || r.col >= ratings.cols) __builtin_trap();
      }
    }
  } catch (const chorus::ml::DataError&) {
  }
  return 0;
}
