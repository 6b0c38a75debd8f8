// ChunkPool (node/chunk_pool.h): the buffers a sealed connection writes through come back when
// the frame that owns one dies, are handed out again, and no more than the cap stay idle.
#include "node/chunk_pool.h"

#include <gtest/gtest.h>

#include <cstring>

namespace chorus::node {
namespace {

TEST(ChunkPool, AChunkComesBackWhenItsFrameDiesAndIsReused) {
  auto pool = ChunkPool::create(4096, 2);
  std::unique_ptr<uint8_t[]> chunk = pool->take();
  const uint8_t* address = chunk.get();
  std::memcpy(chunk.get(), "sealed", 6);
  SharedFrame frame = pool->frameOf(std::move(chunk), 6, 9, 3);
  EXPECT_EQ(frame->size(), 6u);
  EXPECT_EQ(std::memcmp(frame->data(), "sealed", 6), 0);
  EXPECT_EQ(frame->sequence(), 9u);
  EXPECT_EQ(frame->kind(), 3u);
  EXPECT_EQ(pool->idle(), 0u);
  frame.reset();
  EXPECT_EQ(pool->idle(), 1u);
  EXPECT_EQ(pool->take().get(), address);  // the same memory: its pages stay mapped
  EXPECT_EQ(pool->allocated(), 1u);
}

TEST(ChunkPool, AtMostTheCapStaysIdle) {
  auto pool = ChunkPool::create(1024, 2);
  std::vector<SharedFrame> frames;
  for (int i = 0; i < 5; ++i)
    frames.push_back(pool->frameOf(pool->take(), 1024));
  EXPECT_EQ(pool->allocated(), 5u);
  frames.clear();
  EXPECT_EQ(pool->idle(), 2u);
  pool->take();
  pool->take();
  EXPECT_EQ(pool->allocated(), 5u);
  pool->take();
  EXPECT_EQ(pool->allocated(), 6u);
}

TEST(ChunkPool, AFrameOutlivesThePoolsOwner) {
  SharedFrame frame;
  {
    auto pool = ChunkPool::create(64, 1);
    frame = pool->frameOf(pool->take(), 10);
  }
  EXPECT_EQ(frame->size(), 10u);
  frame.reset();  // gives the chunk back to the pool it kept alive, which then goes
}

TEST(ChunkPool, AFrameCannotClaimMoreThanItsChunk) {
  auto pool = ChunkPool::create(64, 1);
  EXPECT_THROW(pool->frameOf(pool->take(), 65), std::logic_error);
}

}  // namespace
}  // namespace chorus::node
