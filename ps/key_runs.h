// Sorted, unique PS keys on the wire as runs of consecutive keys (issue 25, "Per-key cost"):
// each run is two LEB128 varints, the gap from the end of the run before it (from key 0 for the
// first run) and the run's length minus one. A contiguous range of keys costs 2-4 bytes
// whatever its length; keys spread by hashing over N owners about 1-2 bytes each, against 8
// for a plain [ulong]. Pure: no node, no socket (tests/ps/key_runs_test.cc, and the PS message
// fuzz target decodes every PsPull and PsPush through it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ps/shard_map.h"

namespace chorus::ps {

// Most bytes encodeKeyRuns() writes for `keys` keys (a gap of 10 bytes and a length of 1 each).
constexpr size_t keyRunsBound(size_t keys) {
  return keys * 11;
}

// Appends the runs of `keys` (sorted and unique: the caller checked) to `out`.
void encodeKeyRuns(std::span<const Key> keys, std::vector<uint8_t>& out);
// Writes the runs of `keys` (sorted and unique) at `out`, which has room for
// keyRunsBound(keys.size()) bytes; returns the bytes written.
size_t encodeKeyRuns(std::span<const Key> keys, uint8_t* out);

// Replaces `keys` with the keys `bytes` encode. Errors (the message says which byte and why;
// `keys` is then unspecified): a varint cut off by the end or longer than 64 bits, a run that
// passes key 2^64 - 1, or more than `max_keys` keys in all (checked before anything is sized by
// a run's length, so that 11 bytes cannot make the receiver allocate 2^64 keys).
std::optional<std::string> decodeKeyRuns(std::span<const uint8_t> bytes, size_t max_keys,
                                         std::vector<Key>& keys);

// Rows named by their place in an owner's store instead of by key (issue 25: the owner then
// reads and updates them without a lookup per key): `rows` rows from slot `slot` of table
// `table`'s slab (KeyStore). On the wire each run is three LEB128 varints, the table, the slot
// and the rows minus one; a worker learns them from the owner (PsReply.slot_runs) and they
// hold only while the owner's store keeps that layout (KeyStore::layout()).
struct SlotRun {
  uint32_t table = 0;
  uint32_t slot = 0;
  uint32_t rows = 0;
  bool operator==(const SlotRun&) const = default;
};
// Most bytes encodeSlotRuns() writes for `runs` runs.
constexpr size_t slotRunsBound(size_t runs) {
  return runs * 15;
}
// Appends the encoding of `runs` (each of at least one row) to `out`.
void encodeSlotRuns(std::span<const SlotRun> runs, std::vector<uint8_t>& out);
// Replaces `runs` with the runs `bytes` encode. Errors (naming the byte): a varint cut off or
// longer than 32 bits, a run past slot 2^32 - 1, or more than `max_rows` rows in all (checked
// before anything is sized).
std::optional<std::string> decodeSlotRuns(std::span<const uint8_t> bytes, size_t max_rows,
                                          std::vector<SlotRun>& runs);

}  // namespace chorus::ps
