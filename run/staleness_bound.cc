#include "run/staleness_bound.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>
#include <stdexcept>

#include "run/cli_checks.h"

namespace chorus::run {
namespace {

// A whole number >= 0 and nothing else, or nullopt-like -1.
int64_t wholeNumber(std::string_view text) {
  int64_t n = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || n < 0) return -1;
  return n;
}

}  // namespace

node::Result<StalenessBound> StalenessBound::read(std::string_view text) {
  if (text == "inf" || text == "async") return StalenessBound{kInfinite};
  if (text == "bsp") return StalenessBound{0};
  constexpr std::string_view kSsp = "ssp:";
  const std::string_view number = text.starts_with(kSsp) ? text.substr(kSsp.size()) : text;
  const int64_t n = wholeNumber(number);
  if (n < 0) {
    return node::invalidInput(
        fmt::format("bad staleness '{}': use a whole number >= 0 (0 = BSP), 'bsp', 'ssp:N', or "
                    "'inf' / 'async'",
                    text));
  }
  return StalenessBound{n};
}

std::string StalenessBound::toString() const {
  return infinite() ? "inf" : std::to_string(bound);
}

std::string StalenessBound::variantName() const {
  if (infinite()) return "async";
  if (bound == 0) return "bsp";
  return fmt::format("ssp:{}", bound);
}

int64_t StalenessBound::requiredMinStep(int64_t reader_step) const {
  if (infinite()) return std::numeric_limits<int64_t>::min();
  return reader_step - bound;
}

void addStalenessOption(CLI::App& cmd, StalenessBound& target) {
  // The value is parsed here, once; a bad one is refused with parse()'s message.
  const CLI::Validator grammar = readableAs(&StalenessBound::read, "BOUND", "STALENESS");
  cmd.add_option_function<std::string>(
         "--staleness",
         [&target](const std::string& text) {
           target = StalenessBound::read(text).value();  // checked below
         },
         "Staleness bound, in steps (PS mode: clocks; consensus mode: rounds). PS: SSP's bound s "
         "(a worker at clock c sees every update from clocks <= c-s-1); 0 or bsp = BSP, N or ssp:N "
         "= SSP, inf or async = fully asynchronous. Consensus: tau, a neighbor's model may be used "
         "up to tau "
         "rounds late and no node runs more than tau rounds ahead of a live neighbor (0 with "
         "--backup wait-all: synchronous D-PSGD; at most 1000000)")
      ->check(grammar)
      ->default_str(target.toString());
  cmd.add_option_function<std::string>(
         "--staleness-bound",
         [&target](const std::string& text) {
           std::fprintf(stderr,
                        "chorus: warning: --staleness-bound is deprecated and goes in the next "
                        "release: write --staleness %s (one flag for both modes)\n",
                        text.c_str());
           target = StalenessBound::read(text).value();  // checked below
         },
         "Deprecated: --staleness")
      ->check(grammar)
      ->group("");
}

}  // namespace chorus::run
