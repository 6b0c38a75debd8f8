// How an owner applies pushed gradients to the rows it holds, with each row's optimizer state
// (momentum's velocity, AdaGrad's sums of squares) kept next to the row, so that a row and its
// state move together (relocation) and a technique can bring its own rule (a replica that
// applies locally and accumulates a delta for the next sync plugs in here). Free of any
// networking: tests/ps/update_policy_test.cc checks each rule on plain rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "ml/optimizer.h"

namespace chorus::ps {

// The SGD owners apply to pushed gradients. Each push is scaled by `push_scale` (1/N for
// N workers), so that one clock of all workers moves the model as far as one step of the
// averaged gradient: the same progress per clock as consensus mode's averaged local steps.
// The learning rate follows `schedule` over the clock the push belongs to, so every owner
// applies the same rate to a worker's push whenever it arrives.
//
// Momentum: an owner's velocity sees N pushes per clock, not one step. Applied as given
// (kPerPush), a velocity decays by mu^N per clock, so the model has N times less momentum
// memory than one node stepping with the averaged gradient. kPerClock keeps that memory: each
// push uses mu' = mu^(1/N) and a rate scaled by (1 - mu') / (1 - mu), so over one clock of N
// pushes the velocity decays by mu and the steady-state step is lr * g / (1 - mu), as for a
// single node.
struct OwnerOptimizer {
  enum class Momentum { kPerClock, kPerPush };
  ml::SgdConfig sgd;
  ml::LrSchedule schedule;  // baseLr is --lr
  double push_scale = 1.0;
  Momentum momentum_mode = Momentum::kPerClock;

  // Parses --owner-momentum ("clock" or "push"); throws std::invalid_argument naming the flag.
  static Momentum parseMomentum(std::string_view text);

  // The momentum coefficient applied per push.
  double pushMomentum() const;
  // The learning rate applied to one push made at `clock`.
  double pushLr(int64_t clock) const;
  // The SGD settings of one push (sgd with pushMomentum()).
  ml::SgdConfig pushSgd() const;
  // True when an update is w -= lr * g (no momentum, no weight decay): a worker can
  // then apply its own push to a cached row exactly as the owner will.
  bool stateless() const { return sgd.momentum == 0.0 && sgd.weightDecay == 0.0; }
  // True when a clock's momentum is spread over its N pushes (kPerClock with momentum on). BSP
  // owners then apply a clock's pushes together instead (KeyStore::applyClock).
  bool spreadsMomentum() const {
    return sgd.momentum > 0.0 && momentum_mode == Momentum::kPerClock;
  }
};

// One row's part of an update: its values, its optimizer state (stateFloats() floats) and the
// gradient for it (as many floats as the row).
struct RowUpdate {
  std::span<float> values;
  std::span<float> state;
  std::span<const float> grad;
};

// The rule of one management technique. Stateless objects shared by every row of a store.
class UpdatePolicy {
 public:
  virtual ~UpdatePolicy() = default;
  // Its name in logs ("sgd", "adagrad").
  virtual std::string_view name() const = 0;
  // Floats of optimizer state a row of `row_floats` floats keeps (0: none).
  virtual size_t stateFloats(size_t row_floats) const = 0;
  // A fresh row's state (a new key, or one whose state was lost with its owner).
  virtual void initState(std::span<float> state) const = 0;
  // Applies one worker's push, made at `clock`, to its rows.
  virtual void applyPush(int64_t clock, std::span<const RowUpdate> rows) const = 0;
  // Applies one step of the workers' summed gradients of `clock` (each row's `grad` is the sum
  // over the clock's pushes): BSP owners that step once per clock.
  virtual void applyClockSum(int64_t clock, std::span<const RowUpdate> rows) const = 0;
  // True when BSP owners are to apply a clock's pushes together (applyClockSum) rather than one
  // at a time.
  virtual bool stepsPerClock() const = 0;
  // True when the state only ever grows by a per-push term (AdaGrad's sums of squares), so that
  // the state changes of several nodes' replicas add up to what one owner would hold: replicas
  // then sync the state with the values (ps/replica_set.h). False: each replica keeps its own.
  virtual bool stateAddsUp() const { return false; }
  // True when the rule works float by float (each float of a row and of its state depends only
  // on the same float of the gradient) and a row of n floats keeps 0 or n floats of state: a
  // RowUpdate may then cover a run of rows that lie next to each other (KeyStore::applyRuns:
  // one update per run instead of one per 1-float row). False: one RowUpdate per row.
  virtual bool elementwise() const { return false; }
};

// SGD with momentum and weight decay as OwnerOptimizer describes (state: the velocity, when
// momentum is on).
class SgdPolicy final : public UpdatePolicy {
 public:
  explicit SgdPolicy(OwnerOptimizer optimizer) : optimizer_(optimizer) {}
  std::string_view name() const override { return "sgd"; }
  size_t stateFloats(size_t row_floats) const override {
    return optimizer_.sgd.momentum != 0.0 ? row_floats : 0;
  }
  void initState(std::span<float> state) const override;
  void applyPush(int64_t clock, std::span<const RowUpdate> rows) const override;
  void applyClockSum(int64_t clock, std::span<const RowUpdate> rows) const override;
  bool stepsPerClock() const override { return optimizer_.spreadsMomentum(); }
  bool elementwise() const override { return true; }
  const OwnerOptimizer& optimizer() const { return optimizer_; }

 private:
  OwnerOptimizer optimizer_;
};

// AdaGrad with one accumulator per float (G += g*g; w -= lr * g / (sqrt(G) + epsilon)), as
// ml::SparseOptimizer and torch.optim.Adagrad, on each push's gradient scaled by push_scale.
// The rate follows `schedule` over the push's clock.
struct AdagradConfig {
  ml::LrSchedule schedule;
  double push_scale = 1.0;
  double epsilon = 1e-10;
  double initial_accumulator = 0.0;
};

class AdagradPolicy final : public UpdatePolicy {
 public:
  explicit AdagradPolicy(AdagradConfig config) : config_(config) {}
  std::string_view name() const override { return "adagrad"; }
  size_t stateFloats(size_t row_floats) const override { return row_floats; }
  void initState(std::span<float> state) const override;
  void applyPush(int64_t clock, std::span<const RowUpdate> rows) const override;
  void applyClockSum(int64_t clock, std::span<const RowUpdate> rows) const override;
  bool stepsPerClock() const override { return false; }
  bool stateAddsUp() const override { return true; }
  bool elementwise() const override { return true; }

 private:
  AdagradConfig config_;
};

}  // namespace chorus::ps
