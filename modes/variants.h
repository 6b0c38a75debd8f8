// The variants `chorus compare` runs, as each mode's registry entry defines them: a variant is
// named MODE or MODE:ARGS, and the entry of MODE owns the grammar of ARGS and what the variant
// sets on the nodes it starts (modes/registry.h, `parse_variant`). Adding a mode or a PS
// technique adds its variants here and in its registry line; experiment/ names no mode.
// Pure functions: no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "node/result.h"

namespace chorus::modes {

// The models a variant trains.
enum class ModelFamily : uint8_t {
  kAny,     // image models and the sparse models alike
  kSparse,  // only the sparse models (complex, distmult, mf)
  kMf,      // only matrix factorization (ps:rotation: blocks of a rating matrix)
};

// What one variant sets on the nodes of its runs.
struct VariantSpec {
  // The node flags that select it, in order, each with its value: {"--mode", "ps"},
  // {"--staleness", "0"}, {"--technique", "lapse"}. Compare never forwards these as given.
  std::vector<std::pair<std::string, std::string>> settings;
  // The option scopes it is in besides every variant's: compare forwards a mode's own options
  // (`chorus compare --help` groups them) only to the variants in that scope. A mode's scope is
  // its name ("ps", "consensus"); kPsAsyncScope holds the options of fully asynchronous PS.
  std::vector<std::string> scopes;
  // It runs one node alone on the whole training set (single), on a one-node topology.
  bool alone = false;
  // The models it trains, and (kSparse) why not the image models, for compare's message.
  ModelFamily family = ModelFamily::kAny;
  std::string family_reason;
};

// The scope of the options of fully asynchronous PS (--async-rounds): ps:async only.
inline constexpr std::string_view kPsAsyncScope = "ps:async";

// The PS techniques a variant may name, in the order --help lists them: classic, lapse, nups,
// auto. Each is a name `--technique` takes (ps::parseSparseTechnique; a test holds the two lists
// together).
const std::vector<std::string>& psTechniqueNames();

// The grammars of the registry's entries. Each parses ARGS of MODE:ARGS (nullopt: the name
// alone), or says what is wrong with ARGS as its error (kInvalidArgument; the caller names the
// variant and lists every form).
//   single:     the name alone.
//   ps:BOUND, ps:TECHNIQUE, ps:TECHNIQUE:BOUND  (BOUND: bsp, ssp:N or async; TECHNIQUE: see
//               psTechniqueNames(); without a BOUND, PS mode's default bound)
//   ps:rotation (--model mf only: Orion's rotation schedule, `--mf-schedule rotation`; no bound:
//               its workers meet at every sub-epoch; docs/orion.md)
//   consensus:RULE  (RULE: the backup rule, consensus/backup_rule.h: wait-all, static:B,
//               deadline:Q, dynamic[:...])
node::Result<VariantSpec> singleVariant(std::optional<std::string_view> args);
node::Result<VariantSpec> psVariant(std::optional<std::string_view> args);
node::Result<VariantSpec> consensusVariant(std::optional<std::string_view> args);
// Their forms, as --help and the errors list them.
std::string singleVariantForms();
std::string psVariantForms();
std::string consensusVariantForms();

}  // namespace chorus::modes
