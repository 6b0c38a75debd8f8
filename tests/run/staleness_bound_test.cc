// The staleness bound's one grammar: flag, compare variant names and metrics read each other's
// spellings, and a bad value is refused once, naming the flag.
#include "run/staleness_bound.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace chorus::run {
namespace {

// The flag's spellings (0, bsp, N, inf, async) are tested with PS mode's alias, ps::Staleness
// (tests/ps/ssp_test.cc); here the variant names' and the refusals.
TEST(StalenessBound, VariantSpellingsParseAndBadOnesAreNamed) {
  EXPECT_EQ(StalenessBound::read("ssp:3").value().bound, 3);
  EXPECT_EQ(StalenessBound::read("ssp:0").value().bound, 0);
  for (const char* bad : {"", "-1", "x", "2x", "ssp:", "ssp:-1", "ssp:inf", "1e3", "infinite"}) {
    const node::Result<StalenessBound> read = StalenessBound::read(bad);
    ASSERT_FALSE(read.ok()) << "accepted '" << bad << "'";
    EXPECT_NE(read.message().find("bad staleness '" + std::string(bad) + "'"), std::string::npos)
        << read.message();
  }
}

// What the metrics and the variant names write, read() reads back to the same bound.
TEST(StalenessBound, ItsSpellingsRoundTrip) {
  for (const StalenessBound bound : {StalenessBound{0}, StalenessBound{1}, StalenessBound{7},
                                     StalenessBound{StalenessBound::kInfinite}}) {
    EXPECT_EQ(StalenessBound::read(bound.toString()).value(), bound) << bound.toString();
    EXPECT_EQ(StalenessBound::read(bound.variantName()).value(), bound) << bound.variantName();
  }
  EXPECT_EQ(StalenessBound{0}.variantName(), "bsp");
  EXPECT_EQ(StalenessBound{2}.variantName(), "ssp:2");
  EXPECT_EQ(StalenessBound{StalenessBound::kInfinite}.variantName(), "async");
  EXPECT_EQ(StalenessBound{StalenessBound::kInfinite}.toString(), "inf");
}

TEST(StalenessBound, RequiredMinStepIsTheReaderStepMinusTheBound) {
  EXPECT_EQ(StalenessBound{2}.requiredMinStep(10), 8);
  EXPECT_EQ(StalenessBound{0}.requiredMinStep(10), 10);
  EXPECT_EQ(StalenessBound{StalenessBound::kInfinite}.requiredMinStep(10),
            std::numeric_limits<int64_t>::min());
}

StalenessBound parseFlags(std::vector<std::string> args) {
  CLI::App app;
  StalenessBound bound = kDefaultStaleness;
  addStalenessOption(app, bound);
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last first
  app.parse(args);
  return bound;
}

TEST(StalenessBound, TheFlagParsesOnceAndNamesItselfWhenBad) {
  EXPECT_EQ(parseFlags({}), kDefaultStaleness);
  EXPECT_EQ(parseFlags({"--staleness", "async"}).bound, StalenessBound::kInfinite);
  EXPECT_EQ(parseFlags({"--staleness", "bsp"}).bound, 0);
  try {
    (void)parseFlags({"--staleness", "-2"});
    ADD_FAILURE() << "--staleness -2 was accepted";
  } catch (const CLI::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("--staleness"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad staleness '-2'"), std::string::npos) << e.what();
  }
}

// The old spelling still works for one release and says what to write instead.
TEST(StalenessBound, TheOldFlagIsAcceptedWithADeprecationLine) {
  ::testing::internal::CaptureStderr();
  const StalenessBound bound = parseFlags({"--staleness-bound", "5"});
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(bound.bound, 5);
  EXPECT_NE(err.find("--staleness-bound is deprecated"), std::string::npos) << err;
  EXPECT_NE(err.find("write --staleness 5"), std::string::npos) << err;
}

}  // namespace
}  // namespace chorus::run
