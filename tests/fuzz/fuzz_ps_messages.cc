// PS mode's owner above the frame layer: a fuzzed, authenticated peer after its handshake. Each
// record of the input is one frame from one member (or a stranger), read by the real FrameDecoder
// with PS's service (the Verifier the node runs) and handed to the real KvServer handlers
// (PsPull, PsPush, PsClock) through Node::deliverForTesting, on a node that never opens a socket;
// between frames the peer may go down, come back, leave or finish, and time may pass. Checked
// after every input: every worker's clock as the owner knows it lies within the run (0..max_clock:
// an impostor's INT64_MAX moves nothing) and every value the owner holds is finite (a NaN push is
// refused, hole 3 of issue 27). libFuzzer's -malloc_limit_mb catches an allocation a peer's
// numbers size, such as a key run (ps/key_runs.h, decoded by every PsPull and PsPush) whose
// length the owner believed.
//
// Input: 1 byte of options (BSP, learning rate by progress), then records:
//   control byte: bits 0-1 the sender (1, 2: workers; 3: not a member; 0: this owner's id),
//                 bit 7 set: an event instead of a frame (bits 2-3: down, up, left, finished;
//                 bits 4-6: seconds that pass, then tick())
//   frame records: 2 bytes little-endian length, then that many bytes of the frame stream.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "node/frame.h"
#include "node/node.h"
#include "ps/key_space.h"
#include "ps/key_store.h"
#include "ps/kv_server.h"
#include "ps/ps_service.h"
#include "ps/shard_map.h"
#include "tests/fuzz/fake_peers.h"

namespace {

using namespace chorus;

constexpr ps::Clock kMaxClock = 20;

[[noreturn]] void fail(const char* what, long long a, long long b) {
  std::fprintf(stderr, "fuzz_ps_messages: %s (%lld, %lld)\n", what, a, b);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t options_byte = data[0];
  ++data;
  --size;

  const std::vector<node::NodeId> members{0, 1, 2};
  const std::unique_ptr<node::Node> offline = fuzz::offlineNode(0, members);
  node::Node& node = *offline;

  const ps::KeySpace space{ps::ChunkLayout{24, 4}};  // 6 keys of 4 floats, 2 owned here
  const ps::ShardMap map(members);
  const std::vector<float> initial(space.total(), 0.5f);
  ps::OwnerOptimizer optimizer;
  ps::ServerOptions server_options;
  server_options.bsp = (options_byte & 1) != 0;
  server_options.lr_by_progress = (options_byte & 2) != 0;
  server_options.max_clock = kMaxClock;
  server_options.down_timeout = std::chrono::milliseconds(2000);
  ps::KvServer server(node, ps::KeyStore(space, map, 0, initial, optimizer), members,
                      server_options);

  auto now = std::chrono::steady_clock::time_point{};
  fuzz::Records records({data, size});
  uint8_t control = 0;
  while (records.control(control)) {
    const node::NodeId from = control & 3;
    if ((control & 0x80) != 0) {
      node::PeerEvent event;
      event.peer = from;
      switch ((control >> 2) & 3) {
        case 0:
          event.kind = node::PeerEventKind::kDown;
          break;
        case 1:
          event.kind = node::PeerEventKind::kUp;
          break;
        case 2:
          event.kind = node::PeerEventKind::kLeft;
          break;
        default:
          server.workerFinished(from);
          break;
      }
      if (((control >> 2) & 3) != 3) server.onPeerEvent(event);
      now += std::chrono::seconds((control >> 4) & 7);
      server.tick(now);
      continue;
    }
    std::span<const uint8_t> frame;
    if (!records.frameBytes(frame)) break;
    fuzz::deliverFrames(node, from, ps::kPsServiceId, ps::kPsService, frame);
  }

  for (const ps::WorkerView& view : server.workerViews()) {
    if (view.clock < 0 || view.clock > kMaxClock) {
      fail("a worker's clock outside the run", view.worker, view.clock);
    }
  }
  const std::vector<ps::Key> keys = server.store().ownedKeys();
  std::vector<float> values(server.store().floatsOf(keys));
  server.store().copyTo(keys, values.data());
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) fail("a non-finite value in the owner's store", i, 0);
  }
  return 0;
}
