#include "modes/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "consensus/consensus_service.h"
#include "ping/ping_service.h"
#include "ps/ps_service.h"

namespace chorus::modes {

const std::vector<Mode>& registry() {
  // One line per mode.
  static const std::vector<Mode> modes = {
      {"consensus", "gossip averaging with the topology neighbors, backup workers",
       &consensus::kConsensusService},
      {"ping", "Ping/Pong with every peer: a connectivity check", &ping::kPingService},
      {"ps", "sharded parameter ownership, push/pull under a staleness bound", &ps::kPsService},
      {"single", "one node training alone (a topology of one node)", nullptr},
  };
  return modes;
}

const Mode* findMode(std::string_view name) {
  const auto& modes = registry();
  auto it = std::find_if(modes.begin(), modes.end(), [&](const Mode& m) { return m.name == name; });
  return it == modes.end() ? nullptr : &*it;
}

std::string modeNames() {
  std::string out;
  const auto& modes = registry();
  for (size_t i = 0; i < modes.size(); ++i) {
    if (i > 0) out += i + 1 == modes.size() ? " or " : ", ";
    out += modes[i].name;
  }
  return out;
}

std::string registryProblems(const std::vector<Mode>& modes) {
  std::map<std::string_view, int> names;
  std::map<node::ServiceId, std::string_view> ids;
  for (const Mode& mode : modes) {
    if (++names[mode.name] == 2) return fmt::format("two modes are called \"{}\"", mode.name);
    if (mode.service == nullptr) continue;
    const node::ServiceId id = mode.service->id;
    if (id == node::kRuntimeService) {
      return fmt::format("mode \"{}\" has service id 0, the runtime's", mode.name);
    }
    auto [it, added] = ids.emplace(id, mode.name);
    if (!added) {
      return fmt::format("modes \"{}\" and \"{}\" share service id {}", it->second, mode.name, id);
    }
  }
  return {};
}

}  // namespace chorus::modes
