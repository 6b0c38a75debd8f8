// The options of one node and their validation: who the node is, its limits, its timings and
// the link faults it injects. Read once at start (Node::listen validates them).
#pragma once

#include <spdlog/common.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "node/link_limits.h"
#include "node/protocol.h"
#include "node/secret.h"
#include "node/status.h"

namespace chorus::node {

// The largest NodeOptions::write_slice_packets: 1024 packets are 64 MiB, more than any batch.
inline constexpr size_t kMaxWriteSlicePackets = 1024;

// Everything a node needs to know; tests shrink the timings to reach edge cases quickly.
struct NodeOptions {
  std::string cluster;  // cluster name; peers with another name are refused
  NodeId self = 0;      // this node's id
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;     // 0 picks a free port (read it back with port())
  std::vector<NodeId> members;  // every id of the cluster (self included)
  // Largest inbound frame from an established peer (kHandshakeFrameBytes before that).
  uint32_t max_frame_bytes = 256u << 20;
  // Node-wide bound on inbound bytes in flight (frames being read, docs/wire-format.md); a frame
  // that would exceed it closes its connection. 0: twice max_frame_bytes.
  uint64_t inbound_budget_bytes = 0;
  // Accepted connections still in their handshake; more are closed at once.
  size_t max_handshaking_connections = 64;
  uint32_t max_verifier_depth = 64;
  uint32_t max_verifier_tables = 1'000'000;
  std::chrono::milliseconds connect_timeout{5000};         // one TCP connect attempt
  std::chrono::milliseconds handshake_timeout{5000};       // Hello..Welcome on a new connection
  std::chrono::milliseconds heartbeat_interval{500};       // heartbeat when nothing else was sent
  std::chrono::milliseconds peer_timeout{5000};            // silence after which a peer is down
  std::chrono::milliseconds cluster_ready_timeout{30000};  // default for waitClusterReady()
  std::chrono::milliseconds dial_backoff_initial{50};
  std::chrono::milliseconds dial_backoff_max{2000};
  size_t high_watermark = 64u << 20;  // queued bytes at which a peer becomes slow
  size_t low_watermark = 16u << 20;   // queued bytes at which a slow peer is drained
  // The most bytes queued to one peer (send-side backpressure, docs/errors.md): a frame that
  // would take a peer's queue above it is handled by its SendOptions::when_full policy (refused
  // with kOverloaded, or older frames of its kind dropped). A frame is always queued to an empty
  // queue, however large. Must be at least high_watermark.
  size_t max_queued_bytes = 256u << 20;
  // Each socket write carries at most this many TCP packets (0: a batch goes in one write).
  // Two keeps Linux's BBR from pacing large writes on loopback (uv::writeSliceFor).
  size_t write_slice_packets = 2;
  // Fault injection (docs/stragglers.md): every frame this node sends waits link_delay plus a
  // uniform draw from [0, link_jitter) before it reaches the socket, in order. Zero: none.
  std::chrono::microseconds link_delay{0};
  std::chrono::microseconds link_jitter{0};
  // And with probability link_loss a frame counts as lost: what a lost segment costs TCP, one
  // retransmission time-out (link_rto) more, doubled for each further loss (at most
  // kMaxLinkRetransmissions), and since TCP delivers in order, the frames behind it wait too.
  double link_loss = 0;
  std::chrono::microseconds link_rto{kDefaultLinkRto};  // Linux's smallest retransmission time-out
  uint64_t link_seed = 1;  // seeds the jitter and loss draws, with the node id
  // The cluster's shared secret (loadClusterKey): peers must prove they know it at the
  // handshake, and this node proves it to them. Empty: no proof asked or given.
  std::optional<ClusterKey> cluster_key;
  // What every member must run alike, as "key=value" lines (mode, model, data, optimizer: see
  // chorus node). A peer whose lines differ is refused, naming the first difference and both
  // values, and the dialer stops at once. Empty: not compared.
  std::string run_fingerprint;
  // While waitClusterReady() waits, a line naming the missing peers (and why) this often.
  std::chrono::milliseconds ready_progress_interval{5000};
  spdlog::level::level_enum log_level = spdlog::level::info;
  std::vector<spdlog::sink_ptr> log_sinks;  // empty: stderr
  // Colour codes on the stderr sink when it is a terminal; the command line turns them off
  // under a launcher (mpirun, srun mix the ranks' lines into one stream) and with NO_COLOR.
  bool log_color = true;
};

// Checks the options; an error names the offending field.
Status validateOptions(const NodeOptions& options);
// The first setting in which two run fingerprints (NodeOptions::run_fingerprint) differ, as a
// refusal naming it and both values ("node 2 runs with model=softmax, node 0 with model=mlp:
// ..."); empty when they agree or when either is empty (not compared).
std::string runDifference(std::string_view ours, std::string_view theirs, NodeId peer, NodeId self);
// The longest the link faults can hold one frame back: link_delay, link_jitter and, with
// link_loss, every retransmission time-out a frame may wait for.
std::chrono::microseconds linkWorstCase(const NodeOptions& options);

}  // namespace chorus::node
