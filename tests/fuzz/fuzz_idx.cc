// The IDX reader (MNIST, Fashion-MNIST; raw or gzip) on untrusted bytes: the first byte picks
// images or labels. A DataError is the documented answer to a bad file.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "ml/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool labels = (data[0] & 1) != 0;
  chorus::fuzz::MemFile file({data + 1, size - 1});
  try {
    if (labels) {
      (void)chorus::ml::readIdxLabels(file.path(), 10);
    } else {
      (void)chorus::ml::readIdxImages(file.path());
    }
  } catch (const chorus::ml::DataError&) {
  }
  return 0;
}
