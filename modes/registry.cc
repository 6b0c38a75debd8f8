#include "modes/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "consensus/consensus_service.h"
#include "consensus/consensus_session.h"
#include "ping/ping_service.h"
#include "ping/ping_session.h"
#include "ps/ps_service.h"
#include "ps/ps_session.h"
#include "run/cluster_checkpoint.h"
#include "run/single_session.h"

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

// The option checks of ping/, consensus/ and ps/ still throw std::invalid_argument (docs/errors.md,
// "One style above node/"): caught here, next to the call, and made the entry's Status.
template <typename Check>
node::Status checked(Check check) {
  try {
    check();
  } catch (const std::invalid_argument& e) {
    return node::invalidInput(e.what());
  }
  return {};
}

node::Status checkPing(const ModeSettings& settings) {
  return checked([&] { ping::validatePingFitsFrames(settings.ping, settings.max_frame_bytes); });
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

node::Status checkConsensus(const ModeSettings& settings) {
  return checked([&] {
    consensus::validateConsensusOptions(settings.consensus);
    consensus::validateChunkFitsFrames(settings.consensus,
                                       static_cast<uint32_t>(settings.max_frame_bytes));
  });
}

Fingerprint consensusFingerprint(const ModeSettings& settings) {
  return {{"mixing", settings.consensus.mixing},
          {"staleness", settings.consensus.staleness.toString()},
          {"chunk-floats", fmt::format("{}", settings.consensus.chunk_floats)}};
}

node::Status checkPs(const ModeSettings& settings) {
  if (node::Status ps = checked([&] { ps::validatePsOptions(settings.ps); }); !ps.ok()) return ps;
  // A cut is a clock every worker reaches; under a cluster budget workers end at different ones.
  if ((settings.run.checkpoint_every > 0 || run::resumesCluster(settings.run)) &&
      settings.ps.staleness.infinite() &&
      ps::parseAsyncRounds(settings.ps.async_rounds) == ps::AsyncRounds::kCluster) {
    return node::invalidInput(
        "--checkpoint-every and --resume DIR need every PS worker to run the same clocks: with "
        "--staleness inf add --async-rounds worker");
  }
  return {};
}

Fingerprint psFingerprint(const ModeSettings& settings) {
  const ps::PsOptions& o = settings.ps;
  return {
      {"staleness", o.staleness.toString()}, {"key-floats", fmt::format("{}", o.key_floats)},
      {"cache", o.cache ? "yes" : "no"},     {"owner-momentum", o.owner_momentum},
      {"async-rounds", o.async_rounds},      {"bandwidth", fmt::format("{}", o.bandwidth_mbps)}};
}

// Every member's id, in the topology's order.
std::vector<node::NodeId> membersOf(const topology::Topology& topology) {
  std::vector<node::NodeId> members;
  for (const topology::NodeSpec& n : topology.nodes)
    members.push_back(n.id);
  return members;
}

// Step 1 of a dense plan: this node's job, shared by `start` (a std::function is copied, the job
// is not) and moved into the run once, with its whole-cluster checkpoints in `mode`.
node::Result<std::shared_ptr<run::NodeJob>> denseJob(const TrainingContext& context,
                                                     TrainingPlan& plan, std::string_view mode) {
  node::Result<run::NodeJob> loaded = loadDenseJob(context);
  if (!loaded.ok()) return loaded.status();
  auto job = std::make_shared<run::NodeJob>(std::move(loaded).value());
  try {  // run/cluster_checkpoint's reader still throws; its message names the folder and file
    run::prepareCuts(*job, context.settings.run, context.topology.name, mode,
                     static_cast<uint32_t>(context.topology.nodes.size()));
  } catch (const run::NodeCheckpointError& e) {
    return node::invalidInput(e.what());  // a --resume DIR that cannot be used: exit 2
  }
  plan.model_spec = job->model->spec().toString();
  return job;
}

// Consensus (docs/consensus.md): gossip with the topology neighbors; the end of the run travels
// over the neighbor graph (a convergecast of the final models on a spanning tree), so the node
// connects to its neighbors only.
node::Result<TrainingPlan> consensusPlan(const TrainingContext& context) {
  TrainingPlan plan;
  node::Result<std::shared_ptr<run::NodeJob>> dense = denseJob(context, plan, "consensus");
  if (!dense.ok()) return dense.status();
  std::shared_ptr<run::NodeJob> job = *dense;
  consensus::PeerLayout layout;
  layout.self = context.self.id;
  layout.neighbors = context.self.neighbors;
  for (const topology::NodeSpec& n : context.topology.nodes) {
    layout.members.push_back(n.id);
    layout.degrees[n.id] = n.neighbors.size();
    layout.graph[n.id] = n.neighbors;
  }
  plan.peers = layout.neighbors;
  plan.doing = fmt::format("training with neighbors [{}]", fmt::join(layout.neighbors, ", "));
  plan.start = [job, layout, options = context.settings.consensus](node::Node& node) {
    return consensus::makeConsensusRun(node, std::move(*job), layout, options);
  };
  return plan;
}

// PS (docs/ps.md): every node owns a shard of the keys and trains; reads and writes go to each
// key's owner over the full mesh.
node::Result<TrainingPlan> psPlan(const TrainingContext& context) {
  TrainingPlan plan;
  node::Result<std::shared_ptr<run::NodeJob>> dense = denseJob(context, plan, "ps");
  if (!dense.ok()) return dense.status();
  std::shared_ptr<run::NodeJob> job = *dense;
  const std::vector<node::NodeId> members = membersOf(context.topology);
  for (node::NodeId id : members) {
    if (id != context.self.id) plan.peers.push_back(id);
  }
  plan.doing = fmt::format("owning its shard of the parameters, staleness {}",
                           context.settings.ps.staleness.toString());
  plan.start = [job, members, options = context.settings.ps](node::Node& node) {
    return ps::makePsRun(node, std::move(*job), members, options);
  };
  return plan;
}

// One node alone (a topology of one node): the run of chorus train, no peers.
node::Result<TrainingPlan> singlePlan(const TrainingContext& context) {
  TrainingPlan plan;
  if (context.settings.run.checkpoint_every > 0 || run::resumesCluster(context.settings.run)) {
    return node::invalidInput(
        "--checkpoint-every and --resume DIR are for clusters of several nodes; a topology of "
        "one node trains alone: use --save FILE and --resume FILE");
  }
  node::Result<std::shared_ptr<run::NodeJob>> dense = denseJob(context, plan, "single");
  if (!dense.ok()) return dense.status();
  std::shared_ptr<run::NodeJob> job = *dense;
  plan.doing = "training alone";
  plan.start = [job, options = context.settings.run](node::Node& node) {
    return run::makeSingleRun(std::move(*job), options, node.logger());
  };
  return plan;
}

}  // namespace

