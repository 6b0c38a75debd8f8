#include "consensus/consensus_peer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "faults/straggler.h"
#include "ml/metrics.h"
#include "ml/rng.h"
#include "ml/train.h"
#include "node/finite.h"
#include "node/node.h"
#include "run/cli_checks.h"
#include "run/cluster_checkpoint.h"

namespace chorus::consensus {

using Clock = std::chrono::steady_clock;

void addConsensusOptions(CLI::App& cmd, ConsensusOptions& o) {
  // Read here, once: a bad rule is refused by CLI11 naming the flag and the accepted forms.
  cmd.add_option_function<std::string>(
         "--backup",
         [&o](const std::string& text) {
           o.backup = BackupRuleSpec::read(text).value();  // checked below
         },
         "Backup-worker rule: wait-all, static:B, deadline:Q or dynamic[:TOLERANCE] "
         "(docs/backup-rules.md)")
      ->check(run::readableAs(&BackupRuleSpec::read, "RULE", "BACKUP_RULE"))
      ->default_str(o.backup.name());
  cmd.add_option("--mixing", o.mixing,
                 "Mixing weights: uniform (normalized over the models that arrived) or "
                 "metropolis (Metropolis-Hastings)")
      ->capture_default_str();
  cmd.add_option("--chunk-floats", o.chunk_floats,
                 "Floats per ModelShare frame: models travel in chunks of this size")
      ->check(CLI::Range(size_t{1}, size_t{64} << 20))
      ->capture_default_str();
  cmd.add_option("--skip-gap", o.skip_gap,
                 "Iteration skipping: a node whose every neighbor is at least this many rounds "
                 "ahead jumps to their round, mixing in their newest models (0: never skip)")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}))
      ->capture_default_str();
  cmd.add_flag("--rejoin", o.rejoin,
               "This node restarts after a failure and joins the running job instead of "
               "starting at round/clock 0: in consensus mode it takes a neighbor's current "
               "model; in PS mode it gets its keys back from a live node's last read and "
               "joins at the cluster's clock");
}

// A ModelShare frame's bytes besides its chunk of values (envelope, round, offsets): about 100;
// the bound leaves room.
constexpr uint64_t kModelShareOverheadBytes = 4096;

void validateChunkFitsFrames(const ConsensusOptions& o, uint32_t max_frame_bytes) {
  const uint64_t chunk_bytes = uint64_t{o.chunk_floats} * sizeof(float);
  if (chunk_bytes + kModelShareOverheadBytes > max_frame_bytes) {
    throw std::invalid_argument(
        fmt::format("--chunk-floats {} sends model chunks of {} bytes plus an envelope, more than "
                    "--max-frame-mib {} accepts: lower --chunk-floats or raise --max-frame-mib",
                    o.chunk_floats, chunk_bytes, max_frame_bytes >> 20));
  }
}

void validateConsensusOptions(const ConsensusOptions& o) {
  parseMixingKind(o.mixing);
  if (o.staleness.infinite() || o.staleness.bound < 0 || o.staleness.bound > kMaxStaleness) {
    throw std::invalid_argument(fmt::format(
        "--staleness {}: consensus mode needs a bound from 0 to {} rounds (async, an infinite "
        "bound, is PS mode's)",
        o.staleness.toString(), kMaxStaleness));
  }
  if (o.chunk_floats == 0) throw std::invalid_argument("--chunk-floats must be > 0");
  if (o.skip_gap < 0) throw std::invalid_argument("--skip-gap must be >= 0");
}

namespace {

// The root of the end-of-run convergecast: it evaluates the average of the final models.
constexpr NodeId kCollector = 0;

BoardOptions boardOptions(const PeerLayout& layout, const ConsensusOptions& o) {
  BoardOptions b;
  b.neighbors = layout.neighbors;
  b.staleness_bound = o.staleness.bound;
  b.lag_window = o.lag_window;
  b.stall_timeout = o.stall_timeout;
  b.round_timeout = o.round_timeout;
  b.report_every = o.report_every;
  b.skip_gap = o.skip_gap;
  return b;
}

std::string idList(const std::vector<NodeId>& ids) {
  return fmt::format("{}", fmt::join(ids, ", "));
}

}  // namespace

