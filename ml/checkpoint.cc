#include "ml/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace chorus::ml {

namespace {

constexpr char kMagic[8] = {'C', 'H', 'R', 'S', 'C', 'K', 'P', 'T'};
constexpr size_t kMaxSpecLength = 4096;
// magic, version, spec length | params, state, step, epoch, seed
constexpr size_t kFixedHeader = 8 + 4 + 4;
constexpr size_t kCounts = 8 * 5;

template <typename T>
void put(std::string& out, T value) {
  static_assert(std::is_trivially_copyable_v<T>);
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only (see docs/ml.md)
  out.append(bytes, sizeof(T));
}

template <typename T>
T get(const std::string& in, size_t& offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof(T));
  offset += sizeof(T);
  return value;
}

std::string errnoText() {
  return std::generic_category().message(errno);
}

void writeAll(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("cannot write checkpoint {}: {}", path, errnoText()));
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void saveCheckpoint(const std::string& path, const Checkpoint& checkpoint) {
  if (checkpoint.modelSpec.size() > kMaxSpecLength) {
    throw CheckpointError("checkpoint model spec is too long");
  }
  std::string data;
  data.reserve(kFixedHeader + checkpoint.modelSpec.size() + kCounts +
               4 * (checkpoint.params.size() + checkpoint.optimizerState.size()) + 8);
  data.append(kMagic, sizeof kMagic);
  put<uint32_t>(data, kCheckpointVersion);
  put<uint32_t>(data, static_cast<uint32_t>(checkpoint.modelSpec.size()));
  data += checkpoint.modelSpec;
  put<uint64_t>(data, checkpoint.params.size());
  put<uint64_t>(data, checkpoint.optimizerState.size());
  put<int64_t>(data, checkpoint.step);
  put<int64_t>(data, checkpoint.epoch);
  put<uint64_t>(data, checkpoint.seed);
  data.append(reinterpret_cast<const char*>(checkpoint.params.data()),
              4 * checkpoint.params.size());
  data.append(reinterpret_cast<const char*>(checkpoint.optimizerState.data()),
              4 * checkpoint.optimizerState.size());
  put<uint64_t>(data, XXH3_64bits(data.data(), data.size()));

  const std::filesystem::path target(path);
  const std::string temp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw CheckpointError(fmt::format("cannot create checkpoint {}: {}", temp, errnoText()));
  }
  try {
    writeAll(fd, data, temp);
    if (::fsync(fd) != 0) {
      throw CheckpointError(fmt::format("cannot fsync checkpoint {}: {}", temp, errnoText()));
    }
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = errnoText();
    ::unlink(temp.c_str());
    throw CheckpointError(fmt::format("cannot rename {} to {}: {}", temp, path, reason));
  }
  // Make the rename itself durable.
  const std::string folder =
      target.parent_path().empty() ? std::string(".") : target.parent_path().string();
  const int dirFd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirFd >= 0) {
    ::fsync(dirFd);
    ::close(dirFd);
  }
}

Checkpoint loadCheckpoint(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw CheckpointError(fmt::format("cannot open checkpoint {}: {}", path, errnoText()));
  }
  std::string data;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string reason = errnoText();
      ::close(fd);
      throw CheckpointError(fmt::format("cannot read checkpoint {}: {}", path, reason));
    }
    if (n == 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);

  if (data.size() < sizeof kMagic || std::memcmp(data.data(), kMagic, sizeof kMagic) != 0) {
    throw CheckpointError(fmt::format("{}: not a chorus checkpoint (bad magic)", path));
  }
  if (data.size() < kFixedHeader) {
    throw CheckpointError(fmt::format("{}: truncated checkpoint ({} bytes)", path, data.size()));
  }
  size_t offset = sizeof kMagic;
  const auto version = get<uint32_t>(data, offset);
  if (version != kCheckpointVersion) {
    throw CheckpointError(
        fmt::format("{}: checkpoint format version {} is not supported (this "
                    "build reads version {})",
                    path, version, kCheckpointVersion));
  }
  const auto specLength = get<uint32_t>(data, offset);
  if (specLength > kMaxSpecLength) {
    throw CheckpointError(
        fmt::format("{}: corrupt checkpoint header (model spec length {})", path, specLength));
  }
  if (data.size() < kFixedHeader + specLength + kCounts) {
    throw CheckpointError(fmt::format("{}: truncated checkpoint ({} bytes)", path, data.size()));
  }
  Checkpoint checkpoint;
  checkpoint.modelSpec.assign(data.data() + offset, specLength);
  offset += specLength;
  const auto paramCount = get<uint64_t>(data, offset);
  const auto stateCount = get<uint64_t>(data, offset);
  checkpoint.step = get<int64_t>(data, offset);
  checkpoint.epoch = get<int64_t>(data, offset);
  checkpoint.seed = get<uint64_t>(data, offset);
  const uint64_t limit = uint64_t{1} << 40;
  if (paramCount > limit || stateCount > limit) {
    throw CheckpointError(
        fmt::format("{}: corrupt checkpoint header ({} parameters, {} state "
                    "values)",
                    path, paramCount, stateCount));
  }
  const uint64_t expected = offset + 4 * (paramCount + stateCount) + 8;
  if (data.size() != expected) {
    throw CheckpointError(fmt::format("{}: checkpoint is {} bytes but its header implies {} ({})",
                                      path, data.size(), expected,
                                      data.size() < expected ? "truncated" : "trailing garbage"));
  }
  size_t checksumAt = data.size() - 8;
  const auto stored = get<uint64_t>(data, checksumAt);
  const uint64_t actual = XXH3_64bits(data.data(), data.size() - 8);
  if (stored != actual) {
    throw CheckpointError(fmt::format(
        "{}: checkpoint checksum mismatch (stored {:016x}, computed {:016x}): the file is "
        "corrupt",
        path, stored, actual));
  }
  checkpoint.params.resize(paramCount);
  std::memcpy(checkpoint.params.data(), data.data() + offset, 4 * paramCount);
  offset += 4 * paramCount;
  checkpoint.optimizerState.resize(stateCount);
  std::memcpy(checkpoint.optimizerState.data(), data.data() + offset, 4 * stateCount);
  return checkpoint;
}

void checkCompatible(const Checkpoint& checkpoint, const std::string& path,
                     const std::string& modelSpec, size_t paramCount) {
  if (checkpoint.modelSpec != modelSpec) {
    throw CheckpointError(fmt::format("{}: checkpoint is for model '{}', this run builds '{}'",
                                      path, checkpoint.modelSpec, modelSpec));
  }
  if (checkpoint.params.size() != paramCount) {
    throw CheckpointError(fmt::format("{}: checkpoint has {} parameters, the model has {}", path,
                                      checkpoint.params.size(), paramCount));
  }
  if (!checkpoint.optimizerState.empty() && checkpoint.optimizerState.size() != paramCount) {
    throw CheckpointError(fmt::format("{}: checkpoint optimizer state has {} values, expected {}",
                                      path, checkpoint.optimizerState.size(), paramCount));
  }
}

}  // namespace chorus::ml
