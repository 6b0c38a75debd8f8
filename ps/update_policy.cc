#include "ps/update_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace chorus::ps {

OwnerOptimizer::Momentum OwnerOptimizer::parseMomentum(std::string_view text) {
  if (text == "clock") return Momentum::kPerClock;
  if (text == "push") return Momentum::kPerPush;
  throw std::invalid_argument(
      fmt::format("--owner-momentum must be clock or push, not '{}'", text));
}

double OwnerOptimizer::pushMomentum() const {
  return spreadsMomentum() ? std::pow(sgd.momentum, push_scale) : sgd.momentum;
}

double OwnerOptimizer::pushLr(int64_t clock) const {
  const double lr = schedule.at(clock) * push_scale;
  if (!spreadsMomentum()) return lr;
  // N pushes of (1 - mu') / (1 - mu) * lr / N each add up to the single-node steady state.
  return lr * (1.0 - pushMomentum()) / (1.0 - sgd.momentum);
}

ml::SgdConfig OwnerOptimizer::pushSgd() const {
  ml::SgdConfig config = sgd;
  config.momentum = pushMomentum();
  return config;
}

void SgdPolicy::initState(std::span<float> state) const {
  std::fill(state.begin(), state.end(), 0.0f);
}

namespace {

// ml::sgdUpdate over every row of a push, with the same float expressions in the same order (so
// the same bits: tests/ps/update_policy_test.cc compares them), but one call per push instead of
// one per row: for 1-float keys the call and its setup were most of the work (issue 25).
void sgdRows(const ml::SgdConfig& config, double lr, std::span<const RowUpdate> rows) {
  const auto rate = static_cast<float>(lr);
  const auto decay = static_cast<float>(config.weightDecay);
  const auto mu = static_cast<float>(config.momentum);
  if (config.momentum == 0.0) {
    for (const RowUpdate& row : rows) {
      float* __restrict w = row.values.data();
      const float* __restrict g = row.grad.data();
      const size_t n = row.values.size();
      for (size_t i = 0; i < n; ++i)
        w[i] -= rate * (g[i] + decay * w[i]);
    }
    return;
  }
  for (const RowUpdate& row : rows) {
    float* __restrict w = row.values.data();
    const float* __restrict g = row.grad.data();
    float* __restrict v = row.state.data();
    const size_t n = row.values.size();
    if (config.nesterov) {
      for (size_t i = 0; i < n; ++i) {
        const float grad = g[i] + decay * w[i];
        v[i] = mu * v[i] + grad;
        w[i] -= rate * (grad + mu * v[i]);
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        v[i] = mu * v[i] + g[i] + decay * w[i];
        w[i] -= rate * v[i];
      }
    }
  }
}

}  // namespace

void SgdPolicy::applyPush(int64_t clock, std::span<const RowUpdate> rows) const {
  sgdRows(optimizer_.pushSgd(), optimizer_.pushLr(clock), rows);
}

void SgdPolicy::applyClockSum(int64_t clock, std::span<const RowUpdate> rows) const {
  // The workers' mean gradient (the sum times 1/N), one step with the full momentum:
  // synchronous SGD with momentum, exactly.
  const double lr = optimizer_.schedule.at(clock);
  const auto scale = static_cast<float>(optimizer_.push_scale);
  std::vector<float> mean;
  for (const RowUpdate& row : rows) {
    mean.assign(row.grad.begin(), row.grad.end());
    for (float& g : mean)
      g *= scale;
    ml::sgdUpdate(optimizer_.sgd, lr, row.values, mean, row.state);
  }
}

void AdagradPolicy::initState(std::span<float> state) const {
  std::fill(state.begin(), state.end(), static_cast<float>(config_.initial_accumulator));
}

void AdagradPolicy::applyPush(int64_t clock, std::span<const RowUpdate> rows) const {
  const auto lr = static_cast<float>(config_.schedule.at(clock));
  const auto scale = static_cast<float>(config_.push_scale);
  const auto eps = static_cast<float>(config_.epsilon);
  for (const RowUpdate& row : rows) {
    float* __restrict w = row.values.data();
    float* __restrict s = row.state.data();
    const float* __restrict grad = row.grad.data();
    for (size_t j = 0; j < row.values.size(); ++j) {
      const float g = grad[j] * scale;
      s[j] += g * g;
      w[j] -= lr * g / (std::sqrt(s[j]) + eps);
    }
  }
}

void AdagradPolicy::applyClockSum(int64_t clock, std::span<const RowUpdate> rows) const {
  // The sum times 1/N is the mean: one AdaGrad step on it.
  applyPush(clock, rows);
}

}  // namespace chorus::ps
