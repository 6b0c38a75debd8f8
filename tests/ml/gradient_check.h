// Finite-difference gradient checks shared by the layer and model tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <span>

#include "ml/layers.h"
#include "ml/rng.h"
#include "ml/tensor.h"

namespace chorus::ml::testing {

// A random matrix with entries N(0, scale^2), from a seed.
inline Matrix randomMatrix(Eigen::Index rows, Eigen::Index cols, uint64_t seed,
                           double scale = 1.0) {
  Rng rng(seed);
  Matrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i)
    m.data()[i] = static_cast<float>(scale * rng.normal());
  return m;
}

// Compares `analytic` with central differences of `loss` in each coordinate of `values`
// (perturbed in place). Tolerances suit float arithmetic with a double-accumulated loss.
inline void expectGradientsMatch(std::span<float> values, std::span<const float> analytic,
                                 const std::function<double()>& loss, const std::string& what,
                                 double epsilon = 1e-2, size_t maxChecks = 400) {
  ASSERT_EQ(values.size(), analytic.size());
  const size_t stride = std::max<size_t>(1, values.size() / maxChecks);
  size_t bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < values.size(); i += stride) {
    const float saved = values[i];
    values[i] = saved + static_cast<float>(epsilon);
    const double plus = loss();
    values[i] = saved - static_cast<float>(epsilon);
    const double minus = loss();
    values[i] = saved;
    const double numeric = (plus - minus) / (2.0 * epsilon);
    const double error = std::abs(numeric - analytic[i]);
    const double tolerance =
        2e-3 + 3e-2 * std::max(std::abs(numeric), std::abs(double{analytic[i]}));
    worst = std::max(worst, error);
    if (error > tolerance) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << ": coordinate " << i << " analytic " << analytic[i] << " numeric "
                      << numeric;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": worst absolute error " << worst;
}

}  // namespace chorus::ml::testing
