#include "modes/variants.h"

#include <fmt/format.h>

#include <algorithm>

#include "consensus/backup_rule.h"
#include "run/staleness_bound.h"

namespace chorus::modes {
namespace {

// "a, b or c".
std::string orList(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

// BOUND of ps:BOUND or ps:TECHNIQUE:BOUND: bsp, ssp:N or async (run::StalenessBound's variant
// grammar; its other spellings, "3" or "inf", are the flag's, not a variant's).
node::Result<run::StalenessBound> parseBound(std::string_view bound) {
  if (bound != "bsp" && bound != "async" && !bound.starts_with("ssp:")) {
    return node::invalidInput(
        fmt::format("'{}' is neither a staleness bound (bsp, ssp:N, async) nor a technique ({}) "
                    "nor rotation",
                    bound, orList(psTechniqueNames())));
  }
  node::Result<run::StalenessBound> read = run::StalenessBound::read(bound);
  if (!read.ok())
    return node::invalidInput("the staleness bound N of ssp:N must be an integer >= 0");
  return read;
}

}  // namespace

const std::vector<std::string>& psTechniqueNames() {
  static const std::vector<std::string> names = {"classic", "lapse", "nups", "auto"};
  return names;
}

node::Result<VariantSpec> singleVariant(std::optional<std::string_view> args) {
  if (args) return node::invalidInput("single takes no arguments");
  VariantSpec spec;
  spec.alone = true;
  return spec;
}

node::Result<VariantSpec> psVariant(std::optional<std::string_view> args) {
  if (!args || args->empty()) {
    return node::invalidInput("ps needs a staleness bound or a technique");
  }
  VariantSpec spec;
  spec.settings.emplace_back("--mode", "ps");
  spec.scopes.emplace_back("ps");
  if (*args == "rotation" || args->starts_with("rotation:")) {
    if (*args != "rotation") {
      return node::invalidInput(
          "ps:rotation takes no bound: its workers meet at every sub-epoch and share no row "
          "within one (docs/orion.md)");
    }
    // Rotation moves its column blocks by relocation: the nodes run it with --technique lapse.
    spec.settings.emplace_back("--mf-schedule", "rotation");
    spec.family = ModelFamily::kMf;
    spec.family_reason =
        "rotation is Orion's schedule of a rating matrix's row and column blocks (--model mf)";
    return spec;
  }
  std::string_view rest = *args;
  const std::string first(rest.substr(0, rest.find(':')));
  std::optional<std::string> technique;
  if (std::find(psTechniqueNames().begin(), psTechniqueNames().end(), first) !=
      psTechniqueNames().end()) {
    technique = first;
    rest.remove_prefix(std::min(rest.size(), first.size() + 1));
    if (first.size() == args->size() - 1) {
      return node::invalidInput(fmt::format("ps:{}: must be followed by a bound", first));
    }
  }
  if (!rest.empty() || !technique) {
    const node::Result<run::StalenessBound> bound = parseBound(rest);
    if (!bound.ok()) return bound.status();
    spec.settings.emplace_back("--staleness", bound->toString());
    if (bound->infinite()) spec.scopes.emplace_back(kPsAsyncScope);
  }
  if (technique) {
    spec.settings.emplace_back("--technique", *technique);
    spec.family = ModelFamily::kSparse;
    spec.family_reason =
        "a technique manages a sparse model's embedding rows (--model complex, distmult or mf)";
  }
  return spec;
}

node::Result<VariantSpec> consensusVariant(std::optional<std::string_view> args) {
  if (!args || args->empty()) return node::invalidInput("consensus needs a backup rule");
  // The error names the rules.
  if (node::Result<consensus::BackupRuleSpec> rule = consensus::BackupRuleSpec::read(*args);
      !rule.ok()) {
    return rule.status();
  }
  VariantSpec spec;
  spec.settings.emplace_back("--mode", "consensus");
  spec.settings.emplace_back("--backup", std::string(*args));
  spec.scopes.emplace_back("consensus");
  return spec;
}

std::string singleVariantForms() {
  return "single";
}

std::string psVariantForms() {
  return fmt::format(
      "ps:bsp, ps:ssp:N (N >= 0), ps:async, ps:TECHNIQUE[:BOUND] (sparse models; TECHNIQUE: {}; "
      "BOUND as before), ps:rotation (--model mf: Orion's rotation schedule)",
      orList(psTechniqueNames()));
}

std::string consensusVariantForms() {
  return "consensus:RULE (RULE: wait-all, static:B, deadline:Q, dynamic)";
}

}  // namespace chorus::modes