ConsensusPeer::ConsensusPeer(node::Node& node, run::NodeJob job, PeerLayout layout,
                             ConsensusOptions options)
    : node_(node),
      job_(std::move(job)),
      layout_(std::move(layout)),
      options_(std::move(options)),
      mixing_((validateConsensusOptions(options_),
               validateChunkFitsFrames(options_, node.options().max_frame_bytes),
               parseMixingKind(options_.mixing))),
      rule_(makeBackupRule(options_.backup)),
      board_(boardOptions(layout_, options_)),
      gossip_(job_.model->size()),
      finals_(job_.model->size()),
      finals_low_(job_.model->size()),
      catchups_(job_.model->size()),
      membership_(layout_.self, layout_.members),
      messages_(membership_, layout_.neighbors) {
  std::sort(layout_.neighbors.begin(), layout_.neighbors.end());
  std::sort(layout_.members.begin(), layout_.members.end());
  tree_graph_ = layout_.graph;
  if (tree_graph_.empty()) {
    // No graph: a star around the collector (every member sends to node 0 directly).
    for (NodeId id : layout_.members) {
      if (id == kCollector) continue;
      tree_graph_[kCollector].push_back(id);
      tree_graph_[id] = {kCollector};
    }
  }
  tree_ = spanningTreeLinks(tree_graph_, kCollector, layout_.self);
  depths_ = depthsFrom(tree_graph_, kCollector);
  possible_children_ = possibleChildren(tree_graph_, depths_, layout_.self);
  end_peers_ = layout_.neighbors;
  if (tree_.parent) end_peers_.push_back(*tree_.parent);
  end_peers_.insert(end_peers_.end(), tree_.children.begin(), tree_.children.end());
  // A repaired tree links this node to any neighbor in the tree graph.
  if (auto it = tree_graph_.find(layout_.self); it != tree_graph_.end()) {
    end_peers_.insert(end_peers_.end(), it->second.begin(), it->second.end());
  }
  std::sort(end_peers_.begin(), end_peers_.end());
  end_peers_.erase(std::unique(end_peers_.begin(), end_peers_.end()), end_peers_.end());
  node_.setHandler(
      messageType(wire::Body::ModelShare),
      [this](NodeId from, const node::InboundFrame& frame) { onModelShare(from, frame); });
  // TrainingDone from any end-of-run peer (tree links are not always neighbors).
  messages_.install(
      node_,
      [this](NodeId from, const wire::TrainingDone* done) {
        if (done != nullptr && done->parent() >= 0) {
          // The sender's parent in the end-of-run tree (its barrier, or a re-attach).
          const auto named = static_cast<NodeId>(done->parent());
          std::optional<std::vector<NodeId>> late_summary;
          {
            auto lock = membership_.lock();
            named_parent_[from] = named;
            if (named == layout_.self) late_summary = summary_sent_;
          }
          if (late_summary) {
            // It re-attached after the summary went down: it gets it now.
            sendTrainingDone({from}, rounds_done_.load(), &*late_summary, std::nullopt);
          }
          membership_.notify();
        }
        if (done != nullptr && done->finished() != nullptr) {
          bool from_parent = false;
          {
            auto lock = membership_.lock();
            from_parent = parent_ == from;
          }
          if (!from_parent) {
            node_.logger().warn(
                "end-of-run summary from node {}, which is not this node's parent in the spanning "
                "tree: ignored",
                from);
          } else {
            std::vector<NodeId> finished;
            for (uint32_t id : *done->finished()) {
              if (std::binary_search(layout_.members.begin(), layout_.members.end(), id)) {
                finished.push_back(id);
              }
            }
            std::sort(finished.begin(), finished.end());
            finished.erase(std::unique(finished.begin(), finished.end()), finished.end());
            auto lock = membership_.lock();
            summary_ = std::move(finished);
          }
        }
      },
      /*done_from_neighbors_only=*/false);
  node_.setEventHandler([this](const node::PeerEvent& event) { onPeerEvent(event); });
}

bool ConsensusPeer::isNeighbor(NodeId id) const {
  return std::binary_search(layout_.neighbors.begin(), layout_.neighbors.end(), id);
}

std::optional<std::string> ConsensusPeer::refusalOf(NodeId from, const wire::ModelShare& share,
                                                    spdlog::level::level_enum* level) {
  *level = spdlog::level::warn;
  const size_t size = job_.model->size();
  if (share.values() == nullptr) return fmt::format("ModelShare from node {} without values", from);
  if (share.total() != size) {
    return fmt::format(
        "ModelShare from node {} is for a model of {} floats, this node's has {} (every node "
        "must run the same --model and --data)",
        from, share.total(), size);
  }
  const Round round = share.round();
  // A Final or PartialSum carries the rounds its sender finished (at most every round); the
  // others a round.
  const bool summed = share.purpose() == wire::SharePurpose::Final ||
                      share.purpose() == wire::SharePurpose::PartialSum;
  const Round last = summed ? job_.rounds : job_.rounds - 1;
  switch (share.purpose()) {
    case wire::SharePurpose::Gossip:
      if (!isNeighbor(from)) {
        return fmt::format("round-{} model chunk from node {}, which is not a neighbor", round,
                           from);
      }
      break;
    case wire::SharePurpose::Final:
      // Sent by builds before the convergecast: a partial sum of the sender's model alone.
      if (layout_.self != kCollector) {
        return fmt::format("final model chunk from node {}, but only node {} collects them", from,
                           kCollector);
      }
      break;
    case wire::SharePurpose::PartialSum: {
      bool child = false;
      {
        auto lock = membership_.lock();
        auto named = named_parent_.find(from);
        child = named != named_parent_.end() && named->second == layout_.self;
      }
      if (!child) {
        return fmt::format(
            "partial sum chunk from node {}, which did not name this node as its parent in the "
            "end-of-run tree",
            from);
      }
      if (share.models() == nullptr || share.models()->size() == 0) {
        return fmt::format("partial sum chunk from node {} names no models", from);
      }
      if (share.low() != nullptr && share.low()->size() != share.values()->size()) {
        return fmt::format("partial sum chunk from node {} has {} low parts for {} values", from,
                           share.low()->size(), share.values()->size());
      }
      // The node that summed it: the sender, or the owner of a relayed (unmerged) sum.
      const int64_t owner = share.owner() >= 0 ? share.owner() : from;
      std::vector<NodeId> models(share.models()->begin(), share.models()->end());
      std::sort(models.begin(), models.end());
      if (owner > std::numeric_limits<NodeId>::max() ||
          std::adjacent_find(models.begin(), models.end()) != models.end() ||
          !std::binary_search(models.begin(), models.end(), static_cast<NodeId>(owner)) ||
          !std::all_of(models.begin(), models.end(), [&](NodeId id) {
            return id != layout_.self &&
                   std::binary_search(layout_.members.begin(), layout_.members.end(), id);
          })) {
        return fmt::format(
            "partial sum chunk from node {} names models [{}]: not distinct members other than "
            "this node, with its summer's (node {}) among them",
            from, idList(models), owner);
      }
      break;
    }
    case wire::SharePurpose::Catchup: {
      auto lock = membership_.lock();
      if (catchup_from_ != from) {
        return fmt::format("catch-up model chunk from node {}, which this node did not ask", from);
      }
      break;
    }
    default:
      return fmt::format("ModelShare from node {} with purpose {} is not handled", from,
                         static_cast<int>(share.purpose()));
  }
  if (round < 0 || round > last) {
    return fmt::format("model chunk from node {} for round {}, outside this run's rounds 0..{}",
                       from, round, last);
  }
  if (share.purpose() == wire::SharePurpose::Gossip &&
      round < current_round_.load() - options_.staleness.bound) {
    // A slow neighbor's late model: normal, and no longer of use.
    *level = spdlog::level::debug;
    return fmt::format(
        "round-{} model chunk from node {} is too old to be mixed (this node is in round {}, "
        "tau {})",
        round, from, current_round_.load(), options_.staleness.bound);
  }
  const std::span<const float> values(share.values()->data(), share.values()->size());
  if (const std::optional<size_t> bad = node::firstNonFinite(values)) {
    return fmt::format(
        "round-{} model chunk [{}, {}) from node {} holds {} non-finite value(s) (the first, {}, "
        "at parameter {}): its round-{} model will not be used",
        round, share.offset(), share.offset() + values.size(), from, node::countNonFinite(values),
        values[*bad], share.offset() + *bad, round);
  }
  return std::nullopt;
}

