// The messages of Lapse-style relocation (Renz-Wieland et al., VLDB 2020) between the nodes of
// a PS job, as plain structs: what ps/relocation.h's core reads and writes, before any wire
// format. One message concerns one key; the network shell may pack the messages of one kind to
// one destination into one frame. docs/ps-relocation.md describes the protocol message by
// message.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "ps/key_store.h"
#include "ps/shard_map.h"
#include "ps/ssp.h"

namespace chorus::ps {

// Requester -> home: "make me the owner of `key`".
struct LocalizeRequest {
  Key key = 0;
};

// Home -> old owner: "give `key` to `to`". The home changed its directory already: `to` owns the
// key from `version` on. `from_version` is the version at which the old owner got the key (0:
// the key never moved), so that an old owner waiting for the row itself knows which arrival
// this hand-over follows.
struct HandOver {
  Key key = 0;
  NodeId to = 0;
  uint64_t version = 0;
  uint64_t from_version = 0;
};

// Old owner -> new owner: the row, its optimizer state and its push count, owned by the receiver
// from `version` on.
struct Transfer {
  Key key = 0;
  uint64_t version = 0;
  KeyEntry row;
};

// A push of `origin`'s worker on its way to the owner of `key` (sent by the origin, or passed
// on by a node that does not hold the key). `op` is the origin's id of the operation.
struct KeyPush {
  Key key = 0;
  NodeId origin = 0;
  uint64_t op = 0;
  Clock clock = 0;  // the clock the push belongs to (the learning-rate schedule's)
  std::vector<float> grad;
};

// A pull of `origin`'s worker on its way to the owner of `key`. Its SSP wait happened at the
// origin already (see Relocation::pull).
struct KeyPull {
  Key key = 0;
  NodeId origin = 0;
  uint64_t op = 0;
};

// Owner -> origin: the push `op` was applied. `owner` held the key at `version`: the origin's
// location cache learns where the key lives.
struct PushApplied {
  Key key = 0;
  uint64_t op = 0;
  NodeId owner = 0;
  uint64_t version = 0;
};

// Owner -> origin: the values of `key` for the pull `op`, with where the key lives as above.
struct PullAnswer {
  Key key = 0;
  uint64_t op = 0;
  NodeId owner = 0;
  uint64_t version = 0;
  std::vector<float> values;
};

// Home -> requester: the localize was taken; the row comes from `giver`, owned by the requester
// from `version` on. Off the critical path (the row does not wait for it); it tells the requester
// whom it waits for, so that it stops waiting when that node goes down.
struct LocalizeAccepted {
  Key key = 0;
  uint64_t version = 0;
  NodeId giver = 0;
};

// Giver -> the node it was to give the row to: the row the receiver awaits at `version` will not
// come; it died with node `with` on its way here.
struct TransferLost {
  Key key = 0;
  uint64_t version = 0;
  NodeId with = 0;
};

// Any node -> home: the row of `key` died with node `with` (it was on its way at `version`):
// the home counts the key lost.
struct RowLost {
  Key key = 0;
  uint64_t version = 0;
  NodeId with = 0;
};

// Requester -> giver, once the key's home went down: "will you send the row I await at
// `version`?" (the home may have died before its hand-over reached the giver).
struct TransferQuery {
  Key key = 0;
  uint64_t version = 0;
};

// Giver -> requester, in answer to a TransferQuery: no hand-over for `version` reached this node,
// so no row comes (the row stays where it is). A row sent earlier arrived before this answer.
struct NoHandOver {
  Key key = 0;
  uint64_t version = 0;
};

// A node that sent an operation on to node `with` -> the operation's origin, once `with` went
// down: the operation may be lost (a push may or may not have been applied).
struct OpLost {
  Key key = 0;
  uint64_t op = 0;
  NodeId with = 0;
};

// What a Refusal refuses.
enum class RefusedKind : uint8_t {
  kLocalize,
  kHandOver,
  kTransfer,
  kPush,
  kPull,
  kAnswer,
  kNotice,  // LocalizeAccepted, TransferLost, RowLost, TransferQuery, NoHandOver, OpLost
};
const char* refusedKindName(RefusedKind kind);

// Any node -> the sender of a message it could not take, or the origin of an operation that
// failed: what and why. `op` is the operation's id for a push or pull (0 otherwise).
struct Refusal {
  RefusedKind refused = RefusedKind::kPush;
  Key key = 0;
  uint64_t op = 0;
  std::string reason;
};

using RelocationBody = std::variant<LocalizeRequest, HandOver, Transfer, KeyPush, KeyPull,
                                    PushApplied, PullAnswer, Refusal, LocalizeAccepted,
                                    TransferLost, RowLost, TransferQuery, NoHandOver, OpLost>;

// A message to send: where to, and what.
struct Outgoing {
  NodeId to = 0;
  RelocationBody body;
};

// The kind of a message in logs ("localize", "hand-over", ...).
const char* relocationKindName(const RelocationBody& body);
// The key a message concerns.
Key relocationKey(const RelocationBody& body);

}  // namespace chorus::ps
