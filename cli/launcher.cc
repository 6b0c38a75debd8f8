#include "cli/launcher.h"

#include <fmt/format.h>
#include <unistd.h>
#include <uv.h>

#include <cstdio>
#include <cstring>
#include <memory>

#include "faults/crash.h"

extern char** environ;

namespace chorus::cli {

namespace {
// strsignal() is not thread-safe; glibc's sigdescr_np() is.
const char* signalName(int signum) {
  const char* d = sigdescr_np(signum);
  return d != nullptr ? d : "unknown signal";
}
}  // namespace

bool NodeOutcome::crashedAsInjected() const {
  return spawn_error.empty() && term_signal == 0 && exit_status == faults::kInjectedCrashExitStatus;
}

std::string NodeOutcome::describe() const {
  if (!spawn_error.empty()) return "could not start: " + spawn_error;
  if (crashedAsInjected()) return fmt::format("crashed as injected (exit status {})", exit_status);
  if (term_signal != 0)
    return fmt::format("killed by signal {} ({})", term_signal, signalName(term_signal));
  return fmt::format("exited with status {}", exit_status);
}

bool LaunchResult::ok() const {
  if (timed_out || interrupted) return false;
  for (const auto& n : nodes) {
    if (n.failed()) return false;
  }
  return !nodes.empty();
}

std::vector<std::string> LaunchResult::failures() const {
  std::vector<std::string> lines;
  for (const auto& n : nodes) {
    if (n.failed()) lines.push_back(fmt::format("node {} {}", n.id, n.describe()));
  }
  return lines;
}

std::vector<std::string> LaunchResult::injectedCrashes() const {
  std::vector<std::string> lines;
  for (const auto& n : nodes) {
    if (n.crashedAsInjected()) lines.push_back(fmt::format("node {} crashed as injected", n.id));
  }
  return lines;
}

namespace {

class Cluster;

// One child process and the two pipes its stdout and stderr come through. Lives until the
// loop has closed all three handles (the Cluster owns it and outlives the loop run).
struct Child {
  Cluster* cluster = nullptr;
  size_t index = 0;
  uv_process_t process{};
  uv_pipe_t pipes[2]{};  // 0: stdout, 1: stderr
  std::string partial[2];
  bool running = false;
  int open_pipes = 0;  // the outcome is reported once the child exited and both pipes ended
};

// The launch as a whole; every method runs on the one thread that runs the private loop.
class Cluster {
 public:
  Cluster(const LaunchOptions& options, LaunchResult& result)
      : options_(options), result_(result) {}

  void run() {
    uv_loop_init(&loop_);
    uv_signal_init(&loop_, &sigint_);
    uv_signal_init(&loop_, &sigterm_);
    uv_signal_init(&loop_, &sighup_);
    sigint_.data = sigterm_.data = sighup_.data = this;
    uv_signal_start(&sigint_, &Cluster::onSignal, SIGINT);
    uv_signal_start(&sigterm_, &Cluster::onSignal, SIGTERM);
    // A closed terminal or ssh session: the nodes must not outlive it either.
    uv_signal_start(&sighup_, &Cluster::onSignal, SIGHUP);
    // Every child learns who launched it, so that it can stop when this process dies
    // (kLauncherPidVariable).
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      if (std::strncmp(*e, kLauncherPidVariable, std::strlen(kLauncherPidVariable)) == 0 &&
          (*e)[std::strlen(kLauncherPidVariable)] == '=') {
        continue;
      }
      environment_.emplace_back(*e);
    }
    environment_.push_back(fmt::format("{}={}", kLauncherPidVariable, ::getpid()));
    for (auto& e : environment_)
      env_.push_back(e.data());
    env_.push_back(nullptr);
    uv_timer_init(&loop_, &deadline_);
    uv_timer_init(&loop_, &grace_);
    deadline_.data = grace_.data = this;
    if (options_.timeout.count() > 0) {
      uv_timer_start(&deadline_, &Cluster::onDeadline, options_.timeout.count(), 0);
    }
    uint64_t start = uv_hrtime();
    for (size_t i = 0; i < options_.ids.size(); ++i) {
      if (stopping_) {
        result_.nodes[i].id = options_.ids[i];
        result_.nodes[i].spawn_error = "not started: the launch was already stopping";
        continue;
      }
      spawn(i);
    }
    spawned_all_ = true;
    maybeFinish();
    uv_run(&loop_, UV_RUN_DEFAULT);
    result_.seconds = static_cast<double>(uv_hrtime() - start) / 1e9;
    int rc = uv_loop_close(&loop_);
    if (rc != 0)
      err(fmt::format("[launch] internal: loop closed with handles open ({})", uv_strerror(rc)));
  }

