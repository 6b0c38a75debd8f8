#include "launch/launch_env.h"

#include <fmt/format.h>

#include <charconv>
#include <cstring>

namespace chorus::launch {

using node::ErrorCode;

Status rankFromEnvironment(const EnvironmentLookup& lookup, std::optional<LauncherRank>* rank) {
  rank->reset();
  for (const char* variable : kRankVariables) {
    const char* value = lookup(variable);
    if (value == nullptr) continue;
    uint32_t parsed = 0;
    const char* end = value + std::strlen(value);
    const auto [ptr, ec] = std::from_chars(value, end, parsed);
    if (ec != std::errc() || ptr != end || ptr == value) {
      return {ErrorCode::kInvalidArgument,
              fmt::format("environment variable {}=\"{}\" is not a node id (a non-negative "
                          "integer); unset it or pass --id",
                          variable, value)};
    }
    *rank = LauncherRank{parsed, variable};
    return {};
  }
  return {};
}

bool plainLogs(const EnvironmentLookup& lookup) {
  bool plain = lookup("NO_COLOR") != nullptr;
  for (const char* variable : kRankVariables)
    plain = plain || lookup(variable) != nullptr;
  return plain;
}

}  // namespace chorus::launch