void ConsensusPeer::countHeld() {
  size_t finals = 0;
  {
    auto lock = membership_.lock();
    for (const auto& [id, sum] : partial_sums_)
      finals += sum.values.capacity() * sizeof(double);
    for (const auto& [id, model] : catchup_models_)
      finals += model.values.capacity() * sizeof(float);
  }
  const uint64_t bytes = gossip_.heldBytes() + finals_.heldBytes() + finals_low_.heldBytes() +
                         catchups_.heldBytes() + board_.heldBytes() + finals;
  held_bytes_ = bytes;
  if (bytes > peak_held_bytes_.load()) peak_held_bytes_ = bytes;
}

HeldModels ConsensusPeer::held() const {
  return {held_bytes_.load(), peak_held_bytes_.load(), chunks_.load(), refused_chunks_.load()};
}

void ConsensusPeer::onModelShare(NodeId from, const node::InboundFrame& frame) {
  const wire::ModelShare* share = messageOf(frame).body_as_ModelShare();
  chunks_ += 1;
  auto refuse = [&](spdlog::level::level_enum level, const std::string& why) {
    refused_chunks_ += 1;
    if (level < spdlog::level::warn) {  // normal traffic (a late model): not rate-limited
      node_.logger().log(level, "{}: ignored", why);
      return;
    }
    if (!refusals_.count(from)) return;
    const uint64_t count = refusals_.countOf(from);
    node_.logger().log(
        level, "{}: ignored{}", why,
        count > 1 ? fmt::format(" ({} chunks refused from node {} so far)", count, from) : "");
  };
  spdlog::level::level_enum level = spdlog::level::warn;
  if (std::optional<std::string> why = refusalOf(from, *share, &level)) {
    refuse(level, *why);
    return;
  }
  std::span<const float> values(share->values()->data(), share->values()->size());
  bool completed = false;
  const wire::SharePurpose purpose = share->purpose();
  const bool summed =
      purpose == wire::SharePurpose::Final || purpose == wire::SharePurpose::PartialSum;
  const char* what = purpose == wire::SharePurpose::Final        ? "final model chunk"
                     : purpose == wire::SharePurpose::PartialSum ? "partial sum chunk"
                     : purpose == wire::SharePurpose::Catchup    ? "catch-up model chunk"
                                                                 : "model chunk";
  ModelAssembler& assembler = summed                                   ? finals_
                              : purpose == wire::SharePurpose::Catchup ? catchups_
                                                                       : gossip_;
  // A partial sum is assembled under the node that summed it (a relayed one under its owner:
  // one node can relay several), the others under their sender.
  const bool relay = purpose == wire::SharePurpose::PartialSum && share->owner() >= 0;
  const NodeId key = relay ? static_cast<NodeId>(share->owner()) : from;
  if (auto error = assembler.add(key, share->round(), share->offset(), values, &completed)) {
    refuse(spdlog::level::warn, fmt::format("{} from node {}: {}", what, from, *error));
    return;
  }
  if (purpose == wire::SharePurpose::PartialSum) {
    // The low halves travel in the same chunks (none from a sender of floats only: zeros).
    std::vector<float> zeros;
    std::span<const float> low;
    if (share->low() != nullptr) {
      low = {share->low()->data(), share->low()->size()};
    } else {
      zeros.assign(values.size(), 0.0f);
      low = zeros;
    }
    bool low_completed = false;
    if (auto error = finals_low_.add(key, share->round(), share->offset(), low, &low_completed)) {
      refuse(spdlog::level::warn, fmt::format("{} from node {}: {}", what, from, *error));
      return;
    }
    // Checked by refusalOf(): distinct members, the summer among them.
    auto lock = membership_.lock();
    partial_models_[key] = {std::vector<NodeId>(share->models()->begin(), share->models()->end()),
                            relay};
  }
  if (completed) {
    if (purpose == wire::SharePurpose::Gossip) {
      board_.modelArrived(from, share->round(),
                          std::make_shared<const std::vector<float>>(gossip_.takeLatest(from)),
                          Clock::now());
    } else {
      {
        auto lock = membership_.lock();
        if (purpose == wire::SharePurpose::Final) {
          const std::vector<float> model = finals_.takeLatest(from);
          partial_sums_[from] = {
              from, false, std::vector<double>(model.begin(), model.end()), {from}};
        } else if (purpose == wire::SharePurpose::PartialSum) {
          auto [models, relayed] = std::move(partial_models_[key]);
          partial_models_.erase(key);
          std::sort(models.begin(), models.end());
          const std::vector<float> hi = finals_.takeLatest(key);
          const std::vector<float> lo = finals_low_.takeLatest(key);
          partial_sums_[key] = {from, relayed, joinWide(hi, lo), std::move(models)};
        } else {
          catchup_models_[from] = {share->round(), catchups_.takeLatest(from)};
        }
      }
      membership_.notify();
      if (purpose == wire::SharePurpose::PartialSum && options_.on_partial_sum) {
        options_.on_partial_sum(from, key);
      }
    }
  }
  countHeld();
}

void ConsensusPeer::onPeerEvent(const node::PeerEvent& event) {
  switch (event.kind) {
    case node::PeerEventKind::kDown:
    case node::PeerEventKind::kLeft:
      if (isNeighbor(event.peer)) {
        board_.neighborDown(event.peer);
        gossip_.forget(event.peer);
      }
      // What it had half sent goes with it (its complete partial sum stays: node 0 averages
      // every model that made it to the end).
      finals_.forget(event.peer);
      finals_low_.forget(event.peer);
      catchups_.forget(event.peer);
      {
        auto lock = membership_.lock();
        partial_models_.erase(event.peer);
      }
      membership_.down(event.peer);
      countHeld();
      break;
    case node::PeerEventKind::kUp:
      if (isNeighbor(event.peer)) board_.neighborUp(event.peer);
      membership_.up(event.peer);
      break;
    default:
      break;
  }
}

