#include "modes/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "consensus/consensus_service.h"
#include "ping/ping_service.h"
#include "ping/ping_session.h"
#include "ps/ps_service.h"

namespace chorus::modes {
namespace {

// --mode ping: ping/ping_session.h on the node, with the line it prints once connected.
class PingModeSession : public Session {
 public:
  PingModeSession(const SessionContext& context, const ModeSettings& settings)
      : context_(context), ping_(context.node, context.peers, settings.ping) {}
  std::string connectedLine(int64_t ready_ms) const override {
    return fmt::format(
        "node {} of cluster \"{}\" ({} nodes) listening on {}: connected to all {} peers in {} "
        "ms",
        context_.self.id, context_.topology.name, context_.topology.nodes.size(),
        context_.self.address(), context_.peers.size(), ready_ms);
  }
  void run() override {
    const ping::PingOutcome outcome = ping_.run();
    if (outcome.exit_code != 0) throw SessionFailure(outcome.exit_code, outcome.message);
  }
  void stop() override { ping_.stop(); }

 private:
  SessionContext context_;
  ping::PingSession ping_;
};

void checkPing(const ModeSettings& settings) {
  ping::validatePingFitsFrames(settings.ping, settings.max_frame_bytes);
}

Fingerprint pingFingerprint(const ModeSettings& settings) {
  return {{"pings", fmt::format("{}", settings.ping.pings_per_peer)},
          {"payload-bytes", fmt::format("{}", settings.ping.payload_bytes)}};
}

std::unique_ptr<Session> pingSession(const SessionContext& context, const ModeSettings& settings) {
  return std::make_unique<PingModeSession>(context, settings);
}

// "a, b or c".
std::string joinNames(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

void checkConsensus(const ModeSettings& settings) {
  consensus::validateConsensusOptions(settings.consensus);
  consensus::validateChunkFitsFrames(settings.consensus,
                                     static_cast<uint32_t>(settings.max_frame_bytes));
}

Fingerprint consensusFingerprint(const ModeSettings& settings) {
  return {{"mixing", settings.consensus.mixing},
          {"staleness", settings.consensus.staleness.toString()},
          {"chunk-floats", fmt::format("{}", settings.consensus.chunk_floats)}};
}

void checkPs(const ModeSettings& settings) {
  ps::validatePsOptions(settings.ps);
}

Fingerprint psFingerprint(const ModeSettings& settings) {
  const ps::PsOptions& o = settings.ps;
  return {{"staleness", o.staleness.toString()},
          {"key-floats", fmt::format("{}", o.key_floats)},
          {"cache", o.cache ? "yes" : "no"},
          {"owner-momentum", o.owner_momentum},
          {"async-rounds", o.async_rounds}};
}

}  // namespace

const std::vector<Mode>& registry() {
  // One line per mode.
  static const std::vector<Mode> modes = {
      {"consensus", "gossip averaging with the topology neighbors, backup workers",
       &consensus::kConsensusService, true, true, &checkConsensus, &consensusFingerprint},
      {"ping", "Ping/Pong with every peer: a connectivity check", &ping::kPingService, true, false,
       &checkPing, &pingFingerprint, &pingSession},
      {"ps", "sharded parameter ownership, push/pull under a staleness bound", &ps::kPsService,
       true, true, &checkPs, &psFingerprint},
      {"single", "one node training alone (a topology of one node)", nullptr, false},
  };
  return modes;
}

const Mode* findMode(std::string_view name) {
  const auto& modes = registry();
  auto it = std::find_if(modes.begin(), modes.end(), [&](const Mode& m) { return m.name == name; });
  return it == modes.end() ? nullptr : &*it;
}

std::string modeNames() {
  std::vector<std::string> names;
  for (const Mode& mode : registry())
    names.emplace_back(mode.name);
  return joinNames(names);
}

std::vector<std::string> flagModes() {
  std::vector<std::string> names;
  for (const Mode& mode : registry()) {
    if (mode.named_by_flag) names.emplace_back(mode.name);
  }
  return names;
}

std::string flagModeNames() {
  return joinNames(flagModes());
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
