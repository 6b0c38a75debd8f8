#include "node/secret.h"

#include <fmt/format.h>
#include <sodium.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <system_error>
#include <vector>

namespace chorus::node {
namespace {

constexpr size_t kMaxSecretBytes = 64 * 1024;
// Domain separation: the same file used as a key elsewhere gives another key here.
constexpr char kKeyContext[] = "chorus cluster secret v1";

void initSodium() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (sodium_init() < 0) std::abort();  // libsodium cannot work at all (no entropy source)
  });
}

void appendU32(std::vector<uint8_t>& out, uint32_t value) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

}  // namespace

ClusterKey clusterKeyFromSecret(std::span<const uint8_t> secret) {
  initSodium();
  ClusterKey key{};
  crypto_generichash(key.data(), key.size(), secret.data(), secret.size(),
                     reinterpret_cast<const unsigned char*>(kKeyContext), sizeof(kKeyContext) - 1);
  return key;
}

Status loadClusterKey(const std::string& path, ClusterKey* key, std::string* warning) {
  warning->clear();
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    return {ErrorCode::kInvalidArgument,
            fmt::format("secret file {}: {}", path, std::generic_category().message(errno))};
  }
  if (!S_ISREG(info.st_mode)) {
    return {ErrorCode::kInvalidArgument, fmt::format("secret file {}: not a regular file", path)};
  }
  if (static_cast<size_t>(info.st_size) > kMaxSecretBytes) {
    return {ErrorCode::kInvalidArgument,
            fmt::format("secret file {}: {} bytes, more than the {} a secret may have", path,
                        info.st_size, kMaxSecretBytes)};
  }
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return {ErrorCode::kInvalidArgument,
            fmt::format("secret file {}: {}", path, std::generic_category().message(errno))};
  }
  std::vector<uint8_t> bytes(kMaxSecretBytes + 1);
  const size_t read = std::fread(bytes.data(), 1, bytes.size(), file);
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) return {ErrorCode::kInvalidArgument, fmt::format("secret file {}: read error", path)};
  bytes.resize(read);
  while (!bytes.empty() && (bytes.back() == '\n' || bytes.back() == '\r' || bytes.back() == ' ' ||
                            bytes.back() == '\t')) {
    bytes.pop_back();
  }
  if (bytes.empty()) {
    return {ErrorCode::kInvalidArgument,
            fmt::format("secret file {} is empty; put the cluster's secret in it (for example "
                        "`head -c 32 /dev/urandom | base64 > {}`) and copy it to every machine",
                        path, path)};
  }
  if ((info.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    *warning = fmt::format("secret file {} may be read by other users (mode {:o}); `chmod 600 {}`",
                           path, info.st_mode & 0777, path);
  }
  *key = clusterKeyFromSecret(bytes);
  sodium_memzero(bytes.data(), bytes.size());
  return {};
}

static_assert(crypto_scalarmult_BYTES == kHandshakeNonceBytes);
static_assert(crypto_scalarmult_SCALARBYTES == sizeof(EphemeralKey::secret_key));
static_assert(crypto_scalarmult_BYTES == kKeyAgreementBytes);

EphemeralKey::~EphemeralKey() {
  sodium_memzero(secret_key.data(), secret_key.size());
}

EphemeralKey newEphemeralKey() {
  initSodium();
  std::array<uint8_t, 32> secret{};
  randombytes_buf(secret.data(), secret.size());
  EphemeralKey key = ephemeralKeyFrom(secret);
  sodium_memzero(secret.data(), secret.size());
  return key;
}

EphemeralKey ephemeralKeyFrom(const std::array<uint8_t, 32>& secret_key) {
  initSodium();
  EphemeralKey key;
  key.secret_key = secret_key;
  // Clamping is part of X25519 (libsodium clamps inside crypto_scalarmult*).
  crypto_scalarmult_base(key.public_key.data(), key.secret_key.data());
  return key;
}

std::optional<KeyAgreement> agreeOnKey(const EphemeralKey& own,
                                       std::span<const uint8_t> their_public) {
  initSodium();
  if (their_public.size() != kHandshakeNonceBytes) return std::nullopt;
  KeyAgreement agreement{};
  // -1 when the result is all zeros: `their_public` is a point of small order.
  if (crypto_scalarmult(agreement.data(), own.secret_key.data(), their_public.data()) != 0) {
    return std::nullopt;
  }
  return agreement;
}

