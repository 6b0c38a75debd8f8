#include "consensus/sparse_gossip.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <unordered_map>

namespace chorus::consensus {

size_t RowShare::rows() const {
  size_t n = 0;
  for (const RowBlock& b : blocks)
    n += b.keys.size();
  return n;
}

uint64_t RowShare::payloadBytes() const {
  uint64_t bytes = 0;
  for (const RowBlock& b : blocks)
    bytes += b.keys.size() * uint64_t{9} + b.values.size() * uint64_t{4};
  return bytes;
}

void validateSparseGossipOptions(const SparseGossipOptions& o) {
  if (o.cold_every < 1 || o.cold_every > 1'000'000) {
    throw std::invalid_argument(
        fmt::format("--cold-every {}: a count of rounds from 1 to 1000000", o.cold_every));
  }
  if (o.relay_hops < 1 || o.relay_hops >= kNoHop) {
    throw std::invalid_argument(
        fmt::format("--relay-hops {}: a count of hops from 1 to {}", o.relay_hops, kNoHop - 1));
  }
  if (o.hot.size() > o.tables.size()) {
    throw std::invalid_argument("sparse gossip: hot keys for more tables than there are");
  }
  for (size_t t = 0; t < o.hot.size(); ++t) {
    for (RowKey key : o.hot[t]) {
      if (key >= o.tables[t].rows) {
        throw std::invalid_argument(fmt::format(
            "sparse gossip: hot key {} of table {} beyond its {} rows", key, t, o.tables[t].rows));
      }
    }
  }
  std::vector<NodeId> sorted = o.neighbors;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    throw std::invalid_argument("sparse gossip: a neighbor named twice");
  }
}

SparseGossip::SparseGossip(SparseGossipOptions options) : options_(std::move(options)) {
  validateSparseGossipOptions(options_);
  const size_t tables = options_.tables.size();
  hot_.resize(tables);
  hop_.resize(tables);
  due_count_.resize(tables);
  for (size_t t = 0; t < tables; ++t) {
    hot_[t].assign(options_.tables[t].rows, false);
    hop_[t].assign(options_.tables[t].rows, kNoHop);
    due_count_[t].assign(options_.tables[t].rows, 0);
    if (t < options_.hot.size()) {
      for (RowKey key : options_.hot[t])
        hot_[t][key] = true;
    }
  }
  for (NodeId to : options_.neighbors) {
    Outbox box;
    box.to = to;
    box.since.resize(tables);
    box.hot_due.resize(tables);
    box.cold_due.resize(tables);
    for (size_t t = 0; t < tables; ++t)
      box.since[t].assign(options_.tables[t].rows, -1);
    outboxes_.push_back(std::move(box));
  }
}

SparseGossip::Outbox& SparseGossip::outbox(NodeId to) {
  for (Outbox& box : outboxes_) {
    if (box.to == to) return box;
  }
  throw std::logic_error(fmt::format("sparse gossip: node {} is not a neighbor", to));
}

void SparseGossip::markDue(Outbox& box, size_t table, RowKey key, Round round) {
  Round& since = box.since[table][key];
  if (since >= 0) return;
  since = round;
  ++box.pending;
  ++due_count_[table][key];
  if (hot_[table][key]) {
    box.hot_due[table].push_back(key);
  } else {
    box.cold_due[table].push_back(key);
  }
}

void SparseGossip::sent(Outbox& box, size_t table, RowKey key) {
  box.since[table][key] = -1;
  --box.pending;
  if (--due_count_[table][key] == 0) hop_[table][key] = kNoHop;
}

void SparseGossip::markLocal(size_t table, std::span<const RowKey> keys, Round round) {
  if (options_.dense) return;
  for (RowKey key : keys) {
    hop_[table][key] = 0;
    for (Outbox& box : outboxes_)
      markDue(box, table, key, round);
  }
}

