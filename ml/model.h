// Models by name on one flat parameter buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ml/layers.h"
#include "ml/tensor.h"

namespace chorus::ml {

// What to build: a model name with its options and the data's shapes.
struct ModelSpec {
  std::string name;  // softmax | mlp | lenet | cifar-cnn
  // mlp hidden layer sizes; empty means {256, 128}. The `{}` lets designated initializers leave
  // it out without g++'s -Wmissing-field-initializers.
  std::vector<int> hidden{};
  float dropout = 0.0f;  // dropout before the last linear layer (mlp, lenet, cifar-cnn)
  SampleShape input{1, 28, 28};
  int classes = 10;

  // Canonical one-line form, e.g. "mlp hidden=256,128 dropout=0 input=1x28x28 classes=10".
  // Stored in checkpoints: two specs build the same architecture iff their strings are equal.
  std::string toString() const;
};

// The model names makeModel() accepts.
const std::vector<std::string>& modelNames();

// A feed-forward classifier whose parameters all live in one contiguous float buffer and whose
// gradient lives in another of the same length; each layer views its slice through Eigen::Map.
// Copying, averaging or sending a model is a buffer operation on params(). Not thread-safe: one
// thread uses a Model at a time (it keeps per-batch activations).
class Model {
 public:
  // Builds the model named in `spec` and initializes it from `seed` (He for hidden layers,
  // Glorot for the output layer, zero biases). Same spec and seed give bit-identical
  // parameters. Throws std::invalid_argument for an unknown name or an unusable spec.
  static std::unique_ptr<Model> create(const ModelSpec& spec, uint64_t seed);

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // The spec this model was built from.
  const ModelSpec& spec() const { return spec_; }
  // Number of parameters (= length of params() and grads()).
  size_t size() const { return params_.size(); }
  // All parameters, layer after layer (weights then biases within a layer).
  std::span<float> params() { return params_; }
  std::span<const float> params() const { return params_; }
  // Gradient of the last forwardBackward(), same layout as params().
  std::span<float> grads() { return grads_; }
  std::span<const float> grads() const { return grads_; }
  // The layers, first to last.
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  // Forward FLOPs of one sample (sum over layers); backward costs about twice as much.
  double forwardFlopsPerSample() const;
  // Floats of layer outputs one sample produces in a forward pass (the input included): what
  // a batch's activations cost in memory, per sample.
  size_t activationFloatsPerSample() const;

  // Runs forward and backward on a batch (one sample per column) in training mode, writes
  // d(mean loss)/d(params) into grads() and returns the mean cross-entropy loss.
  double forwardBackward(const Matrix& batch, std::span<const int32_t> labels);
  // Logits (classes x batch) in evaluation mode; valid until the next call on this model.
  const Matrix& forward(const Matrix& batch);
  // Logits of the last forward or forwardBackward (classes x batch).
  const Matrix& logits() const { return activations_.back(); }
  // Predicted class of every column of `batch`.
  std::vector<int32_t> predict(const Matrix& batch);
  // A new model with the same spec and a copy of these parameters.
  std::unique_ptr<Model> clone() const;

 private:
  Model(ModelSpec spec, std::vector<std::unique_ptr<Layer>> layers, uint64_t seed);
  const Matrix& run(const Matrix& batch, bool training);

  ModelSpec spec_;
  std::vector<std::unique_ptr<Layer>> layers_;
  AlignedFloats params_;
  AlignedFloats grads_;
  std::vector<Matrix> activations_;  // output of layer i
  std::vector<Matrix> deltas_;       // d loss / d output of layer i
  Matrix logitGrads_;
};

}  // namespace chorus::ml
