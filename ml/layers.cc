#include "ml/layers.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

namespace chorus::ml {

// ---------------------------------------------------------------------------------------------
// Linear

Linear::Linear(size_t inputs, size_t outputs, WeightInit init)
    : Layer({static_cast<int>(inputs), 1, 1}), inputs_(inputs), outputs_(outputs), init_(init) {}

std::string Linear::describe() const {
  return fmt::format("linear({}->{})", inputs_, outputs_);
}

void Linear::bind(float* params, float* grads) {
  params_ = params;
  grads_ = grads;
}

static void drawWeights(Rng& rng, WeightInit init, size_t fanIn, size_t fanOut, float* weights,
                        size_t count) {
  if (init == WeightInit::kHe) {
    const double stddev = std::sqrt(2.0 / static_cast<double>(fanIn));
    for (size_t i = 0; i < count; ++i)
      weights[i] = static_cast<float>(stddev * rng.normal());
  } else {
    const double limit = std::sqrt(6.0 / static_cast<double>(fanIn + fanOut));
    for (size_t i = 0; i < count; ++i) {
      weights[i] = static_cast<float>((2.0 * rng.uniform() - 1.0) * limit);
    }
  }
}

void Linear::initialize(Rng& rng) {
  drawWeights(rng, init_, inputs_, outputs_, params_, outputs_ * inputs_);
  std::fill(params_ + outputs_ * inputs_, params_ + paramCount(), 0.0f);
}

void Linear::forward(const Matrix& in, Matrix& out, bool /*training*/) {
  assert(static_cast<size_t>(in.rows()) == inputs_);
  const auto rows = static_cast<Eigen::Index>(outputs_);
  const auto cols = static_cast<Eigen::Index>(inputs_);
  MatrixMap weights(params_, rows, cols);
  VectorMap bias(params_ + outputs_ * inputs_, rows);
  out.resize(rows, in.cols());
  out.noalias() = weights * in;
  out.colwise() += bias;
}

void Linear::backward(const Matrix& in, const Matrix& /*out*/, const Matrix& gradOut,
                      Matrix* gradIn) {
  const auto rows = static_cast<Eigen::Index>(outputs_);
  const auto cols = static_cast<Eigen::Index>(inputs_);
  MatrixMap weights(params_, rows, cols);
  MatrixMap weightGrads(grads_, rows, cols);
  VectorMap biasGrads(grads_ + outputs_ * inputs_, rows);
  weightGrads.noalias() = gradOut * in.transpose();
  biasGrads = gradOut.rowwise().sum();
  if (gradIn != nullptr) {
    gradIn->resize(cols, gradOut.cols());
    gradIn->noalias() = weights.transpose() * gradOut;
  }
}

// ---------------------------------------------------------------------------------------------
// ReLU

void ReLU::forward(const Matrix& in, Matrix& out, bool /*training*/) {
  out = in.cwiseMax(0.0f);
}

void ReLU::backward(const Matrix& /*in*/, const Matrix& out, const Matrix& gradOut,
                    Matrix* gradIn) {
  if (gradIn == nullptr) return;
  *gradIn = (out.array() > 0.0f).select(gradOut, 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Conv2D

Conv2D::Conv2D(SampleShape input, int outChannels, int kernel, int stride, int padding)
    : Layer(input), kernel_(kernel), stride_(stride), padding_(padding) {
  assert(kernel > 0 && stride > 0 && padding >= 0);
  output_.channels = outChannels;
  output_.height = (input.height + 2 * padding - kernel) / stride + 1;
  output_.width = (input.width + 2 * padding - kernel) / stride + 1;
  assert(output_.height > 0 && output_.width > 0);
  patchSize_ = static_cast<size_t>(kernel) * kernel * input.channels;
}

std::string Conv2D::describe() const {
  return fmt::format("conv({}x{}, {}->{}, stride {}, pad {}) -> {}", kernel_, kernel_,
                     input_.channels, output_.channels, stride_, padding_, output_.toString());
}

size_t Conv2D::paramCount() const {
  return static_cast<size_t>(output_.channels) * patchSize_ + output_.channels;
}

double Conv2D::forwardFlops() const {
  return 2.0 * static_cast<double>(patchSize_) * output_.channels * output_.height * output_.width;
}

void Conv2D::bind(float* params, float* grads) {
  params_ = params;
  grads_ = grads;
}

void Conv2D::initialize(Rng& rng) {
  const size_t weights = static_cast<size_t>(output_.channels) * patchSize_;
  drawWeights(rng, WeightInit::kHe, patchSize_, output_.channels, params_, weights);
  std::fill(params_ + weights, params_ + paramCount(), 0.0f);
}

Eigen::Index Conv2D::samplesPerGroup() const {
  const size_t perSample = patchSize_ * static_cast<size_t>(output_.height) * output_.width;
  const size_t target = size_t{1} << 20;  // floats: 4 MB
  return static_cast<Eigen::Index>(std::max<size_t>(1, target / perSample));
}

void Conv2D::im2col(const Matrix& in, Eigen::Index first, Eigen::Index count) {
  const int channels = input_.channels;
  const int outPixels = output_.height * output_.width;
  columns_.resize(static_cast<Eigen::Index>(patchSize_), count * outPixels);
  for (Eigen::Index s = 0; s < count; ++s) {
    const float* sample = in.col(first + s).data();
    for (int oy = 0; oy < output_.height; ++oy) {
      for (int ox = 0; ox < output_.width; ++ox) {
        float* column = columns_.col(s * outPixels + oy * output_.width + ox).data();
        // For one kernel row the valid kx form one range, and their input pixels are adjacent
        // in HWC memory: one contiguous copy per kernel row, zeros around it.
        const int x0 = ox * stride_ - padding_;
        const int kxBegin = std::max(0, -x0);
        const int kxEnd = std::min(kernel_, input_.width - x0);
        for (int ky = 0; ky < kernel_; ++ky) {
          const int iy = oy * stride_ + ky - padding_;
          float* row = column + ky * kernel_ * channels;
          if (iy < 0 || iy >= input_.height || kxBegin >= kxEnd) {
            std::fill(row, row + kernel_ * channels, 0.0f);
            continue;
          }
          std::fill(row, row + kxBegin * channels, 0.0f);
          const float* src = sample + (iy * input_.width + x0 + kxBegin) * channels;
          std::copy(src, src + (kxEnd - kxBegin) * channels, row + kxBegin * channels);
          std::fill(row + kxEnd * channels, row + kernel_ * channels, 0.0f);
        }
      }
    }
  }
}

void Conv2D::col2im(Matrix& gradIn, Eigen::Index first, Eigen::Index count) const {
  const int channels = input_.channels;
  const int outPixels = output_.height * output_.width;
  for (Eigen::Index s = 0; s < count; ++s) {
    float* sample = gradIn.col(first + s).data();
    for (int oy = 0; oy < output_.height; ++oy) {
      for (int ox = 0; ox < output_.width; ++ox) {
        const float* column = columnGrads_.col(s * outPixels + oy * output_.width + ox).data();
        // The mirror of im2col: one contiguous accumulation per kernel row.
        const int x0 = ox * stride_ - padding_;
        const int kxBegin = std::max(0, -x0);
        const int kxEnd = std::min(kernel_, input_.width - x0);
        if (kxBegin >= kxEnd) continue;
        const int length = (kxEnd - kxBegin) * channels;
        for (int ky = 0; ky < kernel_; ++ky) {
          const int iy = oy * stride_ + ky - padding_;
          if (iy < 0 || iy >= input_.height) continue;
          const float* src = column + (ky * kernel_ + kxBegin) * channels;
          float* dst = sample + (iy * input_.width + x0 + kxBegin) * channels;
          for (int i = 0; i < length; ++i)
            dst[i] += src[i];
        }
      }
    }
  }
}

void Conv2D::forward(const Matrix& in, Matrix& out, bool /*training*/) {
  assert(static_cast<size_t>(in.rows()) == input_.size());
  const Eigen::Index batch = in.cols();
  const Eigen::Index outChannels = output_.channels;
  const Eigen::Index outPixels = output_.height * output_.width;
  MatrixMap weights(params_, outChannels, static_cast<Eigen::Index>(patchSize_));
  VectorMap bias(params_ + outChannels * patchSize_, outChannels);
  out.resize(outChannels * outPixels, batch);
  const Eigen::Index group = samplesPerGroup();
  for (Eigen::Index first = 0; first < batch; first += group) {
    const Eigen::Index count = std::min(group, batch - first);
    im2col(in, first, count);
    // The HWC output of `count` samples is one contiguous outChannels x (count*pixels) block.
    MatrixMap block(out.data() + first * outChannels * outPixels, outChannels, count * outPixels);
    block.noalias() = weights * columns_;
    block.colwise() += bias;
  }
}

void Conv2D::backward(const Matrix& in, const Matrix& /*out*/, const Matrix& gradOut,
                      Matrix* gradIn) {
  const Eigen::Index batch = in.cols();
  const Eigen::Index outChannels = output_.channels;
  const Eigen::Index outPixels = output_.height * output_.width;
  const auto patch = static_cast<Eigen::Index>(patchSize_);
  MatrixMap weights(params_, outChannels, patch);
  MatrixMap weightGrads(grads_, outChannels, patch);
  VectorMap biasGrads(grads_ + outChannels * patch, outChannels);
  weightGrads.setZero();
  biasGrads.setZero();
  if (gradIn != nullptr) gradIn->setZero(in.rows(), batch);
  const Eigen::Index group = samplesPerGroup();
  for (Eigen::Index first = 0; first < batch; first += group) {
    const Eigen::Index count = std::min(group, batch - first);
    Eigen::Map<const Matrix> block(gradOut.data() + first * outChannels * outPixels, outChannels,
                                   count * outPixels);
    im2col(in, first, count);
    weightGrads.noalias() += block * columns_.transpose();
    biasGrads += block.rowwise().sum();
    if (gradIn != nullptr) {
      columnGrads_.resize(patch, count * outPixels);
      columnGrads_.noalias() = weights.transpose() * block;
      col2im(*gradIn, first, count);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// MaxPool2D

MaxPool2D::MaxPool2D(SampleShape input, int window, int stride)
    : Layer(input), window_(window), stride_(stride) {
  assert(window > 0 && stride > 0);
  output_.channels = input.channels;
  output_.height = (input.height - window) / stride + 1;
  output_.width = (input.width - window) / stride + 1;
  assert(output_.height > 0 && output_.width > 0);
}

std::string MaxPool2D::describe() const {
  return fmt::format("maxpool({}x{}, stride {}) -> {}", window_, window_, stride_,
                     output_.toString());
}

void MaxPool2D::forward(const Matrix& in, Matrix& out, bool /*training*/) {
  const Eigen::Index batch = in.cols();
  const int channels = input_.channels;
  const auto outSize = static_cast<Eigen::Index>(output_.size());
  out.resize(outSize, batch);
  argmax_.resize(static_cast<size_t>(outSize * batch));
  for (Eigen::Index s = 0; s < batch; ++s) {
    const float* sample = in.col(s).data();
    float* result = out.col(s).data();
    int32_t* chosen = argmax_.data() + s * outSize;
    for (int oy = 0; oy < output_.height; ++oy) {
      for (int ox = 0; ox < output_.width; ++ox) {
        const int base = (oy * output_.width + ox) * channels;
        for (int c = 0; c < channels; ++c) {
          result[base + c] = -std::numeric_limits<float>::infinity();
          chosen[base + c] = 0;
        }
        for (int ky = 0; ky < window_; ++ky) {
          for (int kx = 0; kx < window_; ++kx) {
            const int offset =
                ((oy * stride_ + ky) * input_.width + (ox * stride_ + kx)) * channels;
            for (int c = 0; c < channels; ++c) {
              const float v = sample[offset + c];
              if (v > result[base + c]) {
                result[base + c] = v;
                chosen[base + c] = offset + c;
              }
            }
          }
        }
      }
    }
  }
}

void MaxPool2D::backward(const Matrix& in, const Matrix& /*out*/, const Matrix& gradOut,
                         Matrix* gradIn) {
  if (gradIn == nullptr) return;
  const Eigen::Index batch = in.cols();
  const auto outSize = static_cast<Eigen::Index>(output_.size());
  gradIn->setZero(in.rows(), batch);
  for (Eigen::Index s = 0; s < batch; ++s) {
    const float* grad = gradOut.col(s).data();
    float* target = gradIn->col(s).data();
    const int32_t* chosen = argmax_.data() + s * outSize;
    for (Eigen::Index i = 0; i < outSize; ++i)
      target[chosen[i]] += grad[i];
  }
}

// ---------------------------------------------------------------------------------------------
// Flatten

void Flatten::forward(const Matrix& in, Matrix& out, bool /*training*/) {
  out = in;
}

void Flatten::backward(const Matrix& /*in*/, const Matrix& /*out*/, const Matrix& gradOut,
                       Matrix* gradIn) {
  if (gradIn != nullptr) *gradIn = gradOut;
}

// ---------------------------------------------------------------------------------------------
// Dropout

Dropout::Dropout(SampleShape shape, float rate, uint64_t seed)
    : Layer(shape), rate_(rate), rng_(seed) {
  assert(rate >= 0.0f && rate < 1.0f);
}

std::string Dropout::describe() const {
  return fmt::format("dropout({})", rate_);
}

void Dropout::forward(const Matrix& in, Matrix& out, bool training) {
  if (!training || rate_ == 0.0f) {
    out = in;
    mask_.resize(0, 0);
    return;
  }
  if (!frozen_ || mask_.rows() != in.rows() || mask_.cols() != in.cols()) {
    const float keep = 1.0f / (1.0f - rate_);
    mask_.resize(in.rows(), in.cols());
    float* m = mask_.data();
    for (Eigen::Index i = 0; i < mask_.size(); ++i) {
      m[i] = rng_.uniform() < rate_ ? 0.0f : keep;
    }
  }
  out = in.cwiseProduct(mask_);
}

void Dropout::backward(const Matrix& /*in*/, const Matrix& /*out*/, const Matrix& gradOut,
                       Matrix* gradIn) {
  if (gradIn == nullptr) return;
  if (mask_.size() == 0) {
    *gradIn = gradOut;
  } else {
    *gradIn = gradOut.cwiseProduct(mask_);
  }
}

// ---------------------------------------------------------------------------------------------
// Loss

double softmaxCrossEntropy(const Matrix& logits, std::span<const int32_t> labels,
                           Matrix* gradLogits) {
  const Eigen::Index classes = logits.rows();
  const Eigen::Index batch = logits.cols();
  assert(static_cast<size_t>(batch) == labels.size() && batch > 0);
  if (gradLogits != nullptr) gradLogits->resize(classes, batch);
  double total = 0.0;
  const float scale = 1.0f / static_cast<float>(batch);
  for (Eigen::Index s = 0; s < batch; ++s) {
    const int32_t label = labels[static_cast<size_t>(s)];
    assert(label >= 0 && label < classes);
    const float* z = logits.col(s).data();
    const float top = *std::max_element(z, z + classes);
    double sum = 0.0;
    for (Eigen::Index c = 0; c < classes; ++c)
      sum += std::exp(static_cast<double>(z[c] - top));
    const double logSum = std::log(sum);
    total += logSum - static_cast<double>(z[label] - top);
    if (gradLogits != nullptr) {
      float* g = gradLogits->col(s).data();
      for (Eigen::Index c = 0; c < classes; ++c) {
        const double p = std::exp(static_cast<double>(z[c] - top) - logSum);
        g[c] = static_cast<float>(p) * scale;
      }
      g[label] -= scale;
    }
  }
  return total / static_cast<double>(batch);
}

}  // namespace chorus::ml
