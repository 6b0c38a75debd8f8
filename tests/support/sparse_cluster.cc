#include "tests/support/sparse_cluster.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "ml/metrics.h"

namespace chorus::testsupport {

ml::KgeConfig smallComplEx(bool shared_negatives) {
  ml::KgeConfig config;
  config.model = ml::KgeModelKind::kComplEx;
  config.dim = 32;
  config.negatives = 16;
  config.sharedNegatives = shared_negatives;
  config.regularizer = ml::KgeRegularizerKind::kNone;
  config.initScale = 0.1;
  return config;
}

ml::SparseTrainOptions sparseTrainOptions(int64_t epochs, size_t batch, double lr) {
  ml::SparseTrainOptions train;
  train.epochs = epochs;
  train.batchSize = batch;
  train.optimizer.kind = ml::SparseOptimizerKind::kAdagrad;
  train.optimizer.lr = lr;
  train.seed = 11;
  train.evalEvery = 0;
  train.logEverySteps = 10;
  return train;
}

double finalMetric(const FinalMetrics& final, const std::string& split, const std::string& name) {
  for (const auto& [s, metrics] : final) {
    if (s != split) continue;
    for (const ml::NamedMetric& m : metrics) {
      if (m.name == name) return m.value;
    }
  }
  ADD_FAILURE() << "no " << split << " " << name;
  return 0;
}

FinalMetrics trainAlone(ml::SparseWorkload& workload, const ml::SparseTrainOptions& train) {
  std::FILE* sink = std::tmpfile();
  ml::ProgressReporter quiet(sink, false);
  FinalMetrics final = ml::trainSparse(workload, train, quiet).final;
  std::fclose(sink);
  return final;
}

}  // namespace chorus::testsupport
