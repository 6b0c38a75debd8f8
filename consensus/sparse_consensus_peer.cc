#include "consensus/sparse_consensus_peer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <stdexcept>
#include <utility>

#include "ml/metrics.h"
#include "ml/rng.h"
#include "node/node.h"

namespace chorus::consensus {

using SteadyClock = std::chrono::steady_clock;

namespace {

double secondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// The board keeps a "model" per neighbor and round; a sparse share's rows wait in the peer's
// inbox instead, so the board holds this empty vector for each.
const ModelPtr& noValues() {
  static const ModelPtr empty = std::make_shared<const std::vector<float>>();
  return empty;
}

// ||a - b||^2 of two sparse gradients (sorted keys).
double squaredDifference(const ml::SparseGrad& a, const ml::SparseGrad& b) {
  double sum = 0;
  size_t i = 0, j = 0;
  const size_t dim = std::max(a.dim, b.dim);
  const auto add_row = [&](const float* row, const float* other) {
    for (size_t d = 0; d < dim; ++d) {
      const double v = static_cast<double>(row[d]) - (other ? static_cast<double>(other[d]) : 0.0);
      sum += v * v;
    }
  };
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a.keys[i] < b.keys[j])) {
      add_row(a.row(i++), nullptr);
    } else if (i == a.size() || b.keys[j] < a.keys[i]) {
      add_row(b.row(j++), nullptr);
    } else {
      add_row(a.row(i++), b.row(j++));
    }
  }
  return sum;
}

double squaredNorm(const ml::SparseGrad& g) {
  double sum = 0;
  for (float v : g.rows)
    sum += static_cast<double>(v) * static_cast<double>(v);
  return sum;
}

}  // namespace

namespace {

BoardOptions boardOptions(const SparseLayout& layout, const SparseConsensusOptions& o) {
  BoardOptions b;
  b.neighbors = layout.neighbors;
  b.staleness_bound = o.staleness.bound;
  b.lag_window = o.lag_window;
  b.stall_timeout = o.stall_timeout;
  b.round_timeout = o.round_timeout;
  b.report_every = o.report_every;
  b.skip_gap = 0;  // iteration skipping is dense consensus's only (docs/sparse-consensus.md)
  return b;
}

// The rounds of one epoch: the batches of the largest shard, the same on every node (a node
// that stopped early would hold up its neighbors).
int64_t roundsPerEpoch(size_t points, size_t nodes, size_t batch) {
  const size_t largest = (points + nodes - 1) / nodes;
  return static_cast<int64_t>(std::max<size_t>(1, (largest + batch - 1) / batch));
}

std::span<const size_t> roundBatch(std::span<const size_t> order, int64_t round, int64_t rounds) {
  const uint64_t n = order.size();
  const auto begin =
      static_cast<size_t>(n * static_cast<uint64_t>(round) / static_cast<uint64_t>(rounds));
  const auto end =
      static_cast<size_t>(n * static_cast<uint64_t>(round + 1) / static_cast<uint64_t>(rounds));
  return order.subspan(begin, end - begin);
}

}  // namespace

SparseConsensusPeer::SparseConsensusPeer(node::Node& node, ml::SparseWorkload& workload,
                                         std::vector<size_t> shard, SparseLayout layout,
                                         SparseConsensusOptions options)
    : node_(node),
      workload_(workload),
      tables_(workload.tables()),
      shard_(std::move(shard)),
      layout_(std::move(layout)),
      options_(std::move(options)),
      mixing_((validateSparseConsensusOptions(options_), parseMixingKind(options_.mixing))),
      rule_(makeBackupRule(options_.backup)),
      board_(boardOptions(layout_, options_)),
      membership_(layout_.self, layout_.members),
      messages_(membership_, layout_.neighbors) {
  std::sort(layout_.neighbors.begin(), layout_.neighbors.end());
  std::sort(layout_.members.begin(), layout_.members.end());
  for (const ml::SparseTable* table : tables_) {
    shapes_.push_back({table->rows(), table->dim()});
    total_rows_ += table->rows();
    optimizers_.emplace_back(options_.train.optimizer, *table);
  }
  // A catch-up share carries the optimizer's state too: table T + t is table t's AdaGrad sums.
  catchup_shapes_ = shapes_;
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (!optimizers_[t].state().empty()) catchup_shapes_.push_back(shapes_[t]);
  }
  for (size_t t = 0; t < catchup_shapes_.size(); ++t)
    catchup_rows_ += catchup_shapes_[t].rows;
  relay_hops_ = static_cast<int>(options_.gossip.relay_hops);
  if (relay_hops_ == 0) {
    relay_hops_ = layout_.graph.empty() ? 1 : std::max(1, graphDiameter(layout_.graph));
  }
  SparseGossipOptions g;
  g.tables = shapes_;
  g.neighbors = layout_.neighbors;
  g.hot = options_.hot;
  g.cold_every = options_.gossip.cold_every;
  g.round_bytes = options_.gossip.round_bytes;
  g.relay_hops = relay_hops_;
  g.dense = options_.gossip.dense_exchange;
  gossip_ = std::make_unique<SparseGossip>(std::move(g));
  rounds_per_epoch_ =
      roundsPerEpoch(workload_.trainPoints(), layout_.members.size(), options_.train.batchSize);
  total_rounds_ = options_.train.epochs * rounds_per_epoch_;

  node_.setHandler(
      messageType(wire::Body::RowShare),
      [this](NodeId from, const node::InboundFrame& frame) { onRowShare(from, frame); });
  messages_.install(node_, {}, /*done_from_neighbors_only=*/true);
  node_.setEventHandler([this](const node::PeerEvent& event) { onPeerEvent(event); });
}

