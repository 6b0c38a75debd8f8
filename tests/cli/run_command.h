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

// `n` distinct loopback ports that were free a moment ago, for topology files that must name
// real ports. They come from below the kernel's ephemeral range (ip_local_port_range): between
// our release and the child's bind, any outgoing connection of a test running in parallel may
// take a released ephemeral port (every node's dialer draws its local port from that range),
// while a port below it is only ever taken by an explicit bind. Each candidate is bound to
// check it is free, and all n stay bound until the last is chosen, so they are distinct.
std::vector<uint16_t> freeLoopbackPorts(size_t n);
// One such port.
uint16_t freeLoopbackPort();

}  // namespace chorus::testing
