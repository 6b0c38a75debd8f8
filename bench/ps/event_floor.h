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
    nodes_[0].open(a);
    nodes_[1].open(b);
  }
  EventFloor(const EventFloor&) = delete;
  EventFloor& operator=(const EventFloor&) = delete;

  // Each node issues `operations` requests (pushes and pulls of `value_bytes` each, alternating,
  // `window` in flight) and serves the other's; values rotate through `working_bytes` of rows,
  // gradients and pull destinations. Returns the wall seconds both took. The working sets are
  // allocated and filled by the first transfer of a size, as the PS benchmark's are before its
  // rounds: run one unmeasured transfer first.
  double transfer(size_t value_bytes, size_t operations, size_t window, size_t working_bytes) {
    for (Node& node : nodes_)
      node.prepare(value_bytes, working_bytes);
    const auto start = std::chrono::steady_clock::now();
    std::thread other([&] { nodes_[1].run(operations, window); });
    nodes_[0].run(operations, window);
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

  // One node: its end of the connection, its epoll set and its buffers, kept between transfers.
  class Node {
   public:
    Node() = default;
    Node(const Node&) = delete;
    Node& operator=(const Node&) = delete;
    ~Node() {
      if (poll_ >= 0) ::close(poll_);
      if (fd_ >= 0) ::close(fd_);
    }

    void open(int fd) {
      fd_ = fd;
      if (::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK) != 0) std::abort();
      poll_ = ::epoll_create1(0);
      if (poll_ < 0) std::abort();
      interest_.events = EPOLLIN;
      interest_.data.fd = fd_;
      if (::epoll_ctl(poll_, EPOLL_CTL_ADD, fd_, &interest_) != 0) std::abort();
    }

    // Sizes the buffers; a no-op when they already fit (the caller's CPU clock runs around
    // transfer(), and the PS's buffers are not refilled per round either).
    void prepare(size_t value_bytes, size_t working_bytes) {
      const size_t floats = value_bytes / sizeof(float);
      const size_t slots = std::max<size_t>(1, working_bytes / value_bytes);
      if (floats == floats_ && slots == slots_) return;
      floats_ = floats;
      slots_ = slots;
      rows_.assign(slots_ * floats_, 0.0f);
      grads_.assign(slots_ * floats_, 1e-3f);
      pulled_.assign(slots_ * floats_, 0.0f);
      body_.resize(value_bytes);
    }

    void run(size_t operations, size_t window) {
      size_t issued = 0;
      completed_ = 0;
      served_ = 0;
      while (issued - completed_ < window && issued < operations)
        issueOne(issued++);
      flush();
      while (completed_ < operations || served_ < operations || !out_.empty()) {
        epoll_event events[2];
        const int n = ::epoll_wait(poll_, events, 2, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) std::abort();
        for (int i = 0; i < n; ++i) {
          if ((events[i].events & EPOLLIN) != 0) readAll();
        }
        while (issued - completed_ < window && issued < operations)
          issueOne(issued++);
        flush();
      }
    }

   private:
    float* slot(std::vector<float>& values, size_t& next) {
      return values.data() + (next++ % slots_) * floats_;
    }

    // Operation `i`: a push when even, a pull when odd.
    void issueOne(size_t i) {
      if (i % 2 == 0) {
        queue(kPush, slot(grads_, next_push_), floats_);
      } else {
        queue(kPull, nullptr, 0);
      }
    }

    void queue(Op op, const float* values, size_t n_floats) {
      std::vector<uint8_t> bytes;
      if (!spare_.empty()) {
        bytes = std::move(spare_.back());
        spare_.pop_back();
      }
      const Header header{op, static_cast<uint32_t>(n_floats * sizeof(float))};
      bytes.resize(sizeof(header) + header.bytes);
      std::memcpy(bytes.data(), &header, sizeof(header));
      if (n_floats > 0) std::memcpy(bytes.data() + sizeof(header), values, header.bytes);
      out_.push_back({std::move(bytes), 0});
    }

    void flush() {
      while (!out_.empty()) {
        Outgoing& o = out_.front();
        const ssize_t w =
            ::send(fd_, o.bytes.data() + o.written, o.bytes.size() - o.written, MSG_NOSIGNAL);
        if (w < 0 && errno == EAGAIN) break;
        if (w <= 0) std::abort();
        o.written += static_cast<size_t>(w);
        if (o.written < o.bytes.size()) break;
        spare_.push_back(std::move(o.bytes));
        out_.pop_front();
      }
      if (out_.empty() == !watching_out_) return;
      watching_out_ = !out_.empty();
      interest_.events = EPOLLIN | (watching_out_ ? EPOLLOUT : 0u);
      if (::epoll_ctl(poll_, EPOLL_CTL_MOD, fd_, &interest_) != 0) std::abort();
    }

    void complete() {
      switch (header_.op) {
        case kPush: {
          // The owner's optimizer: plain SGD, straight from the received values.
          float* row = slot(rows_, next_row_push_);
          const auto* grad = reinterpret_cast<const float*>(body_.data());
          for (size_t i = 0; i < floats_; ++i)
            row[i] -= 0.01f * grad[i];
          queue(kAck, nullptr, 0);
          ++served_;
          break;
        }
        case kPull:
          queue(kRows, slot(rows_, next_row_pull_), floats_);
          ++served_;
          break;
        case kRows:
          std::memcpy(slot(pulled_, next_land_), body_.data(), header_.bytes);
          ++completed_;
          break;
        case kAck:
          ++completed_;
          break;
        default:
          std::abort();
      }
    }

    void readAll() {
      for (;;) {
        uint8_t* into = in_body_ ? body_.data() + body_filled_
                                 : reinterpret_cast<uint8_t*>(&header_) + header_filled_;
        const size_t want =
            in_body_ ? header_.bytes - body_filled_ : sizeof(header_) - header_filled_;
        const ssize_t r = ::recv(fd_, into, want, 0);
        if (r < 0 && errno == EAGAIN) return;
        if (r <= 0) std::abort();
        if (in_body_) {
          body_filled_ += static_cast<size_t>(r);
          if (body_filled_ < header_.bytes) continue;
          in_body_ = false;
        } else {
          header_filled_ += static_cast<size_t>(r);
          if (header_filled_ < sizeof(header_)) continue;
          header_filled_ = 0;
          if (header_.bytes > body_.size()) std::abort();
          if (header_.bytes > 0) {
            in_body_ = true;
            body_filled_ = 0;
            continue;
          }
        }
        complete();
      }
    }

    int fd_ = -1;
    int poll_ = -1;
    epoll_event interest_{};
    bool watching_out_ = false;
    size_t floats_ = 0;  // per value
    size_t slots_ = 1;   // values in each working set
    std::vector<float> rows_, grads_, pulled_;
    size_t next_push_ = 0, next_row_push_ = 0, next_row_pull_ = 0, next_land_ = 0;
    std::deque<Outgoing> out_;
    std::vector<std::vector<uint8_t>> spare_;
    // The message being read.
    Header header_;
    size_t header_filled_ = 0;
    std::vector<uint8_t> body_;
    size_t body_filled_ = 0;
    bool in_body_ = false;
    size_t completed_ = 0;  // this node's requests answered
    size_t served_ = 0;     // the other node's requests answered
  };

  Node nodes_[2];
};

}  // namespace chorus::bench
