#include "ml/optimizer.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <stdexcept>
#include <string>

namespace chorus::ml {

double LrSchedule::at(int64_t step) const {
  if (warmupSteps > 0 && step < warmupSteps) {
    return baseLr * static_cast<double>(step + 1) / static_cast<double>(warmupSteps);
  }
  const int64_t after = step - warmupSteps;
  switch (kind) {
    case Kind::kConstant:
      return baseLr;
    case Kind::kStep:
      if (stepEvery <= 0) return baseLr;
      {
        const int64_t decays = after / stepEvery;
        return baseLr * std::pow(gamma, static_cast<double>(decays));
      }
    case Kind::kCosine: {
      const int64_t span = totalSteps - warmupSteps;
      if (span <= 0) return baseLr;
      const double progress = std::min(1.0, static_cast<double>(after) / static_cast<double>(span));
      return minLr + 0.5 * (baseLr - minLr) * (1.0 + std::cos(M_PI * progress));
    }
  }
  return baseLr;
}

int64_t scheduleSteps(double epochs, int64_t stepsPerEpoch) {
  if (!(epochs > 0.0) || stepsPerEpoch <= 0) return 0;
  return std::max<int64_t>(1, std::llround(epochs * static_cast<double>(stepsPerEpoch)));
}

const char* LrSchedule::kindName(Kind kind) {
  switch (kind) {
    case Kind::kConstant:
      return "constant";
    case Kind::kStep:
      return "step";
    case Kind::kCosine:
      return "cosine";
  }
  return "constant";
}

node::Result<LrSchedule::Kind> LrSchedule::readKind(const std::string& name) {
  if (name == "constant") return Kind::kConstant;
  if (name == "step") return Kind::kStep;
  if (name == "cosine") return Kind::kCosine;
  return node::invalidInput("unknown learning-rate schedule '" + name +
                            "' (known: constant, step, cosine)");
}

void sgdUpdate(const SgdConfig& config, double lr, std::span<float> params,
               std::span<const float> grads, std::span<float> velocity) {
  assert(params.size() == grads.size());
  const auto rate = static_cast<float>(lr);
  const auto decay = static_cast<float>(config.weightDecay);
  const auto mu = static_cast<float>(config.momentum);
  const size_t n = params.size();
  float* w = params.data();
  const float* g = grads.data();
  if (config.momentum == 0.0) {
    for (size_t i = 0; i < n; ++i)
      w[i] -= rate * (g[i] + decay * w[i]);
    return;
  }
  assert(velocity.size() == n);
  float* v = velocity.data();
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

SgdOptimizer::SgdOptimizer(SgdConfig config, LrSchedule schedule, size_t size)
    : config_(config), schedule_(schedule) {
  if (config_.momentum < 0.0 || config_.momentum >= 1.0) {
    throw std::invalid_argument("momentum must be in [0, 1)");
  }
  if (config_.nesterov && config_.momentum == 0.0) {
    throw std::invalid_argument("Nesterov momentum needs momentum > 0");
  }
  if (config_.weightDecay < 0.0) throw std::invalid_argument("weight decay must be >= 0");
  if (!(schedule_.baseLr > 0.0)) throw std::invalid_argument("learning rate must be > 0");
  if (config_.momentum > 0.0) velocity_.assign(size, 0.0f);
}

void SgdOptimizer::setStepCount(int64_t step) {
  if (step < 0) {
    throw std::invalid_argument("optimizer step count " + std::to_string(step) + " is negative");
  }
  step_ = step;
}

void SgdOptimizer::step(std::span<float> params, std::span<const float> grads) {
  sgdUpdate(config_, schedule_.at(step_), params, grads, velocity_);
  ++step_;
}

}  // namespace chorus::ml
