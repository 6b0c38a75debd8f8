// Mixing step of consensus mode: x_i = w_ii y_i + sum_j w_ij y_j over the models that arrived,
// and the reassembly of neighbors' models that travel in chunks. No networking here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "node/protocol.h"

namespace chorus::consensus {

using NodeId = node::NodeId;  // defined once, in node/protocol.h
using Round = int64_t;

// How the weights of one mixing step are chosen (docs/backup-rules.md, "Mixing weights").
enum class MixingKind {
  // Every model used (own included) gets 1 / (1 + |S|): normalized over what arrived.
  kUniform,
  // Metropolis-Hastings: w_ij = 1 / (1 + max(deg i, deg j)) for each neighbor j used, and the
  // rest, including the weight of neighbors not used this round, stays on the node itself.
  kMetropolis,
};

// "uniform" or "metropolis"; throws std::invalid_argument.
MixingKind parseMixingKind(std::string_view text);

// Weights of one step: [0] is the node's own, [1 + k] the k-th used neighbor's. Sums to 1.
std::vector<double> mixingWeights(MixingKind kind, size_t own_degree,
                                  std::span<const size_t> used_neighbor_degrees);

// x <- weights[0] * x + sum_k weights[1 + k] * others[k]; every span has x's size.
void mixInto(std::span<float> x, std::span<const double> weights,
             std::span<const std::span<const float>> others);

// Squared Euclidean distance between two models of the same size.
double squaredDistance(std::span<const float> a, std::span<const float> b);

// Collects neighbors' models that arrive in chunks and keeps, per neighbor, the latest model
// whose chunks have all arrived. A partial model older than the latest complete one is
// dropped: it could never be used. A sender writes one model's chunks before the next model's
// (one connection, in order), so at most one partial model per sender is held: a chunk of a
// newer round drops the partial one (its sender moved on), a chunk of an older round is refused.
// What a peer can make this hold is therefore one model per sender, however many chunks it
// sends.
class ModelAssembler {
 public:
  explicit ModelAssembler(size_t model_size);

  struct Complete {
    Round round = -1;
    std::vector<float> values;
  };

  // Adds chunk [offset, offset + values.size()) of `from`'s round-`round` model. Returns an
  // error message (and changes nothing) for a chunk outside the model, one that overlaps a
  // chunk already received, a round older than `from`'s latest complete model, or one older
  // than the partial model being assembled. `completed` is set when this chunk completed the
  // model.
  std::optional<std::string> add(NodeId from, Round round, size_t offset,
                                 std::span<const float> values, bool* completed);
  // The latest complete model of `from`, or nullptr.
  const Complete* latest(NodeId from) const;
  // Moves the values of `from`'s latest complete model out (its round stays known, so older
  // chunks are still refused); empty when there is none.
  std::vector<float> takeLatest(NodeId from);
  // Bytes of model values held (partial and complete models).
  size_t heldBytes() const;
  // Forgets everything from `from` (it went down; its old models must not be mixed later).
  void forget(NodeId from);
  size_t modelSize() const { return model_size_; }

 private:
  struct Partial {
    std::vector<float> values;
    std::vector<std::pair<size_t, size_t>> ranges;  // received [begin, end), sorted
    size_t received = 0;
  };
  size_t model_size_;
  std::map<NodeId, std::pair<Round, Partial>> partial_;  // at most one per sender
  std::map<NodeId, Complete> latest_;
};

}  // namespace chorus::consensus
