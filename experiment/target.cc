#include "experiment/target.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

namespace chorus::experiment {
namespace {

// What the workload reports, as a message says it.
std::string_view reports(Workload workload) {
  switch (workload) {
    case Workload::kImage:
      return "test accuracy";
    case Workload::kKnowledgeGraph:
      return "MRR";
    case Workload::kRatings:
      return "RMSE";
  }
  return "";
}

std::string_view flagOf(Workload workload) {
  switch (workload) {
    case Workload::kImage:
      return "--target-acc";
    case Workload::kKnowledgeGraph:
      return "--target-mrr";
    case Workload::kRatings:
      return "--target-rmse";
  }
  return "";
}

}  // namespace

Workload workloadOf(std::string_view model) {
  if (model == "complex" || model == "distmult") return Workload::kKnowledgeGraph;
  if (model == "mf") return Workload::kRatings;
  return Workload::kImage;
}

std::string_view targetMetric(Workload workload) {
  switch (workload) {
    case Workload::kImage:
      return "accuracy";
    case Workload::kKnowledgeGraph:
      return "mrr";
    case Workload::kRatings:
      return "rmse";
  }
  return "";
}

std::optional<Target> resolveTarget(const TargetFlags& flags, std::string_view model) {
  const Workload workload = workloadOf(model);
  std::vector<std::pair<std::string_view, double>> given;
  if (flags.acc) given.emplace_back("--target-acc", *flags.acc);
  if (flags.mrr) given.emplace_back("--target-mrr", *flags.mrr);
  if (flags.rmse) given.emplace_back("--target-rmse", *flags.rmse);
  if (flags.any) given.emplace_back("--target", *flags.any);
  if (given.empty()) return std::nullopt;
  if (given.size() > 1) {
    throw std::invalid_argument(
        fmt::format("{} and {}: give one target ({} reads by the model's "
                    "workload)",
                    given[0].first, given[1].first, "--target"));
  }
  const auto [flag, value] = given.front();
  if (flag != "--target" && flag != flagOf(workload)) {
    throw std::invalid_argument(fmt::format(
        "{} does not fit --model {}: it reports {}; use {} (or --target, which reads by the "
        "model's workload)",
        flag, model, reports(workload), flagOf(workload)));
  }
  const bool rmse = workload == Workload::kRatings;
  if (!std::isfinite(value) || value <= 0 || (!rmse && value > 1)) {
    throw std::invalid_argument(fmt::format("{} {}: a target in {} must be {}", flag, value,
                                            reports(workload),
                                            rmse ? "a number > 0" : "a fraction in (0, 1]"));
  }
  return Target{std::string(targetMetric(workload)), value};
}

}  // namespace chorus::experiment
