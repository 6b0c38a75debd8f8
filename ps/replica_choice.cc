#include "ps/replica_choice.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "sampling/access_stats.h"

namespace chorus::ps {

namespace {

struct Candidate {
  double accesses;
  Key key;
  uint64_t bytes;
};

// Every table's own most accessed keys that could be chosen (sampling::chooseHotSet within
// `budgetBytes` and `count`), merged: most accesses first, ties by key. A key chosen across
// tables is always among its own table's candidates, since its table's keys are taken in the
// table's own order.
std::vector<Candidate> candidates(const KeySpace& space, std::span<const TableAccesses> accesses,
                                  uint64_t bytesPerFloat, uint64_t budgetBytes, size_t count) {
  const auto& tables = space.tables();
  if (accesses.size() != tables.size()) {
    throw std::invalid_argument(fmt::format("access counts for {} tables, the key space has {}",
                                            accesses.size(), tables.size()));
  }
  std::vector<Candidate> out;
  for (size_t t = 0; t < tables.size(); ++t) {
    const KeyTable& table = tables[t];
    const TableAccesses& counts = accesses[t];
    if (counts.empty()) continue;
    if (counts.size() != table.rows) {
      throw std::invalid_argument(fmt::format("table {} has {} rows, its access counts {}",
                                              table.name, table.rows, counts.size()));
    }
    const uint64_t rowBytes = std::max<uint64_t>(1, table.row_floats * bytesPerFloat);
    const uint64_t fit = std::min<uint64_t>(budgetBytes / rowBytes, count);
    const sampling::HotSetChoice hot = sampling::chooseHotSet(counts, 1, fit);
    for (sampling::Key row : hot.keys) {
      const Key key = table.first + row;
      out.push_back(Candidate{counts[row], key, table.length(key) * bytesPerFloat});
    }
  }
  std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    return a.accesses != b.accesses ? a.accesses > b.accesses : a.key < b.key;
  });
  return out;
}

ReplicaChoice choose(const KeySpace& space, std::span<const TableAccesses> accesses,
                     uint64_t bytesPerFloat, uint64_t budgetBytes, size_t count) {
  ReplicaChoice choice;
  double hot = 0.0;
  for (const Candidate& c : candidates(space, accesses, bytesPerFloat, budgetBytes, count)) {
    if (choice.keys.size() == count || choice.bytes + c.bytes > budgetBytes) break;
    choice.keys.push_back(c.key);
    choice.bytes += c.bytes;
    hot += c.accesses;
  }
  std::sort(choice.keys.begin(), choice.keys.end());
  double total = 0.0;
  for (const TableAccesses& counts : accesses)
    total = std::accumulate(counts.begin(), counts.end(), total);
  choice.share = total > 0.0 ? std::min(1.0, hot / total) : 0.0;
  return choice;
}

}  // namespace

ReplicaChoice chooseReplicas(const KeySpace& space, std::span<const TableAccesses> accesses,
                             uint64_t bytesPerFloat, uint64_t budgetBytes) {
  return choose(space, accesses, bytesPerFloat, budgetBytes, std::numeric_limits<size_t>::max());
}

ReplicaChoice chooseTopReplicas(const KeySpace& space, std::span<const TableAccesses> accesses,
                                uint64_t bytesPerFloat, size_t count) {
  return choose(space, accesses, bytesPerFloat, std::numeric_limits<uint64_t>::max(), count);
}

std::string formatReplicaChoice(const ReplicaChoice& choice) {
  return fmt::format("replicating {} hot keys ({:.1f} MiB per node), {:.1f}% of expected accesses",
                     choice.keys.size(), static_cast<double>(choice.bytes) / (1 << 20),
                     100.0 * choice.share);
}

}  // namespace chorus::ps
