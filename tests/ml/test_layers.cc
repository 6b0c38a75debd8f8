// Finite-difference gradient checks of every layer, and the loss.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "ml/layers.h"
#include "tests/ml/gradient_check.h"

namespace chorus::ml {
namespace {

using testing::expectGradientsMatch;
using testing::randomMatrix;

// Loss = sum(out .* projection): its gradient w.r.t. `out` is `projection`, so backward() with
// gradOut = projection must reproduce the finite differences of this scalar.
struct LayerHarness {
  Layer& layer;
  Matrix input;
  Matrix projection;
  std::vector<float> params;
  std::vector<float> grads;

  LayerHarness(Layer& l, Eigen::Index batch, uint64_t seed) : layer(l) {
    input = randomMatrix(static_cast<Eigen::Index>(l.inputShape().size()), batch, seed);
    projection = randomMatrix(static_cast<Eigen::Index>(l.outputShape().size()), batch, seed + 1);
    params.resize(l.paramCount());
    grads.resize(l.paramCount());
    l.bind(params.data(), grads.data());
    Rng rng(seed + 2);
    l.initialize(rng);
    // Non-zero biases so that their gradients are exercised away from zero.
    for (auto& p : params)
      p += 0.05f;
  }

  double loss() {
    Matrix out;
    layer.forward(input, out, true);
    return static_cast<double>(
        (out.cast<double>().array() * projection.cast<double>().array()).sum());
  }

