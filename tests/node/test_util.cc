#include "tests/node/test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace chorus::node::testing {

NodeOptions fastOptions(const std::string& cluster, NodeId self, std::vector<NodeId> members) {
  NodeOptions o;
  o.cluster = cluster;
  o.self = self;
  o.members = std::move(members);
  o.connect_timeout = 2s;
  o.handshake_timeout = 2s;
  o.heartbeat_interval = 50ms;
  o.peer_timeout = 1s;
  o.cluster_ready_timeout = kSoon;
  o.dial_backoff_initial = 10ms;
  o.dial_backoff_max = 200ms;
  o.log_level = spdlog::level::debug;
  return o;
}

void EventRecorder::attach(Node& node) {
  node.setEventHandler([this](const PeerEvent& event) {
    std::lock_guard lock(mutex_);
    events_.push_back(event);
    changed_.notify_all();
  });
}

size_t EventRecorder::count(PeerEventKind kind, NodeId peer) const {
  std::lock_guard lock(mutex_);
  size_t n = 0;
  for (const auto& e : events_)
    n += (e.kind == kind && e.peer == peer) ? 1 : 0;
  return n;
}

bool EventRecorder::waitFor(PeerEventKind kind, NodeId peer, size_t count,
                            std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] {
    size_t n = 0;
    for (const auto& e : events_)
      n += (e.kind == kind && e.peer == peer) ? 1 : 0;
    return n >= count;
  });
}

std::string EventRecorder::lastReason(PeerEventKind kind, NodeId peer) const {
  std::lock_guard lock(mutex_);
  for (auto it = events_.rbegin(); it != events_.rend(); ++it) {
    if (it->kind == kind && it->peer == peer) return it->reason;
  }
  return "";
}

std::vector<PeerEvent> EventRecorder::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

void LogCapture::sink_it_(const spdlog::details::log_msg& message) {
  spdlog::memory_buf_t formatted;
  formatter_->format(message, formatted);
  lines_.emplace_back(formatted.data(), formatted.size());
  changed_.notify_all();
}

bool LogCapture::waitForLine(const std::vector<std::string>& parts,
                             std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] {
    for (const auto& line : lines_) {
      bool all = true;
      for (const auto& part : parts)
        all = all && line.find(part) != std::string::npos;
      if (all) return true;
    }
    return false;
  });
}

std::string LogCapture::all() {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& line : lines_)
    out += line;
  return out;
}

RawPeer::RawPeer(uint16_t port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd_);
    fd_ = -1;
    return;
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

RawPeer::~RawPeer() {
  if (fd_ >= 0) ::close(fd_);
}

void RawPeer::sendBytes(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd_, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the node closed on us; the test checks that separately
    p += n;
    size -= static_cast<size_t>(n);
  }
}

namespace {

// Waits until `fd` is readable (data, end of stream or an error to read) or `deadline` passes.
bool waitReadable(int fd, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    return ready > 0;
  }
}

}  // namespace

void RawPeer::shutdownWrite() {
  ::shutdown(fd_, SHUT_WR);
}

