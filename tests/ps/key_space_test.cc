// The key space: tables of rows with a length per key, and a dense model as one table that
// agrees with ChunkLayout key by key.
#include "ps/key_space.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace chorus::ps {
namespace {

TEST(KeySpace, ADenseModelIsOneTableThatAgreesWithItsChunkLayout) {
  for (size_t total : {1u, 7u, 16u, 4097u}) {
    for (size_t chunk : {1u, 4u, 16u, 5000u}) {
      const ChunkLayout layout(total, chunk);
      const KeySpace space(layout);
      ASSERT_EQ(space.tables().size(), 1u);
      EXPECT_EQ(space.numKeys(), layout.numKeys());
      EXPECT_EQ(space.keyEnd(), layout.numKeys());
      EXPECT_EQ(space.total(), layout.total());
      for (Key k = 0; k < layout.numKeys(); ++k) {
        EXPECT_EQ(space.length(k), layout.length(k)) << total << "/" << chunk << " key " << k;
        EXPECT_EQ(space.offset(k), layout.offset(k));
      }
      EXPECT_EQ(space.length(layout.numKeys()), 0u);
      EXPECT_FALSE(space.contains(layout.numKeys()));
    }
  }
}

TEST(KeySpace, TablesHaveTheirOwnRowLengthsAndMayLeaveGaps) {
  KeySpace space;
  EXPECT_EQ(space.addTable("entity", 10, 8), 0u);
  EXPECT_EQ(space.addTable("relation", 100, 3, 16), 100u);  // keys 10..99 are no key
  EXPECT_EQ(space.addTable("bias", 2, 1), 103u);
  EXPECT_EQ(space.numKeys(), 15u);
  EXPECT_EQ(space.keyEnd(), 105u);
  EXPECT_EQ(space.total(), 10u * 8 + 3 * 16 + 2);
  EXPECT_EQ(space.length(9), 8u);
  EXPECT_EQ(space.length(10), 0u);
  EXPECT_EQ(space.length(99), 0u);
  EXPECT_EQ(space.length(100), 16u);
  EXPECT_EQ(space.length(104), 1u);
  EXPECT_EQ(space.length(105), 0u);
  EXPECT_EQ(space.offset(100), 80u);
  EXPECT_EQ(space.offset(102), 112u);
  EXPECT_EQ(space.offset(104), 129u);
  EXPECT_EQ(space.tableOf(101)->name, "relation");
  EXPECT_EQ(space.tableOf(50), nullptr);
  const std::vector<Key> keys{3, 101, 104};
  EXPECT_EQ(space.floatsOf(keys), 8u + 16 + 1);
  const std::vector<Key> all = space.allKeys();
  ASSERT_EQ(all.size(), 15u);
  EXPECT_EQ(all[9], 9u);
  EXPECT_EQ(all[10], 100u);
  // Every float of the flat buffer belongs to exactly one key.
  std::vector<int> covered(space.total());
  for (Key k : all) {
    for (size_t i = 0; i < space.length(k); ++i)
      ++covered[space.offset(k) + i];
  }
  for (int c : covered)
    EXPECT_EQ(c, 1);
}

TEST(KeySpace, RefusesOverlappingOrEmptyTablesAndBadRequests) {
  KeySpace space;
  space.addTable("a", 10, 4);
  EXPECT_THROW(space.addTable("b", 5, 3, 4), std::invalid_argument);
  EXPECT_THROW(space.addTable("c", 0, 4), std::invalid_argument);
  EXPECT_THROW(space.addTable("d", 3, 0), std::invalid_argument);
  EXPECT_THROW(space.addTable("e", ~Key{0} - 1, 5, 1), std::invalid_argument);

  EXPECT_EQ(space.check(std::vector<Key>{1, 2}, 8), std::nullopt);
  EXPECT_EQ(space.check(std::vector<Key>{1, 2}, std::nullopt), std::nullopt);
  EXPECT_NE(space.check(std::vector<Key>{2, 1}, std::nullopt)->find("sorted and unique"),
            std::string::npos);
  EXPECT_NE(space.check(std::vector<Key>{10}, std::nullopt)->find("unknown key 10"),
            std::string::npos);
  EXPECT_NE(space.check(std::vector<Key>{1}, 5)->find("wrong length"), std::string::npos);
}

}  // namespace
}  // namespace chorus::ps
