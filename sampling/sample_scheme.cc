#include "sampling/sample_scheme.h"

#include <algorithm>
#include <stdexcept>

namespace chorus::sampling {

namespace {

constexpr struct {
  SampleSchemeKind kind;
  const char* name;
} kSchemeNames[] = {
    {SampleSchemeKind::kNaive, "naive"},         {SampleSchemeKind::kPreloc, "preloc"},
    {SampleSchemeKind::kPool, "pool"},           {SampleSchemeKind::kPostpone, "postpone"},
    {SampleSchemeKind::kOnlyLocal, "onlylocal"},
};

// NuPS's untuned setting, the default reuse of pool and postpone.
constexpr int64_t kDefaultPoolReuse = 16;

}  // namespace

const char* sampleSchemeName(SampleSchemeKind kind) {
  for (const auto& entry : kSchemeNames) {
    if (entry.kind == kind) return entry.name;
  }
  return "unknown";
}

std::optional<SampleSchemeKind> parseSampleScheme(std::string_view name) {
  for (const auto& entry : kSchemeNames) {
    if (name == entry.name) return entry.kind;
  }
  return std::nullopt;
}

std::optional<std::string> checkSampleOptions(const SampleSchemeOptions& options) {
  if (options.reuse == 0) return "the sample reuse must be at least 1 (1: every draw once)";
  if (options.group_size == 0) return "the sample group size must be at least 1";
  if (options.max_draws_per_key == 0) return "onlylocal's draws per key must be at least 1";
  return std::nullopt;
}

std::optional<std::string> sampleOptionsFromFlags(std::string_view scheme,
                                                  std::optional<int64_t> reuse,
                                                  SampleSchemeOptions& out) {
  const std::optional<SampleSchemeKind> kind = parseSampleScheme(scheme);
  if (!kind) {
    return "--sample-scheme must be naive, preloc, pool, postpone or onlylocal, not '" +
           std::string(scheme) + "'";
  }
  const bool reuses = *kind == SampleSchemeKind::kPool || *kind == SampleSchemeKind::kPostpone;
  if (reuse && !reuses) {
    return std::string("--sample-reuse applies to --sample-scheme pool and postpone, not ") +
           sampleSchemeName(*kind);
  }
  if (reuse && (*reuse < 1 || *reuse > 1'000'000)) {
    return "--sample-reuse must be in [1, 1000000] (1: every draw used once), not " +
           std::to_string(*reuse);
  }
  SampleSchemeOptions options = out;
  options.kind = *kind;
  options.reuse = reuses ? static_cast<uint32_t>(reuse.value_or(kDefaultPoolReuse)) : 1;
  out = options;
  return std::nullopt;
}

size_t poolGroupSize(size_t sample_keys, const SampleSchemeOptions& options) {
  if (options.kind != SampleSchemeKind::kPool && options.kind != SampleSchemeKind::kPostpone) {
    return options.group_size;
  }
  // sample_keys * reuse without overflow: capped at kMaxPoolGroup anyway.
  const size_t spans = sample_keys > kMaxPoolGroup / std::max<uint32_t>(options.reuse, 1)
                           ? kMaxPoolGroup
                           : sample_keys * options.reuse;
  return std::max(options.group_size, std::min(spans, kMaxPoolGroup));
}

SampleScheme::SampleScheme(const NegativeSampler& pi, SampleSchemeOptions options, uint64_t seed,
                           LocalityOracle local)
    : pi_(&pi), options_(options), rng_(seed), local_(std::move(local)) {
  if (auto error = checkSampleOptions(options_)) throw std::invalid_argument(*error);
  if (!local_) throw std::invalid_argument("a sample scheme needs a locality oracle");
}

Key SampleScheme::draw() {
  ++stats_.drawn;
  return (*pi_)(rng_);
}

void SampleScheme::shuffle(std::vector<Key>& keys) {
  for (size_t i = keys.size(); i > 1; --i) {
    std::swap(keys[i - 1], keys[uniformBelow(rng_, i)]);
  }
}

std::vector<Key> SampleScheme::notLocal(const std::vector<Key>& keys) const {
  std::vector<Key> out;
  for (Key k : keys) {
    if (!local_(k)) out.push_back(k);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void SampleScheme::fillPool(size_t n, std::vector<Key>& drawn) {
  const size_t per_group = options_.group_size * options_.reuse;
  const size_t target = n + options_.groups_ahead * per_group;
  std::vector<Key> group(options_.group_size);
  while (pool_.size() < target) {
    for (Key& k : group)
      k = draw();
    drawn.insert(drawn.end(), group.begin(), group.end());
    // Each hand-out of the group is a fresh permutation: every position of the pool is then a
    // uniformly chosen member of an i.i.d. group, i.e. marginally pi.
    for (uint32_t use = 0; use < options_.reuse; ++use) {
      std::vector<Key> order = group;
      shuffle(order);
      pool_.insert(pool_.end(), order.begin(), order.end());
    }
  }
}

PreparedSample SampleScheme::prepare(size_t n) {
  if (n == 0) throw std::invalid_argument("prepareSample needs at least one key");
  PreparedSample prepared;
  prepared.id = next_id_++;
  Sample sample;
  sample.left = n;
  switch (options_.kind) {
    case SampleSchemeKind::kNaive:
    case SampleSchemeKind::kOnlyLocal:
      break;
    case SampleSchemeKind::kPreloc:
      sample.keys.resize(n);
      for (Key& k : sample.keys)
        k = draw();
      prepared.localize = notLocal(sample.keys);
      break;
    case SampleSchemeKind::kPool:
    case SampleSchemeKind::kPostpone: {
      std::vector<Key> drawn;
      fillPool(n, drawn);
      sample.keys.assign(pool_.begin(), pool_.begin() + static_cast<std::ptrdiff_t>(n));
      pool_.erase(pool_.begin(), pool_.begin() + static_cast<std::ptrdiff_t>(n));
      // The sample's own keys too: a key localized with its group may have moved away since.
      drawn.insert(drawn.end(), sample.keys.begin(), sample.keys.end());
      prepared.localize = notLocal(drawn);
      break;
    }
  }
  stats_.localize += prepared.localize.size();
  ++stats_.prepared;
  samples_.emplace(prepared.id, std::move(sample));
  return prepared;
}

Key SampleScheme::nextPostponed(Sample& sample) {
  while (sample.next < sample.keys.size()) {
    const Key k = sample.keys[sample.next++];
    if (local_(k)) return k;
    sample.delayed.push_back(k);
    ++stats_.postponed;
  }
  // Every key left was not local at its turn: they come in the order they were moved.
  const Key k = sample.delayed.front();
  sample.delayed.pop_front();
  return k;
}

SampleKeys SampleScheme::pull(SampleId id, size_t k) {
  auto it = samples_.find(id);
  if (it == samples_.end()) {
    throw std::invalid_argument("pullSample of sample " + std::to_string(id) +
                                ", which was never prepared or has ended");
  }
  Sample& sample = it->second;
  if (k > sample.left) {
    throw std::invalid_argument("pullSample of " + std::to_string(k) + " keys from sample " +
                                std::to_string(id) + ", which has " + std::to_string(sample.left) +
                                " left");
  }
  SampleKeys out;
  out.keys.reserve(k);
  switch (options_.kind) {
    case SampleSchemeKind::kNaive:
      for (size_t i = 0; i < k; ++i)
        out.keys.push_back(draw());
      break;
    case SampleSchemeKind::kPreloc:
    case SampleSchemeKind::kPool:
      out.keys.assign(sample.keys.begin() + static_cast<std::ptrdiff_t>(sample.next),
                      sample.keys.begin() + static_cast<std::ptrdiff_t>(sample.next + k));
      sample.next += k;
      break;
    case SampleSchemeKind::kPostpone:
      for (size_t i = 0; i < k; ++i)
        out.keys.push_back(nextPostponed(sample));
      break;
    case SampleSchemeKind::kOnlyLocal:
      for (size_t i = 0; i < k && !out.error; ++i) {
        bool found = false;
        Key key = 0;
        for (uint64_t tries = 0; tries < options_.max_draws_per_key && !found; ++tries) {
          key = draw();
          found = local_(key);
        }
        if (found) {
          out.keys.push_back(key);
        } else {
          out.error = "onlylocal drew " + std::to_string(options_.max_draws_per_key) +
                      " keys from pi and none was local: this node holds (almost) none of the "
                      "sampling distribution's keys; use --sample-scheme pool or postpone";
        }
      }
      break;
  }
  if (options_.kind != SampleSchemeKind::kOnlyLocal) out.remote = notLocal(out.keys);
  stats_.handed_out += out.keys.size();
  for (Key key : out.keys) {
    // A key counts as local unless it is among the remote ones (sorted).
    if (!std::binary_search(out.remote.begin(), out.remote.end(), key)) ++stats_.local;
  }
  sample.left -= k;
  if (sample.left == 0 || out.error) samples_.erase(it);
  return out;
}

void SampleScheme::finish(SampleId id) {
  samples_.erase(id);
}

size_t SampleScheme::remaining(SampleId id) const {
  auto it = samples_.find(id);
  return it == samples_.end() ? 0 : it->second.left;
}

}  // namespace chorus::sampling
