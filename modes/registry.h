// The modes chorus runs, one entry each: its name (as `--mode` and compare's variants say it),
// a one-line description, and the service its messages travel as (docs/wire-format.md,
// "Services"). The wire ids of every mode are checked here to be distinct, once, for all.
// What a mode's entry does not hold yet (its session factory, its flags, its variant grammar,
// its metric names) still lives in cli/ and experiment/: issue 23, item 2.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "node/service.h"

namespace chorus::modes {

struct Mode {
  std::string_view name;
  std::string_view description;
  // The service its messages travel as; null for a mode that sends none (single).
  const node::ServiceSpec* service = nullptr;
};

// Every mode, sorted by name.
const std::vector<Mode>& registry();
// The mode called `name`, or null.
const Mode* findMode(std::string_view name);
// The names for a message: "consensus, ping, ps or single".
std::string modeNames();
// Why the registry is inconsistent (two modes with one name or one service id, a service id
// of 0), or "" when it is not.
std::string registryProblems(const std::vector<Mode>& modes);

}  // namespace chorus::modes