bool RawPeer::readExact(uint8_t* out, size_t size, std::chrono::steady_clock::time_point deadline) {
  while (size > 0) {
    if (!waitReadable(fd_, deadline)) return false;
    const ssize_t n = ::recv(fd_, out, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    out += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

std::optional<std::vector<uint8_t>> RawPeer::readFrame(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  uint8_t prefix[4];
  if (!readExact(prefix, 4, deadline)) return std::nullopt;
  std::vector<uint8_t> frame(4 + static_cast<size_t>(loadLittleEndian32(prefix)));
  std::memcpy(frame.data(), prefix, 4);
  if (!readExact(frame.data() + 4, frame.size() - 4, deadline)) return std::nullopt;
  return frame;
}

std::optional<std::vector<uint8_t>> RawPeer::readSealedFrame(FrameOpener& opener,
                                                             std::vector<uint8_t>* wire,
                                                             std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  uint8_t prefix[4];
  if (!readExact(prefix, 4, deadline)) return std::nullopt;
  const size_t length = loadLittleEndian32(prefix);
  std::vector<uint8_t> frame(4 + length + kSealTagBytes);
  std::memcpy(frame.data(), prefix, 4);
  if (!readExact(frame.data() + 4, frame.size() - 4, deadline)) return std::nullopt;
  if (wire != nullptr) *wire = frame;
  const std::span<uint8_t> envelope(frame.data() + 4, length);
  if (!opener.openEnvelope({prefix, 4}, envelope, {frame.data() + 4 + length, kSealTagBytes})
           .ok()) {
    return std::nullopt;
  }
  frame.resize(4 + length);
  return frame;
}

bool RawPeer::waitClosed(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  uint8_t buffer[4096];
  for (;;) {
    if (!waitReadable(fd_, deadline)) return false;
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;  // EOF or reset
  }
}

bool RawPeer::handshake(const std::string& cluster, NodeId id, uint32_t version) {
  sendFrame(makeHello(cluster, id, version));
  auto reply = readFrame();
  if (!reply) return false;
  return verifyFrame(reply->data(), reply->size(), FrameLimits{}).ok() &&
         envelopeOf(reply->data()).body_type() == wire::Body::Welcome;
}

SharedFrame makeFrame(NodeId sender, const std::string& cluster, wire::Body type,
                      const BodyWriter& write_body, uint64_t sequence) {
  return encodeFrame(EnvelopeHeader{sender, cluster, sequence, 0}, type, write_body);
}

std::vector<uint8_t> wireBytes(const SharedFrame& frame) {
  std::vector<uint8_t> bytes;
  for (const auto& piece : frame->pieces())
    bytes.insert(bytes.end(), piece.begin(), piece.end());
  return bytes;
}

SharedFrame makeHello(const std::string& cluster, NodeId id, uint32_t version,
                      const std::vector<uint8_t>* nonce) {
  return makeFrame(id, cluster, wire::Body::Hello, [&](flatbuffers::FlatBufferBuilder& b) {
    return wire::CreateHelloDirect(b, cluster.c_str(), id, version, nonce).Union();
  });
}

SharedFrame makeFrame(NodeId sender, const std::string& cluster, ping::wire::Body type,
                      const BodyWriter& write_body, uint64_t sequence, Attachment attachment) {
  return encodeFrame(EnvelopeHeader{sender, cluster, sequence, 0}, ping::messageType(type),
                     ping::messageWriter(type, write_body), 0, std::move(attachment));
}
const ServiceSpec* pingServiceOnly(ServiceId id) {
  return id == ping::kPingServiceId ? &ping::kPingService : nullptr;
}

const ping::wire::Message* pingMessageOf(const std::vector<uint8_t>& frame) {
  return serviceMessageOf<ping::wire::Message>(frame, ping::kPingService);
}

std::vector<uint8_t> pingMessageBytes(uint64_t nonce) {
  flatbuffers::FlatBufferBuilder b;
  const auto ping = ping::wire::CreatePing(b, nonce).Union();
  b.Finish(ping::wire::CreateMessage(b, ping::wire::Body::Ping, ping));
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

std::vector<uint8_t> handMadeServiceFrame(NodeId sender, const std::string& cluster,
                                          ServiceId service, const std::vector<uint8_t>& message,
                                          size_t offset) {
  // The message's place depends on what is built before it: a filler string of 0 to 7 bytes
  // shifts it until it starts where asked.
  for (size_t filler = 0; filler < 8; ++filler) {
    flatbuffers::FlatBufferBuilder b;
    b.CreateString(std::string(filler, 'x'));
    const auto bytes = b.CreateVector(message);
    const auto header = wire::CreateHeaderDirect(b, sender, cluster.c_str(), 1, 0);
    b.FinishSizePrefixed(wire::CreateEnvelope(b, header, wire::Body::NONE, 0, service, bytes),
                         wire::EnvelopeIdentifier());
    std::vector<uint8_t> frame(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
    const auto* placed = envelopeOf(frame.data()).message();
    if (static_cast<size_t>(placed->data() - frame.data()) % kMessageAlignment == offset) {
      return frame;
    }
  }
  return {};
}

SharedFrame makePing(NodeId sender, const std::string& cluster, uint64_t nonce,
                     size_t payload_bytes) {
  std::vector<uint8_t> payload(payload_bytes, 0xab);
  return makeFrame(sender, cluster, ping::wire::Body::Ping, [&](flatbuffers::FlatBufferBuilder& b) {
    return ping::wire::CreatePingDirect(b, nonce, &payload).Union();
  });
}

std::function<void()> CallbackLedger::expect(const std::string& name) {
  {
    std::lock_guard lock(mutex_);
    fired_[name] = 0;
  }
  return [this, name] {
    std::lock_guard lock(mutex_);
    fired_[name] += 1;
    changed_.notify_all();
  };
}

bool CallbackLedger::waitAll(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] {
    for (const auto& [name, n] : fired_) {
      if (n == 0) return false;
    }
    return true;
  });
}

std::string CallbackLedger::problems() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& [name, n] : fired_) {
    if (n != 1) out += name + " fired " + std::to_string(n) + " times; ";
  }
  return out;
}

}  // namespace chorus::node::testing
