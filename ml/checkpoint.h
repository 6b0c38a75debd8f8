// Checkpoints: model parameters, optimizer state and progress in a versioned binary file with an
// XXH3-64 checksum, written atomically. The format is documented in docs/ml.md.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "node/result.h"

namespace chorus::ml {

// A checkpoint file is unreadable, corrupt, truncated or for another model.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a checkpoint holds.
struct Checkpoint {
  std::string modelSpec;              // ModelSpec::toString() of the model
  int64_t step = 0;                   // optimizer steps taken
  int64_t epoch = 0;                  // epochs completed
  uint64_t seed = 0;                  // the run's seed (for shuffling on resume)
  std::vector<float> params;          // the flat parameter buffer
  std::vector<float> optimizerState;  // the optimizer's velocity (empty without momentum)
};

// Current format version.
inline constexpr uint32_t kCheckpointVersion = 1;

// Largest step count loadCheckpoint() accepts: 2^53, beyond which a double (the learning-rate
// schedules' arithmetic) no longer counts every step.
inline constexpr int64_t kMaxCheckpointStep = int64_t{1} << 53;

// Writes `data` to `path` atomically: a temporary file in the same folder, fsync, rename, fsync
// of the folder. Readers see the old file or the new one, never a mix. Throws CheckpointError
// naming the path on failure. (Every checkpoint writer uses it: run/cluster_checkpoint.h too.)
void writeFileAtomically(const std::string& path, const std::string& data);

// The first `limit` bytes of the regular file at `path` (all of it when it is shorter), read
// with O_NONBLOCK (a FIFO without a writer must not block the open) and EINTR retried. What is
// not a regular file is refused before anything is read from it (/dev/zero would be read until
// memory ran out): kInvalidArgument "PATH: not a regular file", to which a caller adds what the
// file should have been. kIo "cannot open PATH: REASON" / "cannot read PATH: REASON" otherwise.
// (Every checkpoint reader uses it: run/cluster_checkpoint.h too.)
node::Result<std::string> readFileUpTo(const std::string& path,
                                       size_t limit = std::numeric_limits<size_t>::max());

// Writes `checkpoint` to `path` atomically: a temporary file in the same folder, fsync, rename,
// fsync of the folder. Readers see the old file or the new one, never a mix. Throws
// CheckpointError naming the path on failure.
void saveCheckpoint(const std::string& path, const Checkpoint& checkpoint);

// Reads and verifies a checkpoint: a regular file; magic, version, sizes and exact length
// before the body is read; checksum; then step in [0, kMaxCheckpointStep], epoch in [0, step]
// and 0 or one optimizer state value per parameter. Throws CheckpointError naming the path and
// what is wrong.
Checkpoint loadCheckpoint(const std::string& path);

// Throws CheckpointError unless `checkpoint` fits a model with this spec and parameter count.
void checkCompatible(const Checkpoint& checkpoint, const std::string& path,
                     const std::string& modelSpec, size_t paramCount);

}  // namespace chorus::ml
