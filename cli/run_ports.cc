#include "cli/run_ports.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <system_error>

namespace chorus::cli {

namespace {

// The first port of the kernel's ephemeral range (32768 when it cannot be read).
int ephemeralLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (in >> low && low > 0 && low <= 65535) return low;
  return 32768;
}

// A socket bound to `port` (0: the kernel picks) on the wildcard address, IPv6 and IPv4 both
// when the machine has IPv6 (so that the port is free for a node on either); -1 when taken.
int bindWildcard(uint16_t port) {
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    const int off = 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(port);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    const int error = errno;
    ::close(fd);
    if (error == EADDRINUSE) return -1;  // taken (on IPv4 or IPv6): no need to try IPv4 alone
  }
  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(port);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
  ::close(fd);
  return -1;
}

uint16_t boundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t length = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return 0;
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

}  // namespace

node::Result<std::vector<uint16_t>> freePorts(size_t count) {
  const int high = ephemeralLow() - 1;
  const int low = 10000;
  std::mt19937_64 rng(
      std::random_device{}() ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  // Every socket stays bound until all are chosen: the ports are distinct.
  std::vector<int> held;
  std::vector<uint16_t> ports;
  node::Status failed;
  for (size_t i = 0; i < count && failed.ok(); ++i) {
    int fd = -1;
    for (int attempt = 0; fd < 0 && high - low >= 1000 && attempt < 200; ++attempt) {
      fd = bindWildcard(static_cast<uint16_t>(std::uniform_int_distribution<int>(low, high)(rng)));
    }
    if (fd < 0) fd = bindWildcard(0);
    const int error = errno;
    const uint16_t port = fd < 0 ? 0 : boundPort(fd);
    if (port == 0) {
      failed = node::Status(
          node::ErrorCode::kIo,
          fmt::format("cannot bind a TCP socket to find a free port for node {} of the run: {}", i,
                      std::generic_category().message(error)));
    }
    if (fd >= 0) held.push_back(fd);
    ports.push_back(port);
  }
  for (const int fd : held)
    ::close(fd);
  if (!failed.ok()) return failed;
  return ports;
}

node::Result<topology::Topology> withFreePorts(topology::Topology topology) {
  node::Result<std::vector<uint16_t>> ports = freePorts(topology.nodes.size());
  if (!ports.ok()) return ports.status();
  for (size_t i = 0; i < topology.nodes.size(); ++i)
    topology.nodes[i].port = (*ports)[i];
  if (!topology.secret_file.empty()) {
    topology.secret_file = std::filesystem::absolute(topology.secretPath()).string();
  }
  return topology;
}

}  // namespace chorus::cli
