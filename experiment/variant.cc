#include "experiment/variant.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>

#include "consensus/backup_rule.h"

namespace chorus::experiment {
namespace {

constexpr std::string_view kAccepted =
    "single, ps:bsp, ps:ssp:N (N >= 0), ps:async, consensus:RULE (RULE: wait-all, static:B, "
    "deadline:Q, dynamic)";

[[noreturn]] void unknown(std::string_view text, std::string_view why) {
  throw std::invalid_argument(
      fmt::format("unknown variant '{}'{}; expected one of: {}", text, why, kAccepted));
}

bool isFlag(std::string_view flag, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), flag) != names.end();
}

}  // namespace

Variant Variant::parse(std::string_view text) {
  Variant v;
  v.name = std::string(text);
  if (text == "single") {
    v.kind = Kind::kSingle;
    return v;
  }
  // ps:bsp, ps:ssp:N, ps:async: the bound's own grammar (run::StalenessBound::variantName).
  constexpr std::string_view kPs = "ps:";
  if (text.starts_with(kPs)) {
    const std::string_view bound = text.substr(kPs.size());
    if (bound != "bsp" && bound != "async" && !bound.starts_with("ssp:")) unknown(text, "");
    try {
      v.staleness = run::StalenessBound::parse(bound);
    } catch (const std::invalid_argument&) {
      unknown(text, " (the staleness bound N must be an integer >= 0)");
    }
    v.kind = Kind::kPs;
    return v;
  }
  constexpr std::string_view kConsensus = "consensus:";
  if (text.starts_with(kConsensus)) {
    std::string_view rule = text.substr(kConsensus.size());
    try {
      consensus::BackupRule::parse(rule);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("variant '{}': {}", text, e.what()));
    }
    v.kind = Kind::kConsensus;
    v.backup = std::string(rule);
    return v;
  }
  unknown(text, "");
}

std::vector<std::string> Variant::modeArgs() const {
  switch (kind) {
    case Kind::kSingle:
      return {};
    case Kind::kPs:
      return {"--mode", "ps", "--staleness", staleness.toString()};
    case Kind::kConsensus:
      return {"--mode", "consensus", "--backup", backup};
  }
  return {};
}

std::string Variant::dirName() const {
  std::string dir = name;
  std::replace(dir.begin(), dir.end(), ':', '-');
  return dir;
}

std::vector<Variant> parseVariantList(std::string_view text) {
  std::vector<Variant> variants;
  std::set<std::string> seen;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(start, comma - start);
    while (!item.empty() && item.front() == ' ')
      item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ')
      item.remove_suffix(1);
    if (item.empty()) {
      throw std::invalid_argument(
          fmt::format("--variants '{}': empty entry; give a comma-separated list such as "
                      "single,ps:bsp,consensus:dynamic",
                      text));
    }
    Variant v = Variant::parse(item);
    if (!seen.insert(v.name).second) {
      throw std::invalid_argument(fmt::format("--variants: '{}' is named twice", item));
    }
    variants.push_back(std::move(v));
    start = comma + 1;
  }
  return variants;
}

std::vector<std::string> nodeArgs(const Variant& variant,
                                  const std::vector<ForwardedOption>& forwarded,
                                  const RunBudget& budget, uint64_t seed,
                                  const std::string& out_dir) {
  std::vector<std::string> args = variant.modeArgs();
  for (const auto& option : forwarded) {
    // --staleness is the name's in PS mode, and an option of consensus mode.
    const bool own_staleness =
        option.flag == "--staleness" && option.scope != OptionScope::kConsensus;
    if (own_staleness || isFlag(option.flag, {"--seed", "--out", "--rounds", "--eval-every",
                                              "--mode", "--backup", "--rejoin"})) {
      throw std::logic_error("nodeArgs: " + option.flag + " is set per run, not forwarded");
    }
    const bool ps = variant.kind == Variant::Kind::kPs;
    if ((option.scope == OptionScope::kPs && !ps) ||
        (option.scope == OptionScope::kPsAsync && !(ps && variant.staleness.infinite())) ||
        (option.scope == OptionScope::kConsensus && variant.kind != Variant::Kind::kConsensus)) {
      continue;
    }
    args.push_back(option.flag);
    args.insert(args.end(), option.values.begin(), option.values.end());
  }
  const int64_t scale = variant.kind == Variant::Kind::kSingle ? std::max(budget.nodes, 1) : 1;
  if (budget.rounds > 0) {
    args.push_back("--rounds");
    args.push_back(std::to_string(budget.rounds * scale));
  }
  args.push_back("--eval-every");
  args.push_back(std::to_string(budget.eval_every * scale));
  args.push_back("--seed");
  args.push_back(std::to_string(seed));
  args.push_back("--out");
  args.push_back(out_dir);
  return args;
}

namespace {
std::string tomlString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}
}  // namespace

std::string singleTopology(std::string_view name, std::string_view address,
                           std::string_view stragglers) {
  std::string text = fmt::format(
      "# The single variant of chorus compare: one node training alone on the whole data set.\n"
      "[cluster]\nname = {}\nmode = \"consensus\"\n\n[[node]]\nid = 0\naddress = {}\n"
      "neighbors = []\n",
      tomlString(name), tomlString(address));
  if (!stragglers.empty()) text += fmt::format("stragglers = {}\n", tomlString(stragglers));
  return text;
}

std::string shellQuote(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& arg : argv) {
    if (!out.empty()) out.push_back(' ');
    const bool plain = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) ||
             std::string_view("-_./:=,+@%").find(c) != std::string_view::npos;
    });
    if (plain) {
      out += arg;
      continue;
    }
    out.push_back('\'');
    for (char c : arg) {
      if (c == '\'') {
        out += "'\\''";
      } else {
        out.push_back(c);
      }
    }
    out.push_back('\'');
  }
  return out;
}

}  // namespace chorus::experiment