node::Result<run::NodeJob> loadDenseJob(const TrainingContext& context) {
  // This process runs one node: it reads its own samples only.
  return run::loadNodeProcessJob(context.settings.run, context.self.id,
                                 static_cast<int>(context.topology.nodes.size()),
                                 context.self.stragglers);
}

const std::vector<Mode>& registry() {
  // One line per mode.
  static const std::vector<Mode> modes = {
      {.name = "consensus",
       .description = "gossip averaging with the topology neighbors, backup workers",
       .service = &consensus::kConsensusService,
       .check = &checkConsensus,
       .fingerprint = &consensusFingerprint,
       .plan = &consensusPlan,
       .sparse = SparseTraining::kConsensus,
       .parse_variant = &consensusVariant,
       .variant_forms = &consensusVariantForms},
      {.name = "ping",
       .description = "Ping/Pong with every peer: a connectivity check",
       .service = &ping::kPingService,
       .trains = false,
       .check = &checkPing,
       .fingerprint = &pingFingerprint,
       .make_session = &pingSession},
      {.name = "ps",
       .description = "sharded parameter ownership, push/pull under a staleness bound",
       .service = &ps::kPsService,
       .check = &checkPs,
       .fingerprint = &psFingerprint,
       .plan = &psPlan,
       .sparse = SparseTraining::kPs,
       .parse_variant = &psVariant,
       .variant_forms = &psVariantForms},
      {.name = "single",
       .description = "one node training alone (a topology of one node)",
       .named_by_flag = false,
       .plan = &singlePlan,
       .alone = true,
       .parse_variant = &singleVariant,
       .variant_forms = &singleVariantForms},
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

std::string sparseModeNames() {
  std::vector<std::string> names;
  for (const Mode& mode : registry()) {
    if (mode.sparse != SparseTraining::kNone) names.emplace_back(mode.name);
  }
  return joinNames(names);
}

const Mode& modeThatRuns(const Mode& named, size_t nodes, bool sparse_model) {
  if (nodes != 1) return named;
  for (const Mode& mode : registry()) {
    const bool trains_it =
        sparse_model ? mode.sparse != SparseTraining::kNone : mode.plan != nullptr;
    if (mode.alone && trains_it) return mode;
  }
  return named;
}

std::string variantForms() {
  std::vector<std::string> forms;
  for (const Mode& mode : registry()) {
    if (mode.variant_forms != nullptr) forms.push_back(mode.variant_forms());
  }
  return fmt::format("{}", fmt::join(forms, ", "));
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
  int alone = 0;
  for (const Mode& mode : modes) {
    const bool builds_training = mode.plan != nullptr || mode.sparse != SparseTraining::kNone;
    if (mode.trains != builds_training) {
      return mode.trains
                 ? fmt::format("mode \"{}\" trains but has no plan and no sparse session",
                               mode.name)
                 : fmt::format("mode \"{}\" does not train but has a training plan", mode.name);
    }
    if (!mode.trains && mode.make_session == nullptr) {
      return fmt::format("mode \"{}\" neither trains nor builds a session", mode.name);
    }
    if ((mode.parse_variant == nullptr) != (mode.variant_forms == nullptr)) {
      return fmt::format(
          "mode \"{}\" has a variant grammar without its forms, or forms without "
          "a grammar",
          mode.name);
    }
    if (mode.parse_variant != nullptr && !mode.trains) {
      return fmt::format("mode \"{}\" has variants but does not train", mode.name);
    }
    if (mode.alone && ++alone == 2) {
      return fmt::format("mode \"{}\" is a second mode that runs a topology of one node",
                         mode.name);
    }
  }
  return {};
}

}  // namespace chorus::modes
