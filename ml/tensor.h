// Shapes and matrix types shared by the ML layer.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <string>
#include <vector>

namespace chorus::ml {

// A batch is a column-major matrix with one sample per column. Image samples are stored
// channels-last (HWC): a convolution's GEMM output is then already the next layer's input.
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using Vector = Eigen::Matrix<float, Eigen::Dynamic, 1>;
using MatrixMap = Eigen::Map<Matrix>;
using VectorMap = Eigen::Map<Vector>;

// A float buffer aligned like Eigen's own matrices (64 bytes with AVX-512). Flat parameter and
// gradient buffers use it so that results do not depend on where the heap put them: Eigen
// takes alignment-dependent code paths whose rounding differs.
using AlignedFloats = std::vector<float, Eigen::aligned_allocator<float>>;

// The shape of one sample: channels x height x width (a flat vector is {n, 1, 1}).
struct SampleShape {
  int channels = 0;
  int height = 1;
  int width = 1;

  // Number of floats in one sample.
  size_t size() const {
    return static_cast<size_t>(channels) * static_cast<size_t>(height) * static_cast<size_t>(width);
  }
  // "CxHxW", for messages and checkpoints.
  std::string toString() const {
    return std::to_string(channels) + "x" + std::to_string(height) + "x" + std::to_string(width);
  }
  bool operator==(const SampleShape&) const = default;
};

}  // namespace chorus::ml
