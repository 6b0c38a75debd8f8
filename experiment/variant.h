// The variants `chorus compare` runs and how each one maps to the options of the nodes it
// starts. A variant is named MODE or MODE:ARGS; the mode registry's entry of MODE owns the
// grammar of ARGS and the node settings (modes/variants.h), so this file names no mode. Pure
// functions: no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "modes/variants.h"
#include "node/result.h"

namespace chorus::experiment {

// One training strategy to compare.
struct Variant {
  std::string name;         // as written, e.g. "ps:ssp:3"
  std::string mode;         // the registry entry that parsed it ("ps")
  modes::VariantSpec spec;  // what it sets on its nodes

  // Reads one variant name with its mode's grammar, or the error naming the variant, what is
  // wrong with it and every accepted form, on one line.
  static node::Result<Variant> read(std::string_view text);
  // The options that select this variant (the spec's settings, flag then value; empty for
  // single, which runs alone on a one-node topology: see singleTopology()).
  std::vector<std::string> modeArgs() const;
  // The value the variant gives `flag` ("--backup"), if it sets it.
  std::optional<std::string> setting(std::string_view flag) const;
  // Whether options of `scope` reach its nodes ("" is every variant's scope).
  bool inScope(std::string_view scope) const;
  // It runs one node alone on the whole training set.
  bool alone() const { return spec.alone; }
  // A folder name for the variant's runs: the name with ':' replaced by '-'.
  std::string dirName() const;
};

// Every accepted form, from the registry: "consensus:RULE (...), ps:bsp, ..., single".
std::string variantForms();

// Reads a comma-separated list ("single,ps:bsp,consensus:dynamic"), or the error naming
// --variants and the entry for an empty list or entry, an unknown variant or one named twice.
node::Result<std::vector<Variant>> readVariantList(std::string_view text);

// One training option as the user gave it to `chorus compare`, forwarded to the nodes of the
// variants in its scope: a mode's option (--key-floats) means nothing to another mode's node and
// would be refused by it.
struct ForwardedOption {
  std::string flag;                 // "--lr"
  std::vector<std::string> values;  // {"0.05"}; empty for a flag without a value
  // "" (every variant, single included), or a scope some variants are in (VariantSpec::scopes):
  // a mode's name ("ps", "consensus") or modes::kPsAsyncScope.
  std::string scope = {};
};

// What every variant of a compare shares besides the forwarded options.
struct RunBudget {
  int64_t rounds = 0;      // --rounds (0: --epochs decides)
  int64_t eval_every = 0;  // --eval-every
  int nodes = 1;           // nodes of the topology
  // A sparse model (complex, distmult, mf): its runs are measured in --epochs and evaluate
  // every --eval-every-epochs (forwarded as given), so neither --rounds nor --eval-every is set.
  bool sparse = false;
};

// The options given to every node of one run of `variant` with `seed`, writing metrics to
// `out_dir`. `forwarded` must not hold --seed, --out, --rounds, --eval-every, --mode,
// --backup, --rejoin or --technique, nor a flag the variant sets, nor --staleness but in a scope
// of variants that do not set it (the consensus variants): this function sets them (or,
// --rejoin, no run may). Options of a scope the variant is not in are left out. The single
// variant does the work of the whole cluster: with --rounds R it runs R * nodes rounds and
// evaluates every eval_every * nodes rounds, so that it sees as many samples as all nodes
// together and is evaluated after the same number of samples; with --epochs it runs the same
// epochs over the whole training set.
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
