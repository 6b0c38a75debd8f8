// Helpers shared by the node tests: event recording, log capture, a raw blocking socket peer,
// and a ledger that fails a test when a callback fires zero or several times.
#pragma once

#include <spdlog/sinks/base_sink.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "node/frame.h"
#include "node/frame_cipher.h"
#include "node/node.h"
#include "ping/ping_service.h"

namespace chorus::node::testing {

using namespace std::chrono_literals;

// Generous upper bound for anything that should happen "soon" on loopback.
inline constexpr std::chrono::milliseconds kSoon = 10s;

// Options with short timings so failure paths are reached quickly.
NodeOptions fastOptions(const std::string& cluster, NodeId self, std::vector<NodeId> members);

// Records a node's events (set as its event handler) and lets a test wait for one.
class EventRecorder {
 public:
  // Installs this recorder as `node`'s event handler.
  void attach(Node& node);
  // Waits until `count` events of `kind` for `peer` were seen.
  bool waitFor(PeerEventKind kind, NodeId peer, size_t count = 1,
               std::chrono::milliseconds timeout = kSoon);
  size_t count(PeerEventKind kind, NodeId peer) const;
  // Reason of the last event of that kind for that peer ("" when none).
  std::string lastReason(PeerEventKind kind, NodeId peer) const;
  std::vector<PeerEvent> events() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<PeerEvent> events_;
};

// A spdlog sink keeping every formatted line, for asserting what a node logged.
class LogCapture : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // True once a line containing every one of `parts` was logged (waits up to `timeout`).
  bool waitForLine(const std::vector<std::string>& parts,
                   std::chrono::milliseconds timeout = kSoon);
  std::string all();

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override;
  void flush_() override {}

 private:
  std::condition_variable_any changed_;
  std::vector<std::string> lines_;
};

// A blocking TCP client on 127.0.0.1 that speaks raw bytes, for malformed-input tests.
class RawPeer {
 public:
  explicit RawPeer(uint16_t port);
  ~RawPeer();
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;

  bool connected() const { return fd_ >= 0; }
  void sendBytes(const void* data, size_t size);
  void sendFrame(const SharedFrame& frame) {
    for (const auto& piece : frame->pieces())
      sendBytes(piece.data(), piece.size());
  }
  // Stops sending (FIN), keeps reading.
  void shutdownWrite();
  // The next whole frame (prefix included), or nullopt on EOF/timeout. Read it with
  // envelopeOf() after verifyFrame().
  std::optional<std::vector<uint8_t>> readFrame(std::chrono::milliseconds timeout = kSoon);
  // The next sealed frame (node/frame_cipher.h) without an attachment, opened with `opener`:
  // prefix and Envelope in clear, or nullopt on EOF, timeout or a record that does not open.
  // `wire` (if given) receives the bytes as they travelled.
  std::optional<std::vector<uint8_t>> readSealedFrame(FrameOpener& opener,
                                                      std::vector<uint8_t>* wire = nullptr,
                                                      std::chrono::milliseconds timeout = kSoon);
  // True when the other side closed within `timeout` (frames before EOF are skipped).
  bool waitClosed(std::chrono::milliseconds timeout = kSoon);
  // Sends Hello as `id` and expects Welcome; false otherwise.
  bool handshake(const std::string& cluster, NodeId id, uint32_t version = kProtocolVersion);

 private:
  // Reads exactly `size` bytes; false on EOF, error or timeout.
  bool readExact(uint8_t* out, size_t size, std::chrono::steady_clock::time_point deadline);
  int fd_ = -1;
};

// Every byte of `frame` as it goes on the wire (attachment included).
std::vector<uint8_t> wireBytes(const SharedFrame& frame);

// A frame with an explicit header, as a peer with id `sender` would write it.
SharedFrame makeFrame(NodeId sender, const std::string& cluster, wire::Body type,
                      const BodyWriter& write_body, uint64_t sequence = 1);
// The same with a message of the ping service (ping/ping.fbs), the node tests' traffic.
SharedFrame makeFrame(NodeId sender, const std::string& cluster, ping::wire::Body type,
                      const BodyWriter& write_body, uint64_t sequence = 1,
                      Attachment attachment = {});
// A Hello as node `id` writes it; with a `nonce`, one offering to prove the cluster's secret.
SharedFrame makeHello(const std::string& cluster, NodeId id, uint32_t version = kProtocolVersion,
                      const std::vector<uint8_t>* nonce = nullptr);
SharedFrame makePing(NodeId sender, const std::string& cluster, uint64_t nonce,
                     size_t payload_bytes = 16);

// A FrameDecoder::ServiceLookup that knows the ping service only (as a node running it).
const ServiceSpec* pingServiceOnly(ServiceId id);
// The message of `service` (root table `Root`) in a whole frame as RawPeer::readFrame() returns
// it, verified (frame and message), or null when the frame carries anything else.
template <class Root>
const Root* serviceMessageOf(const std::vector<uint8_t>& frame, const ServiceSpec& service) {
  if (!verifyFrame(frame.data(), frame.size(), FrameLimits{}).ok()) return nullptr;
  const wire::Envelope& envelope = envelopeOf(frame.data());
  if (envelope.service() != service.id) return nullptr;
  const std::span<const uint8_t> message(envelope.message()->data(), envelope.message()->size());
  if (!verifyMessage(service, message, FrameLimits{}).ok()) return nullptr;
  return flatbuffers::GetRoot<Root>(message.data());
}
// The same for the ping service.
const ping::wire::Message* pingMessageOf(const std::vector<uint8_t>& frame);
// A ping-service message (Ping with `nonce`) as one finished FlatBuffer of its own.
std::vector<uint8_t> pingMessageBytes(uint64_t nonce);
// A whole frame (prefix included) built by hand, as a peer of another build or an attacker
// might: `service` with `message` copied into Envelope.message, its bytes starting at 8 bytes
// past a multiple of 8 within the frame plus `offset` (0: aligned; 4: misaligned).
std::vector<uint8_t> handMadeServiceFrame(NodeId sender, const std::string& cluster,
                                          ServiceId service, const std::vector<uint8_t>& message,
                                          size_t offset = 0);

// Tracks callbacks by name; allFiredOnce() fails unless each fired exactly once.
class CallbackLedger {
 public:
  // Registers an expected callback and returns a function that records it firing.
  std::function<void()> expect(const std::string& name);
  // Waits until every expected callback fired at least once.
  bool waitAll(std::chrono::milliseconds timeout = kSoon);
  // Empty when every callback fired exactly once; otherwise a description of the offenders.
  std::string problems() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, int> fired_;
};

}  // namespace chorus::node::testing
