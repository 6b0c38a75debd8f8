#include "topology/address.h"

#include <arpa/inet.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>

namespace chorus::topology {
namespace {

bool isIpv4(const std::string& host) {
  in_addr parsed{};
  return inet_pton(AF_INET, host.c_str(), &parsed) == 1;
}

bool isIpv6(const std::string& host) {
  in6_addr parsed{};
  return inet_pton(AF_INET6, host.c_str(), &parsed) == 1;
}

// RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens.
bool isHostName(std::string_view host) {
  if (host.empty() || host.size() > 253) {
    return false;
  }
  size_t start = 0;
  while (start <= host.size()) {
    size_t dot = host.find('.', start);
    if (dot == std::string_view::npos) {
      dot = host.size();
    }
    std::string_view label = host.substr(start, dot - start);
    if (label.empty() || label.size() > 63) {
      return false;
    }
    if (label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char c : label) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') {
        return false;
      }
    }
    start = dot + 1;
  }
  return true;
}

bool looksNumeric(std::string_view host) {
  return !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
    return c == '.' || std::isdigit(static_cast<unsigned char>(c));
  });
}

ListeningHost ipv4Host(const in_addr& address) {
  std::string bytes(sizeof(address.s_addr), '\0');
  std::memcpy(bytes.data(), &address.s_addr, sizeof(address.s_addr));
  return {"ipv4:" + bytes, address.s_addr == htonl(INADDR_ANY)};
}

}  // namespace

ListeningHost listeningHostOf(std::string_view host) {
  const std::string text(host);
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return ipv4Host(v4);
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    const unsigned char* bytes = v6.s6_addr;
    // ::ffff:a.b.c.d: a dual-stack socket bound there holds the IPv4 address a.b.c.d.
    const bool mapped = std::all_of(bytes, bytes + 10, [](unsigned char b) { return b == 0; }) &&
                        bytes[10] == 0xff && bytes[11] == 0xff;
    if (mapped) {
      std::memcpy(&v4.s_addr, bytes + 12, sizeof(v4.s_addr));
      return ipv4Host(v4);
    }
    return {"ipv6:" + std::string(bytes, bytes + sizeof(v6.s6_addr)),
            std::all_of(bytes, bytes + sizeof(v6.s6_addr), [](unsigned char b) { return b == 0; })};
  }
  std::string name = text;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name == "localhost") {
    v4.s_addr = htonl(INADDR_LOOPBACK);
    return ipv4Host(v4);
  }
  return {"name:" + name, false};
}

std::variant<std::string, AddressProblem> checkHost(std::string_view host) {
  if (host.empty()) {
    return AddressProblem{"the host is empty", "write a host before the port, e.g. 127.0.0.1:7100"};
  }
  std::string bare(host);
  if (bare.size() >= 2 && bare.front() == '[' && bare.back() == ']') {
    bare = bare.substr(1, bare.size() - 2);
    if (bare.find(':') == std::string::npos) {
      return AddressProblem{fmt::format("'{}': brackets are for IPv6 addresses only", host),
                            bare.empty() ? "write an IPv6 address in the brackets, e.g. [::1]"
                                         : fmt::format("write it without brackets: {}", bare)};
    }
  }
  if (bare.find(':') != std::string::npos) {
    if (isIpv6(bare)) {
      return bare;
    }
    return AddressProblem{fmt::format("'{}' is not a valid IPv6 address", bare),
                          "write an IPv6 address such as [::1]"};
  }
  if (looksNumeric(bare)) {
    if (isIpv4(bare)) {
      return bare;
    }
    return AddressProblem{fmt::format("'{}' is not a valid IPv4 address", bare),
                          "write four numbers 0..255 separated by dots, e.g. 127.0.0.1"};
  }
  if (isHostName(bare)) {
    return bare;
  }
  return AddressProblem{
      fmt::format("'{}' is not a valid host name", bare),
      "use an IPv4 address, [IPv6] or a host name of letters, digits, '-' and '.'"};
}

std::variant<Endpoint, AddressProblem> parseEndpoint(std::string_view address) {
  std::string_view host;
  std::string_view port_text;
  if (!address.empty() && address.front() == '[') {
    size_t close = address.find(']');
    if (close == std::string_view::npos) {
      return AddressProblem{fmt::format("address '{}' has an unclosed '['", address),
                            "write IPv6 addresses as [::1]:7100"};
    }
    const std::string_view inside = address.substr(1, close - 1);
    if (close + 1 == address.size()) {
      return AddressProblem{fmt::format("address '{}' has no port", address),
                            fmt::format("add the port after the bracket, e.g. [{}]:7100",
                                        inside.empty() ? "::1" : inside)};
    }
    if (address[close + 1] != ':') {
      return AddressProblem{
          fmt::format("address '{}' has unexpected '{}' after ']'", address,
                      address.substr(close + 1)),
          fmt::format("write ':' and the port right after the bracket, e.g. [{}]:7100",
                      inside.empty() ? "::1" : inside)};
    }
    host = address.substr(0, close + 1);
    port_text = address.substr(close + 2);
    if (inside.empty()) {
      return AddressProblem{
          fmt::format("address '{}' has an empty host", address),
          fmt::format("write an IPv6 address in the brackets, e.g. [::1]:{}", port_text)};
    }
    if (inside.find(':') == std::string_view::npos) {
      return AddressProblem{
          fmt::format("address '{}': brackets are for IPv6 addresses only", address),
          fmt::format("write it as {}:{}", inside, port_text)};
    }
  } else {
    size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) {
      return AddressProblem{fmt::format("address '{}' has no port", address),
                            fmt::format("write it as host:port, e.g. '{}:7100'",
                                        address.empty() ? "127.0.0.1" : address)};
    }
    host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return AddressProblem{fmt::format("address '{}' has an IPv6 host without brackets", address),
                            fmt::format("write it as [{}]:{}", host, port_text)};
    }
  }
  if (port_text.empty() || !std::all_of(port_text.begin(), port_text.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      })) {
    return AddressProblem{
        fmt::format("port '{}' in address '{}' is not a number", port_text, address),
        "write the port as a number 1..65535 after the last ':'"};
  }
  // Leading zeros are allowed ("007100" is 7100); the value stops growing past 65535 so that any
  // run of digits is a number, just out of range.
  uint32_t port = 0;
  for (char digit : port_text) {
    port = std::min<uint32_t>(port * 10 + static_cast<uint32_t>(digit - '0'), 65536);
  }
  if (port == 0 || port > 65535) {
    return AddressProblem{
        fmt::format("port {} in address '{}' is out of range", port_text, address),
        "use a port number from 1 to 65535 (0 would pick a random port that "
        "other nodes cannot know)"};
  }
  auto checked = checkHost(host);
  if (auto* problem = std::get_if<AddressProblem>(&checked)) {
    problem->message = fmt::format("in address '{}': {}", address, problem->message);
    return *problem;
  }
  return Endpoint{std::get<std::string>(checked), static_cast<uint16_t>(port)};
}

std::string formatEndpoint(std::string_view host, uint16_t port) {
  if (host.find(':') != std::string_view::npos) {
    return fmt::format("[{}]:{}", host, port);
  }
  return fmt::format("{}:{}", host, port);
}

}  // namespace chorus::topology