RowShare SparseGossip::select(NodeId to, Round round,
                              std::span<const std::span<const float>> tables, bool flush) {
  RowShare share;
  share.round = round;
  const size_t n = options_.tables.size();
  if (options_.dense) {
    for (size_t t = 0; t < n; ++t) {
      RowBlock block;
      block.table = static_cast<uint32_t>(t);
      block.keys.resize(options_.tables[t].rows);
      for (RowKey k = 0; k < block.keys.size(); ++k)
        block.keys[k] = k;
      block.values.assign(tables[t].begin(), tables[t].end());
      block.hops.assign(block.keys.size(), 0);
      if (!block.keys.empty()) share.blocks.push_back(std::move(block));
    }
    return share;
  }
  Outbox& box = outbox(to);
  const bool cold_round = flush || (round + 1) % options_.cold_every == 0;
  std::vector<std::vector<RowKey>> keys(n);
  uint64_t bytes = 0;
  for (size_t t = 0; t < n; ++t) {
    keys[t] = std::move(box.hot_due[t]);
    box.hot_due[t].clear();
    bytes += keys[t].size() * rowWireBytes(options_.tables[t].dim);
  }
  for (size_t t = 0; t < n; ++t) {
    std::deque<RowKey>& cold = box.cold_due[t];
    if (cold_round) {
      keys[t].insert(keys[t].end(), cold.begin(), cold.end());
      cold.clear();
    }
  }
  if (!cold_round && options_.round_bytes > 0) {
    // Oldest first across tables: the front of each table's queue is its oldest row.
    for (;;) {
      size_t best = n;
      for (size_t t = 0; t < n; ++t) {
        if (box.cold_due[t].empty()) continue;
        if (best == n ||
            box.since[t][box.cold_due[t].front()] < box.since[best][box.cold_due[best].front()]) {
          best = t;
        }
      }
      if (best == n) break;
      const uint64_t row = rowWireBytes(options_.tables[best].dim);
      if (bytes + row > options_.round_bytes) break;
      bytes += row;
      keys[best].push_back(box.cold_due[best].front());
      box.cold_due[best].pop_front();
    }
  }
  for (size_t t = 0; t < n; ++t) {
    if (keys[t].empty()) continue;
    std::sort(keys[t].begin(), keys[t].end());
    RowBlock block;
    block.table = static_cast<uint32_t>(t);
    const size_t dim = options_.tables[t].dim;
    block.values.resize(keys[t].size() * dim);
    block.hops.resize(keys[t].size());
    for (size_t i = 0; i < keys[t].size(); ++i) {
      const RowKey key = keys[t][i];
      std::memcpy(block.values.data() + i * dim, tables[t].data() + key * dim, dim * sizeof(float));
      block.hops[i] = hop_[t][key];
      sent(box, t, key);
    }
    block.keys = std::move(keys[t]);
    share.blocks.push_back(std::move(block));
  }
  return share;
}

std::vector<uint64_t> SparseGossip::exportState() const {
  std::vector<uint64_t> out = {options_.tables.size(), outboxes_.size()};
  for (size_t t = 0; t < options_.tables.size(); ++t) {
    out.push_back(hop_[t].size());
    out.insert(out.end(), hop_[t].begin(), hop_[t].end());
  }
  auto queue = [&](const Outbox& box, size_t t, const auto& keys) {
    out.push_back(keys.size());
    for (RowKey key : keys) {
      out.push_back(key);
      out.push_back(static_cast<uint64_t>(box.since[t][key]));
    }
  };
  for (const Outbox& box : outboxes_) {
    out.push_back(box.to);
    for (size_t t = 0; t < options_.tables.size(); ++t) {
      queue(box, t, box.hot_due[t]);
      queue(box, t, box.cold_due[t]);
    }
  }
  return out;
}

