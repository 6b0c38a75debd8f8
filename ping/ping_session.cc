#include "ping/ping_session.h"

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace chorus::ping {

void validatePingFitsFrames(const PingOptions& options, size_t max_frame_bytes) {
  constexpr size_t kPingEnvelopeBytes = 4096;  // header, nonce and vector prefix, with room
  if (options.payload_bytes + kPingEnvelopeBytes > max_frame_bytes) {
    throw std::invalid_argument(
        fmt::format("--payload-bytes {} plus a frame's envelope is more "
                    "than --max-frame-mib {} accepts: lower "
                    "--payload-bytes or raise --max-frame-mib",
                    options.payload_bytes, max_frame_bytes >> 20));
  }
}

PingSession::PingSession(node::Node& node, std::vector<NodeId> peers, PingOptions options)
    : node_(node), peers_(std::move(peers)), options_(options), exchange_(node, peers_, options) {}

PingOutcome PingSession::run(std::FILE* out) {
  const NodeId self = node_.id();
  const PingReport report = exchange_.run();
  for (const auto& peer : report.peers) {
    const node::PeerStats stats = node_.stats(peer.peer);
    fmt::print(
        out,
        "  peer {}: {} of {} pongs verified, {} pings answered, rtt min/mean/max "
        "{:.0f}/{:.0f}/{:.0f} us; {} frames / {} bytes out, {} frames / {} bytes in{}\n",
        peer.peer, peer.pongs_verified, options_.pings_per_peer, peer.pings_answered,
        peer.rtt_min_us, peer.rtt_mean_us, peer.rtt_max_us, stats.frames_out, stats.bytes_out,
        stats.frames_in, stats.bytes_in,
        stats.frames_lost > 0
            ? fmt::format("; {} frames out lost and sent again (--link-loss)", stats.frames_lost)
            : "");
  }
  if (!report.status.ok()) {
    return {kPingFailedExit, fmt::format("node {}: {}", self, report.status.message())};
  }
  fmt::print(out, "node {}: ping exchange verified with {} peers in {} ms; leaving\n", self,
             peers_.size(), report.elapsed.count());
  return {};
}

void PingSession::stop() {
  exchange_.cancel({node::ErrorCode::kShutdown, "interrupted"});
}

}  // namespace chorus::ping
