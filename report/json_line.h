// A reader for one line of a metrics file: a JSON object whose values are numbers, strings,
// booleans, null, or nested arrays / objects (kept as raw text). Metrics files come from other
// processes and may be cut short or damaged, so every error is a value, never an assert.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::report {

// A line that is not a JSON object; the message says what is wrong and at which column.
class JsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One value of the object.
struct JsonValue {
  enum class Kind { kNull, kNumber, kString, kBool, kNested };
  Kind kind = Kind::kNull;
  double number = 0;  // kNumber; kBool as 0 / 1
  std::string text;   // kString: the unescaped string; kNested: the raw JSON text
};

// The fields of one JSON object, by key (a repeated key keeps its last value).
class JsonObject {
 public:
  // Parses `line` (surrounding whitespace allowed). Throws JsonError naming the column.
  static JsonObject parse(std::string_view line);
  // Whether `key` is present (with any value, null included).
  bool has(std::string_view key) const;
  // The number at `key`; nullopt when absent, null or not a number.
  std::optional<double> number(std::string_view key) const;
  // The string at `key`; nullopt when absent or not a string.
  std::optional<std::string> string(std::string_view key) const;
  // The raw value at `key`, or nullptr.
  const JsonValue* find(std::string_view key) const;
  // The items of the array at `key` (nested ones as raw text); nullopt when absent or not an
  // array.
  std::optional<std::vector<JsonValue>> array(std::string_view key) const;

 private:
  std::map<std::string, JsonValue, std::less<>> fields_;
};

}  // namespace chorus::report
