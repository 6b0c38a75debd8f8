// The auto path of sparse PS mode (--technique auto): nups's data path (replicas of the keys the
// choice replicates, the relocation shell for every other key) with the choice's third class
// kept still: a localize moves only the keys chooseTechniques relocated (ps/technique_choice.h).
// A key left at its home is never localized, so it is read and written at its home as under
// classic (through the relocation shell, whose directory then never changes for it: one round
// trip to the home). Everything else is nups's, unchanged.
#include <algorithm>
#include <stdexcept>

#include "ps/replica_set.h"
#include "ps/sparse_row_access.h"

namespace chorus::ps {

namespace {

class AutoRowAccess final : public SparseRowAccess {
 public:
  AutoRowAccess(std::unique_ptr<SparseRowAccess> nups, std::vector<Key> relocated)
      : nups_(std::move(nups)), relocated_(std::move(relocated)) {
    if (!std::is_sorted(relocated_.begin(), relocated_.end())) {
      throw std::logic_error("auto: the relocated keys must be sorted");
    }
  }

  Handle pull(std::span<const Key> keys, std::span<float> out) override {
    return nups_->pull(keys, out);
  }
  Handle pullAt(Clock min_clock, std::span<const Key> keys, std::span<float> out) override {
    return nups_->pullAt(min_clock, keys, out);
  }
  Handle push(std::span<const Key> keys, std::span<const float> grads) override {
    return nups_->push(keys, grads);
  }
  node::Status wait(Handle handle) override { return nups_->wait(handle); }

  // Any thread (relocated_ never changes after construction). Only the relocated keys move;
  // replicated ones are local already (nups skips them), the others stay at their homes.
  void localize(std::span<const Key> keys, KeyLocalizer::Done done) override {
    std::vector<Key> moving;
    moving.reserve(keys.size());
    for (Key key : keys) {
      if (std::binary_search(relocated_.begin(), relocated_.end(), key)) moving.push_back(key);
    }
    if (moving.empty()) {
      if (done) done(node::Status{});
      return;
    }
    nups_->localize(moving, std::move(done));
  }
  bool isLocal(Key key) const override { return nups_->isLocal(key); }
  void clock() override { nups_->clock(); }
  void cancelAll(const node::Status& status) override { nups_->cancelAll(status); }
  RowAccessStats stats() const override { return nups_->stats(); }
  PsRunHooks runHooks() override { return nups_->runHooks(); }
  SparseTechnique technique() const override { return SparseTechnique::kAuto; }
  void startRun() override { nups_->startRun(); }
  node::Status finishPushes(std::chrono::milliseconds timeout) override {
    return nups_->finishPushes(timeout);
  }

 private:
  std::unique_ptr<SparseRowAccess> nups_;
  const std::vector<Key> relocated_;
};

// The step rate the window assumes: sparse PS runs 12-40 steps a second per node on this
// machine's WN18RR runs (docs/ps-replication.md), so at NuPS's 25 syncs a second a window is
// about one clock, the shortest the rule uses anyway.
constexpr double kAssumedStepsPerSecond = 25;

}  // namespace

TechniqueChoice chooseAutoTechniques(const KeySpace& space, const ReplicationOptions& options,
                                     const UpdatePolicy& policy, int64_t clocks_per_epoch,
                                     int64_t total_clocks) {
  TechniqueChoiceOptions choice;
  choice.clocks_per_epoch = clocks_per_epoch;
  choice.window_clocks =
      autoWindowClocks(options.syncs_per_second, kAssumedStepsPerSecond, total_clocks);
  choice.bytes_per_float = ReplicaSet::bytesPerRow(1, policy);
  choice.budget_bytes = options.budget_bytes;
  return chooseTechniques(space, options.node_accesses, choice);
}

std::unique_ptr<SparseRowAccess> makeAutoRowAccess(node::Node& node, KeyStore store,
                                                   const RowAccessSetup& setup) {
  return std::make_unique<AutoRowAccess>(makeNupsRowAccess(node, std::move(store), setup),
                                         setup.relocated);
}

}  // namespace chorus::ps
