#include "ps/replica_sync.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace chorus::ps {

size_t ReplicaSyncMessage::payloadBytes() const {
  constexpr size_t kHeader = 16;
  const size_t keys = rows ? rows->keys.size() : 0;
  const size_t floats = rows ? rows->values.size() : 0;
  return kHeader + 8 * keys + 4 * floats + 4 * contributors.size();
}

std::string describeLoss(const ReplicaRoundResult& result) {
  if (result.lost.empty()) return {};
  std::string text = fmt::format("replica sync round {}:", result.round);
  for (size_t j = 0; j < result.lost.size(); ++j) {
    const NodeId node = result.lost[j];
    size_t missing = 0;
    for (const auto& c : result.contributors)
      missing += !std::binary_search(c.begin(), c.end(), node);
    text += fmt::format("{} the delta of node {} is lost in {} of {} parts", j ? ";" : "", node,
                        missing, result.contributors.size());
  }
  return text + (result.lost.size() == 1 ? " (it died mid-sync)" : " (they died mid-sync)");
}

ReplicaSync::ReplicaSync(std::shared_ptr<const ReplicaLayout> layout, NodeId self)
    : layout_(std::move(layout)), self_(self) {
  const std::optional<size_t> index = layout_->memberIndex(self);
  if (!index) {
    throw std::invalid_argument(fmt::format("node {} is not a member of the replica group", self));
  }
  self_index_ = *index;
  dead_.assign(layout_->members().size(), 0);
}

std::vector<NodeId> ReplicaSync::liveMembers() const {
  std::vector<NodeId> live;
  for (size_t m = 0; m < dead_.size(); ++m) {
    if (!dead_[m]) live.push_back(layout_->members()[m]);
  }
  return live;
}

ReplicaSync::Round& ReplicaSync::roundState(uint64_t id) {
  auto [it, added] = rounds_.try_emplace(id);
  if (added) {
    it->second.id = id;
    it->second.parts.resize(layout_->members().size());
  }
  return it->second;
}

size_t ReplicaSync::actingReducer(size_t part) const {
  const size_t n = dead_.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t m = (part + k) % n;
    if (!dead_[m]) return m;
  }
  return self_index_;  // unreachable: this node is live
}

void ReplicaSync::send(Round& round, NodeId to, ReplicaSyncMessage message, ReplicaSyncStep& step) {
  ++round.messages_sent;
  round.bytes_sent += message.payloadBytes();
  step.send.push_back(ReplicaSyncSend{to, std::move(message)});
}

void ReplicaSync::report(Round& round, size_t part, ReplicaSyncStep& step) {
  Part& p = round.parts[part];
  const size_t to = actingReducer(part);
  if (to == self_index_) {
    if (!p.sum) onContribution(round, part, self_, p.own, step);
    return;
  }
  ReplicaSyncMessage message;
  message.round = round.id;
  message.part = layout_->members()[part];
  if (p.sum) {
    message.kind = ReplicaSyncKind::kSum;  // a relay: the new reducer passes it on
    message.contributors = p.sum_contributors;
    message.rows = p.sum;
  } else {
    message.kind = ReplicaSyncKind::kContribution;
    message.rows = p.own;
  }
  send(round, layout_->members()[to], std::move(message), step);
}

void ReplicaSync::onContribution(Round& round, size_t part, NodeId from,
                                 std::shared_ptr<const SparseRows> rows, ReplicaSyncStep& step) {
  Part& p = round.parts[part];
  if (p.sum) {
    // The contributor lacks the sum (its reducer died before sending it): answer with it.
    if (from != self_) {
      send(round, from,
           ReplicaSyncMessage{ReplicaSyncKind::kSum, round.id, layout_->members()[part],
                              p.sum_contributors, p.sum},
           step);
    }
    return;
  }
  p.contributions[from] = std::move(rows);
  tryReduce(round, part, step);
}

