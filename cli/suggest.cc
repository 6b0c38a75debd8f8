#include "cli/suggest.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <numeric>

namespace chorus::cli {
namespace {

size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), size_t{0});
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::vector<std::string> flagNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames())
      names.push_back("--" + name);
  }
  return names;
}

std::vector<std::string> subcommandNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  return names;
}

}  // namespace

std::string nearestName(std::string_view word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = 3;
  for (const std::string& name : names) {
    const size_t d = editDistance(word, name);
    if (d < best_distance && d * 3 < std::max(word.size(), size_t{3}) + 3) {
      best = name;
      best_distance = d;
    }
  }
  return best;
}

std::string suggestFor(const CLI::App& app, const std::vector<std::string>& args) {
  const CLI::App* at = &app;
  bool positional_seen = false;
  for (const std::string& arg : args) {
    if (arg.starts_with("--")) {
      const std::string flag = arg.substr(0, arg.find('='));
      if (at->get_option_no_throw(flag) != nullptr) continue;
      const std::string near = nearestName(flag, flagNames(*at));
      if (!near.empty()) return fmt::format("did you mean {} (for {})?", near, flag);
      continue;
    }
    if (arg.starts_with("-") || positional_seen) continue;
    const auto subs = subcommandNames(*at);
    if (subs.empty()) {
      positional_seen = true;
      continue;
    }
    const auto named =
        at->get_subcommands([&](const CLI::App* sub) { return sub->check_name(arg); });
    if (!named.empty()) {
      at = named.front();
      continue;
    }
    const std::string near = nearestName(arg, subs);
    if (!near.empty()) return fmt::format("did you mean '{}' (for '{}')?", near, arg);
    positional_seen = true;
  }
  return {};
}

}  // namespace chorus::cli
