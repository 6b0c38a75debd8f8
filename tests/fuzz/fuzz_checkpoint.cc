// The checkpoint loader on untrusted bytes (a file a user points --resume at). A CheckpointError
// is the documented answer; a file that loads satisfies the loader's stated invariants.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "ml/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The loader insists on a regular file, so the input goes to tmpfs rather than a memfd.
  auto path = chorus::fuzz::scratchDir() / "model.ckpt";
  chorus::fuzz::writeFile(path, chorus::fuzz::asText(data, size));
  try {
    auto checkpoint = chorus::ml::loadCheckpoint(path.string());
    if (checkpoint.step < 0 || checkpoint.step > chorus::ml::kMaxCheckpointStep) __builtin_trap();
    if (checkpoint.epoch < 0 || checkpoint.epoch > checkpoint.step) __builtin_trap();
    if (!checkpoint.optimizerState.empty() &&
        checkpoint.optimizerState.size() != checkpoint.params.size())
      __builtin_trap();
  } catch (const chorus::ml::CheckpointError&) {
  }
  return 0;
}
