// What a node's death does to relocation (the Relocation members that handle it): the report,
// and the notices that keep every other node from waiting for a row or an answer that died
// with it. docs/ps-relocation.md, "A node that goes down", describes the protocol.
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "ps/relocation.h"

namespace chorus::ps {

std::optional<std::string> Relocation::onAccepted(NodeId from, const LocalizeAccepted& m) {
  std::string error;
  Transit* t = transit(m.key);
  if (!store_.space().contains(m.key) || directory_.home(m.key) != from ||
      !std::binary_search(members_.begin(), members_.end(), m.giver) || m.version == 0) {
    error = fmt::format(
        "node {} accepted a localize of key {} from node {} at version {}, but "
        "it is not the home of such a key",
        from, m.key, m.giver, m.version);
  } else if (auto lost = lost_arrivals_.find(m.key);
             lost != lost_arrivals_.end() && lost->second.count(m.version)) {
    return std::nullopt;  // given up before the acceptance came
  } else if (t && t->early.erase(m.version)) {
    settle(m.key);  // the row came first
    return std::nullopt;
  } else if (!t || t->awaiting <= t->givers.size() || t->givers.count(m.version)) {
    error = fmt::format("node {} accepted a localize of key {} that node {} did not send", from,
                        m.key, self_);
  }
  if (!error.empty()) {
    refuse(from, RefusedKind::kNotice, m.key, 0, error);
    return error;
  }
  t->givers[m.version] = m.giver;
  if (down_.count(m.giver)) giveUp(m.key, m.version, m.giver);
  return std::nullopt;
}

std::optional<std::string> Relocation::onTransferLost(NodeId from, const TransferLost& m) {
  const Transit* t = transit(m.key);
  bool expected = false;
  if (store_.space().contains(m.key) && t && t->awaiting > 0) {
    auto giver = t->givers.find(m.version);
    // From the giver the home named, or for an arrival whose acceptance is still on its way.
    expected = giver != t->givers.end() ? giver->second == from : t->awaiting > t->givers.size();
  }
  if (!expected) {
    const std::string error = fmt::format(
        "node {} said the row of key {} at version {} died, but node {} awaits no such row "
        "from it",
        from, m.key, m.version, self_);
    refuse(from, RefusedKind::kNotice, m.key, 0, error);
    return error;
  }
  giveUp(m.key, m.version, m.with);
  return std::nullopt;
}

std::optional<std::string> Relocation::onRowLost(NodeId from, const RowLost& m) {
  if (!store_.space().contains(m.key) || directory_.home(m.key) != self_) {
    const std::string error = fmt::format(
        "node {} said the row of key {} died, but node {} is not its home", from, m.key, self_);
    refuse(from, RefusedKind::kNotice, m.key, 0, error);
    return error;
  }
  lost_.try_emplace(m.key, m.with);
  return std::nullopt;
}

std::optional<std::string> Relocation::onTransferQuery(NodeId from, const TransferQuery& m) {
  if (!store_.space().contains(m.key) || directory_.home(m.key) == self_) {
    const std::string error =
        fmt::format("node {} asked node {} for the row of key {}, which {}", from, self_, m.key,
                    store_.space().contains(m.key) ? "is homed here" : "does not exist");
    refuse(from, RefusedKind::kNotice, m.key, 0, error);
    return error;
  }
  const NodeId home = directory_.home(m.key);
  if (down_.count(home)) {
    answerQuery(from, m.key, m.version);
  } else {
    // The home's last frames may still be on their way here: answer once they are all in.
    held_queries_[home].push_back(Query{from, m.key, m.version});
  }
  return std::nullopt;
}

void Relocation::answerQuery(NodeId requester, Key key, uint64_t version) {
  if (const Transit* t = transit(key)) {
    for (const auto& [from_version, pass_on] : t->pass_ons) {
      if (pass_on.to == requester && pass_on.version == version) return;  // it will come
    }
  }
  send(requester, NoHandOver{key, version});
}

std::optional<std::string> Relocation::onNoHandOver(NodeId from, const NoHandOver& m) {
  if (!store_.space().contains(m.key)) {
    const std::string error =
        fmt::format("node {} answered for key {}, which does not exist", from, m.key);
    refuse(from, RefusedKind::kNotice, m.key, 0, error);
    return error;
  }
  const Transit* t = transit(m.key);
  if (!t) return std::nullopt;  // the row came before the answer
  auto giver = t->givers.find(m.version);
  if (giver == t->givers.end()) return std::nullopt;
  if (giver->second != from) {
    const std::string error =
        fmt::format("node {} answered for the row of key {} at version {}, which node {} gives",
                    from, m.key, m.version, giver->second);
    refuse(from, RefusedKind::kNotice, m.key, 0, error);
    return error;
  }
  giveUpHandOver(m.key, m.version, from);
  return std::nullopt;
}

std::optional<std::string> Relocation::onOpLost(NodeId from, const OpLost& m) {
  if (!store_.space().contains(m.key)) {
    const std::string error = fmt::format(
        "node {} said an operation on key {} was lost, but no such key exists", from, m.key);
    refuse(from, RefusedKind::kNotice, m.key, 0, error);
    return error;
  }
  auto it = pending_.find(m.op);
  if (it == pending_.end() || !it->second.on_network || it->second.key != m.key) {
    return std::nullopt;  // it completed (or failed) already
  }
  const Completion::Kind kind = it->second.kind;
  complete(Completion{
      m.op,
      kind,
      m.key,
      {},
      fmt::format("node {} passed this {} of key {} on to node {}, which went down{}", from,
                  completionKindName(kind), m.key, m.with,
                  kind == Completion::Kind::kPush ? ": it may or may not have been applied" : "")});
  abandoned_.insert(m.op);  // an answer may still come
  return std::nullopt;
}

Relocation::Abandoned Relocation::abandonArrival(Key key, std::optional<uint64_t> version) {
  Abandoned out;
  Transit& t = transit_[key];
  --t.awaiting;
  if (version) {
    t.givers.erase(*version);
    if (auto it = t.pass_ons.find(*version); it != t.pass_ons.end()) {
      out.pass_on = it->second;
      t.pass_ons.erase(it);
    }
  }
  if (t.awaiting == 0) {
    out.localizes = std::exchange(t.localizes, {});
    out.queued = std::exchange(t.queued, {});
  }
  settle(key);
  return out;
}

void Relocation::failLocalizes(Key key, const std::vector<uint64_t>& ids,
                               const std::string& reason) {
  for (uint64_t id : ids)
    complete(Completion{id, Completion::Kind::kLocalize, key, {}, reason});
}

void Relocation::giveUpHandOver(Key key, uint64_t version, NodeId giver) {
  Abandoned a = abandonArrival(key, version);
  failLocalizes(key, a.localizes,
                fmt::format("the home of key {}, node {}, went down before its hand-over "
                            "reached node {}; the row stays there",
                            key, directory_.home(key), giver));
  // The node noted as next gets no row either.
  if (a.pass_on) send(a.pass_on->to, NoHandOver{key, a.pass_on->version});
  for (KeyOp& op : a.queued)
    dispatch(key, std::move(op));
}

void Relocation::giveUp(Key key, uint64_t version, NodeId with) {
  lost_arrivals_[key][version] = with;
  Abandoned a = abandonArrival(key, version);
  const std::string reason =
      fmt::format("the row of key {} died with node {} on its way to node {}", key, with, self_);
  failLocalizes(key, a.localizes, reason);
  for (const KeyOp& op : a.queued)
    failOp(key, op, reason);
  if (a.pass_on) send(a.pass_on->to, TransferLost{key, a.pass_on->version, with});
  reportRowLost(key, version, with);
}

void Relocation::giveUpRequest(Key key, NodeId home) {
  ++orphaned_[key];
  Abandoned a = abandonArrival(key, std::nullopt);
  failLocalizes(key, a.localizes,
                fmt::format("the localize of key {} died with its home, node {}", key, home));
  // The row stays where it is: the operations go there if the cache knows the way.
  for (KeyOp& op : a.queued)
    dispatch(key, std::move(op));
}

void Relocation::reportRowLost(Key key, uint64_t version, NodeId with) {
  const NodeId home = directory_.home(key);
  if (home == self_) {
    lost_.try_emplace(key, with);
  } else {
    send(home, RowLost{key, version, with});
  }
}

// --- Failures -------------------------------------------------------------------------------

DownReport Relocation::peerDown(NodeId node) {
  DownReport report;
  report.node = node;
  if (node == self_ || !down_.insert(node).second) return report;
  for (Key key : directory_.ownedBy(node)) {
    if (directory_.home(key) != self_) continue;
    lost_[key] = node;
    report.lost.push_back(key);
  }
  for (const auto& [key, giver] : last_giver_) {
    const NodeId owner = directory_.owner(key);
    if (giver == node && owner != node && !down_.count(owner)) report.handed_over.push_back(key);
  }
  // Rows on their way here from the dead node, and requests its death left unanswered.
  std::vector<std::pair<Key, uint64_t>> from_dead;
  std::vector<std::pair<Key, size_t>> orphaned;
  for (auto& [key, t] : transit_) {
    for (const auto& [version, giver] : t.givers) {
      if (giver == node) from_dead.emplace_back(key, version);
    }
    if (directory_.home(key) == node) {
      t.early.clear();  // no acceptance comes any more
      if (t.awaiting > t.givers.size()) orphaned.emplace_back(key, t.awaiting - t.givers.size());
    }
  }
  // Keys homed at the dead node that come from a live giver: the hand-over may have died with
  // the home. Ask the giver, which answers once it, too, saw the home go down.
  for (const auto& [key, t] : transit_) {
    if (directory_.home(key) != node) continue;
    for (const auto& [version, giver] : t.givers) {
      if (giver != node && giver != self_) send(giver, TransferQuery{key, version});
    }
  }
  std::sort(from_dead.begin(), from_dead.end());
  for (const auto& [key, version] : from_dead) {
    giveUp(key, version, node);
    report.given_up.push_back(key);
  }
  for (const auto& [key, n] : orphaned) {
    for (size_t i = 0; i < n; ++i)
      giveUpRequest(key, node);
  }
  if (auto passed = passed_.find(node); passed != passed_.end()) {
    for (const Passed& p : passed->second) {
      if (!down_.count(p.origin)) send(p.origin, OpLost{p.key, p.op, node});
    }
    passed_.erase(passed);
  }
  if (auto held = held_queries_.find(node); held != held_queries_.end()) {
    const std::vector<Query> queries = std::move(held->second);
    held_queries_.erase(held);
    for (const Query& q : queries)
      answerQuery(q.requester, q.key, q.version);
  }
  for (auto it = transit_.begin(); it != transit_.end();) {
    it = it->second.empty() && it->second.localizes.empty() ? transit_.erase(it) : std::next(it);
  }
  for (const auto& [key, t] : transit_) {
    if (t.awaiting > 0) report.waiting.push_back(key);
  }
  for (auto it = cache_.begin(); it != cache_.end();) {
    it = it->second.owner == node ? cache_.erase(it) : std::next(it);
  }
  std::vector<std::pair<uint64_t, Pending>> failed;
  for (const auto& [id, p] : pending_) {
    if (p.on_network) failed.emplace_back(id, p);
  }
  std::sort(failed.begin(), failed.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [id, p] : failed) {
    complete(Completion{
        id,
        p.kind,
        p.key,
        {},
        fmt::format(
            "node {} went down while this {} of key {} was on the network{}", node,
            completionKindName(p.kind), p.key,
            p.kind == Completion::Kind::kPush ? ": it may or may not have been applied" : "")});
    abandoned_.insert(id);
  }
  report.failed_ops = failed.size();
  std::sort(report.handed_over.begin(), report.handed_over.end());
  report.given_up.erase(std::unique(report.given_up.begin(), report.given_up.end()),
                        report.given_up.end());
  std::sort(report.waiting.begin(), report.waiting.end());
  return report;
}

}  // namespace chorus::ps