void ReplicaSync::tryReduce(Round& round, size_t part, ReplicaSyncStep& step) {
  Part& p = round.parts[part];
  if (!round.started || p.sum || actingReducer(part) != self_index_) return;
  for (size_t m = 0; m < dead_.size(); ++m) {
    if (!dead_[m] && !p.contributions.count(layout_->members()[m])) return;
  }
  // Every live member contributed: sum in member order (dead members' contributions that
  // arrived count too), once, here; everyone gets these same floats.
  auto sum = std::make_shared<SparseRows>();
  std::vector<NodeId> contributors;
  for (const auto& [member, rows] : p.contributions) {
    contributors.push_back(member);
    addRows(*layout_, *sum, *rows);
  }
  p.contributions.clear();  // adoptSum must not answer them: everyone gets the broadcast
  ReplicaSyncMessage message{ReplicaSyncKind::kSum, round.id, layout_->members()[part],
                             contributors, sum};
  for (size_t m = 0; m < dead_.size(); ++m) {
    if (!dead_[m] && m != self_index_) send(round, layout_->members()[m], message, step);
  }
  adoptSum(round, part, std::move(sum), std::move(contributors), step);
}

void ReplicaSync::adoptSum(Round& round, size_t part, std::shared_ptr<const SparseRows> sum,
                           std::vector<NodeId> contributors, ReplicaSyncStep& step) {
  Part& p = round.parts[part];
  if (p.sum) return;  // the first sum is final (there is only one per part and round)
  p.sum = std::move(sum);
  p.sum_contributors = std::move(contributors);
  ++round.sums_held;
  for (const auto& [member, rows] : p.contributions) {
    if (member != self_ && !dead_[*layout_->memberIndex(member)]) {
      send(round, member,
           ReplicaSyncMessage{ReplicaSyncKind::kSum, round.id, layout_->members()[part],
                              p.sum_contributors, p.sum},
           step);
    }
  }
  p.contributions.clear();
  if (round.started && !round.finished && round.sums_held == round.parts.size()) {
    finish(round, step);
  }
}

void ReplicaSync::finish(Round& round, ReplicaSyncStep& step) {
  round.finished = true;
  if (round.id == current_) in_round_ = false;
  ReplicaRoundResult result;
  result.round = round.id;
  result.messages_sent = round.messages_sent;
  result.bytes_sent = round.bytes_sent;
  // The parts' keys are disjoint: order every row by key.
  struct Row {
    Key key;
    const float* values;
    size_t width;
  };
  std::vector<Row> rows;
  for (const Part& p : round.parts) {
    size_t at = 0, hint = 0;
    for (Key key : p.sum->keys) {
      hint = *layout_->indexFrom(key, hint);
      const size_t w = layout_->width(hint);
      rows.push_back(Row{key, p.sum->values.data() + at, w});
      at += w;
    }
    result.contributors.push_back(p.sum_contributors);
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.key < b.key; });
  result.sum.keys.reserve(rows.size());
  for (const Row& row : rows) {
    result.sum.keys.push_back(row.key);
    result.sum.values.insert(result.sum.values.end(), row.values, row.values + row.width);
  }
  std::vector<NodeId> members = round.live_at_start;
  for (const auto& c : result.contributors)
    members.insert(members.end(), c.begin(), c.end());
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  for (NodeId m : members) {
    for (const auto& c : result.contributors) {
      if (!std::binary_search(c.begin(), c.end(), m)) {
        result.lost.push_back(m);
        break;
      }
    }
  }
  step.finished.push_back(std::move(result));
  for (Part& p : round.parts)
    p.own.reset();  // a finished round only ever relays its sums
  // No live member can still need an older round once every one of them started this one.
  rounds_.erase(rounds_.begin(), rounds_.lower_bound(round.id));
  if (rounds_.count(round.id + 1) && !rounds_.at(round.id + 1).started) step.start_next = true;
}

ReplicaSyncStep ReplicaSync::start(SparseRows delta) {
  if (in_round_) {
    throw std::logic_error(fmt::format("replica sync round {} is still running", current_));
  }
  if (std::optional<std::string> error = layout_->check(delta)) {
    throw std::invalid_argument("replica delta: " + *error);
  }
  ReplicaSyncStep step;
  ++current_;
  in_round_ = true;
  Round& round = roundState(current_);
  round.started = true;
  round.live_at_start = liveMembers();
  // This node's delta, cut by part.
  std::vector<SparseRows> parts(round.parts.size());
  size_t at = 0, hint = 0;
  for (Key key : delta.keys) {
    const size_t i = *layout_->indexFrom(key, hint);
    hint = i + 1;
    SparseRows& rows = parts[layout_->part(i)];
    rows.keys.push_back(key);
    rows.values.insert(rows.values.end(), delta.values.begin() + static_cast<std::ptrdiff_t>(at),
                       delta.values.begin() + static_cast<std::ptrdiff_t>(at + layout_->width(i)));
    at += layout_->width(i);
  }
  for (size_t p = 0; p < parts.size(); ++p)
    round.parts[p].own = std::make_shared<const SparseRows>(std::move(parts[p]));
  for (size_t p = 0; p < round.parts.size() && !round.finished; ++p)
    report(round, p, step);
  return step;
}

