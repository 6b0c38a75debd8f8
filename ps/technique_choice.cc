#include "ps/technique_choice.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace chorus::ps {

namespace {

// Replicate when at least kSeveralNodes nodes each touch the key in a window with probability
// kLikely or more. "Several" is two: one is relocation's case.
constexpr size_t kSeveralNodes = 2;
constexpr double kLikely = 0.5;
// One node's share of a key's accesses above kMostAccesses: relocate to it.
constexpr double kMostAccesses = 0.5;

struct Shared {
  double users;
  double accesses;
  bool majority;  // one node makes most of its accesses
  Key key;
  uint64_t bytes;
};

void checkShapes(const KeySpace& space, std::span<const NodeAccesses> nodes,
                 const TechniqueChoiceOptions& options) {
  if (nodes.empty()) throw std::invalid_argument("auto: no node's expected accesses");
  if (options.clocks_per_epoch <= 0 || !(options.window_clocks > 0)) {
    throw std::invalid_argument(fmt::format("auto: {} clocks per epoch, window of {} clocks",
                                            options.clocks_per_epoch, options.window_clocks));
  }
  const auto& tables = space.tables();
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (nodes[n].size() != tables.size()) {
      throw std::invalid_argument(
          fmt::format("auto: node {}'s access counts for {} tables, the key space has {}", n,
                      nodes[n].size(), tables.size()));
    }
    for (size_t t = 0; t < tables.size(); ++t) {
      if (!nodes[n][t].empty() && nodes[n][t].size() != tables[t].rows) {
        throw std::invalid_argument(fmt::format("auto: table {} has {} rows, node {}'s counts {}",
                                                tables[t].name, tables[t].rows, n,
                                                nodes[n][t].size()));
      }
    }
  }
}

}  // namespace

double expectedUsers(std::span<const double> lambdas) {
  double users = 0;
  for (double lambda : lambdas) {
    if (lambda > 0) users += -std::expm1(-lambda);
  }
  return users;
}

double autoWindowClocks(double syncs_per_second, double steps_per_second, int64_t total_clocks) {
  if (!(syncs_per_second > 0)) return static_cast<double>(std::max<int64_t>(total_clocks, 1));
  return std::max(1.0, steps_per_second / syncs_per_second);
}

TechniqueChoice chooseTechniques(const KeySpace& space, std::span<const NodeAccesses> nodes,
                                 const TechniqueChoiceOptions& options) {
  checkShapes(space, nodes, options);
  const double per_window = options.window_clocks / static_cast<double>(options.clocks_per_epoch);
  TechniqueChoice choice;
  choice.window_clocks = options.window_clocks;
  std::vector<Shared> shared;
  std::vector<double> lambdas(nodes.size());
  double relocated = 0, home = 0;
  const auto& tables = space.tables();
  for (size_t t = 0; t < tables.size(); ++t) {
    const KeyTable& table = tables[t];
    for (size_t row = 0; row < table.rows; ++row) {
      double total = 0, most = 0;
      size_t likely = 0;  // nodes that touch the key in a window more likely than not
      for (size_t n = 0; n < nodes.size(); ++n) {
        const TableAccesses& counts = nodes[n][t];
        const double accesses = counts.empty() ? 0.0 : std::max(0.0, counts[row]);
        lambdas[n] = accesses * per_window;
        if (-std::expm1(-lambdas[n]) >= kLikely) ++likely;
        total += accesses;
        most = std::max(most, accesses);
      }
      const Key key = table.first + row;
      const bool majority = total > 0 && most > kMostAccesses * total;
      if (total > 0 && likely >= kSeveralNodes) {
        shared.push_back(Shared{expectedUsers(lambdas), total, majority, key,
                                table.length(key) * options.bytes_per_float});
      } else if (majority) {
        choice.relocated.push_back(key);
        relocated += total;
      } else {
        home += total;
      }
    }
  }
  // The most shared first (ties: more accesses, then the lower key: the same on every node).
  std::sort(shared.begin(), shared.end(), [](const Shared& a, const Shared& b) {
    if (a.users != b.users) return a.users > b.users;
    if (a.accesses != b.accesses) return a.accesses > b.accesses;
    return a.key < b.key;
  });
  double replicated = 0;
  for (const Shared& s : shared) {
    if (choice.replica_bytes + s.bytes <= options.budget_bytes) {
      choice.replicated.push_back(s.key);
      choice.replica_bytes += s.bytes;
      replicated += s.accesses;
    } else {
      // Over the cap: the other two rules decide.
      ++choice.over_budget;
      if (s.majority) {
        choice.relocated.push_back(s.key);
        relocated += s.accesses;
      } else {
        home += s.accesses;
      }
    }
  }
  std::sort(choice.replicated.begin(), choice.replicated.end());
  std::sort(choice.relocated.begin(), choice.relocated.end());
  choice.home = space.numKeys() - choice.replicated.size() - choice.relocated.size();
  const double all = replicated + relocated + home;
  if (all > 0) {
    choice.replicated_share = replicated / all;
    choice.relocated_share = relocated / all;
    choice.home_share = home / all;
  }
  return choice;
}

std::string formatTechniqueChoice(const TechniqueChoice& choice) {
  std::string line = fmt::format(
      "auto: {} keys replicated ({:.1f} MiB per node, {:.1f}% of expected accesses), {} "
      "relocated ({:.1f}%), {} at their homes ({:.1f}%); window {:.1f} clocks",
      choice.replicated.size(), static_cast<double>(choice.replica_bytes) / (1 << 20),
      100 * choice.replicated_share, choice.relocated.size(), 100 * choice.relocated_share,
      choice.home, 100 * choice.home_share, choice.window_clocks);
  if (choice.over_budget > 0) {
    line += fmt::format(
        "; {} shared keys over the replicas' memory cap (--replica-bytes) not "
        "replicated",
        choice.over_budget);
  }
  return line;
}

}  // namespace chorus::ps
