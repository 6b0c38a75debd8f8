// Checks for command-line flags: typed values read by their grammar's reader, and numbers.
// Number checks: CLI11's NonNegativeNumber and PositiveNumber report a
// bad value as out of "range 0.000000 to 1797693134862315708145...", the whole range of a
// double printed in full; these say what the flag wants in a few words instead.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>

#include "node/result.h"

namespace chorus::run {

namespace detail {

// The largest number nonNegative() and positive() accept. The flags they check are seconds that
// callers turn into int64 milliseconds or nanoseconds: inf or 1e300 made that conversion
// undefined. A billion seconds (31 years) is more than any time-out needs.
inline constexpr double kMaxFlagNumber = 1e9;

// The check behind nonNegative() and positive(): a number, then `ok(value)`, then finite and at
// most kMaxFlagNumber.
inline CLI::Validator numberCheck(bool (*ok)(double), const char* want, const char* name) {
  return CLI::Validator(
      [ok, want](std::string& input) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(input, value)) return "'" + input + "' is not a number";
        if (!ok(value)) return std::string("must be ") + want + ", not " + input;
        if (!(value <= kMaxFlagNumber)) return "must be at most 1000000000, not " + input;
        return {};
      },
      std::string("NUMBER ") + want, name);
}

}  // namespace detail

// A flag whose text `read` turns into a typed value (a grammar's reader returning
// node::Result): the check refuses text it cannot read with the reader's message, so that the
// option's function, which reads it again into its target, runs on good text only.
template <class T>
CLI::Validator readableAs(node::Result<T> (*read)(std::string_view), const char* type_name,
                          const char* name) {
  return CLI::Validator(
      [read](std::string& input) -> std::string {
        const node::Result<T> value = read(input);
        return value.ok() ? std::string() : value.message();
      },
      type_name, name);
}

// A number >= 0 and <= 1e9 (NaN and inf are refused).
inline CLI::Validator nonNegative() {
  return detail::numberCheck([](double v) { return v >= 0; }, ">= 0", "NON_NEGATIVE");
}

// A number > 0 and <= 1e9 (NaN and inf are refused).
inline CLI::Validator positive() {
  return detail::numberCheck([](double v) { return v > 0; }, "> 0", "POSITIVE");
}

}  // namespace chorus::run
