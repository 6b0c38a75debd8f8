// One node's side of the replica sync (NuPS's background synchronization of hot keys), as a
// state machine without networking: a sparse all-reduce of every node's delta for any number of
// nodes, in two message steps, that finishes among the live nodes when members die mid-round.
// The protocol, its cost and its guarantees are in docs/ps-replication.md; in short:
//
// - Every hot key has a part: the member that reduces it (its home, ReplicaLayout::part). A
//   round starts with this node's delta (ReplicaSet::takeDelta); the node sends each part's
//   rows to the part's reducer (a contribution, empty ones too, so the reducer knows it is
//   complete). A reducer that holds a contribution from every live member sums them in member
//   order and sends the sum, with the list of its contributors, to every live member. A node
//   that holds a sum of every part has finished the round: their union is every node's delta.
// - A part whose reducer died is reduced by the next live member in member order (the part's
//   acting reducer). On a death every node sends its report of each part the dead node was
//   acting for to the new acting reducer: the sum, if it got one (a relay), else its own
//   contribution again. A reducer that gets a relay passes the relayed sum on instead of making
//   one, and a node that holds a sum answers every contribution with it. So at most one sum of a
//   part per round reaches the living, and every survivor applies the same sums: they agree,
//   and no survivor's delta is ever lost. A dead node's contributions count where they arrived
//   before it died; the result names the members whose delta is missing from some part.
// - The runtime must tell every node about a death after the last message it delivers from the
//   dead node (TCP order; the shell closes the connection), and a dead member never comes back
//   (a restarted node is a new member of a new group). Messages from it after that are dropped.
// - A node runs at most one round ahead of any live member (it cannot finish round r + 1
//   without their round-(r + 1) contributions), so rounds r - 1, r and r + 1 are all a node
//   keeps. A message of round r + 1 while this node is idle asks it to start (start_next): a
//   round started by any node's timer pulls the others in.
//
// Single-threaded: the shell calls it from one thread (the loop thread) and sends what each
// call returns. Nothing from a peer is asserted on: a bad message is dropped with an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ps/replica_layout.h"

namespace chorus::ps {

enum class ReplicaSyncKind : uint8_t {
  kContribution,  // one member's delta of one part, to the part's acting reducer
  kSum,           // a part's reduced sum, from its reducer to all (or relayed to a new reducer)
};

struct ReplicaSyncMessage {
  ReplicaSyncKind kind = ReplicaSyncKind::kContribution;
  uint64_t round = 0;  // 1, 2, ...
  NodeId part = 0;     // the member whose part (hot keys by home) the rows are
  // kSum: the members whose contributions the sum holds, sorted.
  std::vector<NodeId> contributors;
  // Rows of the part's keys; shared by the copies of one sum sent to several members. Never
  // null in messages this class makes; null from a peer is a bad message.
  std::shared_ptr<const SparseRows> rows;
  // A contribution from a peer whose values were not all finite (decodeReplicaSync): its rows
  // were dropped (`rows` is empty: the member contributed nothing to the part this round, so
  // the round goes on without its delta), and this many values were NaN or infinite.
  uint64_t dropped_non_finite = 0;

  // Bytes of the message's content: 8 per key, 4 per float and per contributor, 16 of header
  // (round, part, kind, counts); what a wire encoding adds to it is the codec's.
  size_t payloadBytes() const;
};

struct ReplicaSyncSend {
  NodeId to = 0;
  ReplicaSyncMessage message;
};

// A finished round, as this node applies it.
struct ReplicaRoundResult {
  uint64_t round = 0;
  // The sum of the deltas of every contributor, over every part, keys sorted (this node's own
  // delta included: ReplicaSet::applySum takes it as is).
  SparseRows sum;
  // Per part (index into the layout's members): whose contributions its sum holds.
  std::vector<std::vector<NodeId>> contributors;
  // Members whose delta of this round is missing from at least one part (they died before it
  // reached the part's reducer): members live when this node started the round, or that
  // contributed to some part, and are not among a part's contributors. Sorted.
  std::vector<NodeId> lost;
  // Messages and payload bytes this node sent for the round.
  size_t messages_sent = 0;
  size_t bytes_sent = 0;
};

// The log line of a round that lost deltas, e.g. "replica sync round 12: the delta of node 3 is
// lost in 2 of 4 parts (it died mid-sync)"; empty when the round lost nothing.
std::string describeLoss(const ReplicaRoundResult& result);

struct ReplicaSyncStep {
  std::vector<ReplicaSyncSend> send;
  // Rounds finished by this call (at most one, unless a start finished at once: one member).
  std::vector<ReplicaRoundResult> finished;
  // A member started the next round while this node is idle: call start() now.
  bool start_next = false;
  // Bad messages from peers, dropped: each names the peer and what was wrong.
  std::vector<std::string> errors;
};

class ReplicaSync {
 public:
  // The sync of `layout`'s hot keys on member `self` (std::invalid_argument when it is none).
  ReplicaSync(std::shared_ptr<const ReplicaLayout> layout, NodeId self);