std::optional<std::string> ReplicaSync::checkMessage(NodeId from,
                                                     const ReplicaSyncMessage& message) const {
  auto bad = [&](const std::string& what) {
    return fmt::format("replica sync message from node {} (round {}, part {}): {}; dropped", from,
                       message.round, message.part, what);
  };
  if (message.kind != ReplicaSyncKind::kContribution && message.kind != ReplicaSyncKind::kSum) {
    return bad(fmt::format("unknown kind {}", static_cast<int>(message.kind)));
  }
  const std::optional<size_t> part = layout_->memberIndex(message.part);
  if (!part) return bad(fmt::format("node {} is no member, so it has no part", message.part));
  if (!message.rows) return bad("no rows");
  if (std::optional<std::string> error = layout_->check(*message.rows, *part)) return bad(*error);
  if (message.kind == ReplicaSyncKind::kSum) {
    const auto& c = message.contributors;
    if (c.empty()) return bad("a sum without contributors");
    for (size_t j = 0; j < c.size(); ++j) {
      if (!layout_->memberIndex(c[j])) return bad(fmt::format("contributor {} is no member", c[j]));
      if (j > 0 && c[j] <= c[j - 1]) return bad("contributors must be sorted and unique");
    }
  } else if (!message.contributors.empty()) {
    return bad("a contribution names contributors");
  }
  if (message.round == 0) return bad("round 0 does not exist");
  if (message.round > current_ + 1) {
    return bad(fmt::format(
        "this node is at round {}, and no member can run more than one round ahead", current_));
  }
  return std::nullopt;
}

ReplicaSyncStep ReplicaSync::receive(NodeId from, const ReplicaSyncMessage& message) {
  ReplicaSyncStep step;
  const std::optional<size_t> sender = layout_->memberIndex(from);
  if (!sender || from == self_) {
    step.errors.push_back(
        fmt::format("replica sync message from node {}, which is no other member of the replica "
                    "group; dropped",
                    from));
    return step;
  }
  if (dead_[*sender]) {
    ++dropped_late_;
    return step;
  }
  if (std::optional<std::string> error = checkMessage(from, message)) {
    step.errors.push_back(*error);
    return step;
  }
  // Rounds this node keeps: the last finished one, the current one, the next.
  const bool kept = rounds_.count(message.round) || message.round > current_;
  if (!kept) {
    ++dropped_late_;
    return step;
  }
  const size_t part = *layout_->memberIndex(message.part);
  if (message.kind == ReplicaSyncKind::kSum) {
    // A sum needs this node's contribution first: one before it started is made up.
    auto it = rounds_.find(message.round);
    if (it == rounds_.end() || !it->second.started) {
      step.errors.push_back(fmt::format(
          "replica sync message from node {}: a sum of round {} before this node contributed "
          "to it; dropped",
          from, message.round));
      return step;
    }
    adoptSum(it->second, part, message.rows, message.contributors, step);
    return step;
  }
  Round& round = roundState(message.round);
  onContribution(round, part, from, message.rows, step);
  if (!round.started && !in_round_) step.start_next = true;
  return step;
}

ReplicaSyncStep ReplicaSync::memberDown(NodeId node) {
  ReplicaSyncStep step;
  const std::optional<size_t> index = layout_->memberIndex(node);
  if (!index || node == self_ || dead_[*index]) return step;
  std::vector<size_t> before(dead_.size());
  for (size_t p = 0; p < before.size(); ++p)
    before[p] = actingReducer(p);
  dead_[*index] = 1;
  std::vector<uint64_t> ids;
  for (const auto& [id, round] : rounds_)
    ids.push_back(id);
  for (uint64_t id : ids) {
    auto it = rounds_.find(id);
    if (it == rounds_.end() || !it->second.started) continue;
    Round& round = it->second;
    // The parts the dead node was reducing go to their next live member, with this node's
    // report; a part this node reduces may now have every live contribution.
    for (size_t p = 0; p < before.size(); ++p) {
      if (before[p] == *index) report(round, p, step);
    }
    for (size_t p = 0; p < before.size() && !round.finished; ++p)
      tryReduce(round, p, step);
  }
  return step;
}

}  // namespace chorus::ps