  void check(const std::string& name, double epsilon = 1e-2) {
    Matrix out, gradIn;
    layer.forward(input, out, true);
    ASSERT_EQ(out.rows(), static_cast<Eigen::Index>(layer.outputShape().size()));
    layer.backward(input, out, projection, &gradIn);
    ASSERT_EQ(gradIn.rows(), input.rows());
    ASSERT_EQ(gradIn.cols(), input.cols());
    std::vector<float> inputGrads(gradIn.data(), gradIn.data() + gradIn.size());
    expectGradientsMatch(
        {input.data(), static_cast<size_t>(input.size())}, inputGrads, [&] { return loss(); },
        name + " input", epsilon);
    if (!params.empty()) {
      const std::vector<float> paramGrads = grads;
      expectGradientsMatch(
          params, paramGrads, [&] { return loss(); }, name + " params", epsilon);
    }
  }
};

TEST(LayerGradients, Linear) {
  Linear layer(7, 5, WeightInit::kHe);
  LayerHarness h(layer, 4, 11);
  h.check("linear");
}

TEST(LayerGradients, ReLU) {
  ReLU layer({12, 1, 1});
  LayerHarness h(layer, 3, 12);
  // Keep inputs away from the kink at 0, where finite differences are meaningless.
  for (Eigen::Index i = 0; i < h.input.size(); ++i) {
    float& v = h.input.data()[i];
    if (std::abs(v) < 0.05f) v = v < 0 ? -0.05f - v : 0.05f + v;
  }
  h.check("relu");
}

TEST(LayerGradients, Conv2DSamePadding) {
  Conv2D layer({3, 6, 5}, 4, 3, 1, 1);
  EXPECT_EQ(layer.outputShape(), (SampleShape{4, 6, 5}));
  LayerHarness h(layer, 2, 13);
  h.check("conv 3x3 pad 1");
}

TEST(LayerGradients, Conv2DStrideNoPadding) {
  Conv2D layer({2, 7, 7}, 3, 3, 2, 0);
  EXPECT_EQ(layer.outputShape(), (SampleShape{3, 3, 3}));
  LayerHarness h(layer, 3, 14);
  h.check("conv 3x3 stride 2");
}

TEST(LayerGradients, Conv2DStrideAndPadding) {
  Conv2D layer({1, 8, 6}, 2, 5, 2, 2);
  LayerHarness h(layer, 2, 15);
  h.check("conv 5x5 stride 2 pad 2");
}

TEST(LayerGradients, MaxPool2D) {
  MaxPool2D layer({3, 6, 4}, 2, 2);
  EXPECT_EQ(layer.outputShape(), (SampleShape{3, 3, 2}));
  LayerHarness h(layer, 2, 16);
  // A small step, so that a perturbation does not change which input wins a window.
  h.check("maxpool", 1e-3);
}

TEST(LayerGradients, MaxPool2DOverlapping) {
  MaxPool2D layer({2, 5, 5}, 3, 2);
  LayerHarness h(layer, 2, 17);
  h.check("maxpool 3x3 stride 2", 1e-3);
}

TEST(LayerGradients, Flatten) {
  Flatten layer({2, 3, 3});
  EXPECT_EQ(layer.outputShape(), (SampleShape{18, 1, 1}));
  LayerHarness h(layer, 2, 18);
  h.check("flatten");
}

TEST(LayerGradients, DropoutWithFrozenMask) {
  Dropout layer({20, 1, 1}, 0.4f, 99);
  layer.freezeMask(true);
  LayerHarness h(layer, 3, 19);
  h.check("dropout");
}

TEST(Dropout, ScalesKeptValuesAndIsIdentityInEvaluation) {
  Dropout layer({1000, 1, 1}, 0.5f, 7);
  Matrix in = Matrix::Constant(1000, 4, 1.0f), out;
  layer.forward(in, out, false);
  EXPECT_EQ(out, in);
  layer.forward(in, out, true);
  int zeros = 0;
  for (Eigen::Index i = 0; i < out.size(); ++i) {
    const float v = out.data()[i];
    ASSERT_TRUE(v == 0.0f || v == 2.0f) << v;
    zeros += v == 0.0f;
  }
  EXPECT_NEAR(zeros / 4000.0, 0.5, 0.05);
}

TEST(Conv2D, MatchesDirectConvolution) {
  // A direct (naive) convolution over HWC samples as the reference for the im2col path.
  const SampleShape in{2, 5, 6};
  Conv2D layer(in, 3, 3, 1, 1);
  std::vector<float> params(layer.paramCount()), grads(layer.paramCount());
  layer.bind(params.data(), grads.data());
  Rng rng(5);
  layer.initialize(rng);
  for (size_t i = params.size() - 3; i < params.size(); ++i)
    params[i] = 0.1f * (i % 3);
  const Matrix x = randomMatrix(static_cast<Eigen::Index>(in.size()), 2, 6);
  Matrix y;
  layer.forward(x, y, false);
  const SampleShape out = layer.outputShape();
  for (int s = 0; s < 2; ++s) {
    for (int oy = 0; oy < out.height; ++oy) {
      for (int ox = 0; ox < out.width; ++ox) {
        for (int oc = 0; oc < out.channels; ++oc) {
          double expected = params[params.size() - 3 + oc];
          for (int ky = 0; ky < 3; ++ky) {
            for (int kx = 0; kx < 3; ++kx) {
              const int iy = oy + ky - 1, ix = ox + kx - 1;
              if (iy < 0 || iy >= in.height || ix < 0 || ix >= in.width) continue;
              for (int c = 0; c < in.channels; ++c) {
                const float w = params[oc + out.channels * ((ky * 3 + kx) * in.channels + c)];
                expected += w * x((iy * in.width + ix) * in.channels + c, s);
              }
            }
          }
          EXPECT_NEAR(y((oy * out.width + ox) * out.channels + oc, s), expected, 1e-4);
        }
      }
    }
  }
}

TEST(SoftmaxCrossEntropy, GradientMatchesFiniteDifferences) {
  Matrix logits = randomMatrix(6, 5, 21, 2.0);
  const std::vector<int32_t> labels{0, 5, 2, 2, 3};
  Matrix grad;
  const double loss = softmaxCrossEntropy(logits, labels, &grad);
  EXPECT_GT(loss, 0.0);
  std::vector<float> analytic(grad.data(), grad.data() + grad.size());
  testing::expectGradientsMatch(
      {logits.data(), static_cast<size_t>(logits.size())}, analytic,
      [&] { return softmaxCrossEntropy(logits, labels, nullptr); }, "softmax cross-entropy", 1e-3);
}

TEST(SoftmaxCrossEntropy, IsStableForHugeLogits) {
  Matrix logits(3, 1);
  logits << 1000.0f, -1000.0f, 0.0f;
  const std::vector<int32_t> labels{0};
  Matrix grad;
  EXPECT_NEAR(softmaxCrossEntropy(logits, labels, &grad), 0.0, 1e-6);
  EXPECT_TRUE(grad.allFinite());
  const std::vector<int32_t> wrong{1};
  EXPECT_NEAR(softmaxCrossEntropy(logits, wrong, nullptr), 2000.0, 1e-3);
}

}  // namespace
}  // namespace chorus::ml
