// What the libFuzzer targets share: the readers under test take file paths, so each input is
// written to a file in memory (memfd) or to a per-process folder on tmpfs, and only the errors a
// reader documents are accepted as its answer to bad bytes; any other exception escapes and
// libFuzzer reports it as a crash (an undocumented failure mode is a finding, too).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>

namespace chorus::fuzz {

// One input as a file that lives in memory; path() opens it like any file.
class MemFile {
 public:
  explicit MemFile(std::span<const uint8_t> bytes) : fd_(memfd_create("chorus-fuzz", 0)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
      if (n <= 0) {
        std::perror("write");
        std::abort();
      }
      done += static_cast<size_t>(n);
    }
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// A folder of this process's own on tmpfs, emptied for every input.
inline const std::filesystem::path& scratchDir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path base =
        std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    auto path = base / ("chorus-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
    return path;
  }();
  return dir;
}

inline void writeFile(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Splits a fuzz input into `parts` pieces at a separator line, so that one input can describe
// several files (the splits of a knowledge graph, the node files of a run folder).
template <size_t N>
std::array<std::string_view, N> splitParts(std::string_view input, std::string_view separator) {
  std::array<std::string_view, N> parts{};
  for (size_t i = 0; i + 1 < N; ++i) {
    size_t at = input.find(separator);
    if (at == std::string_view::npos) {
      parts[i] = input;
      return parts;
    }
    parts[i] = input.substr(0, at);
    input.remove_prefix(at + separator.size());
  }
  parts[N - 1] = input;
  return parts;
}

inline std::string_view asText(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace chorus::fuzz
