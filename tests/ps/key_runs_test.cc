// Keys as runs on the wire (ps/key_runs.h): every sorted, unique key set survives the round
// trip, and every malformed encoding is refused with the byte it starts at, before anything is
// sized by it.
#include "ps/key_runs.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <set>
#include <vector>

namespace chorus::ps {
namespace {

constexpr Key kMax = std::numeric_limits<Key>::max();

std::vector<Key> roundTrip(const std::vector<Key>& keys) {
  std::vector<uint8_t> bytes;
  encodeKeyRuns(keys, bytes);
  EXPECT_LE(bytes.size(), keyRunsBound(keys.size()));
  std::vector<Key> out{123};  // replaced, not appended to
  const auto error = decodeKeyRuns(bytes, keys.size(), out);
  EXPECT_EQ(error, std::nullopt) << *error;
  return out;
}

std::optional<std::string> decode(std::vector<uint8_t> bytes, size_t max_keys = 1000) {
  std::vector<Key> keys;
  return decodeKeyRuns(bytes, max_keys, keys);
}

TEST(KeyRuns, RandomSortedKeySetsSurviveTheRoundTrip) {
  std::mt19937_64 rng(25);
  for (int trial = 0; trial < 200; ++trial) {
    std::set<Key> set;
    const size_t n = rng() % 300;
    const Key spread = Key{1} << (10 + rng() % 54);
    while (set.size() < n) {
      // Mostly runs of neighbours, some far apart, some at the top of the key range.
      const Key base = rng() % 8 == 0 ? kMax - rng() % 50 : rng() % spread;
      const size_t run = 1 + rng() % 5;
      for (size_t i = 0; i < run && base + i >= base; ++i)
        set.insert(base + i);
    }
    const std::vector<Key> keys(set.begin(), set.end());
    EXPECT_EQ(roundTrip(keys), keys) << "trial " << trial;
  }
}

TEST(KeyRuns, EdgeKeySetsSurviveTheRoundTrip) {
  EXPECT_EQ(roundTrip({}), std::vector<Key>{});
  EXPECT_EQ(roundTrip({0}), std::vector<Key>{0});
  EXPECT_EQ(roundTrip({kMax}), std::vector<Key>{kMax});
  EXPECT_EQ(roundTrip({0, kMax}), (std::vector<Key>{0, kMax}));
  EXPECT_EQ(roundTrip({kMax - 2, kMax - 1, kMax}), (std::vector<Key>{kMax - 2, kMax - 1, kMax}));
}

TEST(KeyRuns, ARangeCostsAFewBytesWhateverItsLength) {
  std::vector<Key> keys(100000);
  for (size_t i = 0; i < keys.size(); ++i)
    keys[i] = 7 + i;
  std::vector<uint8_t> bytes;
  encodeKeyRuns(keys, bytes);
  EXPECT_EQ(bytes.size(), 1u + 3u);  // gap 7, length - 1 = 99999 in 3 bytes
}

TEST(KeyRuns, MalformedRunsAreRefusedNamingTheByte) {
  // A varint cut off by the end: the gap, then the length.
  EXPECT_NE(decode({0x80})->find("varint at byte 0 is cut off"), std::string::npos);
  EXPECT_NE(decode({0x01, 0x00, 0x05})->find("varint at byte 3 is cut off"), std::string::npos);
  // More than 64 bits: ten bytes whose last carries more than the top bit, or eleven.
  std::vector<uint8_t> long_varint(9, 0xff);
  long_varint.push_back(0x02);
  long_varint.push_back(0x00);
  EXPECT_NE(decode(long_varint)->find("longer than 64 bits"), std::string::npos);
  std::vector<uint8_t> eleven(10, 0x80);
  eleven.push_back(0x00);
  EXPECT_NE(decode(eleven)->find("longer than 64 bits"), std::string::npos);
  // A run that passes key 2^64 - 1: gap 2^64 - 1, then 1 more.
  std::vector<uint8_t> top(9, 0xff);
  top.push_back(0x01);
  std::vector<uint8_t> past = top;
  past.push_back(0x01);
  EXPECT_NE(decode(past)->find("passes key 2^64 - 1"), std::string::npos);
  // The key 2^64 - 1 itself is fine; a run after it is not.
  std::vector<uint8_t> at_top = top;
  at_top.push_back(0x00);
  EXPECT_EQ(decode(at_top), std::nullopt);
  at_top.push_back(0x00);
  at_top.push_back(0x00);
  EXPECT_NE(decode(at_top)->find("run at byte 11 starts past key 2^64 - 1"), std::string::npos);
  // A gap past the top after a first run.
  // Appended byte by byte: GCC 12's -Warray-bounds misreads an insert() of one vector's range
  // into another that grows (a false "writing past the end").
  std::vector<uint8_t> gap{0x05, 0x00};
  for (const uint8_t byte : top)
    gap.push_back(byte);
  gap.push_back(0x00);
  EXPECT_NE(decode(gap)->find("run at byte 2 starts past key 2^64 - 1"), std::string::npos);
}

TEST(KeyRuns, AHugeRunIsRefusedBeforeAnythingIsSized) {
  // 11 bytes for 2^63 keys: refused against the limit, nothing allocated for it (a bad_alloc
  // or a long loop would fail this test).
  std::vector<uint8_t> huge{0x00};
  for (int i = 0; i < 9; ++i)
    huge.push_back(0xff);
  huge.back() = 0x7f;
  std::vector<Key> keys;
  const auto error = decodeKeyRuns(huge, 1 << 20, keys);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("more than the 1048576 keys"), std::string::npos) << *error;
  // The limit counts every run: 3 runs of 1 key against a limit of 2.
  EXPECT_NE(decode({0x00, 0x00, 0x01, 0x00, 0x01, 0x00}, 2)->find("run at byte 4"),
            std::string::npos);
  EXPECT_EQ(decode({0x00, 0x00, 0x01, 0x00}, 2), std::nullopt);
  EXPECT_TRUE(decode({0x00, 0x00}, 0));
}

// Rows named by slot (issue 25): runs survive the round trip; malformed ones are refused with
// the byte they start at, before anything is sized by them.
TEST(SlotRuns, RoundTripAndRefuseWhatCannotBeARun) {
  const std::vector<SlotRun> runs{{.table = 0, .slot = 0, .rows = 1},
                                  {.table = 2, .slot = 300, .rows = 70000},
                                  {.table = 0, .slot = UINT32_MAX, .rows = 1}};
  std::vector<uint8_t> bytes;
  encodeSlotRuns(runs, bytes);
  EXPECT_LE(bytes.size(), slotRunsBound(runs.size()));
  std::vector<SlotRun> out{{.table = 9, .slot = 9, .rows = 9}};  // replaced, not appended to
  ASSERT_EQ(decodeSlotRuns(bytes, 70002, out), std::nullopt);
  EXPECT_EQ(out, runs);
  // One row more than the request may name.
  EXPECT_NE(decodeSlotRuns(bytes, 70001, out)->find("more than the 70001 rows"), std::string::npos);
  // Cut off inside the last run's third varint.
  EXPECT_NE(decodeSlotRuns(std::span(bytes).first(bytes.size() - 1), 70002, out)
                ->find("cut off by the end"),
            std::string::npos);
  // A slot past 2^32 - 1, and a run that passes it.
  std::vector<uint8_t> big{0, 0x80, 0x80, 0x80, 0x80, 0x10, 0};
  EXPECT_NE(decodeSlotRuns(big, 10, out)->find("past 2^32 - 1"), std::string::npos);
  std::vector<uint8_t> passes;
  encodeSlotRuns(std::vector<SlotRun>{{.table = 0, .slot = UINT32_MAX, .rows = 2}}, passes);
  EXPECT_NE(decodeSlotRuns(passes, 10, out)->find("passes slot 2^32 - 1"), std::string::npos);
}

}  // namespace
}  // namespace chorus::ps
