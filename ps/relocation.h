// One node's side of Lapse-style relocation (Renz-Wieland et al., VLDB 2020), free of any
// networking: the directory of the keys homed here, the rows owned here, the keys on their way
// here with the operations waiting for them, and a location cache. Inputs are the node's own
// operations (localize, push, pull), its view of the workers' clocks, and messages from peers;
// outputs are messages to send (ps/relocation_message.h) and completions of its operations.
// The network shell moves messages and completions and does nothing else. Single-threaded (the
// node's loop thread). docs/ps-relocation.md has the protocol, its invariants and its failure
// behaviour; tests/ps/relocation_test.cc checks them step by step and
// tests/ps/relocation_property_test.cc under random delivery orders and node deaths.
//
// Contracts the shell keeps:
// - Per-link FIFO: messages from one node to another arrive in the order they were sent (TCP).
// - A worker announces clock c (workerClock on every node) only after every push it made at
//   clocks below c completed (its PushApplied came back). Forwarded pushes overtake nothing on a
//   link, but they take other links than the announcement, so FIFO alone no longer tells that a
//   worker's pushes arrived; completion does.
// - peerDown(n) comes after the last message n's connection delivered (nothing from n follows).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ps/key_directory.h"
#include "ps/key_store.h"
#include "ps/relocation_message.h"
#include "ps/shard_map.h"
#include "ps/ssp.h"

namespace chorus::ps {

struct RelocationOptions {
  NodeId self = 0;
  // The workers whose clocks gate this node's pulls (SSP). Empty: pulls never wait.
  std::vector<WorkerId> workers;
  // Entries of the location cache; at the bound, an arbitrary entry makes room.
  size_t cache_capacity = size_t{1} << 16;
};

// A finished operation of this node's worker.
struct Completion {
  enum class Kind : uint8_t { kLocalize, kPush, kPull };
  uint64_t op = 0;
  Kind kind = Kind::kPush;
  Key key = 0;
  std::vector<float> values;         // a pull's values
  std::optional<std::string> error;  // the operation failed (nothing to read; a push may or
                                     // may not have been applied, as the message says)
};

// "localize", "push" or "pull".
const char* completionKindName(Completion::Kind kind);

// What a node learns when `node` went down (Relocation::peerDown).
struct DownReport {
  NodeId node = 0;
  // Keys homed here that `node` owned: their rows, optimizer state and pushes are gone. Every
  // later operation and localize of them is refused.
  std::vector<Key> lost;
  // Keys homed here that `node` handed over last: the row may have died in transfer (the new
  // owner finds out itself and sends RowLost if it did).
  std::vector<Key> handed_over;
  // Keys whose row this node awaited from `node`: it died on the way. Their waiting operations
  // failed, the node a noted hand-over named was told (TransferLost), and so was the home
  // (RowLost), which counts the key lost from then on.
  std::vector<Key> given_up;
  // Keys this node still waits for (from live nodes).
  std::vector<Key> waiting;
  // This node's operations that were on the network: failed, since the core cannot see which
  // nodes a forwarded operation passed through.
  size_t failed_ops = 0;
};

// Counters for metrics and tests.
struct RelocationStats {
  uint64_t served_here = 0;   // operations applied to a row held here (own and others')
  uint64_t sent = 0;          // own operations sent to another node
  uint64_t cache_hits = 0;    // ... of them, straight to the owner the cache named
  uint64_t passed_on = 0;     // others' operations sent on (a stale cache or the home's step)
  uint64_t queued = 0;        // operations that waited for a transfer
  uint64_t transfers_in = 0;  // rows received
  uint64_t transfers_out = 0;
  uint64_t localizes_sent = 0;
  uint64_t passed_through = 0;  // rows sent on right after they arrived (a localize that came
                                // during their transfer)
  uint64_t refusals_sent = 0;
};

class Relocation {
 public:
  // This node of `map` holding `store`: the rows of the keys whose home is options.self (as
  // KeyStore's constructor from a ShardMap makes it). Every key starts at its home.
  Relocation(const ShardMap& map, KeyStore store, RelocationOptions options);
  // Parked pulls point back at this object: it stays where it is.
  Relocation(const Relocation&) = delete;
  Relocation& operator=(const Relocation&) = delete;

  // --- This node's worker. Each returns the operation's id; its Completion follows (at once
  // when it can be served here). Throw std::invalid_argument for a key outside the space or a
  // gradient of the wrong length (a caller's bug, refused before anything happens).

  // Moves `key` here. Completes when the row arrived (it may have left again since, when
  // another node localized it meanwhile), at once when it is here, with an error when the key
  // is lost or its home is down.
  uint64_t localize(Key key);
  // Pushes `grad` (the row's length) made at `clock` to the owner of `key`. Completes once
  // applied.
  uint64_t push(Key key, std::span<const float> grad, Clock clock);
  // Reads `key` once every worker reached `min_clock` (the reader's clock minus the staleness
  // bound): the values then include every push of every worker at clocks below min_clock, and
  // every push of this node's worker that completed before this call (see the contracts above).
  uint64_t pull(Key key, Clock min_clock);