 private:
  void out(std::string_view line) {
    if (options_.out) {
      options_.out(line);
    } else {
      std::fwrite(line.data(), 1, line.size(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
    }
  }
  void err(std::string_view line) {
    if (options_.err) {
      options_.err(line);
    } else {
      std::fwrite(line.data(), 1, line.size(), stderr);
      std::fputc('\n', stderr);
      std::fflush(stderr);
    }
  }

  void spawn(size_t index) {
    auto child = std::make_unique<Child>();
    child->cluster = this;
    child->index = index;
    NodeOutcome& outcome = result_.nodes[index];
    outcome.id = options_.ids[index];

    // The settings travel typed in the spec; the command line names it and the node's id only.
    std::vector<std::string> args = {options_.binary,    "node", "--spec",
                                     options_.spec_path, "--id", std::to_string(outcome.id)};
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);

    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    for (int s = 0; s < 2; ++s) {
      uv_pipe_init(&loop_, &child->pipes[s], 0);
      child->pipes[s].data = child.get();
      stdio[s + 1].flags = static_cast<uv_stdio_flags>(UV_CREATE_PIPE | UV_WRITABLE_PIPE);
      stdio[s + 1].data.stream = reinterpret_cast<uv_stream_t*>(&child->pipes[s]);
    }
    uv_process_options_t po{};
    po.file = options_.file.empty() ? options_.binary.c_str() : options_.file.c_str();
    po.args = argv.data();
    po.exit_cb = &Cluster::onExit;
    po.stdio_count = 3;
    po.stdio = stdio;
    po.env = env_.data();
    // Its own session and process group: a Ctrl-C at the terminal, or `timeout` signalling
    // our group, reaches this launcher only, which passes it on once. In our group the node
    // would get the signal twice (directly and forwarded).
    po.flags = UV_PROCESS_DETACHED;
    child->process.data = child.get();
    int rc = uv_spawn(&loop_, &child->process, &po);
    if (rc != 0) {
      outcome.spawn_error = fmt::format("{}: {}", options_.binary, uv_strerror(rc));
      err(fmt::format("[launch] node {} {}", outcome.id, outcome.describe()));
      // A failed spawn still leaves initialized handles that must go through uv_close.
      uv_close(reinterpret_cast<uv_handle_t*>(&child->process), nullptr);
      for (auto& p : child->pipes)
        uv_close(reinterpret_cast<uv_handle_t*>(&p), nullptr);
      children_.push_back(std::move(child));
      if (options_.fail_fast) terminateAll(SIGTERM);
      return;
    }
    child->running = true;
    child->open_pipes = 2;
    ++running_;
    for (auto& p : child->pipes) {
      uv_read_start(reinterpret_cast<uv_stream_t*>(&p), &Cluster::onAlloc, &Cluster::onRead);
    }
    out(fmt::format("[launch] node {} started (pid {})", outcome.id, child->process.pid));
    children_.push_back(std::move(child));
  }

  static void onAlloc(uv_handle_t*, size_t suggested, uv_buf_t* buf) {
    buf->base = new char[suggested];
    buf->len = suggested;
  }

  static void onRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
    std::unique_ptr<char[]> owned(buf->base);
    auto* child = static_cast<Child*>(stream->data);
    Cluster* self = child->cluster;
    int s = (stream == reinterpret_cast<uv_stream_t*>(&child->pipes[0])) ? 0 : 1;
    if (nread > 0) {
      child->partial[s].append(buf->base, static_cast<size_t>(nread));
      self->emitLines(*child, s, /*flush=*/false);
    } else if (nread < 0) {
      self->emitLines(*child, s, /*flush=*/true);
      uv_close(reinterpret_cast<uv_handle_t*>(stream), nullptr);
      --child->open_pipes;
      self->maybeReport(*child);
    }
  }

  void emitLines(Child& child, int s, bool flush) {
    std::string& text = child.partial[s];
    uint32_t id = options_.ids[child.index];
    size_t begin = 0;
    for (size_t nl; (nl = text.find('\n', begin)) != std::string::npos; begin = nl + 1) {
      emit(id, s, std::string_view(text).substr(begin, nl - begin));
    }
    text.erase(0, begin);
    if (flush && !text.empty()) {
      emit(id, s, text);
      text.clear();
    }
  }

  void emit(uint32_t id, int s, std::string_view line) {
    const std::string tag = fmt::format("[node {}] ", id);
    // A node's log lines ("[time] [node N] [level] ...") name it already; the prefix moves the
    // name to the front instead of printing it twice.
    std::string rest(line);
    if (rest.starts_with('[')) {
      const size_t time_end = rest.find("] ");
      if (time_end != std::string::npos && rest.compare(time_end + 2, tag.size(), tag) == 0) {
        rest.erase(time_end + 2, tag.size());
      }
    }
    std::string prefixed = tag + rest;
    if (s == 0) {
      out(prefixed);
    } else {
      err(prefixed);
    }
  }

