#include "node/uv_handles.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cassert>

namespace chorus::node::uv {
namespace {

// One writeFromLoop call: its slices are separate libuv requests, and the last to complete
// reports for all and frees the batch.
struct WriteBatch {
  std::vector<SharedFrame> frames;
  Tcp::DoneFn done;
  std::unique_ptr<uv_write_t[]> requests;
  size_t outstanding = 0;
  int first_error = 0;
};

struct ConnectRequest {
  uv_connect_t request{};
  Tcp::DoneFn done;
};

struct ShutdownRequest {
  uv_shutdown_t request{};
  Tcp::DoneFn done;
};

Status requestStatus(int status, std::string_view what) {
  if (status == 0) return {};
  if (status == UV_ECANCELED)
    return {ErrorCode::kClosed, fmt::format("{}: connection closed", what)};
  return uvError(status, what);
}

}  // namespace

Status uvError(int rc, std::string_view what, ErrorCode code) {
  return {code, fmt::format("{}: {} ({})", what, uv_err_name(rc), uv_strerror(rc))};
}

std::string formatAddress(const sockaddr* address) {
  char host[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    uv_ip4_name(in, host, sizeof(host));
    return fmt::format("{}:{}", host, ntohs(in->sin_port));
  }
  if (address->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    uv_ip6_name(in6, host, sizeof(host));
    return fmt::format("[{}]:{}", host, ntohs(in6->sin6_port));
  }
  return "?";
}

HandlePtr<Timer> Timer::create(uv_loop_t* loop) {
  HandlePtr<Timer> timer(new Timer());
  const int rc = uv_timer_init(loop, timer->get());
  assert(rc == 0);  // uv_timer_init cannot fail on a live loop
  (void)rc;
  timer->bindData();
  return timer;
}

void Timer::startFromLoop(uint64_t timeout_ms, uint64_t repeat_ms, std::function<void()> fire) {
  fire_ = std::move(fire);
  uv_timer_start(&handle_, &Timer::onTimer, timeout_ms, repeat_ms);
}

void Timer::stopFromLoop() {
  uv_timer_stop(&handle_);
}

void Timer::onTimer(uv_timer_t* timer) {
  auto* self = static_cast<Timer*>(timer->data);
  if (self->fire_) {
    // Copy: the callback may re-arm this timer with a new function.
    auto fire = self->fire_;
    fire();
  }
}

HandlePtr<Async> Async::create(uv_loop_t* loop, std::function<void()> wake) {
  HandlePtr<Async> async(new Async());
  async->wake_ = std::move(wake);
  const int rc = uv_async_init(loop, async->get(), &Async::onWake);
  assert(rc == 0);
  (void)rc;
  async->bindData();
  return async;
}

void Async::onWake(uv_async_t* async) {
  auto* self = static_cast<Async*>(async->data);
  if (self->wake_) self->wake_();
}

HandlePtr<Tcp> Tcp::create(uv_loop_t* loop) {
  HandlePtr<Tcp> tcp(new Tcp());
  const int rc = uv_tcp_init(loop, tcp->get());
  assert(rc == 0);
  (void)rc;
  tcp->bindData();
  return tcp;
}

Status Tcp::bindFromLoop(const sockaddr* address) {
  const int rc = uv_tcp_bind(&handle_, address, 0);
  if (rc != 0) return uvError(rc, fmt::format("bind {}", formatAddress(address)));
  return {};
}

Status Tcp::listenFromLoop(int backlog, std::function<void(const Status&)> on_connection) {
  on_connection_ = std::move(on_connection);
  const int rc = uv_listen(
      reinterpret_cast<uv_stream_t*>(&handle_), backlog, [](uv_stream_t* server, int status) {
        auto* self = static_cast<Tcp*>(server->data);
        if (self->on_connection_) {
          self->on_connection_(status == 0 ? Status{} : uvError(status, "accept"));
        }
      });
  if (rc != 0) return uvError(rc, "listen");
  return {};
}

Status Tcp::acceptFromLoop(Tcp& client) {
  const int rc = uv_accept(reinterpret_cast<uv_stream_t*>(&handle_),
                           reinterpret_cast<uv_stream_t*>(client.get()));
  if (rc != 0) return uvError(rc, "accept");
  return {};
}

Status Tcp::connectFromLoop(const sockaddr* address, DoneFn done) {
  auto request = std::make_unique<ConnectRequest>();
  request->done = std::move(done);
  request->request.data = request.get();
  const int rc = uv_tcp_connect(&request->request, &handle_, address, [](uv_connect_t* r, int st) {
    std::unique_ptr<ConnectRequest> owned(static_cast<ConnectRequest*>(r->data));
    owned->done(requestStatus(st, "connect"));
  });
  if (rc != 0) return uvError(rc, fmt::format("connect to {}", formatAddress(address)));
  (void)request.release();  // owned by libuv until the callback
  return {};
}

Status Tcp::readStartFromLoop(AllocFn alloc, ReadFn read) {
  alloc_ = std::move(alloc);
  read_ = std::move(read);
  const int rc = uv_read_start(
      reinterpret_cast<uv_stream_t*>(&handle_),
      [](uv_handle_t* handle, size_t /*suggested*/, uv_buf_t* buf) {
        auto* self = static_cast<Tcp*>(handle->data);
        const std::span<uint8_t> memory = self->alloc_();
        buf->base = reinterpret_cast<char*>(memory.data());
        buf->len = memory.size();
      },
      [](uv_stream_t* stream, ssize_t nread, const uv_buf_t* /*buf*/) {
        auto* self = static_cast<Tcp*>(stream->data);
        if (nread == 0) return;  // EAGAIN: nothing read, the buffer is simply not used
        self->read_(nread);
      });
  if (rc != 0) return uvError(rc, "read start");
  return {};
}

void Tcp::readStopFromLoop() {
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&handle_));
}

