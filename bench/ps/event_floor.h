// The second baseline of the PS benchmarks: what request/reply traffic costs an event-driven
// node on this machine when it does nothing else. Two nodes, one thread each, one non-blocking
// loopback connection between them and a bare epoll loop (no libuv, no frames to verify, no
// callbacks, no locks). Each node is a worker and an owner at once, as in PS mode: it pushes
// gradients (the owner subtracts them from its rows and answers with an 8-byte ack) and pulls
// rows (the owner copies them into the reply), alternating, with `window` requests in flight.
// Values come from and go to working sets as large as the PS benchmark's, so that the copies
// are as cache-cold.
//
// PS mode runs its node on a libuv loop by design; this is the floor any such design sits on.
// MB/s of PS divided by MB/s of this is the share of the floor ps/ and node/ keep; this divided
// by the raw stream's is what the request/reply shape itself leaves of the raw bandwidth.
#pragma once

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "bench/ps/loopback.h"

namespace chorus::bench {

class EventFloor {
 public:
  EventFloor() {
    const auto [a, b] = loopbackPair();
    fds_[0] = a;
    fds_[1] = b;
    for (int fd : fds_) {
      if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) std::abort();
    }
  }
  EventFloor(const EventFloor&) = delete;
  EventFloor& operator=(const EventFloor&) = delete;
  ~EventFloor() {
    for (int fd : fds_)
      ::close(fd);
  }

  // Each node issues `operations` requests (pushes and pulls of `value_bytes` each, alternating,
  // `window` in flight) and serves the other's; values rotate through `working_bytes` of rows,
  // gradients and pull destinations. Returns the wall seconds both took.
  double transfer(size_t value_bytes, size_t operations, size_t window, size_t working_bytes) {
    const auto start = std::chrono::steady_clock::now();
    std::thread other([&] { runNode(fds_[1], value_bytes, operations, window, working_bytes); });
    runNode(fds_[0], value_bytes, operations, window, working_bytes);
    other.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  enum Op : uint32_t { kPush = 1, kPull = 2, kAck = 3, kRows = 4 };
  struct Header {
    uint32_t op = 0;
    uint32_t bytes = 0;  // values after the header
  };
  // A message being written, from a buffer reused once it is gone.
  struct Outgoing {
    std::vector<uint8_t> bytes;
    size_t written = 0;
  };

  static void runNode(int fd, size_t value_bytes, size_t operations, size_t window,
                      size_t working_bytes) {
    const size_t slots = std::max<size_t>(1, working_bytes / value_bytes);
    const size_t floats = value_bytes / sizeof(float);
    std::vector<float> rows(slots * floats, 0.0f), grads(slots * floats, 1e-3f),
        pulled(slots * floats);
    size_t next_push = 0, next_row_push = 0, next_row_pull = 0, next_land = 0;

    const int poll = ::epoll_create1(0);
    if (poll < 0) std::abort();
    epoll_event interest{};
    interest.events = EPOLLIN;
    interest.data.fd = fd;
    if (::epoll_ctl(poll, EPOLL_CTL_ADD, fd, &interest) != 0) std::abort();
    bool watching_out = false;

    std::deque<Outgoing> out;
    std::vector<std::vector<uint8_t>> spare;
    auto queue = [&](Op op, const float* values, size_t n_floats) {
      std::vector<uint8_t> bytes;
      if (!spare.empty()) {
        bytes = std::move(spare.back());
        spare.pop_back();
      }
      const Header header{op, static_cast<uint32_t>(n_floats * sizeof(float))};
      bytes.resize(sizeof(header) + header.bytes);
      std::memcpy(bytes.data(), &header, sizeof(header));
      if (n_floats > 0) std::memcpy(bytes.data() + sizeof(header), values, header.bytes);
      out.push_back({std::move(bytes), 0});
    };
    auto flush = [&] {
      while (!out.empty()) {
        Outgoing& o = out.front();
        const ssize_t w =
            ::send(fd, o.bytes.data() + o.written, o.bytes.size() - o.written, MSG_NOSIGNAL);
        if (w < 0 && errno == EAGAIN) break;
        if (w <= 0) std::abort();
        o.written += static_cast<size_t>(w);
        if (o.written < o.bytes.size()) break;
        spare.push_back(std::move(o.bytes));
        out.pop_front();
      }
      if (out.empty() == !watching_out) return;
      watching_out = !out.empty();
      interest.events = EPOLLIN | (watching_out ? EPOLLOUT : 0u);
      if (::epoll_ctl(poll, EPOLL_CTL_MOD, fd, &interest) != 0) std::abort();
    };

    size_t issued = 0, completed = 0, served = 0;
    auto issue = [&] {
      while (issued - completed < window && issued < operations) {
        if (issued % 2 == 0) {
          queue(kPush, grads.data() + (next_push++ % slots) * floats, floats);
        } else {
          queue(kPull, nullptr, 0);
        }
        ++issued;
      }
    };

    Header header;
    size_t header_filled = 0;
    std::vector<uint8_t> body(value_bytes);
    size_t body_filled = 0;
    bool in_body = false;
    auto complete = [&] {
      switch (header.op) {
        case kPush: {
          // The owner's optimizer: plain SGD, straight from the received values.
          float* row = rows.data() + (next_row_push++ % slots) * floats;
          const auto* grad = reinterpret_cast<const float*>(body.data());
          for (size_t i = 0; i < floats; ++i)
            row[i] -= 0.01f * grad[i];
          queue(kAck, nullptr, 0);
          ++served;
          break;
        }
        case kPull:
          queue(kRows, rows.data() + (next_row_pull++ % slots) * floats, floats);
          ++served;
          break;
        case kRows:
          std::memcpy(pulled.data() + (next_land++ % slots) * floats, body.data(), value_bytes);
          ++completed;
          break;
        case kAck:
          ++completed;
          break;
        default:
          std::abort();
      }
    };
    auto readAll = [&] {
      for (;;) {
        uint8_t* into = in_body ? body.data() + body_filled
                                : reinterpret_cast<uint8_t*>(&header) + header_filled;
        const size_t want = in_body ? header.bytes - body_filled : sizeof(header) - header_filled;
        const ssize_t r = ::recv(fd, into, want, 0);
        if (r < 0 && errno == EAGAIN) return;
        if (r <= 0) std::abort();
        if (in_body) {
          body_filled += static_cast<size_t>(r);
          if (body_filled < header.bytes) continue;
          in_body = false;
        } else {
          header_filled += static_cast<size_t>(r);
          if (header_filled < sizeof(header)) continue;
          header_filled = 0;
          if (header.bytes > body.size()) std::abort();
          if (header.bytes > 0) {
            in_body = true;
            body_filled = 0;
            continue;
          }
        }
        complete();
      }
    };

    issue();
    flush();
    while (completed < operations || served < operations || !out.empty()) {
      epoll_event events[2];
      const int n = ::epoll_wait(poll, events, 2, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) std::abort();
      for (int i = 0; i < n; ++i) {
        if ((events[i].events & EPOLLIN) != 0) readAll();
      }
      issue();
      flush();
    }
    ::close(poll);
  }

  int fds_[2] = {-1, -1};
};

}  // namespace chorus::bench