  // --- The workers' clocks (from their announcements). Errors: an unknown worker, a clock
  // that goes back. Releases the pulls that waited for it.
  std::optional<std::string> workerClock(WorkerId worker, Clock clock);
  // `worker` stops counting for pulls (its down time-out passed).
  void excludeWorker(WorkerId worker);

  // --- Peers. Takes one message from `from`. An invalid message (an unknown key, a localize
  // at a node that is not its home, a hand-over from a node that is not the home, a transfer
  // not asked for, a row or gradient of the wrong length, an answer to no pending operation)
  // changes nothing but a Refusal to `from`, and comes back as an error naming the peer.
  std::optional<std::string> receive(NodeId from, RelocationBody body);
  // `node` went down: what is lost, as far as this node can tell. Operations in flight fail;
  // keys homed here and owned by `node` are lost; rows awaited from `node` are given up; the
  // notices that keep the other nodes from waiting go out; nothing is sent to `node` any more.
  DownReport peerDown(NodeId node);

  // --- Outputs, taken out in the order they were made.
  std::vector<Outgoing> takeOutgoing();
  std::vector<Completion> takeCompletions();

  // --- State, for the shell's metrics and for tests.
  // Is the row of `key` here?
  bool holds(Key key) const { return store_.contains(key); }
  // The version at which the row held here arrived (0: held since the start). Key held here.
  uint64_t heldVersion(Key key) const;
  // Does this node, the key's home, count `key` as lost (its row died with a node)?
  bool lost(Key key) const { return lost_.count(key) > 0; }
  // The owner in this node's directory: keys homed here only (nullopt otherwise).
  std::optional<NodeId> directoryOwner(Key key) const;
  // The directory's version stamp of `key` (keys homed here).
  uint64_t directoryVersion(Key key) const { return directory_.keyVersion(key); }
  // Transfers of `key` this node waits for.
  uint32_t awaiting(Key key) const;
  // Operations waiting here for `key`'s transfer.
  size_t queuedOps(Key key) const;
  // Nothing waits here: no transfer, no queued or parked operation, no own operation in flight.
  bool idle() const { return transit_.empty() && pending_.empty(); }
  // The owner the location cache names for `key`, if any.
  std::optional<NodeId> cachedOwner(Key key) const;
  const KeyStore& store() const { return store_; }
  const RelocationStats& stats() const { return stats_; }
  NodeId self() const { return self_; }
  NodeId home(Key key) const { return directory_.home(key); }

 private:
  // An operation on the way to its row: this node's own or another's.
  struct KeyOp {
    NodeId origin = 0;
    uint64_t id = 0;
    bool push = false;
    Clock clock = 0;
    std::vector<float> grad;
  };
  // A hand-over noted before the row it concerns arrived: pass the row to `to` (owner from
  // `version` on) once the transfer of the version it names has come.
  struct PassOn {
    NodeId to = 0;
    uint64_t version = 0;
  };
  // Per key on its way here or through here.
  struct Transit {
    uint32_t awaiting = 0;                // transfers asked for and not arrived
    std::map<uint64_t, PassOn> pass_ons;  // by the version of the arrival they follow
    std::deque<KeyOp> queued;             // operations to apply when the row arrives, in order
    std::vector<uint64_t> localizes;      // own localize operations waiting for the row
    std::map<uint64_t, NodeId> givers;    // awaited arrivals the home accepted: version -> giver
    std::set<uint64_t> early;             // arrivals that came before their acceptance
    bool empty() const {
      return awaiting == 0 && pass_ons.empty() && queued.empty() && givers.empty() && early.empty();
    }
  };
  // An own operation not completed yet.
  struct Pending {
    Completion::Kind kind = Completion::Kind::kPush;
    Key key = 0;
    bool on_network = false;  // sent to another node (peerDown fails it)
  };
  struct CacheEntry {
    NodeId owner = 0;
    uint64_t version = 0;
  };

