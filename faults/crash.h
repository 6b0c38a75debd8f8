// The injected crash of the straggler term crash:NODE@STEP (docs/stragglers.md, "Crashes"):
// the process ends the way a crashed machine's would, as far as its peers can tell.
#pragma once

#include <cstdint>

namespace chorus::faults {

// The exit status of a process ended by an injected crash. chorus uses 0-5 and 128+N for
// everything else; `chorus launch` reports a node with this status as "crashed as injected"
// and does not count it as a failure.
inline constexpr int kInjectedCrashExitStatus = 86;

// Writes one line naming the crash to stderr, then ends the process at once with
// kInjectedCrashExitStatus: no Leave, no destructors, no atexit handlers, no stdio flush.
// The kernel closes the sockets, so the peers see connections drop as after a real crash.
// Never call it from a test that runs nodes as threads: it ends the whole process.
[[noreturn]] void crashProcess(uint32_t node_id, int64_t step);

}  // namespace chorus::faults
