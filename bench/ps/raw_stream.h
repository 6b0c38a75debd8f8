// The baseline of the PS benchmarks: one plain blocking TCP connection over loopback, a writer
// thread that does nothing but send length-prefixed messages and a reader that does nothing but
// receive them. No framing, no verification, no copies in user space: the most bandwidth two
// threads get from the kernel on this machine, so any protocol's bytes/s divided by it is the
// share of the machine it keeps.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "bench/ps/loopback.h"

namespace chorus::bench {

class RawStream {
 public:
  // Connects the pair over 127.0.0.1 (port 0) and starts the writer thread, which sleeps on a
  // condition variable between transfers (it must not steal CPU from what is measured
  // in between).
  RawStream() {
    std::tie(writer_fd_, reader_fd_) = loopbackPair();
    writer_ = std::thread([this] { writeLoop(); });
  }
  RawStream(const RawStream&) = delete;
  RawStream& operator=(const RawStream&) = delete;
  ~RawStream() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    changed_.notify_all();
    writer_.join();
    ::close(writer_fd_);
    ::close(reader_fd_);
  }

  // Moves `count` messages of a 4-byte length plus `payload` bytes from the writer thread to
  // the calling thread, one send() per message, or per `slice` bytes of a message when `slice`
  // is not 0 (Linux's BBR paces large send() calls on loopback, node/ writes slices for that
  // reason: see bench/README.md "Writes of more than two packets"); returns the wall seconds
  // it took.
  double transfer(size_t payload, size_t count, size_t slice = 0) {
    const size_t message = payload + 4;
    if (outbox_.size() != message) {
      outbox_.assign(message, 5);
      const uint32_t body = static_cast<uint32_t>(payload);
      std::memcpy(outbox_.data(), &body, 4);
      inbox_.resize(std::max(message, kChunk));
    }
    const auto start = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(mu_);
      job_count_ = count;
      job_slice_ = slice;
      ++jobs_;
    }
    changed_.notify_all();
    if (message >= kChunk) {
      // Large messages: length, then the body into a buffer of its own, like a framed reader
      // that receives straight into the frame.
      for (size_t i = 0; i < count; ++i) {
        uint32_t body = 0;
        readAll(reinterpret_cast<uint8_t*>(&body), 4);
        readAll(inbox_.data(), body);
      }
    } else {
      // Small messages: whatever is there, in chunks, as a framed reader splits them later.
      size_t left = message * count;
      while (left > 0) {
        const ssize_t r = ::recv(reader_fd_, inbox_.data(), std::min(left, kChunk), 0);
        if (r <= 0) std::abort();
        left -= static_cast<size_t>(r);
      }
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // The writer's current maximum segment size (it grows during the first transfers).
  size_t mss() const {
    int mss = 0;
    socklen_t len = sizeof(mss);
    if (::getsockopt(writer_fd_, IPPROTO_TCP, TCP_MAXSEG, &mss, &len) != 0 || mss <= 0) return 0;
    return static_cast<size_t>(mss);
  }

 private:
  static constexpr size_t kChunk = 256 * 1024;

  void writeLoop() {
    uint64_t done = 0;
    std::unique_lock lock(mu_);
    for (;;) {
      changed_.wait(lock, [&] { return stop_ || jobs_ > done; });
      if (stop_) return;
      const size_t count = job_count_;
      const size_t slice = job_slice_ == 0 ? outbox_.size() : job_slice_;
      lock.unlock();
      for (size_t i = 0; i < count; ++i) {
        for (size_t at = 0; at < outbox_.size(); at += slice)
          writeAll(outbox_.data() + at, std::min(slice, outbox_.size() - at));
      }
      lock.lock();
      ++done;
    }
  }
  void writeAll(const uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::send(writer_fd_, p, n, MSG_NOSIGNAL);
      if (w <= 0) std::abort();
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  void readAll(uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t r = ::recv(reader_fd_, p, n, 0);
      if (r <= 0) std::abort();
      p += r;
      n -= static_cast<size_t>(r);
    }
  }

  int writer_fd_ = -1;
  int reader_fd_ = -1;
  std::vector<uint8_t> outbox_;
  std::vector<uint8_t> inbox_;
  std::mutex mu_;
  std::condition_variable changed_;
  uint64_t jobs_ = 0;
  size_t job_count_ = 0;
  size_t job_slice_ = 0;
  bool stop_ = false;
  std::thread writer_;
};

}  // namespace chorus::bench
