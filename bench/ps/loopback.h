// A connected TCP pair over 127.0.0.1 (port 0) for the baselines of the PS benchmarks.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>

namespace chorus::bench {

// {connecting end, accepted end}, both with TCP_NODELAY as the node's connections have it.
// Aborts on failure: a benchmark without its baseline has nothing to report.
inline std::pair<int, int> loopbackPair() {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (listener < 0 ||
      ::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    std::abort();
  }
  const int dialer = ::socket(AF_INET, SOCK_STREAM, 0);
  if (dialer < 0 ||
      ::connect(dialer, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    std::abort();
  }
  const int accepted = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  if (accepted < 0) std::abort();
  int one = 1;
  ::setsockopt(dialer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(accepted, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return {dialer, accepted};
}

}  // namespace chorus::bench
