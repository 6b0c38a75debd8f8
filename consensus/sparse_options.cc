// The settings of sparse consensus: its flags, their checks, and the relay limit's default
// (the topology's diameter). The protocol is in sparse_consensus_peer.cc.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <deque>
#include <stdexcept>

#include "consensus/sparse_consensus_peer.h"

namespace chorus::consensus {

void addSparseGossipOptions(CLI::App& cmd, SparseGossipFlags& f) {
  cmd.add_option("--cold-every", f.cold_every,
                 "Sparse models in consensus mode: a changed cold row waits at most K - 1 rounds "
                 "(every K-th round sends all of them); 1: every changed row every round "
                 "(docs/sparse-consensus.md)")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}))
      ->capture_default_str();
  cmd.add_option("--round-bytes", f.round_bytes,
                 "Sparse models in consensus mode: in the other rounds, also send cold rows, "
                 "oldest first, while a neighbor's share stays within B bytes (0: none)")
      ->capture_default_str();
  cmd.add_option(
         "--hot-bytes", f.hot_bytes,
         "Sparse models in consensus mode: per table, the bytes of its most accessed rows "
         "(by the data's expected accesses) that travel in the next share after they change")
      ->capture_default_str();
  cmd.add_option("--relay-hops", f.relay_hops,
                 "Sparse models in consensus mode: a change travels this many hops from the node "
                 "that made it (0: the topology's diameter, which reaches every node)")
      ->check(CLI::Range(int64_t{0}, int64_t{kNoHop - 1}))
      ->capture_default_str();
  cmd.add_flag("--dense-exchange", f.dense_exchange,
               "Sparse models in consensus mode: send every row to every neighbor every round "
               "(the baseline sparse gossip is measured against)");
}

void validateSparseGossipFlags(const SparseGossipFlags& f) {
  if (f.cold_every < 1 || f.cold_every > 1'000'000) {
    throw std::invalid_argument(
        fmt::format("--cold-every {}: a count of rounds from 1 to 1000000", f.cold_every));
  }
  if (f.relay_hops < 0 || f.relay_hops >= kNoHop) {
    throw std::invalid_argument(fmt::format(
        "--relay-hops {}: 0 (the diameter) or a count of hops up to {}", f.relay_hops, kNoHop - 1));
  }
}

void validateSparseConsensusOptions(const SparseConsensusOptions& o) {
  parseMixingKind(o.mixing);
  if (o.staleness.infinite() || o.staleness.bound < 0 || o.staleness.bound > 1'000'000) {
    throw std::invalid_argument(fmt::format(
        "--staleness {}: consensus mode needs a bound from 0 to 1000000 rounds (async, an "
        "infinite bound, is PS mode's)",
        o.staleness.toString()));
  }
  if (o.chunk_floats == 0) throw std::invalid_argument("--chunk-floats must be > 0");
  validateSparseGossipFlags(o.gossip);
  ml::validateSparseTrainOptions(o.train);
  if (o.train.keepBest) {
    throw std::invalid_argument("--keep-best is not supported in consensus mode yet");
  }
  if (o.train.timeLimitSeconds > 0) {
    throw std::invalid_argument("--time-limit is not supported in consensus mode yet");
  }
  if (!o.train.savePath.empty() || !o.train.resumePath.empty()) {
    throw std::invalid_argument(
        "--save and --resume are not supported for sparse models in consensus mode yet");
  }
}

int graphDiameter(const std::map<NodeId, std::vector<NodeId>>& graph) {
  int diameter = 0;
  for (const auto& [source, _] : graph) {
    std::map<NodeId, int> depth = {{source, 0}};
    std::deque<NodeId> queue = {source};
    while (!queue.empty()) {
      const NodeId at = queue.front();
      queue.pop_front();
      auto it = graph.find(at);
      if (it == graph.end()) continue;
      for (NodeId next : it->second) {
        if (depth.emplace(next, depth[at] + 1).second) queue.push_back(next);
      }
    }
    if (depth.size() < graph.size()) return static_cast<int>(graph.size());
    for (const auto& [id, d] : depth)
      diameter = std::max(diameter, d);
  }
  return diameter;
}

}  // namespace chorus::consensus
