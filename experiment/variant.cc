#include "experiment/variant.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>

#include "modes/registry.h"

namespace chorus::experiment {
namespace {

bool isFlag(std::string_view flag, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), flag) != names.end();
}

}  // namespace

std::string variantForms() {
  return modes::variantForms();
}

node::Result<Variant> Variant::read(std::string_view text) {
  const size_t colon = text.find(':');
  const std::string_view mode_name = text.substr(0, colon);
  const std::optional<std::string_view> args =
      colon == std::string_view::npos ? std::nullopt
                                      : std::optional<std::string_view>(text.substr(colon + 1));
  const modes::Mode* mode = modes::findMode(mode_name);
  if (mode == nullptr || mode->parse_variant == nullptr) {
    return node::invalidInput(
        fmt::format("unknown variant '{}'{}; expected one of: {}", text,
                    mode == nullptr ? "" : fmt::format(" (mode {} has no variants)", mode->name),
                    variantForms()));
  }
  Variant v;
  v.name = std::string(text);
  v.mode = std::string(mode->name);
  node::Result<modes::VariantSpec> spec = mode->parse_variant(args);
  if (!spec.ok()) {
    return node::invalidInput(fmt::format("unknown variant '{}': {}; expected one of: {}", text,
                                          spec.message(), variantForms()));
  }
  v.spec = std::move(spec).value();
  return v;
}

std::vector<std::string> Variant::modeArgs() const {
  std::vector<std::string> args;
  for (const auto& [flag, value] : spec.settings) {
    args.push_back(flag);
    args.push_back(value);
  }
  return args;
}

std::optional<std::string> Variant::setting(std::string_view flag) const {
  for (const auto& [name, value] : spec.settings) {
    if (name == flag) return value;
  }
  return std::nullopt;
}

bool Variant::inScope(std::string_view scope) const {
  return scope.empty() ||
         std::find(spec.scopes.begin(), spec.scopes.end(), scope) != spec.scopes.end();
}

std::string Variant::dirName() const {
  std::string dir = name;
  std::replace(dir.begin(), dir.end(), ':', '-');
  return dir;
}

node::Result<std::vector<Variant>> readVariantList(std::string_view text) {
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
      return node::invalidInput(
          fmt::format("--variants '{}': empty entry; give a comma-separated list such as "
                      "single,ps:bsp,consensus:dynamic",
                      text));
    }
    node::Result<Variant> v = Variant::read(item);
    if (!v.ok()) return v.status();
    if (!seen.insert(v->name).second) {
      return node::invalidInput(
          fmt::format("--variants: '{}' is named twice; name each variant once", item));
    }
    variants.push_back(std::move(v).value());
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
    // --staleness is a PS variant's name's, and an option of the variants that set none.
    const bool own_staleness = option.flag == "--staleness" && option.scope.empty();
    if (own_staleness || isFlag(option.flag, {"--seed", "--out", "--rounds", "--eval-every",
                                              "--mode", "--backup", "--rejoin", "--technique"})) {
      throw std::logic_error("nodeArgs: " + option.flag + " is set per run, not forwarded");
    }
    if (!variant.inScope(option.scope)) continue;
    if (variant.setting(option.flag)) {
      throw std::logic_error("nodeArgs: " + option.flag + " is set by the variant " + variant.name +
                             ", not forwarded");
    }
    args.push_back(option.flag);
    args.insert(args.end(), option.values.begin(), option.values.end());
  }
  if (!budget.sparse) {
    const int64_t scale = variant.alone() ? std::max(budget.nodes, 1) : 1;
    if (budget.rounds > 0) {
      args.push_back("--rounds");
      args.push_back(std::to_string(budget.rounds * scale));
    }
    args.push_back("--eval-every");
    args.push_back(std::to_string(budget.eval_every * scale));
  }
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
