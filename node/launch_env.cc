#include "node/launch_env.h"

#include <fmt/format.h>

#include <charconv>
#include <cstring>

namespace chorus::node {

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

}  // namespace chorus::node
