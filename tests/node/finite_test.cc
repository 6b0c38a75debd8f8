// The finite check of values from peers (node/finite.h): every position of the sixteen lanes and
// of the tail, every kind of non-finite value, and the largest finite ones.
#include "node/finite.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace chorus::node {
namespace {

TEST(FiniteCheck, FindsEveryKindOfNonFiniteValueAtEveryPosition) {
  const float bad[] = {std::nanf(""), -std::nanf(""), std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (size_t size : {size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{100}}) {
    std::vector<float> values(size, -std::numeric_limits<float>::max());
    values.back() = std::numeric_limits<float>::denorm_min();
    EXPECT_TRUE(allFinite(values));
    EXPECT_EQ(firstNonFinite(values), std::nullopt);
    for (size_t at = 0; at < size; ++at) {
      for (float b : bad) {
        std::vector<float> with = values;
        with[at] = b;
        EXPECT_FALSE(allFinite(with)) << size << " " << at << " " << b;
        EXPECT_EQ(firstNonFinite(with), at);
        EXPECT_EQ(countNonFinite(with), 1u);
      }
    }
  }
  EXPECT_TRUE(allFinite({}));
}

}  // namespace
}  // namespace chorus::node
