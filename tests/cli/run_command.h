// Runs the real `chorus` executable (or any program) and captures what it printed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace chorus::testing {

struct CommandResult {
  int exit_code = -1;  // -1 when it did not exit normally
  int term_signal = 0;
  std::string out;
  std::string err;
};

// Runs `argv` with stdin closed, waits for it, and returns its status and output. `timeout_s`
// bounds the run (the child is killed after it, and term_signal says so).
CommandResult runCommand(const std::vector<std::string>& argv, double timeout_s = 300);

// The chorus executable under test (its path is compiled into the test).
std::string chorusBinary();

// A fresh folder under the system's temporary folder (named from `prefix`), removed with
// everything in it on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // The path of `name` inside the folder.
  std::string file(const std::string& name) const;

 private:
  std::string path_;
};

// A loopback port that was free a moment ago (bound to port 0, read back, released), for
// topology files that must name real ports.
uint16_t freeLoopbackPort();

}  // namespace chorus::testing
