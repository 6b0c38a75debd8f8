// The quality target of a compare (--target-acc, --target-mrr, --target-rmse, or --target that
// reads by workload) and which one fits the model: test accuracy for the image models, MRR for
// knowledge-graph embeddings, RMSE for matrix factorization. Pure functions: no I/O.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace chorus::experiment {

// What a model is evaluated on.
enum class Workload {
  kImage,           // test accuracy, higher is better
  kKnowledgeGraph,  // complex, distmult: MRR, higher is better
  kRatings,         // mf: RMSE, lower is better
};
Workload workloadOf(std::string_view model);
// "accuracy", "mrr" or "rmse": the metric a workload's target is written in.
std::string_view targetMetric(Workload workload);

// The target flags as given (nullopt: not given).
struct TargetFlags {
  std::optional<double> acc, mrr, rmse, any;  // --target-acc, --target-mrr, --target-rmse, --target
};

// The target, or none.
struct Target {
  std::string metric;  // targetMetric() of the workload
  double value = 0;
};

// The one target `flags` give `model`, or nullopt when none was given. Throws
// std::invalid_argument naming the flag when two are given, when one does not fit the model's
// workload (--target-mrr with --model mlp: it reports accuracy; which flag to use instead), or
// when its value is out of range (accuracy and MRR in (0, 1], RMSE > 0).
std::optional<Target> resolveTarget(const TargetFlags& flags, std::string_view model);

}  // namespace chorus::experiment
