// Forward+backward throughput of the models against Eigen's own GEMM on the same shapes, in the
// same binary, so that the ratio says how much of the machine's GEMM speed the layers keep
// (im2col, bias, ReLU, pooling and the loss are the overhead).
#include <benchmark/benchmark.h>

#include <vector>

#include "ml/layers.h"
#include "ml/model.h"
#include "ml/rng.h"

namespace chorus::ml {
namespace {

constexpr Eigen::Index kBatch = 64;

ModelSpec specFor(int which) {
  switch (which) {
    case 0:
      return {.name = "mlp"};
    case 1:
      return {.name = "lenet"};
    default:
      return {.name = "cifar-cnn", .input = {3, 32, 32}};
  }
}

// One GEMM C(m x n) = op(A) * op(B) as a layer performs it.
struct Gemm {
  Eigen::Index m, k, n;
  bool transposeA, transposeB;
};

// The GEMMs of one forward+backward pass: per Linear/Conv2D layer, the forward product, the
// weight gradient and (except for the first layer) the input gradient.
std::vector<Gemm> gemmsOf(const Model& model, Eigen::Index batch) {
  std::vector<Gemm> gemms;
  bool first = true;
  for (const auto& layer : model.layers()) {
    if (layer->paramCount() == 0) continue;
    const SampleShape out = layer->outputShape();
    Eigen::Index m, k, n;
    if (dynamic_cast<const Conv2D*>(layer.get()) != nullptr) {
      m = out.channels;
      n = batch * out.height * out.width;
      k = static_cast<Eigen::Index>(layer->paramCount()) / m - 1;
    } else {
      m = static_cast<Eigen::Index>(out.size());
      k = static_cast<Eigen::Index>(layer->inputShape().size());
      n = batch;
    }
    gemms.push_back({m, k, n, false, false});             // y = W x
    gemms.push_back({m, n, k, false, true});              // dW = dy x^T
    if (!first) gemms.push_back({k, m, n, true, false});  // dx = W^T dy
    first = false;
  }
  return gemms;
}

double flopsOf(const std::vector<Gemm>& gemms) {
  double flops = 0.0;
  for (const auto& g : gemms)
    flops += 2.0 * g.m * g.k * g.n;
  return flops;
}

Matrix randomMatrix(Eigen::Index rows, Eigen::Index cols, uint64_t seed) {
  Rng rng(seed);
  Matrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i)
    m.data()[i] = static_cast<float>(rng.normal());
  return m;
}

void BM_ForwardBackward(benchmark::State& state) {
  const ModelSpec spec = specFor(static_cast<int>(state.range(0)));
  auto model = Model::create(spec, 1);
  const Matrix batch = randomMatrix(static_cast<Eigen::Index>(spec.input.size()), kBatch, 2);
  std::vector<int32_t> labels(kBatch);
  for (Eigen::Index i = 0; i < kBatch; ++i)
    labels[static_cast<size_t>(i)] = i % spec.classes;
  const double flops = flopsOf(gemmsOf(*model, kBatch));
  for (auto _ : state) {
    benchmark::DoNotOptimize(model->forwardBackward(batch, labels));
    benchmark::ClobberMemory();
  }
  state.SetLabel(spec.name);
  state.counters["samples_per_s"] = benchmark::Counter(
      static_cast<double>(kBatch), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP_per_s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_EigenGemmSameShapes(benchmark::State& state) {
  const ModelSpec spec = specFor(static_cast<int>(state.range(0)));
  auto model = Model::create(spec, 1);
  const std::vector<Gemm> gemms = gemmsOf(*model, kBatch);
  std::vector<Matrix> a, b, c;
  uint64_t seed = 10;
  for (const auto& g : gemms) {
    a.push_back(g.transposeA ? randomMatrix(g.k, g.m, ++seed) : randomMatrix(g.m, g.k, ++seed));
    b.push_back(g.transposeB ? randomMatrix(g.n, g.k, ++seed) : randomMatrix(g.k, g.n, ++seed));
    c.emplace_back(g.m, g.n);
  }
  for (auto _ : state) {
    for (size_t i = 0; i < gemms.size(); ++i) {
      if (gemms[i].transposeA) {
        c[i].noalias() = a[i].transpose() * b[i];
      } else if (gemms[i].transposeB) {
        c[i].noalias() = a[i] * b[i].transpose();
      } else {
        c[i].noalias() = a[i] * b[i];
      }
      benchmark::DoNotOptimize(c[i].data());
    }
    benchmark::ClobberMemory();
  }
  state.SetLabel(spec.name + " GEMMs only");
  state.counters["samples_per_s"] = benchmark::Counter(
      static_cast<double>(kBatch), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP_per_s"] =
      benchmark::Counter(flopsOf(gemms) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// 0 = mlp (784-256-128-10), 1 = lenet (28x28), 2 = cifar-cnn (32x32x3); batch 64.
BENCHMARK(BM_ForwardBackward)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EigenGemmSameShapes)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace chorus::ml

BENCHMARK_MAIN();
