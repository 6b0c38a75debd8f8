#include "topology/text_guard.h"

#include <fmt/format.h>

#include <cstdint>

namespace chorus::topology {

size_t firstInvalidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length = 0;
    uint32_t code = 0;
    uint32_t smallest = 0;
    if ((lead & 0xE0) == 0xC0) {
      length = 2;
      code = lead & 0x1F;
      smallest = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3;
      code = lead & 0x0F;
      smallest = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4;
      code = lead & 0x07;
      smallest = 0x10000;
    } else {
      return i;
    }
    if (length > text.size() - i) return i;
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return i;
      code = (code << 6) | (next & 0x3F);
    }
    if (code < smallest || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return i;
    i += length;
  }
  return std::string_view::npos;
}

namespace {

TextProblem problemAt(std::string_view text, size_t offset, std::string message, std::string fix) {
  TextProblem problem{1, 1, std::move(message), std::move(fix)};
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++problem.line;
      problem.column = 1;
    } else {
      ++problem.column;
    }
  }
  return problem;
}

}  // namespace

std::optional<TextProblem> checkTopologyText(std::string_view text) {
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return problemAt(text, nul, "a NUL byte",
                     "a topology file is text: remove the NUL (is this the right file?)");
  }
  if (const size_t bad = firstInvalidUtf8(text); bad != std::string_view::npos) {
    return problemAt(
        text, bad, fmt::format("byte 0x{:02X} is not UTF-8", static_cast<unsigned char>(text[bad])),
        "save the file as UTF-8 (TOML files must be UTF-8)");
  }
  // Outside strings and comments TOML is ASCII: keys, numbers, brackets, booleans.
  enum class In { kCode, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral };
  In in = In::kCode;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const std::string_view rest = text.substr(i);
    switch (in) {
      case In::kCode:
        if (c == '#') {
          in = In::kComment;
        } else if (rest.starts_with("\"\"\"")) {
          in = In::kMultiBasic;
          i += 2;
        } else if (c == '"') {
          in = In::kBasic;
        } else if (rest.starts_with("'''")) {
          in = In::kMultiLiteral;
          i += 2;
        } else if (c == '\'') {
          in = In::kLiteral;
        } else if (static_cast<unsigned char>(c) >= 0x80) {
          return problemAt(text, i, "a non-ASCII character outside a string or comment",
                           "put it inside quotes (\"...\") or remove it");
        }
        break;
      case In::kComment:
        if (c == '\n') in = In::kCode;
        break;
      case In::kBasic:
        if (c == '\\') {
          ++i;  // the escaped character, whatever it is
        } else if (c == '"' || c == '\n') {
          in = In::kCode;
        }
        break;
      case In::kLiteral:
        if (c == '\'' || c == '\n') in = In::kCode;
        break;
      case In::kMultiBasic:
        if (c == '\\') {
          ++i;
        } else if (rest.starts_with("\"\"\"")) {
          in = In::kCode;
          i += 2;
        }
        break;
      case In::kMultiLiteral:
        if (rest.starts_with("'''")) {
          in = In::kCode;
          i += 2;
        }
        break;
    }
  }
  return std::nullopt;
}

}  // namespace chorus::topology