void ConsensusPeer::stop() {
  membership_.stop();
  board_.stop();
}

node::SendOptions gossipSendOptions(size_t chunk_index) {
  return {node::WhenFull::kDropOlderOfKind,
          kGossipChunkKind + static_cast<uint32_t>(chunk_index % kGossipChunkKinds)};
}

void ConsensusPeer::sendModel(const std::vector<NodeId>& to, Round round, size_t backups,
                              wire::SharePurpose purpose) {
  sendChunks(to, job_.model->params(), round, backups, purpose, {});
}

void ConsensusPeer::sendChunks(const std::vector<NodeId>& to, std::span<const float> values,
                               Round round, size_t backups, wire::SharePurpose purpose,
                               std::span<const NodeId> models, std::span<const float> low,
                               int64_t owner) {
  if (to.empty()) return;
  const size_t total = values.size();
  const bool gossip = purpose == wire::SharePurpose::Gossip;
  for (size_t offset = 0; offset < total || (total == 0 && offset == 0);
       offset += options_.chunk_floats) {
    const size_t len = std::min(options_.chunk_floats, total - offset);
    node::SharedFrame frame = encodeMessage(
        node_, wire::Body::ModelShare,
        [&](flatbuffers::FlatBufferBuilder& b) {
          auto chunk = b.CreateVector(values.data() + offset, len);
          // Only a partial sum names the models in it; other shares leave the field out.
          flatbuffers::Offset<flatbuffers::Vector<uint32_t>> ids;
          if (!models.empty()) ids = b.CreateVector(models.data(), models.size());
          flatbuffers::Offset<flatbuffers::Vector<float>> lows;
          if (!low.empty()) lows = b.CreateVector(low.data() + offset, len);
          return wire::CreateModelShare(b, round, offset, total, static_cast<uint32_t>(backups),
                                        chunk, purpose, ids, lows, owner)
              .Union();
        },
        (low.empty() ? 1 : 2) * len * sizeof(float) + models.size() * sizeof(NodeId) + 256);
    if (gossip) {
      // A neighbor that cannot keep up gets the newest share: this chunk pushes the same chunk of
      // older rounds, still queued to it, out (docs/consensus.md, "A slow neighbor").
      node_.broadcast(to, frame, gossipSendOptions(offset / options_.chunk_floats));
    } else {
      node_.broadcast(to, frame);
    }
    if (total == 0) break;
  }
}

void ConsensusPeer::answerRequests(Round round) {
  const std::vector<NodeId> to = messages_.takeRequests();
  if (to.empty()) return;
  node_.logger().info("sending the model after round {} to rejoining node(s) {}", round,
                      idList(to));
  sendModel(to, round, 0, wire::SharePurpose::Catchup);
}

Round ConsensusPeer::catchUp() {
  spdlog::logger& log = node_.logger();
  const std::vector<NodeId> connected = node_.connectedPeers();
  for (NodeId neighbor : layout_.neighbors) {
    if (!std::binary_search(connected.begin(), connected.end(), neighbor)) continue;
    log.info("rejoining: asking node {} for its current model", neighbor);
    {
      auto lock = membership_.lock();
      catchup_from_ = neighbor;
    }
    node::SharedFrame request =
        encodeMessage(node_, wire::Body::ModelRequest, [](flatbuffers::FlatBufferBuilder& b) {
          return wire::CreateModelRequest(b, b.CreateString("rejoin")).Union();
        });
    node_.send(neighbor, request);
    auto lock = membership_.lock();
    const bool answered = membership_.waitFor(lock, options_.catchup_timeout, [&] {
      return catchup_models_.count(neighbor) > 0 || membership_.isDownLocked(neighbor);
    });
    catchup_from_.reset();
    if (membership_.stoppedLocked()) return 0;
    auto it = catchup_models_.find(neighbor);
    if (!answered || it == catchup_models_.end()) {
      log.warn("rejoining: node {} {}; trying the next neighbor", neighbor,
               answered ? "went down" : "did not answer in time");
      continue;
    }
    std::copy(it->second.values.begin(), it->second.values.end(), job_.model->params().begin());
    const Round round = it->second.round;
    log.info("rejoining: took node {}'s model after round {}; joining at round {}", neighbor, round,
             round + 1);
    return round + 1;
  }
  throw std::runtime_error(fmt::format(
      "node {}: no neighbor gave its model for the rejoin (neighbors: {}); start the node "
      "without --rejoin when the whole cluster restarts",
      layout_.self, idList(layout_.neighbors)));
}

ConsensusReport ConsensusPeer::run() {
  report_ = ConsensusReport{};
  rounds_ = RoundState{};
  run::LoopOptions loop;
  loop.append_metrics = options_.rejoin;  // a rejoining node keeps its earlier life's lines
  loop.confusion = job_.confusion;
  const run::LoopReport done = run::runTrainingLoop(job_, *this, node_.logger(), loop);
  ConsensusReport report = std::move(report_);
  static_cast<run::LoopReport&>(report) = done;
  report.first_round = done.first_step;
  report.rounds_done = done.steps_done;
  report.final_loss = done.final.loss;
  report.final_accuracy = done.final.accuracy;
  return report;
}

void ConsensusPeer::describe(ml::MetricsEvent& start) {
  start.add("backup", rule_->name())
      .add("mixing", options_.mixing)
      .add("staleness", options_.staleness.toString())
      .addRaw("neighbors", fmt::format("[{}]", idList(layout_.neighbors)));
  node_.logger().info(
      "consensus: {} rounds on {} samples, model {} ({} parameters), neighbors [{}], "
      "backup rule {}, mixing {}, tau {}",
      job_.rounds, job_.shard.size(), job_.model->spec().toString(), job_.model->size(),
      idList(layout_.neighbors), rule_->name(), options_.mixing, options_.staleness.bound);
}

