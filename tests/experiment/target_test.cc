// The quality target of a compare: which flag fits which model, and the errors when one does
// not.
#include "experiment/target.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace chorus::experiment {
namespace {

std::string errorOf(const TargetFlags& flags, const std::string& model) {
  try {
    resolveTarget(flags, model);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Target, EachWorkloadHasItsOwnFlagAndTargetReadsByWorkload) {
  EXPECT_FALSE(resolveTarget({}, "mlp").has_value());
  TargetFlags acc;
  acc.acc = 0.84;
  EXPECT_EQ(resolveTarget(acc, "mlp")->metric, "accuracy");
  TargetFlags mrr;
  mrr.mrr = 0.3;
  EXPECT_EQ(resolveTarget(mrr, "complex")->metric, "mrr");
  EXPECT_DOUBLE_EQ(resolveTarget(mrr, "distmult")->value, 0.3);
  TargetFlags rmse;
  rmse.rmse = 0.9;
  EXPECT_EQ(resolveTarget(rmse, "mf")->metric, "rmse");
  TargetFlags any;
  any.any = 0.5;
  EXPECT_EQ(resolveTarget(any, "lenet")->metric, "accuracy");
  EXPECT_EQ(resolveTarget(any, "complex")->metric, "mrr");
  EXPECT_EQ(resolveTarget(any, "mf")->metric, "rmse");
  any.any = 2.5;  // an RMSE may be above 1
  EXPECT_DOUBLE_EQ(resolveTarget(any, "mf")->value, 2.5);
}

TEST(Target, AFlagThatDoesNotFitTheWorkloadSaysWhichOneDoes) {
  TargetFlags acc;
  acc.acc = 0.8;
  EXPECT_EQ(errorOf(acc, "complex"),
            "--target-acc does not fit --model complex: it reports MRR; use --target-mrr (or "
            "--target, which reads by the model's workload)");
  EXPECT_NE(errorOf(acc, "mf").find("it reports RMSE; use --target-rmse"), std::string::npos);
  TargetFlags mrr;
  mrr.mrr = 0.3;
  EXPECT_NE(errorOf(mrr, "mlp").find("it reports test accuracy; use --target-acc"),
            std::string::npos);
  EXPECT_NE(errorOf(mrr, "mf").find("--target-mrr does not fit --model mf"), std::string::npos);
  TargetFlags rmse;
  rmse.rmse = 1;
  EXPECT_NE(errorOf(rmse, "complex").find("use --target-mrr"), std::string::npos);
}

TEST(Target, TwoTargetsAndValuesOutOfRangeAreRefused) {
  TargetFlags two;
  two.mrr = 0.3;
  two.any = 0.3;
  EXPECT_NE(errorOf(two, "complex").find("--target-mrr and --target: give one target"),
            std::string::npos);
  for (double bad : {0.0, -0.1, 1.5}) {
    TargetFlags mrr;
    mrr.mrr = bad;
    EXPECT_NE(errorOf(mrr, "complex").find("must be a fraction in (0, 1]"), std::string::npos)
        << bad;
  }
  TargetFlags rmse;
  rmse.rmse = 0;
  EXPECT_NE(errorOf(rmse, "mf").find("must be a number > 0"), std::string::npos);
  EXPECT_EQ(workloadOf("distmult"), Workload::kKnowledgeGraph);
  EXPECT_EQ(workloadOf("cifar-cnn"), Workload::kImage);
}

}  // namespace
}  // namespace chorus::experiment