size_t Tcp::sliceForBatchFromLoop(size_t total) {
  if (slice_packets_ == 0) return write_slice_;
  // A batch smaller than the smallest possible slice is never cut: no getsockopt for it.
  return total > slice_packets_ * kSmallestPacketPayload
             ? writeSliceFor(maxSegmentFromLoop(), slice_packets_)
             : 0;
}

Status Tcp::tryWriteFromLoop(const SharedFrame& frame, size_t* written) {
  *written = 0;
  const std::vector<std::vector<uv_buf_t>> slices =
      sliceForWrites({frame}, sliceForBatchFromLoop(frame->size()));
  for (const auto& slice : slices) {
    size_t bytes = 0;
    for (const uv_buf_t& buf : slice)
      bytes += buf.len;
    const int rc = uv_try_write(reinterpret_cast<uv_stream_t*>(&handle_), slice.data(),
                                static_cast<unsigned>(slice.size()));
    if (rc == UV_EAGAIN) return {};
    if (rc < 0) return uvError(rc, "write");
    *written += static_cast<size_t>(rc);
    if (static_cast<size_t>(rc) < bytes) return {};  // the socket buffer is full
  }
  return {};
}

Status Tcp::writeFromLoop(std::vector<SharedFrame> frames, DoneFn done) {
  size_t total = 0;
  for (const auto& frame : frames)
    total += frame->size();
  std::vector<std::vector<uv_buf_t>> slices = sliceForWrites(frames, sliceForBatchFromLoop(total));
  if (slices.empty()) return {ErrorCode::kInvalidArgument, "write of no bytes"};
  auto batch = std::make_unique<WriteBatch>(WriteBatch{
      std::move(frames), std::move(done), std::make_unique<uv_write_t[]>(slices.size()), 0, 0});
  auto complete = [](uv_write_t* r, int st) {
    auto* owner = static_cast<WriteBatch*>(r->data);
    if (st != 0 && owner->first_error == 0) owner->first_error = st;
    if (--owner->outstanding > 0) return;
    std::unique_ptr<WriteBatch> owned(owner);
    owned->done(requestStatus(owned->first_error, "write"));
  };
  for (size_t i = 0; i < slices.size(); ++i) {
    uv_write_t* request = &batch->requests[i];
    request->data = batch.get();
    // libuv copies the uv_buf_t array (not the bytes) into the request; the bytes stay owned
    // by batch->frames.
    const int rc = uv_write(request, reinterpret_cast<uv_stream_t*>(&handle_), slices[i].data(),
                            static_cast<unsigned>(slices[i].size()), complete);
    if (rc == 0) {
      ++batch->outstanding;
      continue;
    }
    if (batch->outstanding == 0) return uvError(rc, "write");  // nothing points to the batch
    // Slices already queued will complete (failed or cancelled, since the stream is broken)
    // and the last of them reports this error.
    if (batch->first_error == 0) batch->first_error = rc;
    break;
  }
  // Owned by libuv until the last slice's callback. The analyzer sees the batch reachable
  // only from its own requests and calls that a leak.
  (void)batch.release();
  return {};  // NOLINT(clang-analyzer-cplusplus.NewDeleteLeaks)
}

