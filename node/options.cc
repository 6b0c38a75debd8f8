#include "node/options.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <utility>

#include "node/frame.h"

namespace chorus::node {

std::chrono::microseconds linkWorstCase(const NodeOptions& o) {
  const auto retransmissions = o.link_loss > 0 ? o.link_rto * ((1 << kMaxLinkRetransmissions) - 1)
                                               : std::chrono::microseconds(0);
  return o.link_delay + o.link_jitter + retransmissions;
}

std::string runDifference(std::string_view ours, std::string_view theirs, NodeId peer,
                          NodeId self) {
  if (ours.empty() || theirs.empty() || ours == theirs) return {};
  using Settings = std::vector<std::pair<std::string, std::string>>;
  const auto parse = [](std::string_view text) {
    Settings out;
    while (!text.empty()) {
      const size_t end = std::min(text.find('\n'), text.size());
      const std::string_view line = text.substr(0, end);
      text.remove_prefix(std::min(end + 1, text.size()));
      if (line.empty()) continue;
      const size_t eq = line.find('=');
      out.emplace_back(std::string(line.substr(0, eq)),
                       eq == std::string_view::npos ? "" : std::string(line.substr(eq + 1)));
    }
    return out;
  };
  const Settings mine = parse(ours), other = parse(theirs);
  const auto lookup = [](const Settings& settings, const std::string& key) -> std::string {
    for (const auto& [k, v] : settings) {
      if (k == key) return k + "=" + v;
    }
    return key + " unset";
  };
  std::vector<std::string> keys;
  for (const auto& [k, v] : mine)
    keys.push_back(k);
  for (const auto& [k, v] : other)
    keys.push_back(k);
  for (const std::string& key : keys) {
    const std::string a = lookup(mine, key), b = lookup(other, key);
    if (a != b) {
      return fmt::format(
          "node {} runs with {}, node {} with {}: every node of a cluster must run with the same "
          "mode, model, data and training options",
          peer, b, self, a);
    }
  }
  return {};
}

Status validateOptions(const NodeOptions& o) {
  auto bad = [](std::string message) {
    return Status{ErrorCode::kInvalidArgument, std::move(message)};
  };
  if (o.cluster.empty()) return bad("cluster name is empty");
  if (o.cluster.size() > kMaxClusterNameBytes) {
    return bad(fmt::format("cluster name of {} bytes is longer than {} bytes", o.cluster.size(),
                           kMaxClusterNameBytes));
  }
  if (std::find(o.members.begin(), o.members.end(), o.self) == o.members.end()) {
    return bad(fmt::format("own id {} is not in the member list", o.self));
  }
  std::set<NodeId> unique(o.members.begin(), o.members.end());
  if (unique.size() != o.members.size()) return bad("member list holds a duplicate id");
  // A FlatBuffer stays below 2 GiB (its Verifier asserts so): 2047 MiB keeps a frame within it.
  if (o.max_frame_bytes < kMinEnvelopeBytes || o.max_frame_bytes > (2047u << 20)) {
    return bad(fmt::format("max_frame_bytes {} is outside [{}, 2047 MiB]", o.max_frame_bytes,
                           kMinEnvelopeBytes));
  }
  for (const auto& [name, value] : {std::pair{"connect_timeout", o.connect_timeout},
                                    {"handshake_timeout", o.handshake_timeout},
                                    {"cluster_ready_timeout", o.cluster_ready_timeout},
                                    {"heartbeat_interval", o.heartbeat_interval},
                                    {"peer_timeout", o.peer_timeout},
                                    {"dial_backoff_initial", o.dial_backoff_initial},
                                    {"dial_backoff_max", o.dial_backoff_max}}) {
    if (value.count() <= 0) return bad(fmt::format("{} must be positive", name));
  }
  if (o.heartbeat_interval >= o.peer_timeout) {
    return bad("heartbeat_interval must be shorter than peer_timeout");
  }
  if (o.dial_backoff_initial > o.dial_backoff_max) {
    return bad("dial_backoff_initial must not exceed dial_backoff_max");
  }
  if (o.write_slice_packets > kMaxWriteSlicePackets) {
    return bad(fmt::format("write_slice_packets {} is above {}", o.write_slice_packets,
                           kMaxWriteSlicePackets));
  }
  if (o.link_delay.count() < 0 || o.link_jitter.count() < 0) {
    return bad("link_delay and link_jitter must not be negative");
  }
  if (!(o.link_loss >= 0 && o.link_loss <= kMaxLinkLoss)) {
    return bad(fmt::format("link_loss {} is outside 0..{}", o.link_loss, kMaxLinkLoss));
  }
  if (o.link_loss > 0 && (o.link_rto.count() <= 0 || o.link_rto > kMaxLinkRto)) {
    return bad(fmt::format("link_rto must be above 0 and at most {} ms", kMaxLinkRto.count()));
  }
  // A handshake takes up to four one-way trips (Hello, Challenge, Proof, Welcome), and a
  // heartbeat must still land within peer_timeout: a longer link delay would turn healthy
  // peers into failed ones.
  const auto link_worst = linkWorstCase(o);
  const char* link_terms = o.link_loss > 0
                               ? "link_delay + link_jitter + link_loss's retransmissions"
                               : "link_delay + link_jitter";
  if (link_worst * 4 >= o.handshake_timeout) {
    return bad(fmt::format("{} ({} ms) must be below a quarter of handshake_timeout ({} ms)",
                           link_terms, link_worst.count() / 1000.0, o.handshake_timeout.count()));
  }
  if (link_worst + o.heartbeat_interval >= o.peer_timeout) {
    return bad(fmt::format("{} + heartbeat_interval ({} ms) must be below peer_timeout ({} ms)",
                           link_terms, link_worst.count() / 1000.0 + o.heartbeat_interval.count(),
                           o.peer_timeout.count()));
  }
  if (o.inbound_budget_bytes != 0 &&
      o.inbound_budget_bytes < uint64_t{o.max_frame_bytes} + kFramePrefixBytes) {
    return bad(fmt::format("inbound_budget_bytes {} is below one frame of max_frame_bytes {}",
                           o.inbound_budget_bytes, o.max_frame_bytes));
  }
  if (o.max_handshaking_connections == 0) return bad("max_handshaking_connections must be >= 1");
  if (o.low_watermark > o.high_watermark || o.high_watermark == 0) {
    return bad("watermarks need 0 <= low_watermark <= high_watermark and high_watermark > 0");
  }
  if (o.max_queued_bytes < o.high_watermark) {
    return bad(fmt::format("max_queued_bytes {} is below high_watermark {}", o.max_queued_bytes,
                           o.high_watermark));
  }
  return {};
}

}  // namespace chorus::node
