// SGD with momentum / Nesterov and weight decay, and learning-rate schedules. The update works
// on any slice of the flat parameter buffer with a matching slice of optimizer state, so a PS
// owner can apply it to just the chunks (keys) it owns.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "node/result.h"

namespace chorus::ml {

// Learning rate as a function of the global step (0-based).
struct LrSchedule {
  enum class Kind { kConstant, kStep, kCosine };
  Kind kind = Kind::kConstant;
  double baseLr = 0.05;
  int64_t warmupSteps = 0;  // linear ramp from baseLr/warmupSteps to baseLr over these steps
  int64_t stepEvery = 0;    // kStep: multiply by gamma every stepEvery steps (after warm-up)
  double gamma = 0.1;       // kStep
  int64_t totalSteps = 0;   // kCosine: decays from baseLr to minLr at totalSteps
  double minLr = 0.0;       // kCosine

  // The learning rate for `step`.
  double at(int64_t step) const;
  // Reads "constant" | "step" | "cosine", or an error naming the known ones.
  static node::Result<Kind> readKind(const std::string& name);
  // The name readKind() accepts for `kind`.
  static const char* kindName(Kind kind);
};

// `epochs` of a schedule (a warm-up, a step length) in whole steps of `stepsPerEpoch`: 0 when
// epochs is 0, else rounded and at least 1, so a length under half a step is not lost.
int64_t scheduleSteps(double epochs, int64_t stepsPerEpoch);

// The defaults of the training options that `chorus train`, `node`, `launch` and `compare`
// share, in one place, so that a distributed run and its single-node baseline train the same
// optimizer unless told otherwise (tests/cli holds the commands' --help defaults equal).
namespace defaults {
inline constexpr double kLearningRate = 0.05;
inline constexpr double kMomentum = 0.9;
inline constexpr size_t kBatch = 64;
inline constexpr int64_t kEpochs = 5;
}  // namespace defaults

// Hyper-parameters of one SGD update.
struct SgdConfig {
  double momentum = defaults::kMomentum;  // 0 disables the velocity buffer
  bool nesterov = false;                  // Nesterov momentum (requires momentum > 0)
  double weightDecay = 0.0;  // L2 penalty added to the gradient (applies to every parameter)
};

// One SGD step on a slice: g' = g + wd*w; v = mu*v + g'; w -= lr * (nesterov ? g' + mu*v : v)
// (plain w -= lr*g' when momentum is 0, and `velocity` may then be empty). All spans but
// `velocity` (when unused) must have the same length. Deterministic, no allocation.
void sgdUpdate(const SgdConfig& config, double lr, std::span<float> params,
               std::span<const float> grads, std::span<float> velocity);

// SGD over a whole flat buffer with its own velocity and step counter; the single-node trainer
// and consensus mode use this, PS owners call sgdUpdate() per owned slice.
class SgdOptimizer {
 public:
  // `size` is the length of the parameter buffer this optimizer updates.
  SgdOptimizer(SgdConfig config, LrSchedule schedule, size_t size);
  // Applies one update with the current step's learning rate and advances the step.
  void step(std::span<float> params, std::span<const float> grads);
  // Learning rate the next step() will use.
  double currentLr() const { return schedule_.at(step_); }
  // Steps taken so far.
  int64_t stepCount() const { return step_; }
  // Velocity buffer (empty when momentum is 0); saved and restored with checkpoints.
  std::span<float> state() { return velocity_; }
  std::span<const float> state() const { return velocity_; }
  // Restores the step counter (from a checkpoint); throws std::invalid_argument if negative.
  void setStepCount(int64_t step);
  const SgdConfig& config() const { return config_; }

 private:
  SgdConfig config_;
  LrSchedule schedule_;
  std::vector<float, Eigen::aligned_allocator<float>> velocity_;
  int64_t step_ = 0;
};

}  // namespace chorus::ml