  static void onExit(uv_process_t* process, int64_t exit_status, int term_signal) {
    auto* child = static_cast<Child*>(process->data);
    Cluster* self = child->cluster;
    NodeOutcome& outcome = self->result_.nodes[child->index];
    outcome.exit_status = exit_status;
    outcome.term_signal = term_signal;
    child->running = false;
    --self->running_;
    // An injected crash is the experiment, not a failure: the others must go on without it.
    if (outcome.failed() && self->options_.fail_fast && !self->stopping_) {
      self->err(fmt::format("[launch] node {} {}; --fail-fast: stopping the other nodes",
                            outcome.id, outcome.describe()));
      self->terminateAll(SIGTERM);
    }
    uv_close(reinterpret_cast<uv_handle_t*>(process), nullptr);
    self->maybeReport(*child);
    self->maybeFinish();
  }

  // Says how a node ended, after its last output line (both pipes at end of file).
  void maybeReport(Child& child) {
    if (child.running || child.open_pipes > 0) return;
    child.open_pipes = -1;  // reported
    const NodeOutcome& outcome = result_.nodes[child.index];
    if (outcome.ok()) {
      out(fmt::format("[launch] node {} finished", outcome.id));
    } else if (outcome.crashedAsInjected()) {
      // On stdout with the other expected endings: stderr is for what went wrong.
      out(fmt::format("[launch] node {} crashed as injected (exit status {})", outcome.id,
                      outcome.exit_status));
    } else {
      err(fmt::format("[launch] node {} {}", outcome.id, outcome.describe()));
    }
  }

  static void onSignal(uv_signal_t* handle, int signum) {
    auto* self = static_cast<Cluster*>(handle->data);
    self->result_.interrupted = true;
    const uint64_t now = uv_now(&self->loop_);
    ++self->signals_seen_;
    if (self->signals_seen_ == 1) {
      self->first_signal_ms_ = now;
      self->result_.signal = signum;
      self->err(fmt::format(
          "[launch] {}: passing it to every node (another signal a second later kills them)",
          signalName(signum)));
      // A hang-up means the terminal is gone: the nodes are asked to stop with SIGTERM, the
      // signal every launcher and scheduler uses for that.
      self->terminateAll(signum == SIGHUP ? SIGTERM : signum);
    } else if (now - self->first_signal_ms_ < kRepeatIgnoredMs) {
      // The same interrupt seen twice: `timeout` signals both this process and its group,
      // and a terminal may too. Only a second request made later means "kill them".
      return;
    } else {
      self->err("[launch] second signal: killing every node");
      self->killAll();
    }
  }

  static void onDeadline(uv_timer_t* timer) {
    auto* self = static_cast<Cluster*>(timer->data);
    self->result_.timed_out = true;
    self->err(fmt::format("[launch] time limit of {} ms reached: stopping every node",
                          self->options_.timeout.count()));
    self->terminateAll(SIGTERM);
  }

  static void onGrace(uv_timer_t* timer) {
    auto* self = static_cast<Cluster*>(timer->data);
    self->err("[launch] nodes still running after the grace period: killing them");
    self->killAll();
  }

  // Sends `signum` to every running child and arms the SIGKILL fallback.
  void terminateAll(int signum) {
    stopping_ = true;
    for (auto& c : children_) {
      if (c->running) uv_process_kill(&c->process, signum);
    }
    if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&grace_)) && running_ > 0) {
      uv_timer_start(&grace_, &Cluster::onGrace, options_.kill_grace.count(), 0);
    }
  }

  void killAll() {
    for (auto& c : children_) {
      if (c->running) uv_process_kill(&c->process, SIGKILL);
    }
  }

  // Once every child has exited, the launcher's own handles go so that uv_run returns (pipes
  // close themselves at end of file).
  void maybeFinish() {
    if (running_ > 0 || finished_ || !spawned_all_) return;
    finished_ = true;
    for (uv_handle_t* h :
         {reinterpret_cast<uv_handle_t*>(&sigint_), reinterpret_cast<uv_handle_t*>(&sigterm_),
          reinterpret_cast<uv_handle_t*>(&sighup_), reinterpret_cast<uv_handle_t*>(&deadline_),
          reinterpret_cast<uv_handle_t*>(&grace_)}) {
      uv_close(h, nullptr);
    }
  }

  const LaunchOptions& options_;
  LaunchResult& result_;
  uv_loop_t loop_{};
  // A signal within this long after the first counts as the same request.
  static constexpr uint64_t kRepeatIgnoredMs = 1000;

  uv_signal_t sigint_{}, sigterm_{}, sighup_{};
  uv_timer_t deadline_{}, grace_{};
  std::vector<std::string> environment_;  // this process's environment plus the launcher pid
  std::vector<char*> env_;
  uint64_t first_signal_ms_ = 0;
  std::vector<std::unique_ptr<Child>> children_;
  size_t running_ = 0;
  int signals_seen_ = 0;
  bool stopping_ = false;
  bool finished_ = false;
  bool spawned_all_ = false;
};

}  // namespace

LaunchResult runLaunch(const LaunchOptions& options) {
  LaunchResult result;
  result.nodes.resize(options.ids.size());
  Cluster cluster(options, result);
  cluster.run();
  return result;
}

}  // namespace chorus::cli
