// `chorus launch`: runs every node of a topology file as a child process of this one, prefixes
// their output with the node id, forwards Ctrl-C / SIGTERM / SIGHUP, and reports who failed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::cli {

// Set in every node's environment to the launcher's pid: a node whose launcher dies (even by
// SIGKILL) leaves the cluster in order instead of running on as an orphan.
inline constexpr const char* kLauncherPidVariable = "CHORUS_LAUNCHER_PID";

struct LaunchOptions {
  // The run spec every node reads (cli/run_spec.h): its settings, parsed and checked once by the
  // caller. Each child runs `binary node --spec SPEC --id I`.
  std::string spec_path;
  std::vector<uint32_t> ids;  // nodes to start, in order
  std::string binary;         // executable run as `binary node --spec SPEC --id I`
  // The file executed, when it differs from `binary` (which stays argv[0] and names it in
  // messages): "/proc/self/exe" runs this very image even if the file on disk was replaced by
  // a rebuild during a long compare. Empty: `binary`.
  std::string file;
  // Wall-clock limit for the whole cluster; zero means none. When it passes, children get
  // SIGTERM, then SIGKILL after `kill_grace`.
  std::chrono::milliseconds timeout{0};
  std::chrono::milliseconds kill_grace{5000};
  // Stop the remaining nodes (SIGTERM) as soon as one fails (an injected crash is no failure).
  bool fail_fast = false;
  // Where prefixed child output goes; defaults write to this process's stdout / stderr.
  std::function<void(std::string_view line)> out;
  std::function<void(std::string_view line)> err;
};

struct NodeOutcome {
  uint32_t id = 0;
  int64_t exit_status = -1;  // -1 when the child could not be started
  int term_signal = 0;       // signal that ended it, 0 when it exited
  std::string spawn_error;   // why it could not be started, empty otherwise
  // It exited with status 0.
  bool ok() const { return spawn_error.empty() && exit_status == 0 && term_signal == 0; }
  // It ended with the status of an injected crash (crash:NODE@STEP, faults/crash.h): the
  // experiment asked for it, so it is not a failure.
  bool crashedAsInjected() const;
  // Neither ok() nor crashedAsInjected(): what makes a launch fail.
  bool failed() const { return !ok() && !crashedAsInjected(); }
  // "exited with status 3", "killed by signal 9 (Killed)", "could not start: ...",
  // "crashed as injected (exit status 86)".
  std::string describe() const;
};

struct LaunchResult {
  std::vector<NodeOutcome> nodes;  // in the order of LaunchOptions::ids
  bool timed_out = false;
  bool interrupted = false;  // a SIGINT / SIGTERM / SIGHUP reached the launcher
  int signal = 0;            // the first such signal
  double seconds = 0;
  // No time-out, no interrupt, and no node failed() (injected crashes do not count).
  bool ok() const;
  // One line per failed node, e.g. "node 2 exited with status 3".
  std::vector<std::string> failures() const;
  // One line per node that crashed as injected, e.g. "node 2 crashed as injected".
  std::vector<std::string> injectedCrashes() const;
};

// Runs the cluster to completion. Blocks; installs SIGINT/SIGTERM/SIGHUP handlers while it runs.
LaunchResult runLaunch(const LaunchOptions& options);

}  // namespace chorus::cli
