#include "sampling/access_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>

namespace chorus::sampling {

namespace {
constexpr size_t kSketchDepth = 4;
}  // namespace

AccessCounts::AccessCounts(uint64_t keySpace, uint64_t exactBudgetBytes) : keySpace_(keySpace) {
  if (keySpace <= exactBudgetBytes / sizeof(uint64_t)) {
    exact_.assign(keySpace, 0);
  } else {
    const uint64_t width =
        std::max<uint64_t>(1, exactBudgetBytes / sizeof(uint64_t) / kSketchDepth);
    sketch_.emplace(width, kSketchDepth);
  }
}

void AccessCounts::add(Key key, uint64_t count) {
  if (key >= keySpace_) {
    throw std::out_of_range("key " + std::to_string(key) + " outside the key space of " +
                            std::to_string(keySpace_));
  }
  total_ += count;
  if (sketch_) {
    sketch_->add(key, count);
  } else {
    exact_[key] += count;
  }
}

uint64_t AccessCounts::count(Key key) const {
  if (key >= keySpace_) return 0;
  return sketch_ ? sketch_->estimate(key) : exact_[key];
}

std::vector<uint64_t> AccessCounts::dense() const {
  if (!sketch_) return exact_;
  std::vector<uint64_t> out(keySpace_);
  for (Key k = 0; k < keySpace_; ++k)
    out[k] = sketch_->estimate(k);
  return out;
}

std::vector<double> expectedAccesses(std::span<const uint64_t> counts, std::span<const double> pi,
                                     double drawsPerPoint, double dataPoints) {
  if (!pi.empty() && pi.size() != counts.size()) {
    throw std::invalid_argument("the sampling distribution has " + std::to_string(pi.size()) +
                                " keys, the counts " + std::to_string(counts.size()));
  }
  if (!(drawsPerPoint >= 0.0) || !(dataPoints >= 0.0)) {
    throw std::invalid_argument("draws per data point and data points must be >= 0");
  }
  const double draws = drawsPerPoint * dataPoints;
  std::vector<double> out(counts.size());
  for (size_t k = 0; k < counts.size(); ++k) {
    out[k] = static_cast<double>(counts[k]) + (pi.empty() ? 0.0 : draws * pi[k]);
  }
  return out;
}

std::vector<double> asAccesses(std::span<const uint64_t> counts) {
  return {counts.begin(), counts.end()};
}

namespace {

// Keys by accesses, most first, ties by key.
std::vector<Key> ranked(std::span<const double> accesses, size_t take) {
  std::vector<Key> keys(accesses.size());
  std::iota(keys.begin(), keys.end(), Key{0});
  take = std::min(take, keys.size());
  auto before = [&](Key a, Key b) {
    return accesses[a] != accesses[b] ? accesses[a] > accesses[b] : a < b;
  };
  std::partial_sort(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(take), keys.end(),
                    before);
  keys.resize(take);
  return keys;
}

double sum(std::span<const double> values) {
  return std::accumulate(values.begin(), values.end(), 0.0);
}

}  // namespace

HotSetChoice chooseHotSet(std::span<const double> accesses, uint64_t bytesPerKey,
                          uint64_t budgetBytes) {
  const uint64_t fit = bytesPerKey == 0 ? accesses.size() : budgetBytes / bytesPerKey;
  HotSetChoice choice;
  choice.keys = ranked(accesses, static_cast<size_t>(std::min<uint64_t>(fit, accesses.size())));
  // Keys never accessed gain nothing from being hot.
  while (!choice.keys.empty() && !(accesses[choice.keys.back()] > 0.0))
    choice.keys.pop_back();
  choice.share = hotSetShare(accesses, choice.keys);
  return choice;
}

double hotSetShare(std::span<const double> accesses, std::span<const Key> keys) {
  const double total = sum(accesses);
  if (!(total > 0.0)) return 0.0;
  std::vector<Key> unique(keys.begin(), keys.end());
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  double hot = 0.0;
  for (Key k : unique) {
    if (k < accesses.size()) hot += accesses[k];
  }
  return std::min(1.0, hot / total);
}

SkewSummary skewSummary(std::span<const double> accesses) {
  SkewSummary s;
  s.keys = accesses.size();
  s.accesses = sum(accesses);
  for (double a : accesses)
    s.accessedKeys += a > 0.0;
  if (s.keys == 0 || !(s.accesses > 0.0)) return s;
  auto topCount = [&](double fraction) {
    return std::max<size_t>(1,
                            static_cast<size_t>(std::ceil(fraction * static_cast<double>(s.keys))));
  };
  // One partial sort up to the top 10%; the smaller heads are its prefixes.
  std::vector<double> sorted(accesses.begin(), accesses.end());
  const size_t top10 = topCount(0.1);
  std::partial_sort(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(top10),
                    sorted.end(), std::greater<>());
  auto share = [&](size_t n) {
    return std::accumulate(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(n), 0.0) /
           s.accesses;
  };
  s.top0_1 = share(topCount(0.001));
  s.top1 = share(topCount(0.01));
  s.top10 = share(top10);
  return s;
}

std::string formatSkew(std::string_view table, const SkewSummary& s) {
  char text[320];
  std::snprintf(text, sizeof text,
                "%.*s: %llu keys (%llu accessed), %.4g accesses; top 0.1%% of keys take %.1f%%, "
                "top 1%% %.1f%%, top 10%% %.1f%%",
                static_cast<int>(table.size()), table.data(),
                static_cast<unsigned long long>(s.keys),
                static_cast<unsigned long long>(s.accessedKeys), s.accesses, 100.0 * s.top0_1,
                100.0 * s.top1, 100.0 * s.top10);
  return text;
}

}  // namespace chorus::sampling