bool SparseConsensusPeer::isNeighbor(NodeId id) const {
  return std::binary_search(layout_.neighbors.begin(), layout_.neighbors.end(), id);
}

void SparseConsensusPeer::onPeerEvent(const node::PeerEvent& event) {
  switch (event.kind) {
    case node::PeerEventKind::kDown:
    case node::PeerEventKind::kLeft:
      if (isNeighbor(event.peer)) {
        board_.neighborDown(event.peer);
        partial_.erase(event.peer);
        // A node that comes back (--rejoin) starts its rounds afresh.
        last_complete_.erase(event.peer);
        std::lock_guard lock(inbox_mu_);
        inbox_.erase(event.peer);
      }
      membership_.down(event.peer);
      break;
    case node::PeerEventKind::kUp:
      if (isNeighbor(event.peer)) board_.neighborUp(event.peer);
      membership_.up(event.peer);
      break;
    default:
      break;
  }
}

void SparseConsensusPeer::onRowShare(NodeId from, const node::InboundFrame& frame) {
  const wire::RowShare* part = messageOf(frame).body_as_RowShare();
  std::optional<std::string> why =
      part == nullptr ? std::optional<std::string>("empty RowShare") : takePart(from, *part);
  if (!why) return;
  ++refused_;
  if (refusals_.count(from)) {
    node_.logger().warn("refused a RowShare from node {}: {} ({} refused from it so far)", from,
                        *why, refusals_.countOf(from));
  }
}

std::optional<std::string> SparseConsensusPeer::takePart(NodeId from, const wire::RowShare& part) {
  if (!isNeighbor(from)) return fmt::format("node {} is not a neighbor", from);
  const Round round = part.round();
  if (round < 0 || round >= total_rounds_) {
    return fmt::format("round {} is outside this run's rounds 0..{}", round, total_rounds_ - 1);
  }
  const uint32_t parts = part.parts();
  const size_t max_rows = part.catchup() ? catchup_rows_ : total_rows_;
  if (parts == 0 || part.part() >= parts || parts > max_rows + 1) {
    return fmt::format("part {} of {} is not a part of a share of at most {} rows", part.part(),
                       parts, max_rows);
  }
  if (part.catchup()) return takeCatchupPart(from, part);
  if (auto last = last_complete_.find(from);
      last != last_complete_.end() && round <= last->second) {
    return fmt::format("round {} arrived after its round {} was complete", round, last->second);
  }
  std::shared_ptr<RowShare> share;
  auto p = partial_.find(from);
  if (p == partial_.end()) p = partial_.emplace(from, Partial{}).first;
  if (std::optional<std::string> why =
          assemble(p->second, from, part, shapes_, total_rows_, &share)) {
    partial_.erase(from);
    return why;
  }
  if (!share) return std::nullopt;
  partial_.erase(from);
  last_complete_[from] = round;
  {
    std::lock_guard lock(inbox_mu_);
    auto& held = inbox_[from];
    held[round] = std::move(share);
    // Bounded as the board's models: the two oldest merge into the newer one.
    while (held.size() > board_.modelsHeldPerNeighbor() && held.size() >= 2) {
      auto oldest = held.begin();
      auto next = std::next(oldest);
      const std::vector<const RowShare*> both = {oldest->second.get(), next->second.get()};
      next->second = std::make_shared<RowShare>(mergeShares(both));
      held.erase(oldest);
    }
  }
  board_.modelArrived(from, round, noValues(), SteadyClock::now());
  return std::nullopt;
}

