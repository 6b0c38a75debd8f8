// One sparse KGE training step (gather the rows of a batch and its negatives, score, scatter-add
// the gradient, sort the touched keys, AdaGrad on the touched rows) against the memory floor of
// the rows it touches: the bytes of every row access of the step divided by the memcpy speed
// measured in the same binary (sequential copy), and against plain copies of as many random rows
// (BM_GatherSameRows). All rates are per CPU second of the thread (the machine is shared).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <vector>

#include "ml/kge.h"
#include "ml/rng.h"
#include "ml/sparse_table.h"

namespace chorus::ml {
namespace {

// WN18RR's shape: 40,943 entities, 11 relations; ComplEx with 400 floats per row.
constexpr size_t kEntities = 40943, kRelations = 11;

struct StepSetup {
  KgeModel model;
  std::vector<Triple> batch;
  SparseGradAccumulator entityAcc, relationAcc;
  SparseGrad entityGrad, relationGrad;
  SparseOptimizer entityOpt, relationOpt;

  StepSetup(size_t dim, size_t negatives, size_t batchSize)
      : model(config(dim, negatives), kEntities, kRelations, 1),
        entityAcc(kEntities, dim),
        relationAcc(kRelations, dim),
        entityOpt({.kind = SparseOptimizerKind::kAdagrad, .lr = 0.1}, model.entities()),
        relationOpt({.kind = SparseOptimizerKind::kAdagrad, .lr = 0.1}, model.relations()) {
    Rng rng(7);
    for (size_t i = 0; i < batchSize; ++i) {
      batch.push_back({static_cast<uint32_t>(rng.below(kEntities)),
                       static_cast<uint32_t>(rng.below(kRelations)),
                       static_cast<uint32_t>(rng.below(kEntities))});
    }
  }
  static KgeConfig config(size_t dim, size_t negatives) {
    KgeConfig c;
    c.model = KgeModelKind::kComplEx;
    c.dim = dim;
    c.negatives = negatives;
    c.regularizer = KgeRegularizerKind::kN3;
    c.regWeight = 1e-3;
    return c;
  }
  void step(Rng& rng) {
    model.computeGradients(batch, rng, entityAcc, relationAcc);
    entityAcc.finish(entityGrad);
    relationAcc.finish(relationGrad);
    entityOpt.apply(model.entities(), entityGrad);
    relationOpt.apply(model.relations(), relationGrad);
  }
  // Row accesses of one step: per positive and direction, the query's two rows and the
  // (negatives + 1) candidates, each read once for the score and once for the query gradient
  // and written once for its own gradient; plus, per touched row, the optimizer's read and
  // write of row, state and gradient. The floor counts each access as one row of bytes.
  size_t rowAccesses(size_t negatives) const {
    const size_t perDirection = 2 + 3 * (negatives + 1);
    return batch.size() * 2 * perDirection + 5 * (entityGrad.size() + relationGrad.size());
  }
};

// CPU seconds of this thread: the machine is shared, and wall time would charge other
// processes' time slices to the step and to memcpy alike.
double threadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Sequential memcpy speed of a buffer far larger than the caches, bytes per CPU second.
double memcpyBytesPerSecond() {
  static const double speed = [] {
    const size_t bytes = size_t{256} << 20;
    std::vector<char> a(bytes, 1), b(bytes, 2);
    double best = 0.0;
    for (int i = 0; i < 5; ++i) {
      const double start = threadCpuSeconds();
      std::memcpy(b.data(), a.data(), bytes);
      benchmark::DoNotOptimize(b.data());
      const double s = threadCpuSeconds() - start;
      best = std::max(best, static_cast<double>(bytes) / s);
    }
    return best;
  }();
  return speed;
}

void BM_SparseKgeStep(benchmark::State& state) {
  const auto dim = static_cast<size_t>(state.range(0));
  const auto negatives = static_cast<size_t>(state.range(1));
  StepSetup setup(dim, negatives, 512);
  Rng rng(3);
  setup.step(rng);  // warm: the accumulators' buffers reach their size
  const double start = threadCpuSeconds();
  for (auto _ : state)
    setup.step(rng);
  const double stepSeconds =
      (threadCpuSeconds() - start) /
      static_cast<double>(std::max<benchmark::IterationCount>(state.iterations(), 1));
  const double rowBytes = static_cast<double>(dim * sizeof(float));
  const double floorSeconds =
      static_cast<double>(setup.rowAccesses(negatives)) * rowBytes / memcpyBytesPerSecond();
  state.counters["triples_per_s"] = benchmark::Counter(
      static_cast<double>(setup.batch.size() * state.iterations()), benchmark::Counter::kIsRate);
  state.counters["touched_rows"] = static_cast<double>(setup.entityGrad.size());
  state.counters["floor_ms"] = floorSeconds * 1e3;
  state.counters["x_floor"] = stepSeconds / floorSeconds;  // step time over the memory floor
  state.counters["memcpy_GB_per_s"] = memcpyBytesPerSecond() / 1e9;
}

// The same row accesses as plain copies: gather each candidate row of the step into a buffer
// (memcpy per row, random rows), so the ratio to the step shows what the arithmetic and the
// bookkeeping cost on top of moving the rows.
void BM_GatherSameRows(benchmark::State& state) {
  const auto dim = static_cast<size_t>(state.range(0));
  const auto negatives = static_cast<size_t>(state.range(1));
  StepSetup setup(dim, negatives, 512);
  Rng warm(3);
  setup.step(warm);
  const size_t accesses = setup.rowAccesses(negatives);
  std::vector<uint32_t> rows(accesses);
  Rng rng(5);
  for (uint32_t& r : rows)
    r = static_cast<uint32_t>(rng.below(kEntities));
  std::vector<float> out(dim);
  const float* table = setup.model.entities().values().data();
  for (auto _ : state) {
    for (const uint32_t r : rows) {
      std::memcpy(out.data(), table + size_t{r} * dim, dim * sizeof(float));
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.counters["row_GB_per_s"] =
      benchmark::Counter(static_cast<double>(accesses * dim * sizeof(float) * state.iterations()),
                         benchmark::Counter::kIsRate);
}

BENCHMARK(BM_SparseKgeStep)
    ->Args({400, 256})
    ->Args({200, 256})
    ->Args({400, 64})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GatherSameRows)
    ->Args({400, 256})
    ->Args({200, 256})
    ->Args({400, 64})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace chorus::ml

BENCHMARK_MAIN();
