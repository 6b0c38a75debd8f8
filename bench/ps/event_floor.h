// The second baseline of the PS benchmarks: what request/reply traffic costs an event-driven
// node on this machine when it does nothing else. Two nodes, one thread each, one non-blocking
// loopback connection between them and a bare epoll loop (no libuv, no frames to verify, no
// callbacks, no locks). Each node is a worker and an owner at once, as in PS mode: it pushes
// gradients (the owner subtracts them from its rows and answers with an 8-byte ack) and pulls
// rows, alternating, with `window` requests in flight. Values come from and go to working sets
// as large as the PS benchmark's, so that the kernel's copies are as cache-cold.
//
// Values are never copied in user space where a correct PS need not copy them: a push is sent
// from the caller's gradients and a pull reply from the owner's rows (header and values as one
// sendmsg), and a reply's values are received straight into the caller's destination. The
// owner receives a push into one reused buffer and applies SGD from it. The one copy kept is
// the one a PS needs for consistency: when a pull reply cannot be sent at once, its unsent
// values are copied, because a later push would otherwise change rows already promised to the
// reader. A floor that copied every value into a send buffer and out of a receive buffer (as
// it did until 2026-11-23) measured those copies, not the event loop.
//
// PS mode runs its node on a libuv loop by design; this is the floor any such design sits on.
// MB/s of PS divided by MB/s of this is the share of the floor ps/ and node/ keep; this divided
// by the raw stream's is what the request/reply shape itself leaves of the raw bandwidth.
#pragma once

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
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

  // Bytes of pull replies copied so far because the socket could not take them at once.
  uint64_t heldBytes() const { return nodes_[0].heldBytes() + nodes_[1].heldBytes(); }

 private:
  enum Op : uint32_t { kPush = 1, kPull = 2, kAck = 3, kRows = 4 };
  struct Header {
    uint32_t op = 0;
    uint32_t bytes = 0;  // values after the header
  };
  // A message being written: its header, then its values from wherever they live (the
  // caller's gradients, the owner's rows, or `held` once they had to be copied).
  struct Outgoing {
    Header header;
    const uint8_t* values = nullptr;
    size_t written = 0;      // header and values
    size_t values_base = 0;  // values sent before `values` pointed into `held`
    std::vector<uint8_t> held;
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

    uint64_t heldBytes() const { return held_bytes_; }

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
      Outgoing o;
      o.header = Header{op, static_cast<uint32_t>(n_floats * sizeof(float))};
      o.values = reinterpret_cast<const uint8_t*>(values);
      out_.push_back(o);
    }

    void flush() {
      while (!out_.empty()) {
        Outgoing& o = out_.front();
        iovec parts[2];
        int count = 0;
        const size_t total = sizeof(Header) + o.header.bytes;
        if (o.written < sizeof(Header)) {
          parts[count++] = {reinterpret_cast<uint8_t*>(&o.header) + o.written,
                            sizeof(Header) - o.written};
          if (o.header.bytes > 0) parts[count++] = {const_cast<uint8_t*>(o.values), o.header.bytes};
        } else {
          const size_t done = o.written - sizeof(Header);
          parts[count++] = {const_cast<uint8_t*>(o.values) + (done - o.values_base),
                            o.header.bytes - done};
        }
        msghdr message{};
        message.msg_iov = parts;
        message.msg_iovlen = static_cast<size_t>(count);
        const ssize_t w = ::sendmsg(fd_, &message, MSG_NOSIGNAL);
        if (w < 0 && errno == EAGAIN) break;
        if (w <= 0) std::abort();
        o.written += static_cast<size_t>(w);
        if (o.written < total) break;
        out_.pop_front();
      }
      holdUnsentRows();
      if (out_.empty() == !watching_out_) return;
      watching_out_ = !out_.empty();
      interest_.events = EPOLLIN | (watching_out_ ? EPOLLOUT : 0u);
      if (::epoll_ctl(poll_, EPOLL_CTL_MOD, fd_, &interest_) != 0) std::abort();
    }

    // Rows not yet sent are copied, so that the next push this node applies cannot change a
    // reply already made; values from the caller's gradients stay where they are until the
    // push completes, as the API asks of the caller.
    void holdUnsentRows() {
      for (Outgoing& o : out_) {
        if (o.header.op != kRows || !o.held.empty()) continue;
        const size_t sent = o.written > sizeof(Header) ? o.written - sizeof(Header) : 0;
        o.held.assign(o.values + sent, o.values + o.header.bytes);
        held_bytes_ += o.header.bytes - sent;
        o.values = o.held.data();
        o.values_base = sent;
      }
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
          // Sent at once, as libuv's uv_write tries to; whatever does not fit is held.
          queue(kRows, slot(rows_, next_row_pull_), floats_);
          flush();
          ++served_;
          break;
        case kRows:
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
        uint8_t* into = in_body_ ? landing_ + body_filled_
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
            landing_ = header_.op == kRows ? reinterpret_cast<uint8_t*>(slot(pulled_, next_land_))
                                           : body_.data();
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
    // The message being read.
    Header header_;
    size_t header_filled_ = 0;
    std::vector<uint8_t> body_;
    uint8_t* landing_ = nullptr;
    size_t body_filled_ = 0;
    bool in_body_ = false;
    uint64_t held_bytes_ = 0;  // values of pull replies copied because they had to wait
    size_t completed_ = 0;     // this node's requests answered
    size_t served_ = 0;        // the other node's requests answered
  };

  Node nodes_[2];
};

}  // namespace chorus::bench
