// Layers of a model. Each layer's parameters are a slice of the model's flat parameter buffer,
// viewed through Eigen::Map; its gradient is the same slice of the flat gradient buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ml/rng.h"
#include "ml/tensor.h"

namespace chorus::ml {

// How a layer's weights are drawn at initialization.
enum class WeightInit {
  kHe,      // N(0, 2/fan_in): layers followed by ReLU
  kGlorot,  // U(-a, a), a = sqrt(6/(fan_in+fan_out)): the output layer
};

// One stage of a feed-forward network. Batches are matrices with one sample per column.
// Contract: backward() follows the forward() of the same batch and may use what forward() kept.
class Layer {
 public:
  virtual ~Layer() = default;

  // Short description, e.g. "conv(5x5, 1->20, stride 1, pad 0)".
  virtual std::string describe() const = 0;
  // Shape of one input sample.
  SampleShape inputShape() const { return input_; }
  // Shape of one output sample.
  virtual SampleShape outputShape() const = 0;
  // Number of floats this layer owns in the flat parameter buffer.
  virtual size_t paramCount() const { return 0; }
  // Multiply-adds x 2 of one sample's forward pass (0 for layers that do no arithmetic to speak
  // of).
  virtual double forwardFlops() const { return 0.0; }
  // Points the layer at its slices of the model's parameter and gradient buffers.
  virtual void bind(float* /*params*/, float* /*grads*/) {}
  // Draws initial parameters from `rng` (no-op for parameter-free layers).
  virtual void initialize(Rng& /*rng*/) {}
  // out = f(in). `training` switches dropout on.
  virtual void forward(const Matrix& in, Matrix& out, bool training) = 0;
  // Writes (not adds) this layer's parameter gradients, and sets gradIn unless it is null.
  virtual void backward(const Matrix& in, const Matrix& out, const Matrix& gradOut,
                        Matrix* gradIn) = 0;

 protected:
  explicit Layer(SampleShape input) : input_(input) {}
  SampleShape input_;
};

// y = W x + b, W is out x in.
class Linear final : public Layer {
 public:
  Linear(size_t inputs, size_t outputs, WeightInit init);
  std::string describe() const override;
  SampleShape outputShape() const override { return {static_cast<int>(outputs_), 1, 1}; }
  size_t paramCount() const override { return outputs_ * inputs_ + outputs_; }
  double forwardFlops() const override { return 2.0 * static_cast<double>(inputs_ * outputs_); }
  void bind(float* params, float* grads) override;
  void initialize(Rng& rng) override;
  void forward(const Matrix& in, Matrix& out, bool training) override;
  void backward(const Matrix& in, const Matrix& out, const Matrix& gradOut,
                Matrix* gradIn) override;

 private:
  size_t inputs_;
  size_t outputs_;
  WeightInit init_;
  float* params_ = nullptr;
  float* grads_ = nullptr;
};

// max(0, x), any shape.
class ReLU final : public Layer {
 public:
  explicit ReLU(SampleShape shape) : Layer(shape) {}
  std::string describe() const override { return "relu"; }
  SampleShape outputShape() const override { return input_; }
  void forward(const Matrix& in, Matrix& out, bool training) override;
  void backward(const Matrix& in, const Matrix& out, const Matrix& gradOut,
                Matrix* gradIn) override;
};

// 2-D convolution over HWC samples by im2col + one GEMM per group of samples. Square kernel;
// zero padding. Weights are out_channels x (k*k*in_channels), ordered (ky, kx, c) like the
// im2col rows, then out_channels biases.
class Conv2D final : public Layer {
 public:
  Conv2D(SampleShape input, int outChannels, int kernel, int stride, int padding);
  std::string describe() const override;
  SampleShape outputShape() const override { return output_; }
  size_t paramCount() const override;
  double forwardFlops() const override;
  void bind(float* params, float* grads) override;
  void initialize(Rng& rng) override;
  void forward(const Matrix& in, Matrix& out, bool training) override;
  void backward(const Matrix& in, const Matrix& out, const Matrix& gradOut,
                Matrix* gradIn) override;

 private:
  // Fills columns_ with the patches of samples [first, first+count) of `in`.
  void im2col(const Matrix& in, Eigen::Index first, Eigen::Index count);
  // Adds columns_ (patch gradients) back into samples [first, first+count) of gradIn.
  void col2im(Matrix& gradIn, Eigen::Index first, Eigen::Index count) const;
  // Samples per GEMM: keeps the im2col buffer near a few MB so it stays in cache.
  Eigen::Index samplesPerGroup() const;

  SampleShape output_;
  int kernel_;
  int stride_;
  int padding_;
  size_t patchSize_;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  Matrix columns_;
  Matrix columnGrads_;
};

// Max pooling over HWC samples, square window, no padding (partial windows at the edge dropped).
class MaxPool2D final : public Layer {
 public:
  MaxPool2D(SampleShape input, int window, int stride);
  std::string describe() const override;
  SampleShape outputShape() const override { return output_; }
  void forward(const Matrix& in, Matrix& out, bool training) override;
  void backward(const Matrix& in, const Matrix& out, const Matrix& gradOut,
                Matrix* gradIn) override;

 private:
  SampleShape output_;
  int window_;
  int stride_;
  std::vector<int32_t> argmax_;  // per output element: index of the chosen input in its sample
};

// Reinterprets an image as a flat vector. HWC samples are already flat, so this only changes
// the shape bookkeeping (and copies).
class Flatten final : public Layer {
 public:
  explicit Flatten(SampleShape input) : Layer(input) {}
  std::string describe() const override { return "flatten"; }
  SampleShape outputShape() const override { return {static_cast<int>(input_.size()), 1, 1}; }
  void forward(const Matrix& in, Matrix& out, bool training) override;
  void backward(const Matrix& in, const Matrix& out, const Matrix& gradOut,
                Matrix* gradIn) override;
};

// Inverted dropout: in training, zeroes each value with probability p and scales the rest by
// 1/(1-p); identity in evaluation. The mask stream is seeded, so runs are reproducible.
class Dropout final : public Layer {
 public:
  Dropout(SampleShape shape, float rate, uint64_t seed);
  std::string describe() const override;
  SampleShape outputShape() const override { return input_; }
  void forward(const Matrix& in, Matrix& out, bool training) override;
  void backward(const Matrix& in, const Matrix& out, const Matrix& gradOut,
                Matrix* gradIn) override;
  // Test hook: reuse the last mask in the next training forward (for finite differences).
  void freezeMask(bool frozen) { frozen_ = frozen; }

 private:
  float rate_;
  Rng rng_;
  bool frozen_ = false;
  Matrix mask_;
};

// Mean softmax cross-entropy of logits (classes x batch) against labels; writes
// d(mean loss)/d(logits) into gradLogits when it is not null. Labels must be in range.
double softmaxCrossEntropy(const Matrix& logits, std::span<const int32_t> labels,
                           Matrix* gradLogits);

}  // namespace chorus::ml
