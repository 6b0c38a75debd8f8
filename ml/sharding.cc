#include "ml/sharding.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numeric>

#include "ml/rng.h"

namespace chorus::ml {

Shards shardIid(size_t n, int nodes, uint64_t seed) {
  assert(nodes > 0);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  Rng rng(mixSeed(seed, 0x5A4D));
  rng.shuffle(order.begin(), order.end());
  Shards shards(static_cast<size_t>(nodes));
  const size_t base = n / static_cast<size_t>(nodes);
  const size_t extra = n % static_cast<size_t>(nodes);
  size_t start = 0;
  for (size_t node = 0; node < shards.size(); ++node) {
    const size_t count = base + (node < extra ? 1 : 0);
    shards[node].assign(order.begin() + static_cast<std::ptrdiff_t>(start),
                        order.begin() + static_cast<std::ptrdiff_t>(start + count));
    std::sort(shards[node].begin(), shards[node].end());
    start += count;
  }
  return shards;
}

Shards shardDirichlet(std::span<const int32_t> labels, int classes, int nodes, double alpha,
                      uint64_t seed) {
  assert(nodes > 0 && classes > 0 && alpha > 0.0 && std::isfinite(alpha));
  Rng rng(mixSeed(seed, 0xD1C1));
  std::vector<std::vector<size_t>> byClass(static_cast<size_t>(classes));
  for (size_t i = 0; i < labels.size(); ++i) {
    assert(labels[i] >= 0 && labels[i] < classes);
    byClass[static_cast<size_t>(labels[i])].push_back(i);
  }
  Shards shards(static_cast<size_t>(nodes));
  std::vector<double> share(static_cast<size_t>(nodes));
  for (auto& members : byClass) {
    rng.shuffle(members.begin(), members.end());
    for (auto& s : share)
      s = rng.gamma(alpha);
    // Proportions relative to the largest draw: draws near a huge alpha sum to infinity (and
    // the cut points became NaN), tiny ones can be subnormal. Scaled, the sum is in [1, nodes].
    const double largest = *std::max_element(share.begin(), share.end());
    double total = 0.0;
    if (largest > 0.0) {
      for (auto& s : share) {
        s /= largest;
        total += s;
      }
    } else {  // every draw underflowed (tiny alpha): give the class to one node
      std::fill(share.begin(), share.end(), 0.0);
      share[rng.below(share.size())] = 1.0;
      total = 1.0;
    }
    // Cut points from the cumulative proportions, rounded, so the parts cover the class.
    double cumulative = 0.0;
    size_t start = 0;
    for (size_t node = 0; node < shards.size(); ++node) {
      cumulative += share[node];
      const size_t end =
          node + 1 == shards.size()
              ? members.size()
              : std::min(members.size(),
                         static_cast<size_t>(std::llround(cumulative / total * members.size())));
      for (size_t k = start; k < end; ++k)
        shards[node].push_back(members[k]);
      start = std::max(start, end);
    }
  }
  for (auto& shard : shards) {
    if (!shard.empty()) continue;
    auto largest = std::max_element(shards.begin(), shards.end(), [](const auto& a, const auto& b) {
      return a.size() < b.size();
    });
    if (largest->size() <= 1) break;
    shard.push_back(largest->back());
    largest->pop_back();
  }
  for (auto& shard : shards)
    std::sort(shard.begin(), shard.end());
  return shards;
}

double labelSkew(const Shards& shards, std::span<const int32_t> labels, int classes) {
  std::vector<double> global(static_cast<size_t>(classes), 0.0);
  for (int32_t label : labels)
    global[static_cast<size_t>(label)] += 1.0;
  for (auto& g : global)
    g /= std::max<double>(1.0, static_cast<double>(labels.size()));
  double sum = 0.0;
  int counted = 0;
  std::vector<double> local(static_cast<size_t>(classes));
  for (const auto& shard : shards) {
    if (shard.empty()) continue;
    std::fill(local.begin(), local.end(), 0.0);
    for (size_t index : shard)
      local[static_cast<size_t>(labels[index])] += 1.0;
    double distance = 0.0;
    for (size_t c = 0; c < local.size(); ++c) {
      distance += std::abs(local[c] / static_cast<double>(shard.size()) - global[c]);
    }
    sum += 0.5 * distance;
    ++counted;
  }
  return counted == 0 ? 0.0 : sum / counted;
}

}  // namespace chorus::ml
