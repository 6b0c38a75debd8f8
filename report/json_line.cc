#include "report/json_line.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

namespace chorus::report {
namespace {

// Nested arrays and objects deeper than this are refused: a metrics line has at most two
// levels, and the limit keeps a hostile file from exhausting the stack.
constexpr int kMaxDepth = 32;

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  void fail(const std::string& what) const {
    throw JsonError(fmt::format("column {}: {}", pos_ + 1, what));
  }

  void skipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_])))
      ++pos_;
  }

  bool atEnd() const { return pos_ >= text_.size(); }
  char peek() const { return atEnd() ? '\0' : text_[pos_]; }

  void expect(char c) {
    skipSpace();
    if (peek() != c) {
      fail(atEnd() ? fmt::format("expected '{}' but the line ends", c)
                   : fmt::format("expected '{}', found '{}'", c, peek()));
    }
    ++pos_;
  }

  static void appendUtf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out.push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (code >> 6)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (code >> 12)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (code >> 18)));
      out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }

  // The four hex digits of a \u escape, at pos_ (just after the 'u').
  unsigned parseHex4() {
    if (pos_ + 4 > text_.size()) fail("short \\u escape");
    unsigned code = 0;
    auto [end, ec] = std::from_chars(text_.data() + pos_, text_.data() + pos_ + 4, code, 16);
    if (ec != std::errc() || end != text_.data() + pos_ + 4) fail("bad \\u escape");
    pos_ += 4;
    return code;
  }

  std::string parseString() {
    expect('"');
    std::string out;
    while (true) {
      if (atEnd()) fail("unterminated string");
      char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character inside a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (atEnd()) fail("unterminated escape");
      char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          unsigned code = parseHex4();
          // A character beyond U+FFFF is escaped as a surrogate pair, high half then low half:
          // one character. A half without its partner becomes the replacement character.
          if (code >= 0xD800 && code <= 0xDBFF && text_.substr(pos_, 2) == "\\u") {
            const size_t low_at = pos_;
            pos_ += 2;
            const unsigned low = parseHex4();
            if (low >= 0xDC00 && low <= 0xDFFF) {
              code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
            } else {
              pos_ = low_at;  // not a low half: read on its own next
            }
          }
          appendUtf8(out, code >= 0xD800 && code <= 0xDFFF ? 0xFFFD : code);
          break;
        }
        default:
          fail(fmt::format("unknown escape '\\{}'", e));
      }
    }
  }

  double parseNumber() {
    size_t start = pos_;
    while (!atEnd() && (std::isdigit(static_cast<unsigned char>(peek())) || peek() == '-' ||
                        peek() == '+' || peek() == '.' || peek() == 'e' || peek() == 'E')) {
      ++pos_;
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    double value = 0;
    auto [end, ec] = std::from_chars(first, last, value);
    if (ec == std::errc::result_out_of_range && end == last) {
      // Out of range is either too large (an error) or too small for a double, like 1e-400:
      // valid JSON that reads as 0 (or the nearest subnormal). from_chars leaves `value` alone,
      // so strtod says which. The text is digits, sign, '.' and 'e' only, and chorus never
      // changes the C locale, so strtod reads it as from_chars does.
      const double nearest = std::strtod(std::string(first, last).c_str(), nullptr);
      if (std::isfinite(nearest)) {
        value = nearest;
        ec = std::errc();
      }
    }
    if (start == pos_ || ec != std::errc() || end != last || !std::isfinite(value)) {
      pos_ = start;
      fail("bad number");
    }
    return value;
  }

  bool consumeWord(std::string_view word) {
    if (text_.substr(pos_, word.size()) == word) {
      pos_ += word.size();
      return true;
    }
    return false;
  }

  // Skips one value of any kind; used for nested arrays and objects.
  void skipValue(int depth) {
    if (depth > kMaxDepth) fail("nested too deeply");
    skipSpace();
    char c = peek();
    if (c == '"') {
      parseString();
    } else if (c == '{' || c == '[') {
      char close = c == '{' ? '}' : ']';
      ++pos_;
      skipSpace();
      if (peek() == close) {
        ++pos_;
        return;
      }
      while (true) {
        if (c == '{') {
          skipSpace();
          parseString();
          expect(':');
        }
        skipValue(depth + 1);
        skipSpace();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect(close);
        return;
      }
    } else if (consumeWord("true") || consumeWord("false") || consumeWord("null")) {
      return;
    } else if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      parseNumber();
    } else {
      fail(atEnd() ? "a value is missing at the end of the line"
                   : fmt::format("unexpected '{}'", c));
    }
  }

  JsonValue parseValue() {
    skipSpace();
    JsonValue value;
    char c = peek();
    if (c == '"') {
      value.kind = JsonValue::Kind::kString;
      value.text = parseString();
    } else if (c == '{' || c == '[') {
      size_t start = pos_;
      skipValue(1);
      value.kind = JsonValue::Kind::kNested;
      value.text = std::string(text_.substr(start, pos_ - start));
    } else if (consumeWord("true")) {
      value.kind = JsonValue::Kind::kBool;
      value.number = 1;
    } else if (consumeWord("false")) {
      value.kind = JsonValue::Kind::kBool;
    } else if (consumeWord("null")) {
      value.kind = JsonValue::Kind::kNull;
    } else if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      value.kind = JsonValue::Kind::kNumber;
      value.number = parseNumber();
    } else {
      fail(atEnd() ? "a value is missing at the end of the line"
                   : fmt::format("unexpected '{}'", c));
    }
    return value;
  }

  size_t pos_ = 0;

 private:
  std::string_view text_;
};

}  // namespace