std::optional<std::string> SparseConsensusPeer::assemble(Partial& p, NodeId from,
                                                         const wire::RowShare& part,
                                                         std::span<const GossipTableShape> shapes,
                                                         size_t max_rows,
                                                         std::shared_ptr<RowShare>* complete) {
  const Round round = part.round();
  const uint32_t parts = part.parts();
  if (p.round != round) {
    if (p.round > round) {
      return fmt::format("round {} is older than its round {} being assembled", round, p.round);
    }
    // A new round: the sender moved on, its older share can never complete.
    p = Partial{};
    p.round = round;
    p.parts = parts;
    p.share.round = round;
  }
  if (part.part() != p.next || parts != p.parts) {
    return fmt::format(
        "part {} of {} of round {} arrived where part {} of {} was due (a sender "
        "writes a share's parts in order)",
        part.part(), parts, round, p.next, p.parts);
  }
  // The part is checked whole (widths, keys, values) before anything of it is kept: what a
  // hostile neighbor costs beyond the frame itself is at most max_rows checked rows.
  RowShare piece;
  piece.round = round;
  if (part.blocks() != nullptr) {
    size_t rows = p.rows;
    for (const wire::RowBlock* b : *part.blocks()) {
      if (b->keys() == nullptr || b->values() == nullptr || b->hops() == nullptr) {
        return fmt::format("a row block of round {} without keys, values or hop counts", round);
      }
      rows += b->keys()->size();
      if (rows > max_rows) {
        return fmt::format("round {} carries more rows than the model's {}", round, max_rows);
      }
    }
    for (const wire::RowBlock* b : *part.blocks()) {
      if (piece.blocks.empty() || piece.blocks.back().table != b->table()) {
        piece.blocks.push_back(RowBlock{b->table(), {}, {}, {}});
      }
      RowBlock& block = piece.blocks.back();
      block.keys.insert(block.keys.end(), b->keys()->begin(), b->keys()->end());
      block.values.insert(block.values.end(), b->values()->begin(), b->values()->end());
      block.hops.insert(block.hops.end(), b->hops()->begin(), b->hops()->end());
    }
    if (std::optional<std::string> bad = checkRowSharePart(p.share, piece, shapes, from)) {
      return bad;
    }
    p.rows = rows;
  }
  appendRowSharePart(p.share, std::move(piece));
  if (++p.next < p.parts) return std::nullopt;
  // Every part passed checkRowSharePart, so the whole share passes checkRowShare.
  *complete = std::make_shared<RowShare>(std::move(p.share));
  return std::nullopt;
}

std::optional<std::string> SparseConsensusPeer::takeCatchupPart(NodeId from,
                                                                const wire::RowShare& part) {
  std::lock_guard lock(catchup_mu_);
  if (!catchup_from_ || *catchup_from_ != from || catchup_) {
    return fmt::format("a catch-up share from node {}, which this node did not ask for", from);
  }
  std::shared_ptr<RowShare> share;
  if (std::optional<std::string> why =
          assemble(catchup_partial_, from, part, catchup_shapes_, catchup_rows_, &share)) {
    catchup_partial_ = Partial{};
    return why;
  }
  if (!share) return std::nullopt;
  catchup_partial_ = Partial{};
  // Every row of every table, and of every optimizer state table (blocks are ascending and
  // their keys unique and in range, so a count of catchup_rows_ is every row once).
  if (share->rows() != catchup_rows_) {
    return fmt::format(
        "the catch-up share from node {} holds {} rows where the model and its optimizer "
        "state have {}",
        from, share->rows(), catchup_rows_);
  }
  catchup_ = std::move(share);
  catchup_cv_.notify_all();
  return std::nullopt;
}

std::optional<RowShare> SparseConsensusPeer::takeInbox(NodeId from, Round round) {
  std::vector<std::shared_ptr<RowShare>> taken;
  {
    std::lock_guard lock(inbox_mu_);
    auto it = inbox_.find(from);
    if (it == inbox_.end()) return std::nullopt;
    auto& held = it->second;
    while (!held.empty() && held.begin()->first <= round) {
      taken.push_back(std::move(held.begin()->second));
      held.erase(held.begin());
    }
  }
  if (taken.empty()) return std::nullopt;
  std::vector<const RowShare*> ptrs;
  for (const auto& s : taken)
    ptrs.push_back(s.get());
  return mergeShares(ptrs);
}