void SparseGossip::importState(std::span<const uint64_t> words, Round next_round) {
  size_t at = 0;
  auto next = [&](const char* what) {
    if (at >= words.size()) {
      throw std::invalid_argument(fmt::format("sparse gossip state: ends before its {}", what));
    }
    return words[at++];
  };
  const size_t n = options_.tables.size();
  if (next("table count") != n || next("neighbor count") != outboxes_.size()) {
    throw std::invalid_argument(
        "sparse gossip state: written for other tables or another number of neighbors");
  }
  std::vector<std::vector<uint8_t>> hop(n);
  std::vector<std::vector<uint16_t>> due(n);
  for (size_t t = 0; t < n; ++t) {
    const size_t rows = options_.tables[t].rows;
    if (next("table rows") != rows) {
      throw std::invalid_argument(
          fmt::format("sparse gossip state: table {} of another row count", t));
    }
    hop[t].resize(rows);
    due[t].assign(rows, 0);
    for (size_t r = 0; r < rows; ++r) {
      const uint64_t h = next("hop counts");
      if (h > kNoHop) throw std::invalid_argument("sparse gossip state: a hop count above 255");
      hop[t][r] = static_cast<uint8_t>(h);
    }
  }
  std::vector<Outbox> boxes;
  for (const Outbox& old : outboxes_) {
    Outbox box;
    box.to = old.to;
    if (next("neighbor") != old.to) {
      throw std::invalid_argument(
          fmt::format("sparse gossip state: its neighbors are not this node's ({})", old.to));
    }
    box.since.resize(n);
    box.hot_due.resize(n);
    box.cold_due.resize(n);
    for (size_t t = 0; t < n; ++t) {
      box.since[t].assign(options_.tables[t].rows, -1);
      for (int cold = 0; cold < 2; ++cold) {
        const uint64_t count = next("queue length");
        if (count > options_.tables[t].rows) {
          throw std::invalid_argument("sparse gossip state: a queue longer than its table");
        }
        for (uint64_t i = 0; i < count; ++i) {
          const uint64_t key = next("queued row");
          const auto since = static_cast<Round>(next("round"));
          if (key >= options_.tables[t].rows || since < 0 || since >= next_round ||
              box.since[t][key] >= 0 || hot_[t][key] == (cold == 1)) {
            throw std::invalid_argument(
                fmt::format("sparse gossip state: row {} of table {} queued wrongly for node {}",
                            key, t, box.to));
          }
          box.since[t][key] = since;
          ++box.pending;
          ++due[t][key];
          if (cold == 1) {
            box.cold_due[t].push_back(key);
          } else {
            box.hot_due[t].push_back(key);
          }
        }
      }
    }
    boxes.push_back(std::move(box));
  }
  if (at != words.size()) throw std::invalid_argument("sparse gossip state: words after its end");
  hop_ = std::move(hop);
  due_count_ = std::move(due);
  outboxes_ = std::move(boxes);
}

size_t SparseGossip::pendingRows(NodeId to) const {
  for (const Outbox& box : outboxes_) {
    if (box.to == to) return box.pending;
  }
  return 0;
}