JsonObject JsonObject::parse(std::string_view line) {
  Parser parser(line);
  JsonObject object;
  parser.skipSpace();
  if (parser.atEnd()) throw JsonError("empty line");
  parser.expect('{');
  parser.skipSpace();
  if (parser.peek() == '}') {
    ++parser.pos_;
  } else {
    while (true) {
      parser.skipSpace();
      std::string key = parser.parseString();
      parser.expect(':');
      object.fields_[std::move(key)] = parser.parseValue();
      parser.skipSpace();
      if (parser.peek() == ',') {
        ++parser.pos_;
        continue;
      }
      parser.expect('}');
      break;
    }
  }
  parser.skipSpace();
  if (!parser.atEnd()) parser.fail("text after the end of the object");
  return object;
}

bool JsonObject::has(std::string_view key) const {
  return fields_.find(key) != fields_.end();
}

const JsonValue* JsonObject::find(std::string_view key) const {
  auto it = fields_.find(key);
  return it == fields_.end() ? nullptr : &it->second;
}

std::optional<double> JsonObject::number(std::string_view key) const {
  const JsonValue* v = find(key);
  if (v == nullptr || v->kind != JsonValue::Kind::kNumber) return std::nullopt;
  return v->number;
}

std::optional<std::vector<JsonValue>> JsonObject::array(std::string_view key) const {
  const JsonValue* v = find(key);
  if (v == nullptr || v->kind != JsonValue::Kind::kNested || !v->text.starts_with('[')) {
    return std::nullopt;
  }
  // The text was checked when the line was parsed, so this cannot fail on it.
  Parser parser(v->text);
  std::vector<JsonValue> items;
  parser.expect('[');
  parser.skipSpace();
  if (parser.peek() == ']') return items;
  while (true) {
    items.push_back(parser.parseValue());
    parser.skipSpace();
    if (parser.peek() != ',') break;
    ++parser.pos_;
  }
  parser.expect(']');
  return items;
}

std::optional<std::string> JsonObject::string(std::string_view key) const {
  const JsonValue* v = find(key);
  if (v == nullptr || v->kind != JsonValue::Kind::kString) return std::nullopt;
  return v->text;
}

}  // namespace chorus::report
