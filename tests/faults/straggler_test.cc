#include "faults/straggler.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "faults/crash.h"

namespace chorus::faults {
namespace {

// StragglerProfile::read(text) refuses it, and its message holds `expect` and `also`.
void expectRefused(const std::string& text, const std::string& expect, const std::string& also) {
  const node::Result<StragglerProfile> read = StragglerProfile::read(text);
  if (read.ok()) {
    ADD_FAILURE() << "accepted: " << text;
    return;
  }
  const std::string& what = read.message();
  EXPECT_NE(what.find(expect), std::string::npos) << text << " -> " << what;
  EXPECT_NE(what.find(also), std::string::npos) << what;
}

// The profile of good `text` (a test's own).
StragglerProfile parsed(std::string_view text) {
  node::Result<StragglerProfile> read = StragglerProfile::read(text);
  EXPECT_TRUE(read.ok()) << text << ": " << read.message();
  return read.ok() ? std::move(read).value() : StragglerProfile{};
}

using std::chrono::milliseconds;
using std::chrono::nanoseconds;

double ms(nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

TEST(StragglerProfile, EmptyAndNoneInjectNothing) {
  for (const char* text : {"", "none", "  none "}) {
    auto p = parsed(text);
    EXPECT_TRUE(p.empty()) << text;
    StragglerInjector inj(p, 0, 1);
    EXPECT_TRUE(inj.inert());
    EXPECT_EQ(inj.nextDelay(milliseconds(10)).count(), 0);
  }
}

TEST(StragglerProfile, ParsesEveryKind) {
  auto p = parsed("shifted-exp:5,10 + slow:3=4,5=2.5 + fixed:1 + transient:0.1,20,3");
  ASSERT_EQ(p.terms.size(), 4u);
  EXPECT_EQ(p.terms[0].kind, StragglerTerm::Kind::kShiftedExp);
  EXPECT_DOUBLE_EQ(p.terms[0].a, 5);
  EXPECT_DOUBLE_EQ(p.terms[0].b, 10);
  EXPECT_EQ(p.terms[1].kind, StragglerTerm::Kind::kSlow);
  EXPECT_DOUBLE_EQ(p.terms[1].factors.at(3), 4);
  EXPECT_DOUBLE_EQ(p.terms[1].factors.at(5), 2.5);
  EXPECT_EQ(p.terms[2].kind, StragglerTerm::Kind::kFixed);
  EXPECT_EQ(p.terms[3].kind, StragglerTerm::Kind::kTransient);
  EXPECT_DOUBLE_EQ(p.terms[3].b, 20);
}

TEST(StragglerProfile, BadTermsAreNamed) {
  struct Case {
    const char* text;
    const char* expect;
  };
  for (const Case& c : {
           Case{"fast:3", "unknown kind 'fast'"},
           Case{"fixed", "missing ':'"},
           Case{"fixed:abc", "MS 'abc' is not a number"},
           Case{"fixed:-1", "MS must be >= 0"},
           Case{"shifted-exp:5", "expected 2 number(s)"},
           Case{"slow:3", "'3' is not NODE=FACTOR"},
           Case{"slow:x=2", "node id 'x'"},
           Case{"slow:3=0.5", "must be >= 1"},
           Case{"slow:3=2,3=4", "node 3 is listed twice"},
           Case{"transient:1.5,3,2", "PROB must be within [0, 1]"},
           Case{"transient:0.5,2.5,2", "STEPS must be a whole number"},
           Case{"fixed:1++fixed:2", "empty term"},
       }) {
    expectRefused(c.text, c.expect, "accepted terms");
  }
}

// Values past these limits overflowed the int64 nanoseconds a delay becomes: fixed:1e13 and
// slow:0=1e300 gave negative or zero delays.
TEST(StragglerProfile, HugeValuesAreRefusedNamingTheLimit) {
  struct Case {
    const char* text;
    const char* expect;
  };
  for (const Case& c : {
           Case{"fixed:1e13", "MS must be >= 0 and at most 1000000000"},
           Case{"shifted-exp:1e10,1", "BASE_MS and MEAN_MS must be >= 0 and at most"},
           Case{"shifted-exp:1,1e300", "BASE_MS and MEAN_MS must be >= 0 and at most"},
           Case{"slow:0=1e300",
                "FACTOR 1e+300 must be >= 1 (1 = normal speed) and at most 1000000"},
           Case{"transient:1,1e300,2", "STEPS must be a whole number >= 1 and at most"},
           Case{"transient:1,3,1e7", "FACTOR must be >= 1 and at most 1000000"},
       }) {
    expectRefused(c.text, c.expect, "");
  }
  EXPECT_TRUE(StragglerProfile::read("fixed:1e9+shifted-exp:1e9,1e9+slow:0=1e6").ok());
  EXPECT_TRUE(StragglerProfile::read("transient:1,1e12,1e6").ok());
}

// Terms at their limits still multiply past int64 nanoseconds: the delay is capped, never
// negative, and the total saturates.
TEST(StragglerInjector, TheLargestDelaysStayPositive) {
  StragglerInjector inj(parsed("fixed:1e9+shifted-exp:1e9,1e9+slow:0=1e6+slow:0=1e6"), 0, 1);
  for (int i = 0; i < 20; ++i) {
    const nanoseconds delay = inj.nextDelay(milliseconds(10));
    EXPECT_GT(delay.count(), 0) << "step " << i;
    EXPECT_GE(inj.totalDelay(), delay) << "step " << i;
  }
  EXPECT_EQ(inj.totalDelay(), nanoseconds::max());
  StragglerInjector transient(parsed("transient:1,1e12,1e6"), 0, 1);
  EXPECT_NEAR(ms(transient.nextDelay(milliseconds(10))), (1e6 - 1) * 10, 1e-3);
}

TEST(StragglerInjector, SameSeedSameDelaysAndNodesDiffer) {
  auto p = parsed("shifted-exp:2,10+transient:0.2,3,2");
  StragglerInjector a(p, 1, 42), b(p, 1, 42), other_node(p, 2, 42), other_seed(p, 1, 43);
  int differs_node = 0, differs_seed = 0;
  for (int step = 0; step < 200; ++step) {
    auto da = a.nextDelay(milliseconds(4));
    EXPECT_EQ(da, b.nextDelay(milliseconds(4)));
    differs_node += da != other_node.nextDelay(milliseconds(4));
    differs_seed += da != other_seed.nextDelay(milliseconds(4));
  }
  EXPECT_GT(differs_node, 190);
  EXPECT_GT(differs_seed, 190);
}

TEST(StragglerInjector, ShiftedExponentialHasItsMean) {
  StragglerInjector inj(parsed("shifted-exp:5,10"), 0, 7);
  const int n = 20000;
  double sum = 0, min = 1e9;
  for (int i = 0; i < n; ++i) {
    double d = ms(inj.nextDelay(nanoseconds(0)));
    sum += d;
    min = std::min(min, d);
  }
  EXPECT_NEAR(sum / n, 15.0, 0.5);  // base + mean; the standard error here is about 0.07
  EXPECT_GE(min, 5.0);
  EXPECT_NEAR(ms(inj.totalDelay()), sum, 1e-3 * n);
}

TEST(StragglerInjector, SlowFactorAppliesOnlyToItsNode) {
  auto p = parsed("slow:3=4");
  StragglerInjector slow(p, 3, 1), normal(p, 2, 1);
  EXPECT_FALSE(slow.inert());
  EXPECT_TRUE(normal.inert());
  EXPECT_NEAR(ms(slow.nextDelay(milliseconds(10))), 30.0, 1e-6);  // 4x as long in all
  EXPECT_EQ(normal.nextDelay(milliseconds(10)).count(), 0);
}

TEST(StragglerInjector, SlowNodeIsSlowAtTheWholeStep) {
  // Every node waits 10 ms on top of 10 ms of compute; node 3 is 4x slower at all of it.
  auto p = parsed("fixed:10+slow:3=4");
  StragglerInjector slow(p, 3, 1), normal(p, 2, 1);
  double normal_step = 10 + ms(normal.nextDelay(milliseconds(10)));
  double slow_step = 10 + ms(slow.nextDelay(milliseconds(10)));
  EXPECT_NEAR(normal_step, 20.0, 1e-6);
  EXPECT_NEAR(slow_step, 4 * normal_step, 1e-6);
  // The order of the terms does not matter.
  StragglerInjector reordered(parsed("slow:3=4+fixed:10"), 3, 1);
  EXPECT_NEAR(10 + ms(reordered.nextDelay(milliseconds(10))), 80.0, 1e-6);
}

TEST(StragglerInjector, TransientSlowdownsLastTheirSteps) {
  // Probability 1: a slowdown of 3 steps starts whenever none is running.
  StragglerInjector inj(parsed("transient:1,3,2"), 0, 1);
  for (int i = 0; i < 9; ++i)
    EXPECT_NEAR(ms(inj.nextDelay(milliseconds(5))), 5.0, 1e-6);
  // Probability 0: never.
  StragglerInjector never(parsed("transient:0,3,2"), 0, 1);
  EXPECT_TRUE(never.inert());
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(never.nextDelay(milliseconds(5)).count(), 0);
}

TEST(StragglerInjector, CombinedProfilesAddUp) {
  auto p = parsed("fixed:2").combinedWith(parsed("fixed:3")).value();
  EXPECT_EQ(p.text, "fixed:2+fixed:3");
  StragglerInjector inj(p, 0, 1);
  EXPECT_NEAR(ms(inj.nextDelay(milliseconds(1))), 5.0, 1e-6);
}

TEST(StragglerInjector, WaitAfterStepReallyWaits) {
  StragglerInjector inj(parsed("fixed:20"), 0, 1);
  auto start = std::chrono::steady_clock::now();
  auto waited = inj.waitAfterStep(milliseconds(1));
  // A lower bound only: sleeping never returns early, but the machine may be slow.
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(20));
  EXPECT_EQ(waited, milliseconds(20));
}

TEST(StragglerProfile, ParsesCrashTerms) {
  auto p = parsed("fixed:1 + crash: 3@30 , 0@1 + crash:7@1000000000000");
  ASSERT_EQ(p.terms.size(), 3u);
  EXPECT_EQ(p.terms[1].kind, StragglerTerm::Kind::kCrash);
  EXPECT_EQ(p.terms[1].crash_steps, (std::map<uint32_t, int64_t>{{3, 30}, {0, 1}}));
  EXPECT_EQ(p.terms[2].crash_steps, (std::map<uint32_t, int64_t>{{7, 1000000000000}}));
}

TEST(StragglerProfile, BadCrashTermsAreNamedWithTheAcceptedForm) {
  struct Case {
    const char* text;
    const char* expect;
  };
  for (const Case& c : {
           Case{"crash:", "'' is not NODE@STEP"},
           Case{"crash:2", "'2' is not NODE@STEP"},
           Case{"crash:2=10", "'2=10' is not NODE@STEP"},
           Case{"crash:x@10", "node id 'x' is not a non-negative integer"},
           Case{"crash:-1@10", "node id '-1' is not a non-negative integer"},
           Case{"crash:@10", "node id '' is not a non-negative integer"},
           Case{"crash:2@0", "STEP '0' must be a whole number from 1 (the node's first step)"},
           Case{"crash:2@-3", "STEP '-3' must be a whole number from 1"},
           Case{"crash:2@", "STEP '' must be a whole number from 1"},
           Case{"crash:2@2.5", "STEP '2.5' must be a whole number"},
           Case{"crash:2@1e3", "STEP '1e3' must be a whole number"},
           Case{"crash:2@1000000000001", "to 1000000000000"},
           Case{"crash:2@99999999999999999999999", "to 1000000000000"},
           Case{"crash:2@10,2@20", "node 2 is listed twice"},
           Case{"crash:2@10,", "'' is not NODE@STEP"},
           Case{"crash:2@10+fixed:1+crash:1@5,2@20",
                "node 2 is given two crash steps (10 and 20); a node crashes once"},
       }) {
    expectRefused(c.text, c.expect, "crash:NODE@STEP[,NODE@STEP...]");
  }
}

// What the launcher and the topology loader check against the cluster's ids.
TEST(StragglerProfile, NamedNodesAreTheSlowAndCrashTermsIds) {
  EXPECT_EQ(parsed("slow:3=2,1=4+crash:3@5+fixed:1").namedNodes(), (std::vector<uint32_t>{1, 3}));
  EXPECT_TRUE(parsed("shifted-exp:1,2+transient:0.1,3,2").namedNodes().empty());
}

// compare's single variant runs node 0 alone and takes only the terms that act on it.
TEST(StragglerProfile, RestrictedToANodeKeepsWhatActsOnIt) {
  const auto whole = parsed("shifted-exp:5,15+slow:3=3,0=1.5+crash:2@9");
  const auto own = whole.restrictedTo(0);
  EXPECT_EQ(own.text, "shifted-exp:5,15+slow:0=1.5");
  EXPECT_EQ(own.namedNodes(), (std::vector<uint32_t>{0}));
  EXPECT_EQ(parsed(own.text).text, own.text);  // the text parses back
  EXPECT_EQ(whole.restrictedTo(3).text, "shifted-exp:5,15+slow:3=3");
  EXPECT_EQ(parsed("slow:3=3").restrictedTo(0).text, "none");
  EXPECT_TRUE(parsed("slow:3=3").restrictedTo(0).empty());
  // Node 0's delays are drawn exactly as under the whole profile.
  StragglerInjector a(whole, 0, 11), b(own, 0, 11);
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(a.nextDelay(std::chrono::milliseconds(2)), b.nextDelay(std::chrono::milliseconds(2)));
}

// The command line's terms and a node's own attribute from the topology file meet here.
TEST(StragglerProfile, CrashTermsCombineAndAConflictIsRefused) {
  auto p = parsed("crash:1@5").combinedWith(parsed("fixed:2+crash:3@30")).value();
  EXPECT_EQ(p.text, "crash:1@5+fixed:2+crash:3@30");
  EXPECT_EQ(StragglerInjector(p, 1, 1).crashStep(), 5);
  EXPECT_EQ(StragglerInjector(p, 3, 1).crashStep(), 30);
  EXPECT_EQ(StragglerInjector(p, 0, 1).crashStep(), 0);
  auto from_none = parsed("none").combinedWith(parsed("crash:2@4")).value();
  EXPECT_EQ(from_none.text, "crash:2@4");
  EXPECT_EQ(StragglerInjector(from_none, 2, 1).crashStep(), 4);
  const auto twice = parsed("crash:2@10").combinedWith(parsed("crash:2@20"));
  ASSERT_FALSE(twice.ok()) << "two crash steps for node 2 were combined";
  EXPECT_NE(twice.message().find("node 2 is given two crash steps (10 and 20)"), std::string::npos)
      << twice.message();
}

TEST(StragglerInjector, TheCrashIsDueAtItsStepOnlyAndOnlyOnItsNode) {
  auto p = parsed("crash:3@4,5@1");
  StragglerInjector crashing(p, 3, 1), first(p, 5, 1), spared(p, 2, 1);
  EXPECT_FALSE(crashing.inert());
  EXPECT_FALSE(first.inert());
  EXPECT_TRUE(spared.inert());
  EXPECT_FALSE(crashing.crashDue());  // no step counted yet
  for (int64_t step = 1; step <= 6; ++step) {
    EXPECT_EQ(crashing.nextDelay(milliseconds(2)).count(), 0) << step;
    EXPECT_EQ(crashing.steps(), step);
    EXPECT_EQ(crashing.crashDue(), step == 4) << step;
    spared.nextDelay(milliseconds(2));
    EXPECT_FALSE(spared.crashDue()) << step;
  }
  first.nextDelay(milliseconds(2));
  EXPECT_TRUE(first.crashDue());
}

// A crash draws nothing: with it, every delay of the run is the same as without it.
TEST(StragglerInjector, ACrashTermLeavesTheDelaysAsTheyWere) {
  StragglerInjector plain(parsed("shifted-exp:2,10+transient:0.2,3,2"), 1, 42);
  StragglerInjector with_crash(parsed("crash:1@500+shifted-exp:2,10+crash:0@3+transient:0.2,3,2"),
                               1, 42);
  for (int step = 0; step < 200; ++step) {
    EXPECT_EQ(plain.nextDelay(milliseconds(4)), with_crash.nextDelay(milliseconds(4))) << step;
  }
}

TEST(StragglerInjector, WaitAfterStepReturnsWhenNoCrashIsDue) {
  StragglerInjector inj(parsed("crash:3@1"), 2, 1);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(inj.waitAfterStep(milliseconds(1)).count(), 0);
  EXPECT_EQ(inj.steps(), 3);
}

// The real thing, in a child process: the line on stderr, then the dedicated exit status, and
// not one step early.
TEST(StragglerInjectorDeathTest, WaitAfterStepEndsTheProcessAfterTheCrashStep) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StragglerInjector inj(parsed("fixed:1+crash:3@4"), 3, 1);
        for (int i = 0; i < 3; ++i)
          inj.waitAfterStep(milliseconds(1));
        std::fputs("three steps done\n", stderr);
        inj.waitAfterStep(milliseconds(1));
        std::fputs("still alive after step 4\n", stderr);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(kInjectedCrashExitStatus),
      "three steps done\n"
      "chorus: injected crash of node 3 after step 4 \\(stragglers crash:3@4\\)\n");
}

}  // namespace
}  // namespace chorus::faults