MixResult SparseGossip::mix(Round round, std::span<const std::span<float>> tables, MixingKind kind,
                            size_t own_degree, std::span<const CarriedShare> used) {
  MixResult result;
  const size_t n = options_.tables.size();
  // Per used share and table, its block (or none), and a cursor into its sorted keys.
  struct Cursor {
    const RowBlock* block = nullptr;
    size_t at = 0;
  };
  std::vector<Cursor> cursors(used.size());
  // The weights of each set of carriers met this round (a bit per used share).
  std::unordered_map<uint64_t, std::vector<double>> weights_of;
  std::vector<size_t> carriers;
  std::vector<size_t> degrees;
  std::vector<std::span<const float>> others;
  std::vector<float> before;
  for (size_t t = 0; t < n; ++t) {
    const size_t dim = options_.tables[t].dim;
    for (size_t k = 0; k < used.size(); ++k) {
      cursors[k] = {};
      for (const RowBlock& b : used[k].share->blocks) {
        if (b.table == t) cursors[k].block = &b;
      }
    }
    for (;;) {
      // The smallest key any share still has for this table.
      RowKey key = std::numeric_limits<RowKey>::max();
      bool any = false;
      for (const Cursor& c : cursors) {
        if (c.block != nullptr && c.at < c.block->keys.size()) {
          key = std::min(key, c.block->keys[c.at]);
          any = true;
        }
      }
      if (!any) break;
      carriers.clear();
      uint64_t mask = 0;
      uint8_t hop = kNoHop;
      for (size_t k = 0; k < cursors.size(); ++k) {
        Cursor& c = cursors[k];
        if (c.block != nullptr && c.at < c.block->keys.size() && c.block->keys[c.at] == key) {
          carriers.push_back(k);
          if (k < 64) mask |= uint64_t{1} << k;
          hop = std::min(hop, c.block->hops[c.at]);
        }
      }
      const std::vector<double>* weights = nullptr;
      std::vector<double> own_weights;
      degrees.clear();
      for (size_t k : carriers)
        degrees.push_back(used[k].degree);
      if (used.size() <= 64) {
        auto it = weights_of.find(mask);
        if (it == weights_of.end()) {
          it = weights_of.emplace(mask, mixingWeights(kind, own_degree, degrees)).first;
        }
        weights = &it->second;
      } else {
        own_weights = mixingWeights(kind, own_degree, degrees);
        weights = &own_weights;
      }
      others.clear();
      for (size_t k : carriers) {
        const Cursor& c = cursors[k];
        others.emplace_back(c.block->values.data() + c.at * dim, dim);
      }
      std::span<float> row(tables[t].data() + key * dim, dim);
      before.assign(row.begin(), row.end());
      mixInto(row, *weights, others);
      ++result.rows_mixed;
      const bool changed = std::memcmp(before.data(), row.data(), dim * sizeof(float)) != 0;
      if (!options_.dense && changed && hop != kNoHop && hop + 1 < options_.relay_hops) {
        const auto next = static_cast<uint8_t>(hop + 1);
        uint8_t& own = hop_[t][key];
        own = std::min(own, next);
        bool marked = false;
        for (Outbox& box : outboxes_) {
          const bool carried = std::any_of(carriers.begin(), carriers.end(),
                                           [&](size_t k) { return used[k].from == box.to; });
          if (carried) continue;
          markDue(box, t, key, round);
          marked = true;
        }
        if (marked) ++result.rows_relayed;
        if (due_count_[t][key] == 0) own = kNoHop;
      }
      for (size_t k : carriers)
        ++cursors[k].at;
    }
  }
  return result;
}

RowShare mergeShares(std::span<const RowShare* const> shares) {
  RowShare out;
  if (shares.empty()) return out;
  out.round = shares.back()->round;
  if (shares.size() == 1) {
    out = *shares.front();
    return out;
  }
  uint32_t max_table = 0;
  for (const RowShare* s : shares) {
    for (const RowBlock& b : s->blocks)
      max_table = std::max(max_table, b.table + 1);
  }
  for (uint32_t t = 0; t < max_table; ++t) {
    // key -> (share index, row index), the newest share winning.
    std::vector<std::pair<RowKey, std::pair<size_t, size_t>>> rows;
    size_t dim = 0;
    for (size_t s = 0; s < shares.size(); ++s) {
      for (const RowBlock& b : shares[s]->blocks) {
        if (b.table != t) continue;
        if (!b.keys.empty()) dim = b.values.size() / b.keys.size();
        for (size_t i = 0; i < b.keys.size(); ++i)
          rows.push_back({b.keys[i], {s, i}});
      }
    }
    if (rows.empty()) continue;
    // Stable: for one key, the later share's entry comes last and wins.
    std::stable_sort(rows.begin(), rows.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    RowBlock block;
    block.table = t;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (i + 1 < rows.size() && rows[i + 1].first == rows[i].first) continue;
      const auto [s, r] = rows[i].second;
      const RowBlock* from = nullptr;
      for (const RowBlock& b : shares[s]->blocks) {
        if (b.table == t) from = &b;
      }
      block.keys.push_back(rows[i].first);
      block.hops.push_back(from->hops[r]);
      block.values.insert(block.values.end(), from->values.begin() + r * dim,
                          from->values.begin() + (r + 1) * dim);
    }
    out.blocks.push_back(std::move(block));
  }
  return out;
}

