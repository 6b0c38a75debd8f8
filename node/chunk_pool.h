// Buffers of one size, reused: what a connection writes its sealed frames through
// (Connection, docs/security.md "Cost"). A sealed frame cannot be written from the sender's
// memory (it is shared between connections, and the caller's attachment must not change), so
// it is sealed into a buffer of the connection's; a fresh multi-megabyte buffer per frame cost
// more in page faults (the kernel mapping and zeroing it) than the cipher did. Large frames are
// sealed in pieces through chunks of a fixed size instead, and a chunk whose write completed
// comes back here to be filled again, so its pages stay mapped. Pure code; one thread (the
// connection's loop) takes chunks and gives them back, which happens when the frame that owns
// one dies; the pool lives as long as its last chunk does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "node/frame.h"

namespace chorus::node {

class ChunkPool : public std::enable_shared_from_this<ChunkPool> {
 public:
  // Chunks of `chunk_bytes`; at most `max_idle` of them are kept while no frame owns them (the
  // memory a connection holds between writes), more are freed.
  static std::shared_ptr<ChunkPool> create(size_t chunk_bytes, size_t max_idle);
  ~ChunkPool();
  ChunkPool(const ChunkPool&) = delete;
  ChunkPool& operator=(const ChunkPool&) = delete;

  size_t chunkBytes() const { return chunk_bytes_; }
  // An idle chunk, or a new one (uninitialized) when none is idle.
  std::unique_ptr<uint8_t[]> take();
  // The first `used` bytes of `chunk` (from take()) as an outbound frame; the chunk comes back
  // to this pool when the frame dies.
  SharedFrame frameOf(std::unique_ptr<uint8_t[]> chunk, size_t used, uint64_t sequence = 0,
                      uint32_t kind = 0);
  // Chunks kept for reuse now.
  size_t idle() const { return idle_.size(); }
  // Chunks allocated so far (not taken from the idle ones).
  uint64_t allocated() const { return allocated_; }

 private:
  class Returner;  // the flatbuffers::Allocator through which a frame gives its chunk back
  ChunkPool(size_t chunk_bytes, size_t max_idle) : chunk_bytes_(chunk_bytes), max_idle_(max_idle) {}
  void giveBack(uint8_t* chunk);

  size_t chunk_bytes_;
  size_t max_idle_;
  std::vector<std::unique_ptr<uint8_t[]>> idle_;
  uint64_t allocated_ = 0;
};

}  // namespace chorus::node
