// The end-of-run sums of final models (docs/consensus.md, "End of a run"): what a node adds up
// before it sends to its tree parent, and what node 0 averages. Pure: no networking.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "node/protocol.h"

namespace chorus::consensus {

using NodeId = node::NodeId;  // defined once, in node/protocol.h

// A sum of final models kept in double, with the ids of the models in it, each counted at most
// once. The sums offered are laminar (two of them either share no model or one holds the other:
// every node sums once, over its own model and what its subtree sent), so refusing a sum that
// shares a model with what is counted loses nothing that is not counted already, provided the
// larger sums are offered first (node 0 does: its children's, then relayed ones by size).
class SumLedger {
 public:
  explicit SumLedger(size_t model_size) : sum_(model_size, 0.0) {}

  enum class Verdict {
    kAdded,           // its models were new: added
    kAlreadyCounted,  // every one of its models is counted already (a re-sent subtree): dropped
    kOverlaps,        // some of its models are counted, some not: dropped (sums must be laminar)
    kWrongSize,       // values of another model size: dropped
  };
  // Adds `values`, the sum of the models `models` (distinct ids), unless one is counted already.
  Verdict add(std::span<const double> values, std::span<const NodeId> models);
  // The same for a float sum (a node's own final model).
  Verdict add(std::span<const float> values, std::span<const NodeId> models);

  const std::vector<double>& sum() const { return sum_; }
  // The models counted, sorted.
  const std::vector<NodeId>& models() const { return models_; }

 private:
  Verdict admit(size_t size, std::span<const NodeId> models);
  std::vector<double> sum_;
  std::vector<NodeId> models_;
};

// A double sum on the wire as a double-float pair: hi[i] = float(sum[i]) and lo[i] =
// float(sum[i] - hi[i]), so hi[i] + lo[i] in double keeps about 48 significant bits where a float
// keeps 24 (a float sum of many models loses digits at every hop of the tree).
void splitWide(std::span<const double> sum, std::vector<float>& hi, std::vector<float>& lo);
// hi[i] + lo[i] in double; lo may be empty (a sender of floats only).
std::vector<double> joinWide(std::span<const float> hi, std::span<const float> lo);

}  // namespace chorus::consensus