void SparseConsensusPeer::sendShare(NodeId to, const RowShare& share, size_t backups,
                                    bool catchup) {
  // The parts: runs of rows of one block, at most chunk_floats values each (one row at least).
  // A catch-up share also has the optimizer state's tables (catchup_shapes_ starts with shapes_).
  const std::vector<GossipTableShape>& shapes = catchup ? catchup_shapes_ : shapes_;
  struct Piece {
    size_t block, begin, end;
  };
  std::vector<std::vector<Piece>> parts(1);
  size_t floats = 0;
  for (size_t b = 0; b < share.blocks.size(); ++b) {
    const RowBlock& block = share.blocks[b];
    const size_t dim = shapes[block.table].dim;
    size_t begin = 0;
    for (size_t r = 0; r < block.keys.size(); ++r) {
      if (floats > 0 && floats + dim > options_.chunk_floats) {
        if (r > begin) parts.back().push_back({b, begin, r});
        parts.emplace_back();
        floats = 0;
        begin = r;
      }
      floats += dim;
    }
    if (block.keys.size() > begin) parts.back().push_back({b, begin, block.keys.size()});
  }
  const auto count = static_cast<uint32_t>(parts.size());
  for (uint32_t i = 0; i < count; ++i) {
    size_t hint = 256;
    for (const Piece& piece : parts[i]) {
      const size_t dim = shapes[share.blocks[piece.block].table].dim;
      hint += (piece.end - piece.begin) * (9 + 4 * dim) + 64;
    }
    node::SharedFrame frame = encodeMessage(
        node_, wire::Body::RowShare,
        [&](flatbuffers::FlatBufferBuilder& fb) {
          std::vector<flatbuffers::Offset<wire::RowBlock>> blocks;
          for (const Piece& piece : parts[i]) {
            const RowBlock& block = share.blocks[piece.block];
            const size_t dim = shapes[block.table].dim;
            const size_t n = piece.end - piece.begin;
            auto keys = fb.CreateVector(block.keys.data() + piece.begin, n);
            auto values = fb.CreateVector(block.values.data() + piece.begin * dim, n * dim);
            auto hops = fb.CreateVector(block.hops.data() + piece.begin, n);
            blocks.push_back(wire::CreateRowBlock(fb, block.table, keys, values, hops));
          }
          auto vec = fb.CreateVector(blocks);
          return wire::CreateRowShare(fb, share.round, i, count, static_cast<uint32_t>(backups),
                                      vec, catchup)
              .Union();
        },
        hint);
    // A part refused by a full queue (or a connection that closed) loses its rows for `to`
    // until they change again: counted, and said once (docs/sparse-consensus.md).
    node_.send(to, frame, [this](NodeId peer, const node::Status& status) {
      if (status.ok()) return;
      if (parts_lost_++ == 0 && status.code() != node::ErrorCode::kShutdown) {
        node_.logger().warn(
            "a RowShare part to node {} was not sent: {} (later losses are only "
            "counted)",
            peer, status.message());
      }
    });
  }
}

RowShare SparseConsensusPeer::catchupShare(Round round) const {
  RowShare share;
  share.round = round;
  const auto add = [&](size_t index, size_t rows, std::span<const float> values) {
    RowBlock block;
    block.table = static_cast<uint32_t>(index);
    block.keys.resize(rows);
    for (RowKey k = 0; k < block.keys.size(); ++k)
      block.keys[k] = k;
    block.values.assign(values.begin(), values.end());
    block.hops.assign(block.keys.size(), kNoHop);
    if (!block.keys.empty()) share.blocks.push_back(std::move(block));
  };
  for (size_t t = 0; t < tables_.size(); ++t)
    add(t, tables_[t]->rows(), tables_[t]->values());
  // The state tables follow in table order (catchup_shapes_), as the receiver expects them.
  size_t index = tables_.size();
  for (size_t t = 0; t < tables_.size(); ++t) {
    const std::span<const float> state = std::as_const(optimizers_[t]).state();
    if (!state.empty()) add(index++, tables_[t]->rows(), state);
  }
  return share;
}

void SparseConsensusPeer::answerRequests(Round round) {
  const std::vector<NodeId> to = messages_.takeRequests();
  if (to.empty()) return;
  const RowShare share = catchupShare(round);
  for (NodeId peer : to) {
    node_.logger().info("sending the tables after round {} to rejoining node {}", round, peer);
    sendShare(peer, share, 0, /*catchup=*/true);
  }
}

