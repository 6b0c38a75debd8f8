// Model construction, flat-buffer layout, seeding, and finite-difference checks of whole models.
#include <gtest/gtest.h>

#include <numeric>

#include "ml/model.h"
#include "tests/ml/gradient_check.h"

namespace chorus::ml {
namespace {

using testing::randomMatrix;

std::vector<int32_t> someLabels(size_t n, int classes) {
  std::vector<int32_t> labels(n);
  for (size_t i = 0; i < n; ++i)
    labels[i] = static_cast<int32_t>((i * 7 + 3) % classes);
  return labels;
}

void checkModelGradients(const ModelSpec& spec, Eigen::Index batch) {
  auto model = Model::create(spec, 42);
  const Matrix x = randomMatrix(static_cast<Eigen::Index>(spec.input.size()), batch, 43);
  const auto labels = someLabels(static_cast<size_t>(batch), spec.classes);
  model->forwardBackward(x, labels);
  const std::vector<float> analytic(model->grads().begin(), model->grads().end());
  // Evaluation-mode loss (no dropout) equals the training loss for these dropout-free specs.
  auto loss = [&] { return softmaxCrossEntropy(model->forward(x), labels, nullptr); };
  testing::expectGradientsMatch(model->params(), analytic, loss, spec.toString(), 1e-3, 600);
}

TEST(ModelGradients, Softmax) {
  checkModelGradients({.name = "softmax", .input = {1, 6, 6}, .classes = 4}, 5);
}

TEST(ModelGradients, Mlp) {
  checkModelGradients({.name = "mlp", .hidden = {9, 7}, .input = {1, 4, 5}, .classes = 3}, 6);
}

TEST(ModelGradients, LeNet) {
  // The smallest input LeNet accepts: 16x16 -> conv5 12 -> pool 6 -> conv5 2 -> pool 1.
  checkModelGradients({.name = "lenet", .input = {1, 16, 16}, .classes = 10}, 2);
}

TEST(ModelGradients, CifarCnn) {
  checkModelGradients({.name = "cifar-cnn", .input = {3, 8, 8}, .classes = 10}, 2);
}

TEST(Model, ParametersAreOneContiguousBufferCoveredByTheLayers) {
  auto model = Model::create({.name = "lenet"}, 1);
  size_t total = 0;
  for (const auto& layer : model->layers())
    total += layer->paramCount();
  EXPECT_EQ(model->size(), total);
  EXPECT_EQ(model->params().size(), model->size());
  EXPECT_EQ(model->grads().size(), model->size());
  // Caffe's LeNet: 20*25+20 + 50*500+50 + 800*500+500 + 500*10+10.
  EXPECT_EQ(model->size(), 520u + 25050u + 400500u + 5010u);
}

TEST(Model, DefaultMlpIs784x256x128x10) {
  auto model = Model::create({.name = "mlp"}, 1);
  EXPECT_EQ(model->size(), 784u * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
}

TEST(Model, SameSeedGivesBitIdenticalModelsOtherSeedsDiffer) {
  for (const std::string name : {"softmax", "mlp", "lenet", "cifar-cnn"}) {
    ModelSpec spec{.name = name};
    if (name == "cifar-cnn") spec.input = {3, 32, 32};
    auto a = Model::create(spec, 7);
    auto b = Model::create(spec, 7);
    auto c = Model::create(spec, 8);
    EXPECT_TRUE(std::equal(a->params().begin(), a->params().end(), b->params().begin())) << name;
    EXPECT_FALSE(std::equal(a->params().begin(), a->params().end(), c->params().begin())) << name;
  }
}

TEST(Model, WritingTheFlatBufferChangesThePrediction) {
  auto model = Model::create({.name = "softmax", .input = {1, 2, 2}, .classes = 3}, 1);
  std::fill(model->params().begin(), model->params().end(), 0.0f);
  // Bias of class 2 is the last parameter: with zero weights, every sample predicts class 2.
  model->params().back() = 1.0f;
  const Matrix x = randomMatrix(4, 5, 3);
  for (int32_t label : model->predict(x))
    EXPECT_EQ(label, 2);
}

TEST(Model, CloneCopiesParametersAndIsIndependent) {
  auto model = Model::create({.name = "mlp", .hidden = {5}, .input = {1, 3, 3}}, 3);
  auto copy = model->clone();
  EXPECT_TRUE(std::equal(model->params().begin(), model->params().end(), copy->params().begin()));
  copy->params()[0] += 1.0f;
  EXPECT_NE(model->params()[0], copy->params()[0]);
}

TEST(Model, RejectsUnknownNamesAndUnusableSpecs) {
  EXPECT_THROW(Model::create({.name = "resnet"}, 1), std::invalid_argument);
  EXPECT_THROW(Model::create({.name = "mlp", .hidden = {0}}, 1), std::invalid_argument);
  EXPECT_THROW(Model::create({.name = "lenet", .input = {1, 8, 8}}, 1), std::invalid_argument);
  EXPECT_THROW(Model::create({.name = "mlp", .dropout = 1.0f}, 1), std::invalid_argument);
  EXPECT_THROW(Model::create({.name = "softmax", .classes = 1}, 1), std::invalid_argument);
}

TEST(Model, SpecStringsDistinguishArchitectures) {
  EXPECT_EQ(ModelSpec({.name = "mlp"}).toString(),
            "mlp hidden=256,128 dropout=0 input=1x28x28 classes=10");
  EXPECT_NE(ModelSpec({.name = "mlp", .hidden = {100}}).toString(),
            ModelSpec({.name = "mlp"}).toString());
}

}  // namespace
}  // namespace chorus::ml
