#include "ml/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <stdexcept>

namespace chorus::ml {

const std::vector<std::string>& modelNames() {
  static const std::vector<std::string> names{"softmax", "mlp", "lenet", "cifar-cnn"};
  return names;
}

static std::vector<int> hiddenOrDefault(const ModelSpec& spec) {
  return spec.hidden.empty() ? std::vector<int>{256, 128} : spec.hidden;
}

std::string ModelSpec::toString() const {
  std::string text = name;
  if (name == "mlp") text += fmt::format(" hidden={}", fmt::join(hiddenOrDefault(*this), ","));
  if (name != "softmax") text += fmt::format(" dropout={}", dropout);
  text += fmt::format(" input={} classes={}", input.toString(), classes);
  return text;
}

namespace {

// Appends layers while tracking the current sample shape.
class LayerStack {
 public:
  LayerStack(SampleShape input, uint64_t seed) : shape_(input), seed_(seed) {}
  void linear(int outputs, WeightInit init) {
    add(std::make_unique<Linear>(shape_.size(), static_cast<size_t>(outputs), init));
  }
  void relu() { add(std::make_unique<ReLU>(shape_)); }
  void conv(int outChannels, int kernel, int padding) {
    if (shape_.height + 2 * padding < kernel || shape_.width + 2 * padding < kernel) {
      throw std::invalid_argument(fmt::format("input {} is too small for a {}x{} convolution",
                                              shape_.toString(), kernel, kernel));
    }
    add(std::make_unique<Conv2D>(shape_, outChannels, kernel, 1, padding));
  }
  void pool() {
    if (shape_.height < 2 || shape_.width < 2) {
      throw std::invalid_argument(
          fmt::format("input {} is too small for 2x2 pooling", shape_.toString()));
    }
    add(std::make_unique<MaxPool2D>(shape_, 2, 2));
  }
  void flatten() { add(std::make_unique<Flatten>(shape_)); }
  void dropout(float rate) {
    if (rate > 0.0f) add(std::make_unique<Dropout>(shape_, rate, mixSeed(seed_, 1000 + count())));
  }
  std::vector<std::unique_ptr<Layer>> take() { return std::move(layers_); }

 private:
  uint64_t count() const { return layers_.size(); }
  void add(std::unique_ptr<Layer> layer) {
    shape_ = layer->outputShape();
    layers_.push_back(std::move(layer));
  }
  SampleShape shape_;
  uint64_t seed_;
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace

std::unique_ptr<Model> Model::create(const ModelSpec& spec, uint64_t seed) {
  if (spec.input.channels <= 0 || spec.input.height <= 0 || spec.input.width <= 0) {
    throw std::invalid_argument("model input shape must be positive, got " + spec.input.toString());
  }
  if (spec.classes < 2) throw std::invalid_argument("a classifier needs at least 2 classes");
  if (!(spec.dropout >= 0.0f && spec.dropout < 1.0f)) {
    throw std::invalid_argument(fmt::format("dropout must be in [0, 1), got {}", spec.dropout));
  }
  LayerStack stack(spec.input, seed);
  if (spec.name == "softmax") {
    stack.linear(spec.classes, WeightInit::kGlorot);
  } else if (spec.name == "mlp") {
    for (int width : hiddenOrDefault(spec)) {
      if (width <= 0) {
        throw std::invalid_argument(fmt::format("mlp hidden sizes must be > 0, got {}", width));
      }
      stack.linear(width, WeightInit::kHe);
      stack.relu();
    }
    stack.dropout(spec.dropout);
    stack.linear(spec.classes, WeightInit::kGlorot);
  } else if (spec.name == "lenet") {
    // LeNet-5 as in Caffe's MNIST example, with ReLU after the convolutions.
    stack.conv(20, 5, 0);
    stack.relu();
    stack.pool();
    stack.conv(50, 5, 0);
    stack.relu();
    stack.pool();
    stack.flatten();
    stack.linear(500, WeightInit::kHe);
    stack.relu();
    stack.dropout(spec.dropout);
    stack.linear(spec.classes, WeightInit::kGlorot);
  } else if (spec.name == "cifar-cnn") {
    // Three conv blocks (32, 64, 128 channels, 3x3, same padding, 2x2 pooling) and a 256-unit
    // hidden layer: about 0.6 M parameters and 20 MFLOP per 32x32 sample, so an epoch of
    // CIFAR-10 fits in a couple of minutes on one core.
    for (int channels : {32, 64, 128}) {
      stack.conv(channels, 3, 1);
      stack.relu();
      stack.pool();
    }
    stack.flatten();
    stack.linear(256, WeightInit::kHe);
    stack.relu();
    stack.dropout(spec.dropout);
    stack.linear(spec.classes, WeightInit::kGlorot);
  } else {
    throw std::invalid_argument(
        fmt::format("unknown model '{}' (known: {})", spec.name, fmt::join(modelNames(), ", ")));
  }
  return std::unique_ptr<Model>(new Model(spec, stack.take(), seed));
}

Model::Model(ModelSpec spec, std::vector<std::unique_ptr<Layer>> layers, uint64_t seed)
    : spec_(std::move(spec)), layers_(std::move(layers)) {
  size_t total = 0;
  for (const auto& layer : layers_)
    total += layer->paramCount();
  params_.assign(total, 0.0f);
  grads_.assign(total, 0.0f);
  size_t offset = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->bind(params_.data() + offset, grads_.data() + offset);
    Rng rng(mixSeed(seed, i));
    layers_[i]->initialize(rng);
    offset += layers_[i]->paramCount();
  }
  activations_.resize(layers_.size());
  deltas_.resize(layers_.size());
}

double Model::forwardFlopsPerSample() const {
  double flops = 0.0;
  for (const auto& layer : layers_)
    flops += layer->forwardFlops();
  return flops;
}

size_t Model::activationFloatsPerSample() const {
  size_t floats = spec_.input.size();
  for (const auto& layer : layers_)
    floats += layer->outputShape().size();
  return floats;
}

const Matrix& Model::run(const Matrix& batch, bool training) {
  assert(static_cast<size_t>(batch.rows()) == spec_.input.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Matrix& in = i == 0 ? batch : activations_[i - 1];
    layers_[i]->forward(in, activations_[i], training);
  }
  return activations_.back();
}

double Model::forwardBackward(const Matrix& batch, std::span<const int32_t> labels) {
  const Matrix& logits = run(batch, true);
  const double loss = softmaxCrossEntropy(logits, labels, &deltas_.back());
  for (size_t i = layers_.size(); i-- > 0;) {
    const Matrix& in = i == 0 ? batch : activations_[i - 1];
    layers_[i]->backward(in, activations_[i], deltas_[i], i == 0 ? nullptr : &deltas_[i - 1]);
  }
  return loss;
}

const Matrix& Model::forward(const Matrix& batch) {
  return run(batch, false);
}

std::vector<int32_t> Model::predict(const Matrix& batch) {
  const Matrix& logits = forward(batch);
  std::vector<int32_t> classes(static_cast<size_t>(logits.cols()));
  for (Eigen::Index s = 0; s < logits.cols(); ++s) {
    Eigen::Index best = 0;
    logits.col(s).maxCoeff(&best);
    classes[static_cast<size_t>(s)] = static_cast<int32_t>(best);
  }
  return classes;
}

std::unique_ptr<Model> Model::clone() const {
  auto copy = create(spec_, 0);
  std::copy(params_.begin(), params_.end(), copy->params_.begin());
  return copy;
}

}  // namespace chorus::ml
