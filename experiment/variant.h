// The variants `chorus compare` runs (single, ps:bsp, ps:ssp:N, ps:async, consensus:RULE) and
// how each one maps to the options of the nodes it starts. Pure functions: no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "run/staleness_bound.h"

namespace chorus::experiment {

// One training strategy to compare.
struct Variant {
  enum class Kind {
    kSingle,     // one node trains alone on the whole training set
    kPs,         // --mode ps --staleness S
    kConsensus,  // --mode consensus --backup RULE
  };
  Kind kind = Kind::kSingle;
  std::string name;               // as written, e.g. "ps:ssp:3"
  run::StalenessBound staleness;  // kPs: the name's bound (ps:bsp = 0, ps:async = infinite)
  std::string backup;             // kConsensus: the backup-worker rule, e.g. "static:1"

  // Parses one variant name; throws std::invalid_argument naming the accepted forms.
  static Variant parse(std::string_view text);
  // The options that select this variant's mode (empty for kSingle, which runs as a one-node
  // consensus cluster; see singleTopology()).
  std::vector<std::string> modeArgs() const;
  // A folder name for the variant's runs: the name with ':' replaced by '-'.
  std::string dirName() const;
};

// Parses a comma-separated list ("single,ps:bsp,consensus:dynamic"); throws
// std::invalid_argument for an empty list, an unknown variant or a variant named twice.
std::vector<Variant> parseVariantList(std::string_view text);

// Which variants a forwarded option reaches: a PS-mode option (--key-floats) means nothing to a
// consensus node and would be refused by it, and the other way round.
enum class OptionScope {
  kEvery,      // training options: every variant, single included
  kPs,         // PS-mode options: the ps:* variants only
  kPsAsync,    // options of fully asynchronous PS (--async-rounds): ps:async only
  kConsensus,  // consensus-mode options: the consensus:* variants only
};

// One training option as the user gave it to `chorus compare`, forwarded to the nodes of the
// variants in its scope.
struct ForwardedOption {
  std::string flag;                 // "--lr"
  std::vector<std::string> values;  // {"0.05"}; empty for a flag without a value
  OptionScope scope = OptionScope::kEvery;
};

// What every variant of a compare shares besides the forwarded options.
struct RunBudget {
  int64_t rounds = 0;      // --rounds (0: --epochs decides)
  int64_t eval_every = 0;  // --eval-every
  int nodes = 1;           // nodes of the topology
};

// The options given to every node of one run of `variant` with `seed`, writing metrics to
// `out_dir`. `forwarded` must not hold --seed, --out, --rounds, --eval-every, --mode,
// --backup or --rejoin, nor --staleness but for the consensus variants (kConsensus): this
// function sets them (or, --rejoin, no run may). Options
// scoped to the other mode are left out. The single variant does the work of the
// whole cluster: with --rounds R it runs R * nodes rounds and evaluates every eval_every * nodes
// rounds, so that it sees as many samples as all nodes together and is evaluated after the same
// number of samples; with --epochs it runs the same epochs over the whole training set.
std::vector<std::string> nodeArgs(const Variant& variant,
                                  const std::vector<ForwardedOption>& forwarded,
                                  const RunBudget& budget, uint64_t seed,
                                  const std::string& out_dir);

// The one-node topology the single variant runs on: cluster `name`, consensus mode, node 0 at
// `address` ("host:port", IPv6 hosts in brackets) with no neighbors and the straggler
// attribute `stragglers` (may be empty).
std::string singleTopology(std::string_view name, std::string_view address,
                           std::string_view stragglers);

// A shell-ready rendering of a command line (arguments quoted where needed), for command.txt.
std::string shellQuote(const std::vector<std::string>& argv);

}  // namespace chorus::experiment
