#include "ml/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
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

// Closes a file descriptor when it goes out of scope.
struct FileDescriptor {
  explicit FileDescriptor(int descriptor) : fd(descriptor) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { ::close(fd); }
  int fd;
};

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

void writeFileAtomically(const std::string& path, const std::string& data) {
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

  writeFileAtomically(path, data);
}

node::Result<std::string> readFileUpTo(const std::string& path, size_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return node::Status(node::ErrorCode::kIo, fmt::format("cannot open {}: {}", path, errnoText()));
  }
  const FileDescriptor file{fd};
  struct stat status {};
  if (::fstat(fd, &status) != 0) {
    return node::Status(node::ErrorCode::kIo, fmt::format("cannot stat {}: {}", path, errnoText()));
  }
  if (!S_ISREG(status.st_mode)) {
    return node::invalidInput(fmt::format("{}: not a regular file", path));
  }
  // The size the file has now bounds the buffer: a file that grows while being read is read as
  // it was (a checksum or a stated length then finds a file that changed).
  std::string data(std::min(static_cast<size_t>(status.st_size), limit), '\0');
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return node::Status(node::ErrorCode::kIo,
                          fmt::format("cannot read {}: {}", path, errnoText()));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  data.resize(done);
  return data;
}

Checkpoint loadCheckpoint(const std::string& path) {
  node::Result<std::string> read = readFileUpTo(path);
  if (!read.ok()) {
    throw CheckpointError(read.status().code() == node::ErrorCode::kInvalidArgument
                              ? read.message() + " (a checkpoint is a file written by --save)"
                              : read.message());
  }
  std::string data = std::move(read).value();
  const uint64_t fileSize = data.size();

  // The fixed header first, then the spec and the counts it announces; the body only once the
  // file's size is what they imply.
  if (fileSize < sizeof kMagic || std::memcmp(data.data(), kMagic, sizeof kMagic) != 0) {
    throw CheckpointError(fmt::format("{}: not a chorus checkpoint (bad magic)", path));
  }
  if (fileSize < kFixedHeader) {
    throw CheckpointError(fmt::format("{}: truncated checkpoint ({} bytes)", path, fileSize));
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
  if (fileSize < kFixedHeader + specLength + kCounts) {
    throw CheckpointError(fmt::format("{}: truncated checkpoint ({} bytes)", path, fileSize));
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
  if (fileSize != expected) {
    throw CheckpointError(fmt::format("{}: checkpoint is {} bytes but its header implies {} ({})",
                                      path, fileSize, expected,
                                      fileSize < expected ? "truncated" : "trailing garbage"));
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
  // The checksum says the file is as written, not that a run wrote it: meaning checks follow.
  if (checkpoint.step < 0 || checkpoint.step > kMaxCheckpointStep) {
    throw CheckpointError(fmt::format("{}: checkpoint holds step {} (a run writes 0 to 2^53)", path,
                                      checkpoint.step));
  }
  if (checkpoint.epoch < 0 || checkpoint.epoch > checkpoint.step) {
    throw CheckpointError(
        fmt::format("{}: checkpoint holds epoch {} at step {} (a run writes 0 to the step, as "
                    "every epoch takes at least one step)",
                    path, checkpoint.epoch, checkpoint.step));
  }
  if (stateCount != 0 && stateCount != paramCount) {
    throw CheckpointError(
        fmt::format("{}: checkpoint holds {} optimizer state values for {} parameters (a run "
                    "writes 0 or one per parameter)",
                    path, stateCount, paramCount));
  }
  // memcpy into an empty vector's data() (null) is undefined even for zero bytes.
  checkpoint.params.resize(paramCount);
  if (paramCount > 0) {
    std::memcpy(checkpoint.params.data(), data.data() + offset, 4 * paramCount);
  }
  offset += 4 * paramCount;
  checkpoint.optimizerState.resize(stateCount);
  if (stateCount > 0) {
    std::memcpy(checkpoint.optimizerState.data(), data.data() + offset, 4 * stateCount);
  }
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
