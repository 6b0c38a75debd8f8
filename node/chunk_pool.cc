#include "node/chunk_pool.h"

#include <stdexcept>

namespace chorus::node {

// Owned by the DetachedBuffer of one frame (own_allocator): deallocate() is its chunk coming
// back, and the shared_ptr keeps the pool alive until then.
class ChunkPool::Returner final : public flatbuffers::Allocator {
 public:
  explicit Returner(std::shared_ptr<ChunkPool> pool) : pool_(std::move(pool)) {}
  uint8_t* allocate(size_t) override { throw std::logic_error("ChunkPool chunks do not grow"); }
  void deallocate(uint8_t* p, size_t) override { pool_->giveBack(p); }

 private:
  std::shared_ptr<ChunkPool> pool_;
};

std::shared_ptr<ChunkPool> ChunkPool::create(size_t chunk_bytes, size_t max_idle) {
  if (chunk_bytes == 0) throw std::invalid_argument("ChunkPool of empty chunks");
  return std::shared_ptr<ChunkPool>(new ChunkPool(chunk_bytes, max_idle));
}

ChunkPool::~ChunkPool() = default;

std::unique_ptr<uint8_t[]> ChunkPool::take() {
  if (!idle_.empty()) {
    std::unique_ptr<uint8_t[]> chunk = std::move(idle_.back());
    idle_.pop_back();
    return chunk;
  }
  ++allocated_;
  return std::make_unique_for_overwrite<uint8_t[]>(chunk_bytes_);
}

SharedFrame ChunkPool::frameOf(std::unique_ptr<uint8_t[]> chunk, size_t used, uint64_t sequence,
                               uint32_t kind) {
  if (used > chunk_bytes_) throw std::logic_error("ChunkPool::frameOf beyond the chunk");
  uint8_t* bytes = chunk.release();
  return std::make_shared<const OutboundFrame>(
      flatbuffers::DetachedBuffer(new Returner(shared_from_this()), true, bytes, chunk_bytes_,
                                  bytes, used),
      sequence, kind);
}

void ChunkPool::giveBack(uint8_t* chunk) {
  std::unique_ptr<uint8_t[]> owned(chunk);
  if (idle_.size() < max_idle_) idle_.push_back(std::move(owned));
}

}  // namespace chorus::node