  uint64_t nextOp(Completion::Kind kind, Key key);
  void checkKey(Key key, const char* what) const;
  // Serves `op` here, queues it for the transfer here, or sends it one step closer to the row.
  void dispatch(Key key, KeyOp op);
  void applyHere(Key key, KeyOp op);
  void failOp(Key key, const KeyOp& op, const std::string& reason);
  void complete(Completion completion);
  // The home's step of a localize by `requester` (this node or a peer).
  void relocate(Key key, NodeId requester);
  // A hand-over for `key` to `to` at `version`, of the row this node got at `from_version`:
  // passes the row on when it is here, else notes it for the transfer.
  void handOver(Key key, NodeId to, uint64_t version, uint64_t from_version);
  // Sends the row of `key` (held here) to `to`, owner from `version` on.
  void sendRow(Key key, NodeId to, uint64_t version);
  // The row of `key` arrived at `version`: applies the waiting operations, completes the
  // localizes, passes it on when a hand-over is noted for it.
  void arrive(Key key, uint64_t version, KeyEntry row);
  void learn(Key key, NodeId owner, uint64_t version);
  // What waited for an arrival that will not come, taken out.
  struct Abandoned {
    std::optional<PassOn> pass_on;  // the hand-over noted for it
    std::vector<uint64_t> localizes;
    std::deque<KeyOp> queued;  // when no other arrival is awaited
  };
  // One awaited arrival of `key` (at `version`, or one never accepted) will not come.
  Abandoned abandonArrival(Key key, std::optional<uint64_t> version);
  void failLocalizes(Key key, const std::vector<uint64_t>& ids, const std::string& reason);
  // The awaited arrival of `key` at `version` will not come: the row died with node `with`.
  void giveUp(Key key, uint64_t version, NodeId with);
  // An awaited arrival of `key` that its home (`home`, now down) never accepted will not come.
  void giveUpRequest(Key key, NodeId home);
  // The row of `key` (at `version`) died with node `with`: the home counts it lost.
  void reportRowLost(Key key, uint64_t version, NodeId with);
  void send(NodeId to, RelocationBody body);
  void refuse(NodeId to, RefusedKind kind, Key key, uint64_t op, const std::string& reason);
  Transit* transit(Key key);
  void settle(Key key);

  std::optional<std::string> onLocalize(NodeId from, const LocalizeRequest& m);
  std::optional<std::string> onHandOver(NodeId from, const HandOver& m);
  std::optional<std::string> onTransfer(NodeId from, Transfer& m);
  std::optional<std::string> onPush(NodeId from, KeyPush& m);
  std::optional<std::string> onPull(NodeId from, const KeyPull& m);
  std::optional<std::string> onPushApplied(NodeId from, const PushApplied& m);
  std::optional<std::string> onPullAnswer(NodeId from, PullAnswer& m);
  std::optional<std::string> onRefusal(NodeId from, const Refusal& m);
  std::optional<std::string> onAccepted(NodeId from, const LocalizeAccepted& m);
  std::optional<std::string> onTransferLost(NodeId from, const TransferLost& m);
  std::optional<std::string> onRowLost(NodeId from, const RowLost& m);
  std::optional<std::string> onTransferQuery(NodeId from, const TransferQuery& m);
  std::optional<std::string> onNoHandOver(NodeId from, const NoHandOver& m);
  std::optional<std::string> onOpLost(NodeId from, const OpLost& m);
  // Answers a TransferQuery of `requester` (the key's home is down here): nothing when a noted
  // hand-over will send the row, NoHandOver otherwise.
  void answerQuery(NodeId requester, Key key, uint64_t version);
  // The awaited arrival of `key` at `version` from `giver` will not come: the hand-over never
  // reached it; the row stays there.
  void giveUpHandOver(Key key, uint64_t version, NodeId giver);
  // The pending own operation `op` of `kind` for `key`, or why an answer for it is wrong.
  std::optional<std::string> checkAnswer(NodeId from, uint64_t op, Completion::Kind kind,
                                         Key key) const;

  NodeId self_;
  std::vector<NodeId> members_;
  KeyDirectory directory_;  // authoritative for the keys homed here only
  KeyStore store_;
  size_t cache_capacity_;
  std::optional<WorkerClocks> clocks_;
  std::unordered_map<Key, uint64_t> held_versions_;  // rows that arrived here (absent: 0)
  std::unordered_map<Key, Transit> transit_;
  std::unordered_map<Key, CacheEntry> cache_;
  std::unordered_map<uint64_t, Pending> pending_;
  std::unordered_set<uint64_t> abandoned_;  // failed by peerDown: late answers are dropped
  // Homed here: who handed each key over last (for peerDown's report).
  std::unordered_map<Key, NodeId> last_giver_;
  std::unordered_map<Key, NodeId> lost_;  // homed here: lost with this node
  // Arrivals given up, by key and version, with the node the row died with: a hand-over that
  // comes later for one of them tells its receiver at once.
  std::unordered_map<Key, std::map<uint64_t, NodeId>> lost_arrivals_;
  // Requests whose home died before it accepted them, per key: the home may have sent the
  // hand-over before it died, so a row can still come, and it is taken.
  std::unordered_map<Key, uint32_t> orphaned_;
  struct Query {
    NodeId requester = 0;
    Key key = 0;
    uint64_t version = 0;
  };
  // TransferQueries held until this node, too, saw the key's home go down, by home.
  std::unordered_map<NodeId, std::vector<Query>> held_queries_;
  // Others' operations this node sent on, per destination, the latest kPassedMemory: when the
  // destination goes down, their origins hear of it (they cannot know the path).
  struct Passed {
    NodeId origin = 0;
    uint64_t op = 0;
    Key key = 0;
  };
  static constexpr size_t kPassedMemory = size_t{1} << 14;
  std::unordered_map<NodeId, std::deque<Passed>> passed_;
  std::set<NodeId> down_;
  uint64_t next_op_ = 1;
  std::vector<Outgoing> outgoing_;
  std::vector<Completion> completions_;
  RelocationStats stats_;
};

}  // namespace chorus::ps
