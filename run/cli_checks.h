// Number checks for command-line flags. CLI11's NonNegativeNumber and PositiveNumber report a
// bad value as out of "range 0.000000 to 1797693134862315708145...", the whole range of a
// double printed in full; these say what the flag wants in a few words instead.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace chorus::run {

namespace detail {

// The check behind nonNegative() and positive(): a number, then `ok(value)`.
inline CLI::Validator numberCheck(bool (*ok)(double), const char* want, const char* name) {
  return CLI::Validator(
      [ok, want](std::string& input) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(input, value)) return "'" + input + "' is not a number";
        if (!ok(value)) return std::string("must be ") + want + ", not " + input;
        return {};
      },
      std::string("NUMBER ") + want, name);
}

}  // namespace detail

// A number >= 0 (NaN is refused).
inline CLI::Validator nonNegative() {
  return detail::numberCheck([](double v) { return v >= 0; }, ">= 0", "NON_NEGATIVE");
}

// A number > 0 (NaN is refused).
inline CLI::Validator positive() {
  return detail::numberCheck([](double v) { return v > 0; }, "> 0", "POSITIVE");
}

}  // namespace chorus::run
