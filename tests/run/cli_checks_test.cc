// The number checks of command-line flags (run/cli_checks.h).
#include "run/cli_checks.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <string>

namespace chorus::run {
namespace {

// Parses `--value TEXT` with `check`; returns the error message, or "" when it was accepted.
std::string parseError(const CLI::Validator& check, const std::string& text) {
  CLI::App app;
  double value = 0;
  app.add_option("--value", value)->check(check);
  try {
    app.parse("--value " + text, false);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(CliChecks, NonNegativeTakesZeroUpToABillion) {
  for (const char* good : {"0", "0.5", "30", "1e9"})
    EXPECT_EQ(parseError(nonNegative(), good), "") << good;
  EXPECT_NE(parseError(nonNegative(), "-3").find("must be >= 0, not -3"), std::string::npos);
  EXPECT_NE(parseError(nonNegative(), "x").find("'x' is not a number"), std::string::npos);
  EXPECT_NE(parseError(nonNegative(), "nan"), "");
}

TEST(CliChecks, PositiveRefusesZero) {
  for (const char* good : {"0.001", "30", "1e9"})
    EXPECT_EQ(parseError(positive(), good), "") << good;
  EXPECT_NE(parseError(positive(), "0").find("must be > 0, not 0"), std::string::npos);
  EXPECT_NE(parseError(positive(), "nan"), "");
}

// Callers compute static_cast<int64_t>(seconds * 1000): inf or 1e300 made that undefined.
TEST(CliChecks, InfiniteAndHugeNumbersAreRefusedNamingTheFlag) {
  for (const CLI::Validator& check : {nonNegative(), positive()}) {
    for (const char* bad : {"inf", "1e300", "1000000001"}) {
      const std::string error = parseError(check, bad);
      EXPECT_NE(error.find("--value"), std::string::npos) << bad << ": " << error;
      EXPECT_NE(error.find(std::string("must be at most 1000000000, not ") + bad),
                std::string::npos)
          << bad << ": " << error;
    }
  }
}

}  // namespace
}  // namespace chorus::run
