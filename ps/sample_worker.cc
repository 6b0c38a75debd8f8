#include "ps/sample_worker.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "ps/sparse_row_access.h"

namespace chorus::ps {

namespace {

// Refuses a distribution whose keys the PS does not hold as one table (the access would throw
// on the first draw instead, far from the cause).
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

SampleWorker::SampleWorker(SparseRowAccess& access, const KeySpace& space,
                           const sampling::NegativeSampler& pi,
                           sampling::SampleSchemeOptions options, uint64_t seed)
    : access_(access),
      space_(space),
      options_(options),
      scheme_(checkedPi(pi, space), options, seed,
              [&access](Key key) { return access.isLocal(key); }) {}

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
    // Not waited for: the keys are read where they are if they have not arrived by the pull.
    access_.localize(prepared.localize, [counts = localize_counts_](const node::Status& s) {
      {
        std::lock_guard lock(counts->mu);
        ++counts->ended;
        if (!s.ok()) ++counts->failed;
      }
      counts->ended_cv.notify_all();
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

  // The access reads sorted, unique keys: read each distinct key once, then lay the values out
  // in sample order.
  distinct_.assign(out.keys.begin(), out.keys.end());
  std::sort(distinct_.begin(), distinct_.end());
  distinct_.erase(std::unique(distinct_.begin(), distinct_.end()), distinct_.end());
  read_.resize(space_.floatsOf(distinct_));
  node::Status status = access_.wait(access_.pull(distinct_, read_));
  if (!status.ok()) return status;
  at_.assign(distinct_.size(), 0);
  for (size_t i = 1; i < distinct_.size(); ++i)
    at_[i] = at_[i - 1] + space_.length(distinct_[i - 1]);
  out.offsets.reserve(out.keys.size());
  for (Key key : out.keys) {
    const size_t d = static_cast<size_t>(std::lower_bound(distinct_.begin(), distinct_.end(), key) -
                                         distinct_.begin());
    out.offsets.push_back(out.values.size());
    const auto row = read_.begin() + static_cast<std::ptrdiff_t>(at_[d]);
    out.values.insert(out.values.end(), row, row + static_cast<std::ptrdiff_t>(space_.length(key)));
  }
  return {};
}

void SampleWorker::finishSample(sampling::SampleId id) {
  std::lock_guard lock(mu_);
  scheme_.finish(id);
}

void SampleWorker::awaitLocalizes() const {
  std::unique_lock lock(localize_counts_->mu);
  localize_counts_->ended_cv.wait(
      lock, [this] { return localize_counts_->ended == localize_counts_->requests; });
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
  s.localize_ended = localize_counts_->ended;
  s.localize_failed = localize_counts_->failed;
  return s;
}

}  // namespace chorus::ps
