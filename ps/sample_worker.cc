#include "ps/sample_worker.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "ps/kv_worker.h"

namespace chorus::ps {

namespace {

// Refuses a distribution whose keys the PS does not hold as one table (KvWorker would throw on
// the first draw instead, far from the cause).
const sampling::NegativeSampler& checkedPi(const sampling::NegativeSampler& pi,
                                           const KeySpace& space) {
  const KeyTable* first = space.tableOf(pi.first());
  if (pi.end() <= pi.first() || first == nullptr || first != space.tableOf(pi.end() - 1)) {
    throw std::invalid_argument(fmt::format(
        "the sampling distribution draws keys [{}, {}), which are not one table of the PS key "
        "space; sample from one embedding table",
        pi.first(), pi.end()));
  }
  return pi;
}

}  // namespace

sampling::LocalityOracle ownedHere(const KeyDirectory& directory, NodeId self) {
  return [&directory, self](Key key) { return directory.owner(key) == self; };
}

SampleWorker::SampleWorker(KvWorker& worker, const KeySpace& space,
                           const sampling::NegativeSampler& pi,
                           sampling::SampleSchemeOptions options, uint64_t seed,
                           sampling::LocalityOracle local, KeyLocalizer& localizer)
    : worker_(worker),
      space_(space),
      localizer_(localizer),
      options_(options),
      scheme_(checkedPi(pi, space), options, seed, std::move(local)) {}

sampling::SampleId SampleWorker::prepareSample(size_t n) {
  sampling::PreparedSample prepared;
  {
    std::lock_guard lock(mu_);
    prepared = scheme_.prepare(n);
  }
  if (!prepared.localize.empty()) {
    {
      std::lock_guard lock(localize_counts_->mu);
      ++localize_counts_->requests;
    }
    localizer_.localize(prepared.localize, [counts = localize_counts_](const node::Status& s) {
      if (s.ok()) return;
      std::lock_guard lock(counts->mu);
      ++counts->failed;
    });
  }
  return prepared.id;
}

node::Status SampleWorker::pullSample(sampling::SampleId id, size_t k, SampleBatch& out) {
  sampling::SampleKeys drawn;
  {
    std::lock_guard lock(mu_);
    drawn = scheme_.pull(id, k);
    remote_keys_ += drawn.remote.size();
  }
  out.keys = std::move(drawn.keys);
  out.values.clear();
  out.offsets.clear();
  if (drawn.error) return {node::ErrorCode::kInvalidArgument, *drawn.error};
  if (out.keys.empty()) return {};

  // KvWorker reads sorted, unique keys: read each distinct key once, then lay the values out
  // in sample order.
  std::vector<Key> distinct = out.keys;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::vector<float> read(space_.floatsOf(distinct));
  node::Status status = worker_.wait(worker_.pull(distinct, read));
  if (!status.ok()) return status;
  std::vector<size_t> at(distinct.size());
  for (size_t i = 1; i < distinct.size(); ++i)
    at[i] = at[i - 1] + space_.length(distinct[i - 1]);
  out.offsets.reserve(out.keys.size());
  for (Key key : out.keys) {
    const size_t d = static_cast<size_t>(std::lower_bound(distinct.begin(), distinct.end(), key) -
                                         distinct.begin());
    out.offsets.push_back(out.values.size());
    const auto row = read.begin() + static_cast<std::ptrdiff_t>(at[d]);
    out.values.insert(out.values.end(), row, row + static_cast<std::ptrdiff_t>(space_.length(key)));
  }
  return {};
}

void SampleWorker::finishSample(sampling::SampleId id) {
  std::lock_guard lock(mu_);
  scheme_.finish(id);
}

SampleWorkerStats SampleWorker::stats() const {
  SampleWorkerStats s;
  {
    std::lock_guard lock(mu_);
    s.scheme = scheme_.stats();
    s.remote_keys = remote_keys_;
  }
  std::lock_guard lock(localize_counts_->mu);
  s.localize_requests = localize_counts_->requests;
  s.localize_failed = localize_counts_->failed;
  return s;
}

}  // namespace chorus::ps
