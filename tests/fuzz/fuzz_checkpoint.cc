// The checkpoint loaders on untrusted bytes (a file or a cut folder a user points --resume at):
// chorus train's checkpoint (ml/checkpoint.h) and a node's part of a whole-cluster cut
// (run/cluster_checkpoint.h). Their errors are the documented answers; a file that loads
// satisfies the loader's stated invariants (and a node checkpoint decodes from its own encoding to
// itself).
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "ml/checkpoint.h"
#include "run/cluster_checkpoint.h"

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
  try {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    const auto node = chorus::run::decodeNodeCheckpoint(bytes, "fuzz.ckpt");
    if (node.header.cut <= 0 || node.header.node >= node.header.nodes) __builtin_trap();
    // Compared as bytes: a float array may hold NaN, which equals nothing.
    const std::string encoded = chorus::run::encodeNodeCheckpoint(node);
    const auto again = chorus::run::decodeNodeCheckpoint(encoded, "again.ckpt");
    if (!(again.header == node.header) || chorus::run::encodeNodeCheckpoint(again) != encoded)
      __builtin_trap();
  } catch (const chorus::run::NodeCheckpointError&) {
  }
  return 0;
}
