// The loop thread: owns one uv_loop_t and every handle on it. Other threads reach it only
// through post() (a mutex-guarded queue of closures plus one uv_async_t doorbell).
// Internal header (includes <uv.h>).
#pragma once

#include <uv.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "node/uv_handles.h"

namespace spdlog {
class logger;
}

namespace chorus::node {

class EventLoop {
 public:
  explicit EventLoop(std::shared_ptr<spdlog::logger> logger);
  // The loop must have been stopped and joined (or never started).
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Starts the loop thread. Closures posted before are run once it runs.
  void start();
  // Queues `fn` to run on the loop thread; any thread. Returns false (and drops `fn`) once
  // the loop has stopped accepting work.
  bool post(std::function<void()> fn);
  // True on the loop thread.
  bool onLoopThread() const { return std::this_thread::get_id() == thread_id_.load(); }
  // The libuv loop; use only on the loop thread (or before start()).
  uv_loop_t* uvLoop() { return &loop_; }
  // Refuses further posts, runs what is queued, closes the doorbell. The thread ends once
  // every other handle is closed too.
  void stopFromLoop();
  // Waits for the thread to end and returns uv_loop_close()'s result (0 when every handle
  // was closed). Idempotent; any thread but the loop thread.
  int join();
  // True once start() ran.
  bool started() const { return started_.load(); }
  // True on the thread running the loop `loop` (for FromLoop checks in handle owners).
  static bool onThreadOf(const uv_loop_t* loop);

 private:
  void drainFromLoop();
  void run();

  std::shared_ptr<spdlog::logger> logger_;
  uv_loop_t loop_{};
  uv::HandlePtr<uv::Async> doorbell_;
  std::mutex mutex_;
  std::vector<std::function<void()>> queue_;  // guarded by mutex_
  bool accepting_ = true;                     // guarded by mutex_
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
  std::atomic<bool> started_{false};
  int close_result_ = 0;
};

}  // namespace chorus::node
