// Checks on a topology file's raw text, made before the TOML parser sees it. Debian's toml++ 3.3
// trips a debug assertion on a NUL byte in a table header and reaches __builtin_unreachable on a
// non-ASCII character (U+02A0) inside an array; a TOML file must be UTF-8 anyway. So these are
// refused here, with their line and column, and the parser only sees text it handles.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace chorus::topology {

// Offset of the first byte of `text` that starts no well-formed UTF-8 sequence (overlong forms,
// surrogates and code points past U+10FFFF included), or npos when it is all UTF-8.
size_t firstInvalidUtf8(std::string_view text);

// What is wrong with a file's text before parsing, and where (1-based; column in bytes).
struct TextProblem {
  size_t line = 1;
  size_t column = 1;
  std::string message;
  std::string fix;
};

// The first NUL byte, invalid UTF-8 sequence, or non-ASCII character outside a string or a
// comment; nullopt when there is none.
std::optional<TextProblem> checkTopologyText(std::string_view text);

}  // namespace chorus::topology
