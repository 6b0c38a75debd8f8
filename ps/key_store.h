// The parameters a node owns in PS mode, with the owner-side optimizer. Each key carries its
// management technique so that a later NuPS layer can replicate hot keys or relocate others
// while the classic keys stay as they are; today every key is kHome (served by its home node).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ml/optimizer.h"
#include "ps/shard_map.h"

namespace chorus::ps {

// How a key is managed (NuPS, Renz-Wieland et al.): one value per key, so the techniques can
// coexist in one store.
enum class KeyTechnique : uint8_t {
  kHome,  // classic: the home node holds the only copy and applies every update
};
const char* keyTechniqueName(KeyTechnique technique);

// The optimizer owners apply to pushed gradients. Each push is scaled by `push_scale` (1/N for
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

// One owned key: its floats, optimizer state and technique.
struct KeyEntry {
  KeyTechnique technique = KeyTechnique::kHome;
  std::vector<float> values;
  std::vector<float> velocity;  // empty unless the optimizer uses momentum
  uint64_t updates = 0;         // pushes applied
};

class KeyStore {
 public:
  // Takes the keys of `layout` whose home in `map` is `self`, initialized from `initial` (the
  // whole flat model, identical on every node).
  KeyStore(const ChunkLayout& layout, const ShardMap& map, NodeId self,
           std::span<const float> initial, OwnerOptimizer optimizer);

  // Why `keys` (with `values` floats, or no values when nullopt) cannot be served here, or
  // nullopt: keys must be sorted and unique, exist in the layout, be owned here, and `values`
  // must hold exactly their floats.
  std::optional<std::string> check(std::span<const uint64_t> keys,
                                   std::optional<size_t> values) const;
  // Appends the values of checked `keys` to `out`, in key order.
  void read(std::span<const uint64_t> keys, std::vector<float>& out) const;
  // Writes the values of checked `keys` to `out` (exactly floatsOf(keys) floats), in key order.
  void copyTo(std::span<const uint64_t> keys, float* out) const;
  // The values of checked `keys`, in key order, where they live: valid until the next apply,
  // applyClock or restore.
  std::vector<std::span<const float>> rows(std::span<const uint64_t> keys) const;
  // Applies the gradients `grads` (key order, checked), pushed at `clock`, with the owner
  // optimizer.
  void apply(std::span<const uint64_t> keys, std::span<const float> grads, int64_t clock);
  // One checked push: its keys (key order) and their gradients.
  struct Push {
    std::span<const uint64_t> keys;
    std::span<const float> grads;
  };
  // BSP with momentum per clock: applies all pushes of `clock` as one step of the owner
  // optimizer on the workers' mean gradient per key (the sum times 1/N) with the full momentum:
  // synchronous SGD with momentum, exactly.
  void applyClock(std::span<const Push> pushes, int64_t clock);
  // True when BSP owners use applyClock() instead of one apply() per push.
  bool stepsPerClock() const { return optimizer_.spreadsMomentum(); }
  // A restarted owner (--rejoin): sets checked `keys` to `values` (key order) and clears their
  // optimizer state, which died with the previous process.
  void restore(std::span<const uint64_t> keys, std::span<const float> values);

  // Floats of all `keys` together (keys in the layout).
  size_t floatsOf(std::span<const uint64_t> keys) const;
  // Keys owned here, sorted.
  std::vector<Key> ownedKeys() const;
  const KeyEntry* find(Key key) const;
  const ChunkLayout& layout() const { return layout_; }
  const OwnerOptimizer& optimizer() const { return optimizer_; }
  uint64_t updatesApplied() const { return updates_; }

 private:
  ChunkLayout layout_;
  ShardMap map_;
  NodeId self_;
  OwnerOptimizer optimizer_;
  // Indexed by key (the layout's keys are dense); null where another node owns the key.
  std::vector<std::unique_ptr<KeyEntry>> entries_;
  uint64_t updates_ = 0;
};

}  // namespace chorus::ps
