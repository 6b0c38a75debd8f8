// The kernel's TCP counters that tell a connection's trouble apart from its cost: segments sent
// again (spurious on loopback, where nothing is dropped) and segments that arrived out of order.
// They are machine-wide, so other traffic during a measurement counts too; on a quiet machine
// they belong to what is measured. bench/README "Where ps/ and node/ lose against the floor"
// explains why the PS benchmark reports them.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace chorus::bench {

struct TcpCounters {
  uint64_t retransmitted = 0;  // Tcp: RetransSegs (/proc/net/snmp)
  uint64_t out_of_order = 0;   // TcpExt: TCPOFOQueue (/proc/net/netstat)

  // Zero when the files cannot be read (not Linux, no /proc): the counters then say nothing.
  static TcpCounters now() {
    TcpCounters c;
    c.retransmitted = field("/proc/net/snmp", "Tcp:", "RetransSegs");
    c.out_of_order = field("/proc/net/netstat", "TcpExt:", "TCPOFOQueue");
    return c;
  }

 private:
  // These files hold pairs of lines, "<prefix> name name ..." then "<prefix> value value ...".
  static uint64_t field(const char* path, const std::string& prefix, const std::string& name) {
    std::ifstream in(path);
    std::string names, values;
    while (std::getline(in, names) && std::getline(in, values)) {
      if (names.rfind(prefix, 0) != 0 || values.rfind(prefix, 0) != 0) continue;
      std::istringstream n(names), v(values);
      std::string key, value;
      while (n >> key && v >> value) {
        if (key == name) return std::stoull(value);
      }
    }
    return 0;
  }
};

}  // namespace chorus::bench