size_t Tcp::maxSegmentFromLoop() {
  uv_os_fd_t fd{};
  if (uv_fileno(reinterpret_cast<const uv_handle_t*>(&handle_), &fd) != 0) return 0;
  int mss = 0;
  socklen_t length = sizeof(mss);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &length) != 0 || mss <= 0) return 0;
  return static_cast<size_t>(mss);
}

std::vector<std::vector<uv_buf_t>> sliceForWrites(const std::vector<SharedFrame>& frames,
                                                  size_t slice) {
  std::vector<std::vector<uv_buf_t>> writes;
  size_t room = 0;  // bytes the last write may still take
  for (const auto& frame : frames) {
    for (const auto& piece : frame->pieces()) {
      // uv_buf_t has no const variant, but libuv never writes through it.
      auto* bytes = const_cast<char*>(reinterpret_cast<const char*>(piece.data()));  // NOLINT
      size_t left = piece.size();
      while (left > 0) {
        if (writes.empty() || (slice > 0 && room == 0)) {
          writes.emplace_back();
          room = slice;
        }
        const size_t take = slice > 0 ? std::min(left, room) : left;
        writes.back().push_back(uv_buf_init(bytes, static_cast<unsigned>(take)));
        bytes += take;
        left -= take;
        if (slice > 0) room -= take;
      }
    }
  }
  return writes;
}

size_t writeSliceFor(size_t mss, size_t packets) {
  if (mss == 0) return 0;
  const size_t segments_per_packet = std::max<size_t>(1, kLargestPacketPayload / mss);
  return packets * segments_per_packet * mss;
}

Status Tcp::shutdownFromLoop(DoneFn done) {
  auto request = std::make_unique<ShutdownRequest>();
  request->done = std::move(done);
  request->request.data = request.get();
  const int rc = uv_shutdown(
      &request->request, reinterpret_cast<uv_stream_t*>(&handle_), [](uv_shutdown_t* r, int st) {
        std::unique_ptr<ShutdownRequest> owned(static_cast<ShutdownRequest*>(r->data));
        owned->done(requestStatus(st, "shutdown"));
      });
  if (rc != 0) return uvError(rc, "shutdown");
  (void)request.release();  // owned by libuv until the callback
  return {};
}

Status Tcp::setNoDelayFromLoop() {
  const int rc = uv_tcp_nodelay(&handle_, 1);
  if (rc != 0) return uvError(rc, "TCP_NODELAY");
  return {};
}

uint16_t Tcp::localPortFromLoop() {
  sockaddr_storage address{};
  int length = sizeof(address);
  if (uv_tcp_getsockname(&handle_, reinterpret_cast<sockaddr*>(&address), &length) != 0) return 0;
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  }
  return 0;
}

std::string Tcp::peerNameFromLoop() {
  sockaddr_storage address{};
  int length = sizeof(address);
  if (uv_tcp_getpeername(&handle_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return "?";
  }
  return formatAddress(reinterpret_cast<const sockaddr*>(&address));
}

}  // namespace chorus::node::uv