int64_t ConsensusPeer::firstStep(ml::MetricsWriter& /*metrics*/) {
  // A resumed cut: every node restarts after the cut's last round with the model it had then
  // (prepareCuts() put it in place), so that the rounds continue as if never stopped.
  rounds_.first_round = job_.cuts.resumed ? job_.cuts.resumed->header.cut
                        : options_.rejoin ? catchUp()
                                          : 0;
  return rounds_.first_round;
}

bool ConsensusPeer::finished(int64_t step) const {
  return step >= job_.rounds;
}

run::StepExchange ConsensusPeer::beforeGradient(int64_t step) {
  current_round_ = step;
  return {};
}

void ConsensusPeer::afterGradient(int64_t step, const ml::Model& model,
                                  std::span<const int32_t> /*labels*/) {
  RoundState& r = rounds_;
  const std::span<const float> grads = model.grads();
  double norm_sq = 0, diff_sq = 0;
  for (size_t i = 0; i < grads.size(); ++i)
    norm_sq += static_cast<double>(grads[i]) * grads[i];
  if (!r.previous_grad.empty()) {
    for (size_t i = 0; i < grads.size(); ++i) {
      const double d = static_cast<double>(grads[i]) - r.previous_grad[i];
      diff_sq += d * d;
    }
  }
  // Two independent minibatch gradients at nearby points differ by about 2 sigma^2 in
  // expected squared norm, so half the difference estimates the noise (EMA, weight 0.1).
  r.grad_norm_ema = step == r.first_round ? norm_sq : 0.9 * r.grad_norm_ema + 0.1 * norm_sq;
  if (!r.previous_grad.empty()) {
    r.noise_ema = r.have_noise ? 0.9 * r.noise_ema + 0.1 * diff_sq / 2 : diff_sq / 2;
    r.have_noise = true;
  }
  r.previous_grad.assign(grads.begin(), grads.end());
}

std::string ConsensusPeer::divergence(double loss, int64_t step) const {
  // Every value from a peer was checked finite on arrival, so the loss went non-finite here;
  // still, a neighbor's finite but huge model can be the cause: say whose came last.
  const std::vector<NodeId>& last_mixed = rounds_.last_mixed;
  return fmt::format(
      "training diverged (loss {}) in round {}{}: lower --lr{}", loss, step,
      last_mixed.empty()
          ? std::string()
          : fmt::format(", right after mixing in the model(s) of node(s) {} (checked finite)",
                        idList(last_mixed)),
      last_mixed.empty() ? "" : ", or look at those nodes' logs");
}

run::StepExchange ConsensusPeer::exchange(int64_t& step, double compute_s) {
  spdlog::logger& log = node_.logger();
  RoundState& r = rounds_;
  ml::Model& model = *job_.model;
  const size_t own_degree = layout_.neighbors.size();
  Round k = step;
  r.compute_ema = k == r.first_round ? compute_s : 0.8 * r.compute_ema + 0.2 * compute_s;

  // Iteration skipping: when every neighbor already is at round j >= k + gap (this node is
  // the last of its neighborhood), it mixes their newest models into y_i and sends that as
  // its round-j model: the rounds k .. j-1 are skipped (only rounds every neighbor did).
  std::vector<UsedModel> skip_models;
  r.skipped = 0;
  double skip_distance = 0;  // of y_i to the models mixed in by the skip, before that mix
  if (const std::optional<Round> target = board_.skipTarget(k)) {
    r.skipped = *target - k;
    log.info("round {}: every neighbor is at round {} or later; skipping to round {}", k, *target,
             *target);
    k = *target;
    step = k;
    current_round_ = k;
    skip_models = board_.takeNewest(k);
    report_.skips += 1;
    report_.skipped_rounds += r.skipped;
  }

  // 2. Plan, then send (k, y_i) to every neighbor; 3. wait for the fastest of them.
  RoundObservation obs = board_.observe(r.compute_ema, r.grad_norm_ema, r.noise_ema);
  obs.late_credit = r.late_credit;
  obs.backup_used = r.backup_used;
  obs.backup_staleness = r.backup_staleness;
  r.plan = rule_->plan(obs);
  const WaitPlan& plan = r.plan;
  report_.backups.push_back(plan.backups);
  if (!skip_models.empty()) {
    std::vector<size_t> degrees;
    std::vector<std::span<const float>> others;
    for (const UsedModel& used : skip_models) {
      auto d = layout_.degrees.find(used.from);
      degrees.push_back(d == layout_.degrees.end() ? own_degree : d->second);
      others.emplace_back(*used.values);
      skip_distance += squaredDistance(model.params(), *used.values);
    }
    mixInto(model.params(), mixingWeights(mixing_, own_degree, degrees), others);
  }
  sendModel(layout_.neighbors, k, plan.backups, wire::SharePurpose::Gossip);
  GatherResult got = board_.gather(k, plan, [&](const std::vector<NodeId>& missing) {
    log.info("round {}: waiting for node{} {}", k, missing.size() == 1 ? "" : "s", idList(missing));
    if (options_.on_waiting) options_.on_waiting(k, missing);
  });
  if (got.stopped) return {.stopped = true};
  if (got.timed_out) {
    log.warn("round {}: no models from node(s) {} within {} s; mixing with what arrived", k,
             idList(got.missing), options_.round_timeout.count() / 1000.0);
  }
  if (r.skipped == 0 && plan.backups > 0) {
    // What the backups' models were still worth this round: fresh ones beyond the m waited
    // for count 1, late ones 1 / (1 + staleness).
    double credit = 0, stale_sum = 0;
    size_t fresh = 0, late = 0;
    for (const UsedModel& used : got.models) {
      if (used.staleness == 0) {
        ++fresh;
      } else {
        ++late;
        credit += 1.0 / (1.0 + static_cast<double>(used.staleness));
        stale_sum += static_cast<double>(used.staleness);
      }
    }
    const size_t fresh_extra = fresh - std::min(fresh, plan.wait_for);
    credit += static_cast<double>(fresh_extra);
    const double b = static_cast<double>(plan.backups);
    const double sample = std::clamp(credit / b, 0.0, 1.0);
    // Per backup; a round that ended short of its plan (time-out) may have mixed late models
    // of neighbors it waited for: then per model mixed, so that both stay per one model.
    const double mixed_late = static_cast<double>(fresh_extra + late);
    const double per = std::max(b, mixed_late);
    const double used_sample = mixed_late / per;
    const double stale_sample = stale_sum / per;
    r.late_credit = r.have_late_credit ? 0.9 * r.late_credit + 0.1 * sample : sample;
    r.backup_used = r.have_late_credit ? 0.9 * r.backup_used + 0.1 * used_sample : used_sample;
    r.backup_staleness =
        r.have_late_credit ? 0.9 * r.backup_staleness + 0.1 * stale_sample : stale_sample;
    r.have_late_credit = true;
  }

  // 4. Mix x_i = w_ii y_i + sum_j w_ij y_j over what arrived.
  std::vector<size_t> degrees;
  std::vector<std::span<const float>> others;
  for (const UsedModel& used : got.models) {
    auto d = layout_.degrees.find(used.from);
    degrees.push_back(d == layout_.degrees.end() ? own_degree : d->second);
    others.emplace_back(*used.values);
  }
  // The statistics cover every model mixed in this round, those of a skip included.
  std::vector<UsedModel> all_used = std::move(skip_models);
  all_used.insert(all_used.end(), got.models.begin(), got.models.end());
  r.distance = skip_distance;
  r.staleness_sum = 0;
  r.staleness_max = 0;
  for (const UsedModel& used : got.models)
    r.distance += squaredDistance(model.params(), *used.values);
  for (const UsedModel& used : all_used) {
    r.staleness_sum += static_cast<double>(used.staleness);
    r.staleness_max = std::max(r.staleness_max, used.staleness);
  }
  report_.max_staleness = std::max(report_.max_staleness, r.staleness_max);
  mixInto(model.params(), mixingWeights(mixing_, own_degree, degrees), others);
  r.last_mixed.clear();
  for (const UsedModel& used : all_used)
    r.last_mixed.push_back(used.from);
  r.live_neighbors = got.live_neighbors;
  r.timed_out = got.timed_out;
  return {.wait_s = got.waited_seconds};
}

