// Whole-cluster checkpoints of sparse consensus (docs/checkpoints.md, "Sparse runs"): a node's
// part of a cut (its tables after the epoch's last round's mixing, their optimizer state and the
// gossip's send state) and its restore. No barrier: nothing but the shares of the rounds after
// the cut crosses it, and the resumed nodes send those again from the same state.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>

#include "consensus/sparse_consensus_peer.h"
#include "node/finite.h"
#include "node/node.h"
#include "run/cluster_checkpoint.h"

namespace chorus::consensus {

namespace {

constexpr const char* kRemedy =
    "resume with the topology, --batch, --epochs and gossip flags the checkpoints were written "
    "with";

std::string tableName(size_t t) {
  return fmt::format("table-{}", t);
}
std::string stateName(size_t t) {
  return fmt::format("optimizer-{}", t);
}

}  // namespace

void SparseConsensusPeer::writeCut(int64_t cut, Round next_round) {
  run::NodeCheckpoint part;
  part.header = options_.cuts.header;
  part.header.cut = cut;
  part.words[std::string(run::kProgressSection)] = {static_cast<uint64_t>(cut),
                                                    static_cast<uint64_t>(next_round)};
  for (size_t t = 0; t < tables_.size(); ++t) {
    const std::span<const float> values = tables_[t]->values();
    part.floats[tableName(t)].assign(values.begin(), values.end());
    const std::span<const float> state = optimizers_[t].state();
    part.floats[stateName(t)].assign(state.begin(), state.end());
  }
  part.words["gossip"] = gossip_->exportState();
  const std::string path = run::writeNodeCheckpoint(options_.cuts.dir, part, options_.cuts.every);
  node_.logger().info("epoch {}: wrote this node's part of cut {} to {}", cut, cut, path);
}

Round SparseConsensusPeer::restoreCut() {
  const run::NodeCheckpoint& cut = *options_.cuts.resumed;
  const std::string& path = options_.cuts.resumed_path;
  auto fail = [&](const std::string& what) {
    return run::NodeCheckpointError(fmt::format("{}: {}; {}", path, what, kRemedy));
  };
  const int64_t epoch = cut.header.cut;
  const Round first = epoch * rounds_per_epoch_;
  const std::vector<uint64_t>& progress = cut.words.at(std::string(run::kProgressSection));
  if (progress[1] != static_cast<uint64_t>(first)) {
    throw fail(fmt::format("written after round {}, and epoch {} ends at round {} in this run",
                           progress[1], epoch, first));
  }
  // Checked whole before anything is set.
  for (size_t t = 0; t < tables_.size(); ++t) {
    auto values = cut.floats.find(tableName(t));
    auto state = cut.floats.find(stateName(t));
    if (values == cut.floats.end() || state == cut.floats.end()) {
      throw fail(fmt::format("no '{}' or '{}' array (not a sparse consensus checkpoint)",
                             tableName(t), stateName(t)));
    }
    if (values->second.size() != tables_[t]->values().size() ||
        state->second.size() != optimizers_[t].state().size()) {
      throw fail(
          fmt::format("table {} holds {} values and {} optimizer state values, and this "
                      "model's has {} and {}",
                      t, values->second.size(), state->second.size(), tables_[t]->values().size(),
                      optimizers_[t].state().size()));
    }
    if (const std::optional<size_t> bad = node::firstNonFinite(values->second)) {
      throw fail(fmt::format("value {} of table {} is not finite", *bad, t));
    }
  }
  auto gossip = cut.words.find("gossip");
  if (gossip == cut.words.end())
    throw fail("no 'gossip' array (not a sparse consensus checkpoint)");
  try {
    gossip_->importState(gossip->second, first);
  } catch (const std::invalid_argument& e) {
    throw fail(e.what());
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    const std::vector<float>& values = cut.floats.at(tableName(t));
    std::copy(values.begin(), values.end(), tables_[t]->values().begin());
    const std::vector<float>& state = cut.floats.at(stateName(t));
    std::copy(state.begin(), state.end(), optimizers_[t].state().begin());
  }
  node_.logger().info("resuming from cut {} ({}): epoch {}, round {}", epoch, path, epoch + 1,
                      first);
  return first;
}

}  // namespace chorus::consensus
