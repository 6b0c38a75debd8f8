// The CIFAR-10 binary batch reader (raw or gzip) on untrusted bytes. A DataError is the
// documented answer, and a batch that fails leaves the data set unchanged.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "ml/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::fuzz::MemFile file({data, size});
  chorus::ml::Dataset dataset;
  try {
    chorus::ml::readCifarBatch(file.path(), dataset);
  } catch (const chorus::ml::DataError&) {
    if (dataset.size() != 0) __builtin_trap();
  }
  return 0;
}
