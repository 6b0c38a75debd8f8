// Benchmarks of the peer runtime, each next to its baseline in the same run:
//  - frame encode + verify + decode of a float payload vs memcpy of the same bytes;
//  - the finite check of values from peers vs the same memcpy;
//  - bulk throughput of 4 MiB messages between two nodes vs a blocking TCP socket pair;
//  - pipelined 64-byte message rate between two nodes vs the same socket pair.
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <sodium.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "node/finite.h"
#include "node/frame.h"
#include "node/frame_cipher.h"
#include "node/node.h"
#include "node/secret.h"
#include "ping/ping_service.h"

namespace chorus::node {
namespace {

using namespace std::chrono_literals;

// ---- framing vs memcpy ----

// One Tensor frame holding `values`, encoded as the runtime does (builder pre-sized).
SharedFrame encodeTensorFrame(const std::vector<float>& values) {
  return encodeFrame(
      EnvelopeHeader{1, "bench", 1, 0}, ping::messageType(ping::wire::Body::Tensor),
      ping::messageWriter(ping::wire::Body::Tensor,
                          [&](flatbuffers::FlatBufferBuilder& b) {
                            return ping::wire::CreateTensorDirect(b, 7, &values).Union();
                          }),
      values.size() * sizeof(float));
}

void BM_FrameEncodeVerifyDecode(benchmark::State& state) {
  const size_t floats = static_cast<size_t>(state.range(0)) / sizeof(float);
  std::vector<float> values(floats, 1.5f);
  const FrameLimits limits{1u << 31, 64, 1'000'000};
  for (auto _ : state) {
    auto frame = encodeTensorFrame(values);
    // On the receiving side the socket read lands in the frame's own buffer, so decoding is
    // verify + an in-place view of the floats.
    Status status = verifyFrame(frame->data(), frame->size(), limits);
    const auto* bytes = envelopeOf(frame->data()).message();
    if (status.ok()) {
      status = verifyMessage(ping::kPingService, {bytes->data(), bytes->size()}, limits);
    }
    if (!status.ok()) state.SkipWithError(status.message().c_str());
    const auto* tensor = flatbuffers::GetRoot<ping::wire::Message>(bytes->data())->body_as_Tensor();
    benchmark::DoNotOptimize(tensor->values()->data()[floats / 2]);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

// The same, with the received bytes going through FrameDecoder::consume (one more copy, as
// when bytes arrive in a buffer the decoder does not own).
void BM_FrameEncodeVerifyDecodeViaDecoderCopy(benchmark::State& state) {
  const size_t floats = static_cast<size_t>(state.range(0)) / sizeof(float);
  std::vector<float> values(floats, 1.5f);
  FrameDecoder decoder(FrameLimits{1u << 31, 64, 1'000'000});
  decoder.setServices([](ServiceId id) -> const ServiceSpec* {
    return id == ping::kPingServiceId ? &ping::kPingService : nullptr;
  });
  for (auto _ : state) {
    auto frame = encodeTensorFrame(values);
    Status status = decoder.consume(frame->data(), frame->size(), [&](InboundFrame&& f) {
      benchmark::DoNotOptimize(ping::messageOf(f).body_as_Tensor()->values()->data()[floats / 2]);
      return true;
    });
    if (!status.ok()) state.SkipWithError(status.message().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> source(bytes, 3);
  std::vector<uint8_t> target(bytes);
  for (auto _ : state) {
    std::memcpy(target.data(), source.data(), bytes);
    benchmark::DoNotOptimize(target.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

// The finite check every tensor from a peer goes through (node/finite.h), against memcpy of
// the same bytes: one read-only pass, so it should cost about as much as a copy or less.
void BM_AllFinite(benchmark::State& state) {
  const size_t floats = static_cast<size_t>(state.range(0)) / sizeof(float);
  std::vector<float> values(floats, 1.5f);
  for (auto _ : state) {
    benchmark::DoNotOptimize(values.data());
    const bool finite = allFinite(values);
    benchmark::DoNotOptimize(finite);
    if (!finite) state.SkipWithError("not finite");
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

// Sealing one frame and opening it again (node/frame_cipher.h), no sockets: the crypto's share
// of a sealed frame's cost, per frame size (64 B: the fixed cost of two records' set-up).
void BM_FrameSealOpen(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> payload(bytes, 7);
  const SharedFrame frame =
      encodeFrame(EnvelopeHeader{0, "bench", 1, 0}, ping::messageType(ping::wire::Body::Ping),
                  messageWriter(ping::wire::Body::Ping,
                                [&](flatbuffers::FlatBufferBuilder& b) {
                                  return ping::wire::CreatePingDirect(b, 1, &payload).Union();
                                }),
                  bytes);
  SessionKey key{};
  FrameSealer sealer(key);
  FrameOpener opener(key);
  for (auto _ : state) {
    const SharedFrame sealed = sealer.seal(*frame);
    auto* bytes_in = const_cast<uint8_t*>(sealed->data());
    const size_t envelope = loadLittleEndian32(bytes_in);
    const Status status =
        opener.openEnvelope({bytes_in, kFramePrefixBytes}, {bytes_in + kFramePrefixBytes, envelope},
                            {bytes_in + kFramePrefixBytes + envelope, kSealTagBytes});
    if (!status.ok()) std::abort();
    benchmark::DoNotOptimize(bytes_in);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(frame->size()));
}
BENCHMARK(BM_FrameSealOpen)->Arg(64)->Arg(4 << 10)->Arg(4 << 20);

// The candidate AEADs one-shot over a contiguous 4 MiB buffer, encryption only (why the sealer
// uses OpenSSL's ChaCha20-Poly1305; docs/security.md): 0 libsodium 1.0.18's ChaCha20-Poly1305,
// 1 OpenSSL's, 2 OpenSSL's AES-256-GCM (AES-NI/VAES where the CPU has them).
void BM_AeadCipher(benchmark::State& state) {
  const size_t bytes = 4u << 20;
  std::vector<uint8_t> in(bytes, 3);
  std::vector<uint8_t> out(bytes);
  uint8_t key[32] = {1};
  uint8_t nonce[12] = {2};
  uint8_t tag[16];
  const int which = static_cast<int>(state.range(0));
  if (sodium_init() < 0) std::abort();
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  const EVP_CIPHER* cipher = which == 2 ? EVP_aes_256_gcm() : EVP_chacha20_poly1305();
  state.SetLabel(which == 0   ? "libsodium chacha20-poly1305"
                 : which == 1 ? "openssl chacha20-poly1305"
                              : "openssl aes-256-gcm");
  for (auto _ : state) {
    if (which == 0) {
      unsigned long long tag_bytes = 0;
      crypto_aead_chacha20poly1305_ietf_encrypt_detached(out.data(), tag, &tag_bytes, in.data(),
                                                         bytes, nullptr, 0, nullptr, nonce, key);
    } else {
      int n = 0;
      if (EVP_EncryptInit_ex2(ctx, cipher, key, nonce, nullptr) != 1 ||
          EVP_EncryptUpdate(ctx, out.data(), &n, in.data(), static_cast<int>(bytes)) != 1 ||
          EVP_EncryptFinal_ex(ctx, tag, &n) != 1 ||
          EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag) != 1) {
        std::abort();
      }
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::DoNotOptimize(tag);
  }
  EVP_CIPHER_CTX_free(ctx);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_AeadCipher)->Arg(0)->Arg(1)->Arg(2);

BENCHMARK(BM_FrameEncodeVerifyDecode)
    ->RangeMultiplier(8)
    ->Range(1 << 10, 64 << 20)
    ->Arg(4 << 20);  // a 4 MiB tensor
BENCHMARK(BM_AllFinite)->RangeMultiplier(8)->Range(1 << 10, 64 << 20)->Arg(4 << 20);
BENCHMARK(BM_FrameEncodeVerifyDecodeViaDecoderCopy)->RangeMultiplier(8)->Range(1 << 10, 64 << 20);
BENCHMARK(BM_Memcpy)->RangeMultiplier(8)->Range(1 << 10, 64 << 20)->Arg(4 << 20);

// ---- two nodes on loopback ----

// Node 0 dials node 1; node 1 counts Tensor/Ping frames.
// With `sealed`, both hold a cluster secret, so every frame is sealed (node/frame_cipher.h).
struct NodePair {
  explicit NodePair(bool sealed = false) {
    NodeOptions a;
    a.cluster = "bench";
    a.self = 0;
    a.members = {0, 1};
    a.log_level = spdlog::level::warn;
    a.high_watermark = 256u << 20;
    a.low_watermark = 64u << 20;
    if (sealed) {
      const std::string secret = "bench secret";
      a.cluster_key = clusterKeyFromSecret(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(secret.data()), secret.size()));
    }
    NodeOptions b = a;
    b.self = 1;
    sender = std::make_unique<Node>(a);
    receiver = std::make_unique<Node>(b);
    auto count = [this](NodeId, const InboundFrame&) {
      std::lock_guard lock(mutex);
      ++received;
      changed.notify_all();
    };
    receiver->setHandler(ping::messageType(ping::wire::Body::Tensor), count);
    receiver->setHandler(ping::messageType(ping::wire::Body::Ping), count);
    if (!sender->listen().ok() || !receiver->listen().ok()) std::abort();
    if (!sender->connect({{1, "127.0.0.1", receiver->port()}}).ok()) std::abort();
    if (!receiver->connect({{0, "", 0}}).ok()) std::abort();
    if (!sender->waitClusterReady(10s).ok()) std::abort();
  }
  ~NodePair() {
    sender->shutdown(1s);
    receiver->shutdown(1s);
  }
  void waitReceived(uint64_t target) {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return received >= target; });
  }
  std::unique_ptr<Node> sender;
  std::unique_ptr<Node> receiver;
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t received = 0;
};

// CPU time of the whole process (every thread: both nodes' loops, the kernel's copies in their
// system calls), for cost per byte or per message that outside load does not inflate the way it
// inflates wall time on a shared machine.
double processCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

constexpr size_t kBulkBytes = 4u << 20;
constexpr int kBulkPerIteration = 16;
constexpr int kSmallPerIteration = 20000;
constexpr size_t kSmallPayload = 64;

void nodeBulk(benchmark::State& state, bool sealed) {
  NodePair pair(sealed);
  std::vector<float> values(kBulkBytes / sizeof(float), 2.0f);
  auto frame = ping::encodeMessage(
      *pair.sender, ping::wire::Body::Tensor,
      [&](flatbuffers::FlatBufferBuilder& b) {
        return ping::wire::CreateTensorDirect(b, 1, &values).Union();
      },
      kBulkBytes);
  uint64_t target = 0;
  const double cpu_before = processCpuSeconds();
  for (auto _ : state) {
    for (int i = 0; i < kBulkPerIteration; ++i)
      pair.sender->send(1, frame);
    target += kBulkPerIteration;
    pair.waitReceived(target);
  }
  const double bytes = static_cast<double>(state.iterations()) * kBulkPerIteration *
                       static_cast<double>(frame->size());
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  // Both nodes' CPU per byte moved: what bounds throughput when the machine has no core to
  // spare for either node.
  state.counters["cpu_ns_per_B"] = (processCpuSeconds() - cpu_before) * 1e9 / bytes;
}

void BM_NodeBulk4MiB(benchmark::State& state) {
  nodeBulk(state, false);
}
// The same frames sealed: what encryption and authentication cost against the plain pair.
void BM_NodeBulk4MiBSealed(benchmark::State& state) {
  nodeBulk(state, true);
}

void nodeSmall(benchmark::State& state, bool sealed) {
  NodePair pair(sealed);
  std::vector<uint8_t> payload(kSmallPayload, 9);
  uint64_t target = 0;
  uint64_t nonce = 0;
  const double cpu_before = processCpuSeconds();
  for (auto _ : state) {
    for (int i = 0; i < kSmallPerIteration; ++i) {
      // Encoded per message, as a real sender would.
      const uint64_t n = ++nonce;
      pair.sender->send(
          1, ping::encodeMessage(*pair.sender, ping::wire::Body::Ping,
                                 [&](flatbuffers::FlatBufferBuilder& b) {
                                   return ping::wire::CreatePingDirect(b, n, &payload).Union();
                                 }));
    }
    target += kSmallPerIteration;
    pair.waitReceived(target);
  }
  const double messages = static_cast<double>(state.iterations()) * kSmallPerIteration;
  state.SetItemsProcessed(static_cast<int64_t>(messages));
  // Both nodes' CPU per message (encode, send, receive, verify, dispatch; sealed: both records).
  state.counters["cpu_us_per_msg"] = (processCpuSeconds() - cpu_before) * 1e6 / messages;
}

void BM_NodeSmallMessages64B(benchmark::State& state) {
  nodeSmall(state, false);
}
void BM_NodeSmallMessages64BSealed(benchmark::State& state) {
  nodeSmall(state, true);
}

// ---- the baseline: a plain blocking TCP socket pair ----

struct SocketPair {
  SocketPair() {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        ::listen(listener, 1) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      std::abort();
    }
    writer = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(writer, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      std::abort();
    }
    reader = ::accept(listener, nullptr, nullptr);
    ::close(listener);
    int one = 1;
    ::setsockopt(writer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~SocketPair() {
    ::close(writer);
    ::close(reader);
  }
  static void writeAll(int fd, const uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
      if (w <= 0) std::abort();
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  static void readAll(int fd, uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t r = ::recv(fd, p, n, 0);
      if (r <= 0) std::abort();
      p += r;
      n -= static_cast<size_t>(r);
    }
  }
  int writer = -1;
  int reader = -1;
};

// Messages of `message_bytes` (length prefix included) written one send() each by a writer
// thread; the reader reads each message's length then its body, like a framed receiver.
void rawSocketMessages(benchmark::State& state, size_t message_bytes, int per_iteration) {
  SocketPair pair;
  std::vector<uint8_t> message(message_bytes, 5);
  const uint32_t body = static_cast<uint32_t>(message_bytes - 4);
  std::memcpy(message.data(), &body, 4);
  std::vector<uint8_t> inbox(message_bytes);
  std::atomic<int64_t> batches{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    int64_t done = 0;
    for (;;) {
      while (batches.load() == done && !stop.load())
        std::this_thread::yield();
      if (stop.load() && batches.load() == done) return;
      for (int i = 0; i < per_iteration; ++i) {
        SocketPair::writeAll(pair.writer, message.data(), message.size());
      }
      ++done;
    }
  });
  // Small messages are read in bulk (a framed reader reads whatever is there, then splits).
  std::vector<uint8_t> chunk(256 * 1024);
  for (auto _ : state) {
    batches.fetch_add(1);
    size_t left = message_bytes * static_cast<size_t>(per_iteration);
    if (message_bytes >= chunk.size()) {
      for (int i = 0; i < per_iteration; ++i) {
        uint32_t length = 0;
        SocketPair::readAll(pair.reader, reinterpret_cast<uint8_t*>(&length), 4);
        SocketPair::readAll(pair.reader, inbox.data(), length);
      }
    } else {
      while (left > 0) {
        const ssize_t r = ::recv(pair.reader, chunk.data(), std::min(left, chunk.size()), 0);
        if (r <= 0) std::abort();
        left -= static_cast<size_t>(r);
      }
    }
  }
  stop = true;
  writer.join();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * per_iteration *
                          static_cast<int64_t>(message_bytes));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * per_iteration);
}

void BM_RawSocketBulk4MiB(benchmark::State& state) {
  // Exactly the bytes of the node's 4 MiB Tensor frame.
  std::vector<float> values(kBulkBytes / sizeof(float), 2.0f);
  const auto frame = encodeFrame(
      EnvelopeHeader{0, "bench", 1, 0}, ping::messageType(ping::wire::Body::Tensor),
      ping::messageWriter(ping::wire::Body::Tensor, [&](flatbuffers::FlatBufferBuilder& b) {
        return ping::wire::CreateTensorDirect(b, 1, &values).Union();
      }));
  rawSocketMessages(state, frame->size(), kBulkPerIteration);
}

void BM_RawSocketSmallMessages64B(benchmark::State& state) {
  // Exactly the bytes of the node's Ping frame with a 64-byte payload.
  std::vector<uint8_t> payload(kSmallPayload, 9);
  const auto frame = encodeFrame(
      EnvelopeHeader{0, "bench", 1, 0}, ping::messageType(ping::wire::Body::Ping),
      ping::messageWriter(ping::wire::Body::Ping, [&](flatbuffers::FlatBufferBuilder& b) {
        return ping::wire::CreatePingDirect(b, 1, &payload).Union();
      }));
  rawSocketMessages(state, frame->size(), kSmallPerIteration);
}

BENCHMARK(BM_NodeBulk4MiB)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RawSocketBulk4MiB)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_NodeBulk4MiBSealed)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_NodeSmallMessages64B)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_NodeSmallMessages64BSealed)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RawSocketSmallMessages64B)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace chorus::node

BENCHMARK_MAIN();