void ConsensusPeer::describeStep(ml::MetricsEvent& event) {
  const RoundState& r = rounds_;
  const double n_used = static_cast<double>(r.last_mixed.size());
  event.add("backups", static_cast<uint64_t>(r.plan.backups))
      .add("wait_for", static_cast<uint64_t>(r.plan.wait_for))
      .add("used", static_cast<uint64_t>(r.last_mixed.size()))
      .addRaw("used_from", fmt::format("[{}]", idList(r.last_mixed)))
      .add("live_neighbors", static_cast<uint64_t>(r.live_neighbors))
      .add("staleness_mean", n_used > 0 ? r.staleness_sum / n_used : 0.0)
      .add("staleness_max", r.staleness_max)
      .add("consensus_distance", n_used > 0 ? r.distance / n_used : 0.0)
      .add("grad_norm_sq", r.grad_norm_ema)
      .add("grad_noise", r.noise_ema)
      .add("late_credit", r.late_credit)
      .add("backup_used", r.backup_used)
      .add("backup_staleness", r.backup_staleness)
      .add("skipped", r.skipped)
      .addBool("timed_out", r.timed_out);
  // Send-side backpressure since the previous round line: gossip chunks that a newer one pushed
  // out of a slow neighbor's queue, and frames refused because a queue was full.
  const node::PeerStats totals = node_.totals();
  event.add("shares_superseded", totals.frames_superseded - rounds_.superseded_seen)
      .add("frames_refused", totals.frames_refused - rounds_.refused_seen);
  rounds_.superseded_seen = totals.frames_superseded;
  rounds_.refused_seen = totals.frames_refused;
}

void ConsensusPeer::afterStep(int64_t step, double /*loss*/, const ml::Evaluation* /*evaluated*/) {
  answerRequests(step);
  if (options_.on_round_end) options_.on_round_end(step);
}

void ConsensusPeer::cutReached(run::NodeCheckpoint& part) {
  // After round cut-1's mixing: what the node continues from is its model and momentum alone
  // (the backup rule's estimates start again on resume; docs/checkpoints.md).
  part.floats["params"].assign(job_.model->params().begin(), job_.model->params().end());
  const std::string path = run::writeNodeCheckpoint(job_.cuts.dir, part, job_.cuts.every);
  node_.logger().info("round {}: wrote this node's part of cut {} to {}", part.header.cut - 1,
                      part.header.cut, path);
}

run::Traffic ConsensusPeer::traffic() const {
  const node::PeerStats totals = node_.totals();
  return {totals.bytes_out, totals.bytes_in};
}

void ConsensusPeer::ended(const run::LoopReport& /*report*/) {
  report_.final_model.assign(job_.model->params().begin(), job_.model->params().end());
  report_.shares_superseded = node_.totals().frames_superseded;
}

