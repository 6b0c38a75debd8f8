#include "faults/crash.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace chorus::faults {

void crashProcess(uint32_t node_id, int64_t step) {
  const std::string line =
      fmt::format("chorus: injected crash of node {} after step {} (stragglers crash:{}@{})\n",
                  node_id, step, node_id, step);
  // One write(2) on the raw descriptor, not stdio: the line must not wait in a buffer that
  // _exit drops, nor take a lock another thread may hold; a line this short reaches a pipe in
  // one piece.
  const char* data = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // stderr is gone: the exit status still says what happened
    data += n;
    left -= static_cast<size_t>(n);
  }
  // _exit, not exit: a crashed machine runs no destructors, sends no Leave and flushes nothing.
  ::_exit(kInjectedCrashExitStatus);
}

}  // namespace chorus::faults
