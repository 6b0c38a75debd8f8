#include "consensus/mixing.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace chorus::consensus {

MixingKind parseMixingKind(std::string_view text) {
  if (text == "uniform") return MixingKind::kUniform;
  if (text == "metropolis") return MixingKind::kMetropolis;
  throw std::invalid_argument(
      fmt::format("bad mixing weights '{}': use 'uniform' or 'metropolis'", text));
}

std::vector<double> mixingWeights(MixingKind kind, size_t own_degree,
                                  std::span<const size_t> used_neighbor_degrees) {
  std::vector<double> w(1 + used_neighbor_degrees.size());
  if (kind == MixingKind::kUniform) {
    std::fill(w.begin(), w.end(), 1.0 / static_cast<double>(w.size()));
    return w;
  }
  double rest = 1.0;
  for (size_t k = 0; k < used_neighbor_degrees.size(); ++k) {
    w[1 + k] = 1.0 / (1.0 + static_cast<double>(std::max(own_degree, used_neighbor_degrees[k])));
    rest -= w[1 + k];
  }
  w[0] = rest;
  return w;
}

void mixInto(std::span<float> x, std::span<const double> weights,
             std::span<const std::span<const float>> others) {
  const float self = static_cast<float>(weights[0]);
  for (float& v : x)
    v *= self;
  for (size_t k = 0; k < others.size(); ++k) {
    const float wk = static_cast<float>(weights[1 + k]);
    const float* y = others[k].data();
    for (size_t i = 0; i < x.size(); ++i)
      x[i] += wk * y[i];
  }
}

double squaredDistance(std::span<const float> a, std::span<const float> b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    sum += d * d;
  }
  return sum;
}

ModelAssembler::ModelAssembler(size_t model_size) : model_size_(model_size) {}

std::optional<std::string> ModelAssembler::add(NodeId from, Round round, size_t offset,
                                               std::span<const float> values, bool* completed) {
  *completed = false;
  const size_t end = offset + values.size();
  if (values.empty() || offset >= model_size_ || end > model_size_ || end < offset) {
    return fmt::format("model chunk [{}, {}) from node {} lies outside the {}-float model", offset,
                       end, from, model_size_);
  }
  auto done = latest_.find(from);
  if (done != latest_.end() && round <= done->second.round) {
    return fmt::format("chunk of round {} from node {} arrived after its round {} was complete",
                       round, from, done->second.round);
  }
  auto held = partial_.find(from);
  if (held != partial_.end() && held->second.first != round) {
    if (round < held->second.first) {
      return fmt::format(
          "chunk of round {} from node {} is older than its round {} being assembled", round, from,
          held->second.first);
    }
    partial_.erase(held);  // the sender moved on: that model can never complete
    held = partial_.end();
  }
  if (held == partial_.end()) held = partial_.emplace(from, std::make_pair(round, Partial{})).first;
  Partial& p = held->second.second;
  auto pos = std::lower_bound(p.ranges.begin(), p.ranges.end(), std::make_pair(offset, end));
  bool overlaps = (pos != p.ranges.end() && pos->first < end) ||
                  (pos != p.ranges.begin() && std::prev(pos)->second > offset);
  if (overlaps) {
    return fmt::format("chunk [{}, {}) of round {} from node {} overlaps one already received",
                       offset, end, round, from);
  }
  if (p.values.empty()) p.values.resize(model_size_);
  std::copy(values.begin(), values.end(), p.values.begin() + static_cast<ptrdiff_t>(offset));
  p.ranges.insert(pos, {offset, end});
  p.received += values.size();
  if (p.received < model_size_) return std::nullopt;

  Complete& c = latest_[from];
  c.round = round;
  c.values = std::move(p.values);
  partial_.erase(held);
  *completed = true;
  return std::nullopt;
}

const ModelAssembler::Complete* ModelAssembler::latest(NodeId from) const {
  auto it = latest_.find(from);
  return it == latest_.end() ? nullptr : &it->second;
}

std::vector<float> ModelAssembler::takeLatest(NodeId from) {
  auto it = latest_.find(from);
  if (it == latest_.end()) return {};
  return std::exchange(it->second.values, {});
}

size_t ModelAssembler::heldBytes() const {
  size_t floats = 0;
  for (const auto& [from, partial] : partial_)
    floats += partial.second.values.capacity();
  for (const auto& [from, complete] : latest_)
    floats += complete.values.capacity();
  return floats * sizeof(float);
}

void ModelAssembler::forget(NodeId from) {
  partial_.erase(from);
  latest_.erase(from);
}

}  // namespace chorus::consensus