HandshakeMac handshakeMac(const ClusterKey& key, HandshakeRole prover, const std::string& cluster,
                          uint32_t from, uint32_t to, std::span<const uint8_t> their_nonce,
                          std::span<const uint8_t> own_nonce) {
  initSodium();
  std::vector<uint8_t> message;
  const char* label = prover == HandshakeRole::kAcceptor ? "chorus accept" : "chorus dial";
  message.insert(message.end(), label, label + std::strlen(label) + 1);
  appendU32(message, static_cast<uint32_t>(cluster.size()));
  message.insert(message.end(), cluster.begin(), cluster.end());
  appendU32(message, from);
  appendU32(message, to);
  appendU32(message, static_cast<uint32_t>(their_nonce.size()));
  message.insert(message.end(), their_nonce.begin(), their_nonce.end());
  appendU32(message, static_cast<uint32_t>(own_nonce.size()));
  message.insert(message.end(), own_nonce.begin(), own_nonce.end());
  static_assert(crypto_auth_hmacsha256_BYTES == kHandshakeMacBytes);
  static_assert(crypto_auth_hmacsha256_KEYBYTES == kClusterKeyBytes);
  HandshakeMac mac{};
  crypto_auth_hmacsha256(mac.data(), message.data(), message.size(), key.data());
  return mac;
}

namespace {

SessionKey directionKey(const ClusterKey& key, const char* direction, const std::string& cluster,
                        uint32_t dialer, uint32_t acceptor, std::span<const uint8_t> dialer_nonce,
                        std::span<const uint8_t> acceptor_nonce, const KeyAgreement& agreement) {
  std::vector<uint8_t> message;
  // v2 (protocol version 5): the X25519 agreement is part of the derivation.
  const char* label = "chorus frames v2";
  message.insert(message.end(), label, label + std::strlen(label) + 1);
  message.insert(message.end(), direction, direction + std::strlen(direction) + 1);
  appendU32(message, static_cast<uint32_t>(cluster.size()));
  message.insert(message.end(), cluster.begin(), cluster.end());
  appendU32(message, dialer);
  appendU32(message, acceptor);
  appendU32(message, static_cast<uint32_t>(dialer_nonce.size()));
  message.insert(message.end(), dialer_nonce.begin(), dialer_nonce.end());
  appendU32(message, static_cast<uint32_t>(acceptor_nonce.size()));
  message.insert(message.end(), acceptor_nonce.begin(), acceptor_nonce.end());
  // Keyed with K: a holder of the agreement alone (an attacker who broke X25519, or an end that
  // skipped the MACs) still needs the secret; a holder of K alone needs the agreement.
  message.insert(message.end(), agreement.begin(), agreement.end());
  SessionKey out{};
  crypto_generichash(out.data(), out.size(), message.data(), message.size(), key.data(),
                     key.size());
  sodium_memzero(message.data(), message.size());
  return out;
}

}  // namespace

SessionKeys sessionKeys(const ClusterKey& key, HandshakeRole self, const std::string& cluster,
                        uint32_t dialer, uint32_t acceptor, std::span<const uint8_t> dialer_nonce,
                        std::span<const uint8_t> acceptor_nonce, const KeyAgreement& agreement) {
  initSodium();
  const SessionKey outbound = directionKey(key, "dialer to acceptor", cluster, dialer, acceptor,
                                           dialer_nonce, acceptor_nonce, agreement);
  const SessionKey inbound = directionKey(key, "acceptor to dialer", cluster, dialer, acceptor,
                                          dialer_nonce, acceptor_nonce, agreement);
  SessionKeys keys;
  keys.send = self == HandshakeRole::kDialer ? outbound : inbound;
  keys.receive = self == HandshakeRole::kDialer ? inbound : outbound;
  return keys;
}

bool handshakeMacMatches(const HandshakeMac& expected, std::span<const uint8_t> received) {
  initSodium();
  return received.size() == expected.size() &&
         sodium_memcmp(expected.data(), received.data(), expected.size()) == 0;
}

}  // namespace chorus::node