  // Whether a round has started here and not finished.
  bool inRound() const { return in_round_; }
  // The current round, or the last finished one when idle (0: none yet).
  uint64_t round() const { return current_; }
  // Starts the next round with this node's delta (checked rows of the layout: what
  // ReplicaSet::takeDelta gives). Must not be in a round (std::logic_error otherwise).
  ReplicaSyncStep start(SparseRows delta);
  // A message from member `from`.
  ReplicaSyncStep receive(NodeId from, const ReplicaSyncMessage& message);
  // The runtime declared `node` dead: it leaves the group for good, after every message it
  // delivered. Unknown nodes and repeats change nothing.
  ReplicaSyncStep memberDown(NodeId node);
  // Members not declared dead (this node included), sorted.
  std::vector<NodeId> liveMembers() const;
  // Messages from dead members or of rounds already done, dropped (not errors).
  uint64_t droppedLate() const { return dropped_late_; }

 private:
  struct Part {
    // Contributions received (this node's own included), by member: the part's reducer reduces
    // them, and a node that gets the sum answers them with it.
    std::map<NodeId, std::shared_ptr<const SparseRows>> contributions;
    std::shared_ptr<const SparseRows> own;  // this node's contribution (rows of the part)
    std::shared_ptr<const SparseRows> sum;  // the part's sum, once this node holds it
    std::vector<NodeId> sum_contributors;
  };
  struct Round {
    uint64_t id = 0;
    bool started = false;
    bool finished = false;
    std::vector<Part> parts;
    std::vector<NodeId> live_at_start;
    size_t sums_held = 0;
    size_t messages_sent = 0;
    size_t bytes_sent = 0;
  };

  Round& roundState(uint64_t id);
  // The live member that reduces `part` now: the part's member, else the next live one.
  size_t actingReducer(size_t part) const;
  void send(Round& round, NodeId to, ReplicaSyncMessage message, ReplicaSyncStep& step);
  // Sends this node's report of `part` (its sum, else its contribution) to the acting reducer.
  void report(Round& round, size_t part, ReplicaSyncStep& step);
  void onContribution(Round& round, size_t part, NodeId from,
                      std::shared_ptr<const SparseRows> rows, ReplicaSyncStep& step);
  // Takes a part's sum, answers the contributions waiting for it, and finishes the round when
  // it was the last.
  void adoptSum(Round& round, size_t part, std::shared_ptr<const SparseRows> sum,
                std::vector<NodeId> contributors, ReplicaSyncStep& step);
  // As the acting reducer: the sum, once every live member contributed.
  void tryReduce(Round& round, size_t part, ReplicaSyncStep& step);
  void finish(Round& round, ReplicaSyncStep& step);
  std::optional<std::string> checkMessage(NodeId from, const ReplicaSyncMessage& message) const;

  std::shared_ptr<const ReplicaLayout> layout_;
  NodeId self_;
  size_t self_index_;
  std::vector<uint8_t> dead_;         // per member
  std::map<uint64_t, Round> rounds_;  // at most: the last finished, the current, the next
  uint64_t current_ = 0;
  bool in_round_ = false;
  uint64_t dropped_late_ = 0;
};

}  // namespace chorus::ps
