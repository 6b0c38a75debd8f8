// The one-line metrics parser (report/json_line.h).
#include <gtest/gtest.h>

#include <string>

#include "report/json_line.h"

namespace chorus::report {
namespace {

TEST(JsonLine, ReadsScalarsAndKeepsNestedValuesRaw) {
  JsonObject o = JsonObject::parse(
      R"( {"event":"round","time":1.5e-3,"round":12,"ok":true,"none":null,"s":"a\"b\u00e9\n",)"
      R"("used_from":[1, 2,{"x":[]}],"neg":-2} )");
  EXPECT_EQ(o.string("event"), "round");
  EXPECT_DOUBLE_EQ(*o.number("time"), 1.5e-3);
  EXPECT_DOUBLE_EQ(*o.number("round"), 12);
  EXPECT_DOUBLE_EQ(*o.number("neg"), -2);
  EXPECT_EQ(o.string("s"), "a\"b\xc3\xa9\n");
  EXPECT_TRUE(o.has("none"));
  EXPECT_FALSE(o.number("none").has_value());
  EXPECT_FALSE(o.number("ok").has_value());
  EXPECT_EQ(o.find("ok")->kind, JsonValue::Kind::kBool);
  EXPECT_EQ(o.find("used_from")->text, R"([1, 2,{"x":[]}])");
  EXPECT_FALSE(o.has("missing"));
  EXPECT_TRUE(JsonObject::parse("{}").find("a") == nullptr);
}

// Valid JSON below the smallest double reads as 0; above the largest it stays an error.
TEST(JsonLine, NumbersTooSmallForADoubleReadAsZero) {
  JsonObject o = JsonObject::parse(R"({"a":1e-400,"b":-1e-400,"c":0.5e-320,"d":1e-310})");
  EXPECT_EQ(*o.number("a"), 0.0);
  EXPECT_EQ(*o.number("b"), 0.0);
  EXPECT_GE(*o.number("c"), 0.0);
  EXPECT_LT(*o.number("c"), 1e-320);
  EXPECT_DOUBLE_EQ(*o.number("d"), 1e-310);
  EXPECT_THROW(JsonObject::parse(R"({"a":1e400})"), JsonError);
  EXPECT_THROW(JsonObject::parse(R"({"a":-1e400})"), JsonError);
}

// A character beyond U+FFFF comes escaped as a surrogate pair: one 4-byte UTF-8 character. A
// half without its partner is the replacement character U+FFFD.
TEST(JsonLine, SurrogatePairsAreOneCharacter) {
  JsonObject o =
      JsonObject::parse(R"({"pair":"\ud83d\ude00","lone_high":"\ud83dx","lone_low":"\ude00",)"
                        R"("high_then_other":"\ud83d\u0041","reversed":"\ude00\ud83d"})");
  EXPECT_EQ(o.string("pair"), "\xF0\x9F\x98\x80");  // U+1F600
  EXPECT_EQ(o.string("lone_high"), "\xEF\xBF\xBDx");
  EXPECT_EQ(o.string("lone_low"), "\xEF\xBF\xBD");
  EXPECT_EQ(o.string("high_then_other"),
            "\xEF\xBF\xBD"
            "A");
  EXPECT_EQ(o.string("reversed"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_THROW(JsonObject::parse(R"({"a":"\ud83d\u00"})"), JsonError);
}

TEST(JsonLine, DamagedLinesAreErrorsNamingTheColumn) {
  for (const char* bad :
       {"", "{", R"({"a":1)", R"({"a":)", R"({"a":1}x)", R"({"a" 1})", R"({"a":"unterminated)",
        R"({"a":tru})", R"({"a":1e999})", "[1,2]", R"({"a":[1,2})", R"({"a":"\q"})"}) {
    EXPECT_THROW(JsonObject::parse(bad), JsonError) << bad;
  }
  try {
    JsonObject::parse(R"({"a":1}x)");
  } catch (const JsonError& e) {
    EXPECT_NE(std::string(e.what()).find("column 8"), std::string::npos) << e.what();
  }
  // Deep nesting is refused instead of recursing without bound.
  std::string deep = R"({"a":)" + std::string(10000, '[') + std::string(10000, ']') + "}";
  EXPECT_THROW(JsonObject::parse(deep), JsonError);
}

}  // namespace
}  // namespace chorus::report