std::optional<std::string> checkRowShare(const RowShare& share,
                                         std::span<const GossipTableShape> tables, NodeId from) {
  uint32_t previous_table = 0;
  for (size_t i = 0; i < share.blocks.size(); ++i) {
    const RowBlock& b = share.blocks[i];
    if (b.table >= tables.size()) {
      return fmt::format("rows from node {} for table {}, but the model has {} tables", from,
                         b.table, tables.size());
    }
    if (i > 0 && b.table <= previous_table) {
      return fmt::format("rows from node {}: table {} named twice or out of order", from, b.table);
    }
    previous_table = b.table;
    const GossipTableShape& shape = tables[b.table];
    if (b.values.size() != b.keys.size() * shape.dim || b.hops.size() != b.keys.size()) {
      return fmt::format(
          "rows from node {} for table {}: {} keys with {} values and {} hop counts (rows of {} "
          "floats)",
          from, b.table, b.keys.size(), b.values.size(), b.hops.size(), shape.dim);
    }
    for (size_t k = 0; k < b.keys.size(); ++k) {
      if (b.keys[k] >= shape.rows) {
        return fmt::format("rows from node {}: key {} of table {} beyond its {} rows", from,
                           b.keys[k], b.table, shape.rows);
      }
      if (k > 0 && b.keys[k] <= b.keys[k - 1]) {
        return fmt::format(
            "rows from node {}: keys of table {} not sorted and unique ({} after {})", from,
            b.table, b.keys[k], b.keys[k - 1]);
      }
    }
    for (float v : b.values) {
      if (!std::isfinite(v)) {
        return fmt::format("rows from node {} for table {} hold a value that is not finite", from,
                           b.table);
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> checkRowSharePart(const RowShare& assembled, const RowShare& part,
                                             std::span<const GossipTableShape> tables,
                                             NodeId from) {
  if (std::optional<std::string> bad = checkRowShare(part, tables, from)) return bad;
  if (assembled.blocks.empty() || part.blocks.empty()) return std::nullopt;
  const RowBlock& last = assembled.blocks.back();
  const RowBlock& first = part.blocks.front();
  if (first.table < last.table) {
    return fmt::format("rows from node {}: table {} after table {} of an earlier part", from,
                       first.table, last.table);
  }
  if (first.table == last.table && !first.keys.empty() && !last.keys.empty() &&
      first.keys.front() <= last.keys.back()) {
    return fmt::format(
        "rows from node {}: keys of table {} not sorted and unique across parts ({} after {})",
        from, first.table, first.keys.front(), last.keys.back());
  }
  return std::nullopt;
}

void appendRowSharePart(RowShare& assembled, RowShare&& part) {
  for (RowBlock& b : part.blocks) {
    if (!assembled.blocks.empty() && assembled.blocks.back().table == b.table) {
      RowBlock& last = assembled.blocks.back();
      last.keys.insert(last.keys.end(), b.keys.begin(), b.keys.end());
      last.values.insert(last.values.end(), b.values.begin(), b.values.end());
      last.hops.insert(last.hops.end(), b.hops.begin(), b.hops.end());
    } else {
      assembled.blocks.push_back(std::move(b));
    }
  }
}

}  // namespace chorus::consensus