Round SparseConsensusPeer::catchUp() {
  spdlog::logger& log = node_.logger();
  const std::vector<NodeId> connected = node_.connectedPeers();
  for (NodeId neighbor : layout_.neighbors) {
    if (!std::binary_search(connected.begin(), connected.end(), neighbor)) continue;
    log.info("rejoining: asking node {} for its tables", neighbor);
    {
      std::lock_guard lock(catchup_mu_);
      catchup_from_ = neighbor;
      catchup_partial_ = Partial{};
      catchup_.reset();
    }
    node_.send(
        neighbor,
        encodeMessage(node_, wire::Body::ModelRequest, [](flatbuffers::FlatBufferBuilder& b) {
          return wire::CreateModelRequest(b, b.CreateString("rejoin")).Union();
        }));
    std::unique_lock lock(catchup_mu_);
    catchup_cv_.wait_for(lock, options_.catchup_timeout,
                         [&] { return catchup_ != nullptr || membership_.stopped(); });
    if (membership_.stopped()) return 0;
    if (catchup_) {
      // Blocks 0..T-1 are the tables, the rest their optimizer state in table order
      // (catchupShare); the share holds every row of each, so each block is one whole table.
      std::vector<std::span<float>> targets;
      for (ml::SparseTable* table : tables_)
        targets.push_back(table->values());
      for (ml::SparseOptimizer& optimizer : optimizers_) {
        if (!optimizer.state().empty()) targets.push_back(optimizer.state());
      }
      for (const RowBlock& block : catchup_->blocks) {
        std::copy(block.values.begin(), block.values.end(), targets[block.table].begin());
      }
      const Round first = catchup_->round + 1;
      catchup_from_.reset();
      catchup_.reset();
      log.info("rejoining: took node {}'s tables after its round {}; running rounds {}..{}",
               neighbor, first - 1, first, total_rounds_ - 1);
      return first;
    }
    log.warn("rejoining: node {} did not answer within {} ms; asking the next neighbor", neighbor,
             options_.catchup_timeout.count());
  }
  throw std::runtime_error(
      "rejoining: no live neighbor answered with its tables (is the run still going?)");
}

std::vector<ml::NamedMetric> SparseConsensusPeer::evaluate(const std::string& split) {
  return workload_.evaluate(split);
}

void SparseConsensusPeer::stop() {
  membership_.stop();
  board_.stop();
  std::lock_guard lock(catchup_mu_);
  catchup_cv_.notify_all();
}

