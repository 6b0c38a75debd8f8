// `chorus node`'s flags, its help, and the checks of flags that need no data and no port:
// every setting becomes a typed NodeArgs here, once, from the flags or from a run spec.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/node_internal.h"
#include "cli/run_spec.h"
#include "cli/suggest.h"
#include "faults/link_delay.h"
#include "faults/straggler.h"
#include "modes/registry.h"
#include "node/node.h"
#include "run/cli_checks.h"
#include "run/cluster_checkpoint.h"
#include "run/staleness_bound.h"
#include "topology/topology.h"

namespace chorus::cli {
namespace {

using std::chrono::milliseconds;

// --spec FILE: the node's settings from the spec, with the id of --id. A spec holds every
// setting, so any other flag is refused rather than silently overridden or ignored.
NodeArgs fromSpec(const CLI::App& cmd, const std::string& path, std::optional<uint32_t> id) {
  for (const CLI::Option* option : cmd.get_options()) {
    const std::string name = option->get_name();
    if (option->count() == 0 || name == "--spec" || name == "--id") continue;
    throw CommandFailure(2, fmt::format("{}: --spec {} holds every setting of the node; give only "
                                        "--id with it",
                                        name, path));
  }
  node::Result<NodeArgs> args = readRunSpec(path);
  if (!args.ok()) throw CommandFailure(2, args.message());
  args->id = id;
  return std::move(args).value();
}

}  // namespace

void registerNodeCommand(CLI::App& app, std::function<void(const NodeArgs&)> action) {
  auto args = std::make_shared<NodeArgs>();
  args->run.data.name = "fashion-mnist";
  args->run.model.name = "mlp";
  CLI::App* cmd = app.add_subcommand(
      "node",
      "Run one node of a topology file.\n"
      "The node listens on its address from the file, connects to every other member (in\n"
      "consensus mode to its topology neighbors only; the lower id dials, the higher accepts)\n"
      "and waits until those are connected. Then, by\n"
      "--mode (default: the file's mode):\n"
      "  consensus  train: local SGD steps on this node's shard, gossip averaging with the\n"
      "             topology neighbors, waiting only for the fastest (--backup); per-round\n"
      "             metrics in --out DIR/node-<id>.jsonl; at the end every node prints its test\n"
      "             accuracy and node 0 also that of the average of all final models\n"
      "             (docs/consensus.md).\n"
      "  ping       exchange --pings Ping/Pong messages with every peer, check each echoed\n"
      "             payload and print what happened (a connectivity check).\n"
      "  ps         train with sharded parameter ownership: every node owns a shard of the\n"
      "             keys and is a worker; each clock it reads the model (SSP: --staleness),\n"
      "             computes a gradient on its shard and pushes it to the owners, who apply\n"
      "             the optimizer; per-clock metrics in --out DIR/node-<id>.jsonl; node 0\n"
      "             also prints the accuracy of the model as held by the owners (docs/ps.md).\n"
      "A topology of one node trains alone in either training mode: the run of chorus train\n"
      "(the single variant of chorus compare).\n"
      "Sparse models (--model complex, distmult or mf, with chorus train's flags for them)\n"
      "train in PS mode: their embedding rows are the keys, each worker reads the rows its\n"
      "step touches and pushes their gradient, the owners apply the optimizer; node 0 prints\n"
      "the owners' model's quality at the end (docs/sparse-ps.md). In consensus mode every\n"
      "node keeps a replica, steps on its shard and sends each neighbor only the rows changed\n"
      "since they last went there (hot rows every round, cold rows every --cold-every rounds\n"
      "or within --round-bytes), mixing row by row; node 0 prints its replica's quality\n"
      "(docs/sparse-consensus.md).\n"
      "Then it leaves in order (Leave, wait for the peers' Leave, close).\n"
      "Example, on each machine with its own id (all nodes of a file on one machine: chorus\n"
      "launch): chorus node --topology lab.toml --id 0 --data fashion-mnist --model mlp --out "
      "runs/a\n"
      "Exit status: 0 on success; 1 training failed or data unreadable; 2 bad arguments or\n"
      "topology; 3 cannot listen; 4 cluster not ready in time (the message names the missing\n"
      "peers); 5 ping exchange failed; 86 crashed as injected (--stragglers crash:NODE@STEP);\n"
      "128+N interrupted by signal N (SIGINT, SIGTERM and SIGHUP\n"
      "make the node leave in order; under `chorus launch` the node also leaves when the\n"
      "launcher dies).");
  cmd->add_option("--mode", args->mode,
                  modes::flagModeNames() + " (default: the topology file's mode)")
      ->check(CLI::IsMember(modes::flagModes()));
  cmd->add_option("--topology", args->topology,
                  "Topology file (TOML); see docs/topology.md (required unless --spec)")
      ->check(CLI::ExistingFile);
  auto spec = std::make_shared<std::string>();
  cmd->add_option("--spec", *spec,
                  "Run spec written by chorus launch or chorus compare: every setting of the node "
                  "but its id, parsed and checked once by them; give only --id with it")
      ->type_name("FILE");
  cmd->add_option("--id", args->id,
                  "This node's id in the file. Default: the rank from OMPI_COMM_WORLD_RANK,\n"
                  "PMI_RANK or SLURM_PROCID (mpirun / srun)");
  cmd->add_option("--log-level", args->log_level, "trace, debug, info, warn, error, critical, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
  cmd->add_option("--ready-timeout", args->ready_timeout_s,
                  "Seconds to wait until every peer is connected (a line every 5 s names the "
                  "peers still missing and why; chorus launch passes 60 unless given)")
      ->check(run::positive())
      ->capture_default_str();
  cmd->add_option("--pings", args->pings,
                  "--mode ping: Ping/Pong round trips per peer (same on every node)")
      ->capture_default_str();
  cmd->add_option("--payload-bytes", args->payload_bytes, "--mode ping: bytes of payload per ping")
      ->check(CLI::Range(0, 64 << 20))
      ->capture_default_str();
  cmd->add_option("--ping-timeout", args->ping_timeout_s,
                  "--mode ping: seconds allowed for the whole ping exchange")
      ->check(run::positive())
      ->capture_default_str();
  cmd->add_option("--linger", args->linger_s,
                  "Seconds to wait for the peers' Leave when shutting down")
      ->check(run::nonNegative())
      ->capture_default_str();
  cmd->add_option("--heartbeat-ms", args->heartbeat_ms,
                  "Heartbeat interval when nothing else is sent")
      ->check(CLI::Range(1u, 3'600'000u))
      ->capture_default_str();
  cmd->add_option("--write-slice-packets", args->write_slice_packets,
                  "Each socket write carries at most this many TCP packets (0: no cut). 2 keeps "
                  "Linux's BBR from pacing large writes on loopback; see bench/README.md")
      ->check(CLI::Range(0u, static_cast<uint32_t>(node::kMaxWriteSlicePackets)))
      ->capture_default_str();
  cmd->add_option("--peer-timeout-ms", args->peer_timeout_ms,
                  "Silence after which a peer is reported down")
      ->check(CLI::Range(2u, 3'600'000u))
      ->capture_default_str();
  cmd->add_option("--secret-file", args->secret_file,
                  "File holding the cluster's shared secret (the same on every node; trailing "
                  "line breaks are ignored; default: the topology's [cluster] secret_file). Each "
                  "new connection's two ends prove they know it (HMAC challenge both ways), a "
                  "peer that cannot is refused, and every frame after the handshake is encrypted "
                  "and authenticated (ChaCha20-Poly1305, keys of that connection): a frame "
                  "altered, replayed or reordered on the way closes the connection. There is no "
                  "switch to turn that off; without a secret frames travel in clear "
                  "(docs/security.md)")
      ->check(CLI::ExistingFile);
  // --link-delay and --link-loss are read here, once; a bad value is refused naming the flag.
  cmd->add_option_function<std::string>(
         "--link-delay",
         [args](const std::string& text) {
           args->link_delay = faults::LinkDelay::read(text).value();  // checked below
         },
         "Fault injection: every frame this node sends waits MS milliseconds (plus a "
         "uniform draw from [0, JITTER_MS), seeded by --seed) before it reaches the "
         "socket, in order: MS or MS,JITTER_MS, e.g. 20 or 20,5 (default: none; the node's "
         "link_delay attribute in the topology file adds to it). A round "
         "trip then takes at least 2 x MS; see docs/stragglers.md")
      ->check(run::readableAs(&faults::LinkDelay::read, "MS[,JITTER_MS]", "LINK_DELAY"));
  cmd->add_option_function<std::string>(
         "--link-loss",
         [args](const std::string& text) {
           args->link_loss = faults::LinkLoss::read(text).value();  // checked below
         },
         "Fault injection: each frame this node sends is lost with probability P, as "
         "TCP loses a segment: it is sent again after a retransmission time-out of "
         "RTO_MS (default 200, Linux's smallest), doubled for each further loss (at "
         "most 3), and nothing behind it on that link arrives before it: P or P,RTO_MS, "
         "e.g. 0.01 or 0.01,200 (default: none); P at most 0.5; see docs/stragglers.md")
      ->check(run::readableAs(&faults::LinkLoss::read, "P[,RTO_MS]", "LINK_LOSS"));
  cmd->add_option("--max-frame-mib", args->max_frame_mib, "Largest accepted frame, in MiB")
      ->check(CLI::Range(1u, 2047u))
      ->capture_default_str();
  run::addRunOptions(*cmd, args->run);
  run::addCheckpointOptions(*cmd, args->run);
  run::addStalenessOption(*cmd, args->staleness);
  consensus::addConsensusOptions(*cmd, args->consensus);
  ps::addPsOptions(*cmd, args->ps);
  addSparseNodeOptions(*cmd, args->sparse);
  cmd->callback([cmd, args, spec, action = std::move(action)] {
    if (spec->empty()) {
      if (args->topology.empty()) {
        throw CommandFailure(2,
                             "--topology FILE is required (or --spec FILE, as chorus launch "
                             "and chorus compare give their nodes)");
      }
      recordGivenFlags(*cmd, args->sparse);
      return action(*args);
    }
    action(fromSpec(*cmd, *spec, args->id));
  });
}

LinkFaults nodeLinkFaults(const faults::LinkDelay& delay_flag, const faults::LinkLoss& loss_flag,
                          const topology::NodeSpec& node, const std::string& topology_path,
                          milliseconds heartbeat, milliseconds peer_timeout,
                          const std::string& time_out_name, const std::string& remedy) {
  LinkFaults link;
  std::string source;
  link.delay = delay_flag;
  if (!delay_flag.empty()) source = "--link-delay " + delay_flag.text;
  if (!node.link_delay.empty()) {
    link.delay.delay += node.link_delay.delay;
    link.delay.jitter += node.link_delay.jitter;
    source += fmt::format("{}node {}'s link_delay \"{}\" in {}", source.empty() ? "" : " plus ",
                          node.id, node.link_delay.text, topology_path);
  }
  link.loss = loss_flag;
  if (!link.loss.empty()) {
    source += fmt::format("{}--link-loss {}", source.empty() ? "" : " plus ", loss_flag.text);
  }
  // A heartbeat is due every `heartbeat`; held back as long as the link faults can hold a
  // frame, it could come later than the time-out after the one before it, and a healthy peer
  // would be called down.
  node::NodeOptions faulty;
  link.applyTo(faulty);
  if (node::linkWorstCase(faulty) + heartbeat >= peer_timeout) {
    throw CommandFailure(
        2, fmt::format("{}: delay plus jitter{} must stay below {} ms, or a heartbeat could arrive "
                       "later than {}; {}",
                       source,
                       link.loss.empty() ? ""
                                         : fmt::format(" plus {} retransmission time-outs",
                                                       (1 << node::kMaxLinkRetransmissions) - 1),
                       (peer_timeout - heartbeat).count(), time_out_name, remedy));
  }
  return link;
}

void LinkFaults::applyTo(node::NodeOptions& options) const {
  options.link_delay = delay.delay;
  options.link_jitter = delay.jitter;
  options.link_loss = loss.probability;
  options.link_rto = loss.rto;
}

void checkStragglersNameMembers(const faults::StragglerProfile& stragglers,
                                const topology::Topology& topo, const std::string& topology_path) {
  for (const uint32_t named : stragglers.namedNodes()) {
    if (topo.find(named) == nullptr) {
      throw CommandFailure(
          2, fmt::format("--stragglers {}: names node {}, which is not in {} (its "
                         "ids are 0 to {}); a term for no node would never act",
                         stragglers.text, named, topology_path, topo.nodes.size() - 1));
    }
  }
}

void addNodeCommands(CLI::App& app) {
  registerNodeCommand(app, runNode);
}

NodeArgs parseNodeArguments(const std::string& topology, const std::vector<uint32_t>& ids,
                            const std::vector<std::string>& node_args,
                            std::vector<std::string>* given) {
  CLI::App app{"", "chorus"};
  app.require_subcommand(1);
  NodeArgs parsed;
  registerNodeCommand(app, [&ids, &parsed](const NodeArgs& args) {
    checkNodes(args, ids);
    parsed = args;
  });
  std::vector<std::string> argv = {"node", "--topology", topology, "--id",
                                   std::to_string(ids.empty() ? 0 : ids.front())};
  argv.insert(argv.end(), node_args.begin(), node_args.end());
  const std::vector<std::string> words = argv;
  std::reverse(argv.begin(), argv.end());  // CLI11 takes the words last to first
  try {
    app.parse(argv);
  } catch (const CLI::ParseError& e) {
    const std::string hint = suggestFor(app, words);
    throw CommandFailure(2, fmt::format("{} (passed on to the nodes: see chorus node --help){}",
                                        e.what(), hint.empty() ? "" : "; " + hint));
  }
  if (given != nullptr) {
    for (const CLI::Option* option : app.get_subcommand("node")->get_options()) {
      if (option->count() > 0) given->push_back(option->get_name());
    }
  }
  parsed.id.reset();
  return parsed;
}

}  // namespace chorus::cli
