// Line-by-line reading of text data files, plain or gzip-compressed (zlib's gzread reads both),
// for the sparse data readers (triples, ratings). Errors name the file and, where there is one,
// the line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

// zlib's file handle (gzFile is a pointer to it), declared so that <zlib.h> stays out of here.
struct gzFile_s;

namespace chorus::ml {
// Opens `path` for reading through zlib (plain or gzip) with a 128 KiB buffer. Throws DataError
// naming the file when it cannot. The caller gzclose()s the handle.
::gzFile_s* openCompressedFile(const std::string& path);
}  // namespace chorus::ml

namespace chorus::ml {

// Reads a text file one line at a time without holding it whole. A line ends at '\n'; a '\r'
// before it is dropped, so files written on Windows read alike. The last line needs no '\n'.
// Not copyable; one reader per file.
class TextLines {
 public:
  // Opens `path` (plain or gzip). Throws DataError naming the file when it cannot.
  explicit TextLines(std::string path);
  ~TextLines();
  TextLines(const TextLines&) = delete;
  TextLines& operator=(const TextLines&) = delete;

  // The next line without its end; false at the end of the file. The view is valid until the
  // next call. Throws DataError on a read error, a damaged or cut-short gzip stream, a NUL byte
  // (a binary file) or a line longer than 1 MiB.
  bool next(std::string_view& line);
  // The 1-based number of the line next() returned last (0 before the first).
  size_t lineNumber() const { return line_; }
  // The file's path, as given.
  const std::string& path() const { return path_; }
  // "path:line: " for messages about the current line.
  std::string where() const;

 private:
  bool fill();

  std::string path_;
  ::gzFile_s* file_ = nullptr;
  std::vector<char> buffer_;
  size_t begin_ = 0, end_ = 0;  // unread bytes of buffer_
  bool eof_ = false;
  std::string long_;  // a line that spans buffer refills
  size_t line_ = 0;
};

// Splits `line` at every `separator` (a character or a string such as "::") into `fields`.
void splitFields(std::string_view line, std::string_view separator,
                 std::vector<std::string_view>& fields);

// `text` without leading and trailing spaces and tabs.
std::string_view trimmed(std::string_view text);

// The path of `dir/name.gz` when that file exists, else `dir/name`.
std::string plainOrGz(const std::string& dir, const std::string& name);

}  // namespace chorus::ml
