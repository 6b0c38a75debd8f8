// The replica service (NuPS replication of hot keys: ps/replica_shell.h, ps/replica_codec.h,
// ps/replica_sync.h) above the frame layer: a fuzzed, authenticated peer after its handshake.
// Each record of the input is one frame from one member (or a stranger), read by the real
// FrameDecoder with the replica service (the Verifier the node runs) and handed to a real
// ReplicaShell's handlers (ReplicaSync contributions and sums of any round and part,
// ReplicaDrain) through Node::deliverForTesting, on a node that never opens a socket and whose
// sync timer never runs (rounds start when a peer's message pulls this node in); between frames
// a member may go down, come back or leave. Checked after every input: this node is still a live
// member of the sync, no round finished here without a message for it (a peer's round number
// moves nothing: no member runs more than one round ahead), and every replicated key still has
// its value floats. AddressSanitizer, UBSan and -malloc_limit_mb catch a read past the
// attachment or an allocation a peer's numbers size.
//
// The group: members 0, 1, 2 (this node is 0; 3 is a stranger); hot keys 0..5 of a table of 2
// floats and 6..7 of a table of 3; SGD (state not synced) or Adagrad (state synced) by option.
// Input: 1 byte of options (bit 0: Adagrad), then records:
//   control byte: bits 0-1 the sender, bit 7 set: an event instead of a frame (bits 2-3: down,
//                 up, left)
//   frame records: 2 bytes little-endian length, then that many bytes of the frame stream.
#include <spdlog/spdlog.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "node/frame.h"
#include "node/node.h"
#include "ps/replica_layout.h"
#include "ps/replica_service.h"
#include "ps/replica_shell.h"
#include "ps/update_policy.h"
#include "tests/fuzz/fake_peers.h"

namespace {

using namespace chorus;

[[noreturn]] void fail(const char* what, unsigned long long a, unsigned long long b) {
  std::fprintf(stderr, "fuzz_replica_messages: %s (%llu, %llu)\n", what, a, b);
  std::abort();
}

// The hot keys (tests/fuzz/make_seeds.cc writes messages for this layout).
ps::KeySpace hotSpace() {
  ps::KeySpace space;
  space.addTable("pairs", 0, 6, 2);
  space.addTable("triples", 6, 2, 3);
  return space;
}

std::shared_ptr<const ps::UpdatePolicy> policyOf(bool adagrad) {
  if (adagrad) {
    ps::AdagradConfig config;
    config.schedule.baseLr = 0.1;
    return std::make_shared<ps::AdagradPolicy>(config);
  }
  ps::OwnerOptimizer optimizer;
  optimizer.sgd.momentum = 0.0;
  optimizer.schedule.baseLr = 1.0;
  return std::make_shared<ps::SgdPolicy>(optimizer);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool adagrad = (data[0] & 1) != 0;
  ++data;
  --size;

  const std::vector<node::NodeId> members{0, 1, 2};
  const std::unique_ptr<node::Node> offline = fuzz::offlineNode(0, {0, 1, 2, 3});
  node::Node& node = *offline;

  const ps::KeySpace space = hotSpace();
  const std::shared_ptr<const ps::UpdatePolicy> policy = policyOf(adagrad);
  auto layout = std::make_shared<const ps::ReplicaLayout>(space, space.allKeys(),
                                                          ps::ShardMap(members), policy.get());
  std::vector<float> initial(layout->totalLength());
  for (size_t i = 0; i < initial.size(); ++i)
    initial[i] = 0.25f * static_cast<float>(i % 5);
  ps::ReplicaShellOptions shell_options;
  shell_options.syncs_per_second = 0;  // rounds start only from peers' messages
  ps::ReplicaShell shell(node, layout, initial, policy, shell_options);

  uint64_t frames = 0;
  fuzz::Records records({data, size});
  uint8_t control = 0;
  while (records.control(control)) {
    const node::NodeId from = control & 3;
    if ((control & 0x80) != 0) {
      node::PeerEvent event;
      event.peer = from;
      event.reason = "fuzz";
      const int kind = (control >> 2) & 3;
      event.kind = kind == 1   ? node::PeerEventKind::kUp
                   : kind == 2 ? node::PeerEventKind::kLeft
                               : node::PeerEventKind::kDown;
      shell.onPeerEvent(event);
      continue;
    }
    std::span<const uint8_t> frame;
    if (!records.frameBytes(frame)) break;
    frames += fuzz::deliverFrames(node, from, ps::kReplicaServiceId, ps::kReplicaService, frame);
  }

  const ps::ReplicaShellCounters counters = shell.counters();
  if (counters.round > frames)
    fail("rounds finished without messages for them", counters.round, frames);
  // A message the core refuses counts as received (it was decoded and handed over) and refused.
  if (counters.messages_received > frames || counters.refused_messages > frames) {
    fail("more messages counted than delivered", counters.messages_received, frames);
  }
  bool self_live = false;
  for (node::NodeId m : counters.live_members) {
    if (m == 0) self_live = true;
    if (m > 2) fail("a stranger became a live member", m, 0);
  }
  if (!self_live) fail("this node left its own sync", counters.live_members.size(), 0);
  for (size_t i = 0; i < layout->size(); ++i) {
    if (shell.values(layout->keys()[i]).size() != layout->length(i)) {
      fail("a replicated key lost its value floats", layout->keys()[i], layout->length(i));
    }
  }
  node.shutdown(std::chrono::milliseconds(0));
  return 0;
}