bool ConsensusPeer::waitEndOfRun(const std::function<std::vector<NodeId>()>& missing,
                                 Clock::time_point deadline, Round last_round,
                                 std::string_view what) {
  Clock::time_point next_report = Clock::now() + options_.report_every;
  auto lock = membership_.lock();
  while (true) {
    if (membership_.stoppedLocked()) return false;
    const std::vector<NodeId> waiting = missing();
    if (waiting.empty()) return true;
    if (messages_.hasRequestsLocked()) {
      // A neighbor that rejoined after this node's last round gets the final model.
      lock.unlock();
      answerRequests(last_round);
      lock.lock();
      continue;
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    if (now >= next_report) {
      next_report += options_.report_every;
      node_.logger().info("finished; waiting for {} from node(s) {}", what, idList(waiting));
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::min(deadline, next_report) - now) +
                      std::chrono::milliseconds(1);
    membership_.waitFor(lock, wait,
                        [&] { return missing().empty() || messages_.hasRequestsLocked(); });
  }
}

void ConsensusPeer::sendPartialSum(NodeId to, Round rounds_done, std::span<const double> sum,
                                   std::span<const NodeId> models, int64_t owner) {
  std::vector<float> hi, lo;
  splitWide(sum, hi, lo);
  sendChunks({to}, hi, rounds_done, 0, wire::SharePurpose::PartialSum, models, lo, owner);
}

void ConsensusPeer::sendTrainingDone(const std::vector<NodeId>& to, Round rounds_done,
                                     const std::vector<NodeId>* summary,
                                     std::optional<NodeId> parent) {
  if (to.empty()) return;
  node::SharedFrame frame =
      encodeMessage(node_, wire::Body::TrainingDone, [&](flatbuffers::FlatBufferBuilder& b) {
        flatbuffers::Offset<flatbuffers::Vector<uint32_t>> finished;
        if (summary != nullptr) finished = b.CreateVector(*summary);
        return wire::CreateTrainingDone(b, rounds_done, finished,
                                        parent ? static_cast<int64_t>(*parent) : -1)
            .Union();
      });
  node_.broadcast(to, frame);
}

std::set<NodeId> ConsensusPeer::downLocked() const {
  std::set<NodeId> down;
  if (auto it = tree_graph_.find(layout_.self); it != tree_graph_.end()) {
    for (NodeId n : it->second) {
      if (membership_.isDownLocked(n)) down.insert(n);
    }
  }
  return down;
}

std::optional<std::vector<NodeId>> ConsensusPeer::sendUpTheTree(Round rounds_done,
                                                                const SumLedger& own,
                                                                std::set<NodeId>& handled,
                                                                Clock::time_point deadline) {
  spdlog::logger& log = node_.logger();
  const Round last_round = rounds_done - 1;
  std::optional<NodeId> sent_to;
  std::set<NodeId> relayed;  // owners of the sums relayed to sent_to
  while (true) {
    std::optional<NodeId> parent;
    std::set<NodeId> down;
    std::map<NodeId, PartialSum> to_relay;
    {
      auto lock = membership_.lock();
      if (summary_) return summary_;
      down = downLocked();
      parent = repairedParent(tree_graph_, depths_, layout_.self, down);
      if (parent != sent_to) relayed.clear();
      for (const auto& [owner, sum] : partial_sums_) {
        if (handled.count(owner) == 0 && relayed.count(owner) == 0) to_relay.emplace(owner, sum);
      }
      parent_ = parent;
    }
    const std::vector<NodeId> down_ids(down.begin(), down.end());
    if (!parent) {
      const bool reaches = reachesRoot(tree_graph_, kCollector, layout_.self, down);
      report_.cut_off =
          reaches ? fmt::format(
                        "no live neighbor closer to node {} in the end-of-run tree (node(s) {} "
                        "down): the final models of node(s) {} are not in the cluster's average",
                        kCollector, idList(down_ids), idList(own.models()))
                  : fmt::format(
                        "cut off from node {}: every path to it crosses node(s) that are down "
                        "({} known here); the final models of node(s) {} are not in the "
                        "cluster's average",
                        kCollector, idList(down_ids), idList(own.models()));
      log.error("{}", *report_.cut_off);
      return std::nullopt;
    }
    if (parent != sent_to) {
      if (sent_to) {
        log.warn(
            "tree parent node {} went down before the end-of-run summary came: re-attaching to "
            "node {} and re-sending the partial sum of node(s) {} (node {} drops it if it was "
            "counted already)",
            *sent_to, *parent, idList(own.models()), kCollector);
      }
      // The parent named at the barrier knows; a new one learns it here, before the sums.
      if (sent_to || parent != tree_.parent) {
        sendTrainingDone({*parent}, rounds_done, nullptr, parent);
      }
    }
    // Relayed sums first: the parent has them before it takes this node's own as complete.
    for (const auto& [owner, sum] : to_relay) {
      log.info("relaying the partial sum of node(s) {} (from node {}) to node {}",
               idList(sum.models), sum.from, *parent);
      sendPartialSum(*parent, rounds_done, sum.values, sum.models, owner);
      relayed.insert(owner);
    }
    if (parent != sent_to) {
      // Sent once as an ordinary sum; sent again (the first parent may have forwarded it before
      // it went down), unmerged, so that node 0 can tell it is a copy.
      sendPartialSum(*parent, rounds_done, own.sum(), own.models(),
                     sent_to ? static_cast<int64_t>(layout_.self) : -1);
      sent_to = parent;
    }
    // Until the summary comes, the parent goes down, or a sum to relay arrives.
    waitEndOfRun(
        [&] {
          if (summary_ || membership_.isDownLocked(*sent_to)) return std::vector<NodeId>{};
          for (const auto& [owner, sum] : partial_sums_) {
            if (handled.count(owner) == 0 && relayed.count(owner) == 0)
              return std::vector<NodeId>{};
          }
          return std::vector<NodeId>{*sent_to};
        },
        deadline, last_round, "the end-of-run summary");
    auto lock = membership_.lock();
    if (summary_) return summary_;
    if (membership_.stoppedLocked() || Clock::now() >= deadline) return std::nullopt;
  }
}

void ConsensusPeer::finish(int64_t rounds_done, std::vector<uint32_t>& finished,
                           std::vector<uint32_t>& departed) {
  spdlog::logger& log = node_.logger();
  const Clock::time_point deadline = Clock::now() + options_.finish_timeout;
  const Round last_round = rounds_done - 1;
  rounds_done_ = rounds_done;
  // 1. The barrier: this node needs no more gossip from its neighbors; it names its parent in
  // the end-of-run tree (the lowest-id live neighbor one hop closer to node 0).
  std::optional<NodeId> parent;
  {
    auto lock = membership_.lock();
    parent = repairedParent(tree_graph_, depths_, layout_.self, downLocked());
    parent_ = parent;
  }
  tree_.parent = parent;
  sendTrainingDone(end_peers_, rounds_done, nullptr, parent);

  // 2. The convergecast: each neighbor that may be a child says whose child it is; those that
  // named this node send their partial sums (or go down: their subtree re-attaches elsewhere, or
  // is missing).
  auto childrenLocked = [&] {
    std::vector<NodeId> out;
    for (const auto& [id, named] : named_parent_) {
      if (named == layout_.self && !membership_.isDownLocked(id)) out.push_back(id);
    }
    return out;
  };
  waitEndOfRun(
      [&] {
        std::vector<NodeId> out;
        for (NodeId n : possible_children_) {
          if (membership_.isDownLocked(n)) continue;
          auto named = named_parent_.find(n);
          if (named == named_parent_.end() ||
              (named->second == layout_.self && partial_sums_.count(n) == 0)) {
            out.push_back(n);
          }
        }
        return out;
      },
      deadline, last_round, "the partial sums of the final models");
  if (options_.before_partial_sum) options_.before_partial_sum();
  std::map<NodeId, PartialSum> sums;
  {
    auto lock = membership_.lock();
    sums = partial_sums_;
  }
  // This node's own sum: its model and its children's sums (in id order, fixed).
  SumLedger own(report_.final_model.size());
  own.add(std::span<const float>(report_.final_model), std::vector<NodeId>{layout_.self});
  std::set<NodeId> handled;  // sums added here (not to relay)
  for (auto& [owner, part] : sums) {
    if (part.relay || part.from != owner) continue;
    const SumLedger::Verdict verdict = own.add(part.values, part.models);
    handled.insert(owner);
    if (verdict != SumLedger::Verdict::kAdded) {
      log.warn(
          "the partial sum from node {} (of node(s) {}) repeats models already summed: left out",
          owner, idList(part.models));
    }
  }

  std::optional<std::vector<NodeId>> summary;
  if (layout_.self != kCollector) {
    // 3. Up the tree (re-attaching when the parent goes down), until the summary comes down.
    summary = sendUpTheTree(rounds_done, own, handled, deadline);
  } else {
    // 3. Node 0: the relayed sums too, larger first; a copy of a subtree already counted through
    // its former parent is dropped (node 0 counts every model at most once).
    std::vector<std::pair<NodeId, const PartialSum*>> relays;
    for (const auto& [owner, part] : sums) {
      if (handled.count(owner) == 0) relays.emplace_back(owner, &part);
    }
    std::stable_sort(relays.begin(), relays.end(), [](const auto& a, const auto& b) {
      return a.second->models.size() > b.second->models.size();
    });
    for (const auto& [owner, part] : relays) {
      switch (own.add(part->values, part->models)) {
        case SumLedger::Verdict::kAdded:
          log.info("averaging the re-sent partial sum of node(s) {} (from node {})",
                   idList(part->models), part->from);
          break;
        case SumLedger::Verdict::kAlreadyCounted:
          log.warn(
              "the re-sent partial sum of node(s) {} (from node {}) is counted already (its "
              "former parent forwarded it): dropped",
              idList(part->models), part->from);
          break;
        default:
          log.warn(
              "the re-sent partial sum of node(s) {} (from node {}) overlaps models "
              "counted: left out",
              idList(part->models), part->from);
      }
    }
    ml::Model& model = *job_.model;
    const std::vector<NodeId>& models = own.models();
    const size_t count = models.size();
    std::unique_ptr<ml::Model> average = model.clone();
    for (size_t i = 0; i < own.sum().size(); ++i)
      average->params()[i] = static_cast<float>(own.sum()[i] / static_cast<double>(count));
    const ml::Evaluation eval = ml::evaluate(*average, job_.data->test);
    report_.average_accuracy = eval.accuracy;
    report_.averaged_models = count;
    report_.average_model.assign(average->params().begin(), average->params().end());
    log.debug("test accuracy of the average of {} final models ({}): {:.2f}%", count,
              idList(models), 100 * eval.accuracy);
    summary = models;
  }
  // 4. Down the tree, to every neighbor that named this node its parent (one that re-attaches
  // later gets it when it says so).
  if (summary) {
    std::vector<NodeId> children;
    {
      auto lock = membership_.lock();
      children = childrenLocked();
      summary_sent_ = summary;
    }
    sendTrainingDone(children, rounds_done, &*summary, std::nullopt);
    report_.missing_models.clear();
    for (NodeId id : layout_.members) {
      if (!std::binary_search(summary->begin(), summary->end(), id)) {
        report_.missing_models.push_back(id);
      }
    }
    if (!report_.missing_models.empty()) {
      log.warn(
          "the final models of node(s) {} are missing from node {}'s average (down, or cut "
          "off with their subtree)",
          idList(report_.missing_models), kCollector);
    }
  }

  // 5. Stay until every neighbor (and tree link) finished or left: nobody leaves while a
  // neighbor may still wait for its models.
  run::SettleOptions settle;
  settle.peers = end_peers_;
  settle.timeout =
      std::max(std::chrono::milliseconds(0),
               std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  settle.report_every = options_.report_every;
  settle.has_work = [&] { return messages_.hasRequestsLocked(); };
  settle.work = [&] { answerRequests(last_round); };
  run::PeerSettlement settled = membership_.settle(settle, log);
  if (summary) {
    // Cluster-wide: who reached the end (their models were averaged) and who did not.
    finished.clear();
    departed.clear();
    for (NodeId id : membership_.others()) {
      (std::binary_search(summary->begin(), summary->end(), id) ? finished : departed)
          .push_back(id);
    }
  } else {
    // No summary came (cut off, or the deadline): what this node saw of its neighbors.
    finished = std::move(settled.finished);
    departed = std::move(settled.departed);
  }
  if (!departed.empty()) {
    log.warn("node(s) {} left before the end of training", idList(departed));
  }
}

void ConsensusPeer::describeEnd(ml::MetricsEvent& last) {
  last.add("skips", report_.skips).add("skipped_rounds", report_.skipped_rounds);
  if (!report_.missing_models.empty() || report_.average_accuracy) {
    last.addRaw("missing_models", fmt::format("[{}]", fmt::join(report_.missing_models, ",")));
  }
  if (report_.cut_off) last.addBool("cut_off", true);
  if (report_.average_accuracy) {
    last.add("average_accuracy", *report_.average_accuracy)
        .add("averaged_models", static_cast<uint64_t>(report_.averaged_models));
  }
}

}  // namespace chorus::consensus
