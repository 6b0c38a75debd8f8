#include "node/event_loop.h"

#include <spdlog/spdlog.h>

#include <cassert>

namespace chorus::node {
namespace {
// The loop the current thread runs, if any.
thread_local const uv_loop_t* current_loop = nullptr;
}  // namespace

bool EventLoop::onThreadOf(const uv_loop_t* loop) {
  return current_loop == loop;
}

EventLoop::EventLoop(std::shared_ptr<spdlog::logger> logger) : logger_(std::move(logger)) {
  const int rc = uv_loop_init(&loop_);
  if (rc != 0) throw std::runtime_error(std::string("uv_loop_init: ") + uv_strerror(rc));
  doorbell_ = uv::Async::create(&loop_, [this] { drainFromLoop(); });
}

EventLoop::~EventLoop() {
  if (!started()) {
    // Never ran: close the doorbell and let the loop finish its close callback.
    doorbell_.reset();
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
    return;
  }
  join();
}

void EventLoop::start() {
  assert(!started());
  started_.store(true);
  thread_ = std::thread([this] { run(); });
}

void EventLoop::run() {
  thread_id_.store(std::this_thread::get_id());
  current_loop = &loop_;
  uv_run(&loop_, UV_RUN_DEFAULT);
  close_result_ = uv_loop_close(&loop_);
  if (close_result_ != 0) {
    // A handle was left open: a bug. Name it, then close it so memory is still reclaimed.
    uv_walk(
        &loop_,
        [](uv_handle_t* handle, void* arg) {
          auto* logger = static_cast<spdlog::logger*>(arg);
          logger->error("handle of type {} still open at shutdown",
                        uv_handle_type_name(handle->type));
          if (!uv_is_closing(handle)) uv_close(handle, nullptr);
        },
        logger_.get());
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
  }
  current_loop = nullptr;
  thread_id_.store(std::thread::id());
}

bool EventLoop::post(std::function<void()> fn) {
  {
    std::lock_guard lock(mutex_);
    if (!accepting_) return false;
    queue_.push_back(std::move(fn));
    // Rung under the mutex: the doorbell is closed only after accepting_ turned false under
    // this same mutex, so it is never rung once closing began.
    doorbell_->send();
  }
  return true;
}

void EventLoop::drainFromLoop() {
  assert(onLoopThread());
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard lock(mutex_);
    batch.swap(queue_);
  }
  for (auto& fn : batch)
    fn();
}

void EventLoop::stopFromLoop() {
  assert(onLoopThread());
  {
    std::lock_guard lock(mutex_);
    accepting_ = false;
  }
  // Run what was posted before the gate closed; those closures see the stopped state.
  for (;;) {
    std::vector<std::function<void()>> batch;
    {
      std::lock_guard lock(mutex_);
      batch.swap(queue_);
    }
    if (batch.empty()) break;
    for (auto& fn : batch)
      fn();
  }
  doorbell_.reset();
}

int EventLoop::join() {
  assert(!onLoopThread());
  if (thread_.joinable()) thread_.join();
  return close_result_;
}

}  // namespace chorus::node