SparseConsensusReport SparseConsensusPeer::run() {
  SparseConsensusReport report;
  const ml::SparseTrainOptions& train = options_.train;
  spdlog::logger& log = node_.logger();
  const NodeId self = layout_.self;
  const bool reporter = self == layout_.members.front();
  const size_t rank = static_cast<size_t>(
      std::find(layout_.members.begin(), layout_.members.end(), self) - layout_.members.begin());
  report.rounds_per_epoch = rounds_per_epoch_;
  report.spec = workload_.spec();
  for (const ml::SparseTable* table : tables_)
    report.parameters += table->values().size();
  size_t hot_rows = 0;
  for (const auto& keys : options_.hot)
    hot_rows += keys.size();
  const size_t own_degree = layout_.neighbors.size();
  const auto degreeOf = [&](NodeId id) {
    auto it = layout_.degrees.find(id);
    return it == layout_.degrees.end() ? layout_.members.size() - 1 : it->second;
  };

  // A rejoining or resumed node appends to its file: its earlier life's lines stay.
  const run::CutPlan& cuts = options_.cuts;
  ml::MetricsWriter metrics(train.metricsPath, options_.rejoin || cuts.resumed.has_value());
  for (const std::string& line : cuts.skipped)
    log.warn("{}", line);
  const Round first_round = options_.rejoin ? catchUp() : cuts.resumed ? restoreCut() : 0;
  report.first_round = first_round;
  if (options_.rejoin && options_.on_caught_up && !membership_.stopped()) {
    options_.on_caught_up(first_round);
  }
  ml::MetricsEvent start("start");
  start.add("model", workload_.spec())
      .add("parameters", static_cast<uint64_t>(report.parameters))
      .add("train_points", static_cast<uint64_t>(workload_.trainPoints()))
      .add("batch", static_cast<uint64_t>(train.batchSize))
      .add("optimizer", ml::sparseOptimizerName(train.optimizer.kind))
      .add("lr", train.optimizer.lr)
      .add("seed", train.seed)
      .add("start_epoch", first_round / rounds_per_epoch_)
      .add("first_round", first_round)
      .add("mode", "consensus")
      .add("exchange", options_.gossip.dense_exchange ? "dense" : "sparse")
      .add("node", static_cast<uint64_t>(self))
      .add("workers", static_cast<uint64_t>(layout_.members.size()))
      .add("neighbors", fmt::format("{}", fmt::join(layout_.neighbors, ",")))
      .add("backup", options_.backup.name())
      .add("mixing", options_.mixing)
      .add("staleness", options_.staleness.toString())
      .add("cold_every", options_.gossip.cold_every)
      .add("round_bytes", options_.gossip.round_bytes)
      .add("hot_rows", static_cast<uint64_t>(hot_rows))
      .add("relay_hops", int64_t{relay_hops_})
      .add("shard_points", static_cast<uint64_t>(shard_.size()))
      .add("rounds_per_epoch", rounds_per_epoch_)
      .add("rows", static_cast<uint64_t>(total_rows_));
  for (const auto& [key, value] : train.startFields)
    start.add(key, value);
  metrics.write(start);
  log.info(
      "sparse consensus: {} epochs of {} rounds on {} of {} points, model {} ({} rows, {} hot), "
      "{} exchange with neighbors [{}], cold rows every {} round(s), relay {} hop(s)",
      train.epochs, rounds_per_epoch_, shard_.size(), workload_.trainPoints(), workload_.spec(),
      total_rows_, hot_rows, options_.gossip.dense_exchange ? "dense" : "sparse",
      fmt::join(layout_.neighbors, ", "), options_.gossip.cold_every, relay_hops_);

  std::vector<ml::SparseGradAccumulator> accumulators;
  for (const ml::SparseTable* table : tables_)
    accumulators.emplace_back(table->rows(), table->dim());
  std::vector<ml::SparseGrad> grads(tables_.size()), previous(tables_.size());
  std::vector<size_t> order = shard_;
  const std::vector<std::string> splits = workload_.evalSplits();
  const auto views = [&] {
    std::vector<std::span<const float>> v;
    for (const ml::SparseTable* t : tables_)
      v.emplace_back(t->values());
    return v;
  };
  const auto mutableViews = [&] {
    std::vector<std::span<float>> v;
    for (ml::SparseTable* t : tables_)
      v.emplace_back(t->values());
    return v;
  };

  double grad_ema = 0, noise_ema = 0, compute_ema = 0;
  bool have_grad = false, have_noise = false;
  Round round = first_round;
  int64_t points_seen = 0;
  node::PeerStats last_bytes = node_.totals();
  const int64_t first_epoch = first_round / rounds_per_epoch_;
  int64_t epoch = first_epoch;
  for (; epoch < train.epochs && !membership_.stopped(); ++epoch) {
    // Each node's order of an epoch depends only on (seed, epoch, its rank), as sparse PS mode's.
    std::copy(shard_.begin(), shard_.end(), order.begin());
    ml::Rng shuffle(
        ml::mixSeed(train.seed, 0x5EED1000 + static_cast<uint64_t>(epoch) * 4096 + rank));
    shuffle.shuffle(order.begin(), order.end());
    ml::Rng rng(ml::mixSeed(train.seed, 0x5EED0000 + static_cast<uint64_t>(epoch) * 4096 + rank));
    const auto epoch_start = SteadyClock::now();
    double epoch_wait = 0, epoch_loss = 0;
    size_t epoch_points = 0;
    uint64_t epoch_rows = 0, epoch_share_bytes = 0;
    for (int64_t r = epoch == first_epoch ? first_round % rounds_per_epoch_ : 0;
         r < rounds_per_epoch_; ++r, ++round) {
      const auto compute_start = SteadyClock::now();
      const std::span<const size_t> batch = roundBatch(order, r, rounds_per_epoch_);
      double loss = 0;
      // 1. The local step on this node's replica.
      if (!batch.empty()) {
        loss = workload_.computeGradients(batch, rng, accumulators);
        if (!std::isfinite(loss)) {
          throw std::runtime_error(
              fmt::format("training diverged (loss {}) at epoch {}, round {}: "
                          "lower --lr",
                          loss, epoch + 1, round));
        }
        double norm = 0, diff = 0;
        for (size_t t = 0; t < tables_.size(); ++t) {
          std::swap(previous[t], grads[t]);
          accumulators[t].finish(grads[t]);
          norm += squaredNorm(grads[t]);
          if (have_grad) diff += squaredDifference(grads[t], previous[t]);
          optimizers_[t].apply(*tables_[t], grads[t]);
          gossip_->markLocal(t, grads[t].keys, round);
        }
        grad_ema = have_grad ? 0.9 * grad_ema + 0.1 * norm : norm;
        if (have_grad) {
          noise_ema = have_noise ? 0.9 * noise_ema + 0.1 * diff / 2 : diff / 2;
          have_noise = true;
        }
        have_grad = true;
        epoch_loss += loss * static_cast<double>(batch.size());
        epoch_points += batch.size();
      }
      const double compute_s = secondsSince(compute_start);
      compute_ema = round == 0 ? compute_s : 0.8 * compute_ema + 0.2 * compute_s;
      // 2. Each live neighbor's share (the last round sends every pending row).
      const RoundObservation obs = board_.observe(compute_ema, grad_ema, noise_ema);
      const WaitPlan plan = rule_->plan(obs);
      const bool last = round + 1 == total_rounds_;
      uint64_t rows_sent = 0, share_bytes = 0;
      const std::vector<std::span<const float>> view = views();
      for (NodeId to : layout_.neighbors) {
        if (membership_.isDown(to)) continue;
        const RowShare share = gossip_->select(to, round, view, last);
        rows_sent += share.rows();
        share_bytes += share.payloadBytes();
        sendShare(to, share, plan.backups);
      }
      // 3. Wait per the plan and the staleness bound, then mix row by row.
      const GatherResult gathered = board_.gather(round, plan, [&](const std::vector<NodeId>& w) {
        log.info("round {}: waiting for node(s) {}", round, fmt::join(w, ", "));
      });
      if (gathered.stopped) break;
      std::vector<RowShare> shares;
      std::vector<NodeId> from;
      int64_t staleness_max = 0;
      shares.reserve(gathered.models.size());
      for (const UsedModel& m : gathered.models) {
        std::optional<RowShare> s = takeInbox(m.from, m.round);
        if (!s) continue;
        shares.push_back(std::move(*s));
        from.push_back(m.from);
        staleness_max = std::max(staleness_max, m.staleness);
      }
      std::vector<CarriedShare> used;
      for (size_t k = 0; k < shares.size(); ++k)
        used.push_back({from[k], degreeOf(from[k]), &shares[k]});
      const MixResult mixed = gossip_->mix(round, mutableViews(), mixing_, own_degree, used);
      report.max_staleness = std::max(report.max_staleness, staleness_max);
      report.rows_sent += rows_sent;
      report.share_bytes += share_bytes;
      report.rows_mixed += mixed.rows_mixed;
      epoch_rows += rows_sent;
      epoch_share_bytes += share_bytes;
      epoch_wait += gathered.waited_seconds;
      size_t pending = 0;
      for (NodeId to : layout_.neighbors)
        pending += gossip_->pendingRows(to);
      const node::PeerStats bytes = node_.totals();
      metrics.write(ml::MetricsEvent("round")
                        .add("round", round)
                        .add("epoch", epoch + 1)
                        .add("loss", loss)
                        .add("rows_sent", rows_sent)
                        .add("share_bytes", share_bytes)
                        .add("rows_mixed", static_cast<uint64_t>(mixed.rows_mixed))
                        .add("rows_relayed", static_cast<uint64_t>(mixed.rows_relayed))
                        .add("rows_pending", static_cast<uint64_t>(pending))
                        .add("used", static_cast<uint64_t>(used.size()))
                        .add("wait_for", static_cast<uint64_t>(plan.wait_for))
                        .add("backups", static_cast<uint64_t>(plan.backups))
                        .add("live_neighbors", static_cast<uint64_t>(gathered.live_neighbors))
                        .add("compute_s", compute_s)
                        .add("wait_s", gathered.waited_seconds)
                        .add("staleness_max", staleness_max)
                        .addBool("timed_out", gathered.timed_out)
                        .add("bytes_sent", bytes.bytes_out - last_bytes.bytes_out)
                        .add("bytes_received", bytes.bytes_in - last_bytes.bytes_in));
      last_bytes = bytes;
      answerRequests(round);
      if (options_.on_round_end) options_.on_round_end(round);
    }
    if (membership_.stopped()) break;
    const double seconds = secondsSince(epoch_start);
    report.train_seconds += seconds;
    report.wait_seconds += epoch_wait;
    points_seen += static_cast<int64_t>(epoch_points);
    const double mean_loss = epoch_loss / static_cast<double>(std::max<size_t>(epoch_points, 1));
    report.epoch_losses.push_back(mean_loss);
    const node::PeerStats bytes = node_.totals();
    ml::MetricsEvent event("epoch");
    event.add("epoch", epoch + 1)
        .add("step", round)
        .add("loss", mean_loss)
        .add("epoch_seconds", seconds)
        .add("train_seconds", report.train_seconds)
        .add("wait_seconds", epoch_wait)
        .add("points_per_s", seconds > 0 ? static_cast<double>(epoch_points) / seconds : 0.0)
        .add("rows_sent", epoch_rows)
        .add("share_bytes", epoch_share_bytes)
        .add("bytes_out", bytes.bytes_out)
        .add("bytes_in", bytes.bytes_in);
    std::string line = fmt::format(
        "epoch {}/{}: train loss {:.4f} (this node) | {:.1f} s ({:.1f} s waiting for neighbors), "
        "{:.0f} rows sent per round",
        epoch + 1, train.epochs, mean_loss, seconds, epoch_wait,
        static_cast<double>(epoch_rows) / static_cast<double>(rounds_per_epoch_));
    const bool last = epoch + 1 == train.epochs;
    if (reporter && !splits.empty() && train.evalEvery > 0 && (epoch + 1) % train.evalEvery == 0 &&
        !last) {
      const auto eval_start = SteadyClock::now();
      const std::vector<ml::NamedMetric> quality = evaluate(splits.front());
      const double eval_seconds = secondsSince(eval_start);
      ml::addMetrics(event, splits.front() + "_", quality);
      event.add("eval_seconds", eval_seconds);
      line += fmt::format(" | {}: {} ({:.1f} s)", splits.front(), ml::formatMetrics(quality),
                          eval_seconds);
    }
    metrics.write(event);
    log.info("{}", line);
    if (cuts.cutAt(epoch + 1, train.epochs) && !membership_.stopped()) writeCut(epoch + 1, round);
  }
  report.stopped = membership_.stopped();
  report.epochs_done = epoch;
  report.rounds_done = round;
  report.points_per_second =
      report.train_seconds > 0 ? static_cast<double>(points_seen) / report.train_seconds : 0.0;
  const node::PeerStats clock_bytes = node_.totals();

  ml::MetricsEvent summary("summary");
  if (!report.stopped) {
    // TrainingDone first, so that the neighbors can leave while node 0 evaluates.
    node::SharedFrame done =
        encodeMessage(node_, wire::Body::TrainingDone, [&](flatbuffers::FlatBufferBuilder& b) {
          return wire::CreateTrainingDone(b, round, 0, -1).Union();
        });
    for (NodeId to : layout_.neighbors) {
      if (!membership_.isDown(to)) node_.send(to, done);
    }
    // Every replica is a model of this run (there is no global one): node 0 evaluates its
    // replica on every split, every other node its own on the final split, so that the files
    // show how far the replicas agree.
    if (!splits.empty()) {
      const std::vector<std::string> evaluated =
          reporter ? splits : std::vector<std::string>{splits.back()};
      auto quality = ml::evaluateSplitsInto(workload_, evaluated, summary);
      report.replica = quality.back().second;
      if (reporter) report.final = std::move(quality);
    }
    run::SettleOptions settle;
    settle.peers = layout_.neighbors;
    settle.timeout = options_.finish_timeout;
    settle.report_every = options_.report_every;
    // A neighbor that rejoins late still gets the final tables.
    settle.has_work = [this] { return messages_.hasRequestsLocked(); };
    settle.work = [this, round] { answerRequests(round - 1); };
    run::PeerSettlement settled = membership_.settle(settle, log);
    report.finished_peers = std::move(settled.finished);
    report.departed_peers = std::move(settled.departed);
  }
  const node::PeerStats bytes = node_.totals();
  report.bytes_out = bytes.bytes_out;
  report.bytes_in = bytes.bytes_in;
  report.shares_refused = refused_.load();
  report.parts_lost = parts_lost_.load();
  const double rounds = static_cast<double>(std::max<Round>(report.rounds_done - first_round, 1));
  ml::addSparseRunSummary(summary, {.epochs = report.epochs_done,
                                    .steps = report.rounds_done,
                                    .train_seconds = report.train_seconds,
                                    .wait_seconds = report.wait_seconds,
                                    .points_per_s = report.points_per_second,
                                    .bytes_out = report.bytes_out,
                                    .bytes_in = report.bytes_in,
                                    .stopped = report.stopped});
  summary.add("rows_sent", report.rows_sent)
      .add("share_bytes", report.share_bytes)
      .add("rows_per_round", static_cast<double>(report.rows_sent) / rounds)
      .add("share_bytes_per_round", static_cast<double>(report.share_bytes) / rounds)
      .add("round_bytes_out", clock_bytes.bytes_out)
      .add("bytes_per_round", static_cast<double>(clock_bytes.bytes_out) / rounds)
      .add("rows_mixed", report.rows_mixed)
      .add("max_staleness", report.max_staleness)
      .add("shares_refused", report.shares_refused)
      .add("parts_lost", report.parts_lost);
  metrics.write(summary);
  return report;
}

}  // namespace chorus::consensus
