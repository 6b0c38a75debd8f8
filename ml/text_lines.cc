#include "ml/text_lines.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "ml/dataset.h"

namespace chorus::ml {

namespace {
constexpr size_t kBufferBytes = size_t{1} << 18;
// Longer lines are not text data: a binary file, or a file without line ends.
constexpr size_t kMaxLine = size_t{1} << 20;
}  // namespace

TextLines::TextLines(std::string path) : path_(std::move(path)), buffer_(kBufferBytes) {
  std::error_code ec;
  if (std::filesystem::is_directory(path_, ec)) {
    throw DataError(fmt::format("{}: is a folder, not a file", path_));
  }
  file_ = openCompressedFile(path_);
}

::gzFile_s* openCompressedFile(const std::string& path) {
  errno = 0;
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    throw DataError(
        fmt::format("{}: cannot open: {}", path,
                    errno != 0 ? std::generic_category().message(errno) : "out of memory"));
  }
  gzbuffer(file, 1 << 17);
  return file;
}

TextLines::~TextLines() {
  if (file_ != nullptr) gzclose(file_);
}

std::string TextLines::where() const {
  return fmt::format("{}:{}: ", path_, line_);
}

bool TextLines::fill() {
  if (eof_) return false;
  const int got = gzread(file_, buffer_.data(), static_cast<unsigned>(buffer_.size()));
  int code = 0;
  if (got < 0) {
    const char* message = gzerror(file_, &code);
    throw DataError(fmt::format("{}: read error after line {}: {}", path_, line_, message));
  }
  if (got == 0) {
    // gzread returns 0 both at a clean end and when the compressed stream is cut short.
    const char* message = gzerror(file_, &code);
    if (code != Z_OK && code != Z_STREAM_END) {
      throw DataError(fmt::format("{}: corrupt or truncated gzip data after line {}: {}", path_,
                                  line_, message));
    }
    eof_ = true;
    return false;
  }
  begin_ = 0;
  end_ = static_cast<size_t>(got);
  if (std::memchr(buffer_.data(), '\0', end_) != nullptr) {
    throw DataError(
        fmt::format("{}: holds a NUL byte after line {}: not a text file", path_, line_));
  }
  return true;
}

bool TextLines::next(std::string_view& line) {
  long_.clear();
  bool spanning = false;
  for (;;) {
    if (begin_ == end_ && !fill()) {
      if (!spanning) return false;
      break;  // the last line has no '\n'
    }
    const char* start = buffer_.data() + begin_;
    const auto* newline = static_cast<const char*>(std::memchr(start, '\n', end_ - begin_));
    if (newline != nullptr) {
      const auto length = static_cast<size_t>(newline - start);
      begin_ += length + 1;
      if (!spanning) {
        line = std::string_view(start, length);
        ++line_;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        return true;
      }
      long_.append(start, length);
      break;
    }
    long_.append(start, end_ - begin_);
    begin_ = end_;
    spanning = true;
    if (long_.size() > kMaxLine) {
      throw DataError(fmt::format("{}:{}: line longer than {} bytes: not a text data file", path_,
                                  line_ + 1, kMaxLine));
    }
  }
  ++line_;
  line = long_;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return true;
}

void splitFields(std::string_view line, std::string_view separator,
                 std::vector<std::string_view>& fields) {
  fields.clear();
  size_t start = 0;
  for (;;) {
    const size_t at = line.find(separator, start);
    if (at == std::string_view::npos) {
      fields.push_back(line.substr(start));
      return;
    }
    fields.push_back(line.substr(start, at - start));
    start = at + separator.size();
  }
}

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t'))
    text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t'))
    text.remove_suffix(1);
  return text;
}

std::string plainOrGz(const std::string& dir, const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path gz = fs::path(dir) / (name + ".gz");
  if (fs::is_regular_file(gz, ec)) return gz.string();
  return (fs::path(dir) / name).string();
}

}  // namespace chorus::ml
