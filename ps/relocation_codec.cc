#include "ps/relocation_codec.h"

#include <fmt/format.h>

#include <type_traits>

namespace chorus::ps {

namespace {

// Notice kinds of RelocNotice.
enum NoticeKind : uint8_t {
  kAccepted = 0,
  kTransferLost = 1,
  kRowLost = 2,
  kTransferQuery = 3,
  kNoHandOver = 4,
  kOpLost = 5,
};

template <class T>
const T& as(const RelocationBody& body) {
  return std::get<T>(body);
}

template <class V>
size_t sizeOf(const V* v) {
  return v == nullptr ? 0 : v->size();
}

// Every vector given has `n` entries.
template <class... V>
bool allSized(size_t n, const V*... vectors) {
  return ((sizeOf(vectors) == n) && ...);
}

std::optional<std::string> keysInSpace(const flatbuffers::Vector<uint64_t>* keys,
                                       const KeySpace& space, size_t& floats) {
  floats = 0;
  for (const uint64_t key : *keys) {
    if (!space.contains(key)) {
      return fmt::format("key {} is outside the key space (keys 0-{})", key, space.keyEnd());
    }
    floats += space.length(key);
  }
  return std::nullopt;
}

std::vector<float> slice(const flatbuffers::Vector<float>* values, size_t& at, size_t n) {
  std::vector<float> out(values->begin() + static_cast<std::ptrdiff_t>(at),
                         values->begin() + static_cast<std::ptrdiff_t>(at + n));
  at += n;
  return out;
}

}  // namespace

int relocationBatchKind(const RelocationBody& body) {
  if (std::holds_alternative<LocalizeAccepted>(body)) return 100 + kAccepted;
  if (std::holds_alternative<TransferLost>(body)) return 100 + kTransferLost;
  if (std::holds_alternative<RowLost>(body)) return 100 + kRowLost;
  if (std::holds_alternative<TransferQuery>(body)) return 100 + kTransferQuery;
  if (std::holds_alternative<NoHandOver>(body)) return 100 + kNoHandOver;
  if (std::holds_alternative<OpLost>(body)) return 100 + kOpLost;
  return static_cast<int>(body.index());
}

wire::Body relocationWireBody(const RelocationBody& first) {
  return std::visit(
      [](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, LocalizeRequest>) return wire::Body::RelocLocalize;
        if constexpr (std::is_same_v<T, HandOver>) return wire::Body::RelocHandOver;
        if constexpr (std::is_same_v<T, Transfer>) return wire::Body::RelocTransfer;
        if constexpr (std::is_same_v<T, KeyPush>) return wire::Body::RelocPush;
        if constexpr (std::is_same_v<T, KeyPull>) return wire::Body::RelocPull;
        if constexpr (std::is_same_v<T, PushApplied>) return wire::Body::RelocPushApplied;
        if constexpr (std::is_same_v<T, PullAnswer>) return wire::Body::RelocPullAnswer;
        if constexpr (std::is_same_v<T, Refusal>) return wire::Body::RelocRefusal;
        return wire::Body::RelocNotice;
      },
      first);
}

bool isRelocationWireBody(wire::Body body) {
  switch (body) {
    case wire::Body::RelocLocalize:
    case wire::Body::RelocHandOver:
    case wire::Body::RelocTransfer:
    case wire::Body::RelocPush:
    case wire::Body::RelocPull:
    case wire::Body::RelocPushApplied:
    case wire::Body::RelocPullAnswer:
    case wire::Body::RelocRefusal:
    case wire::Body::RelocNotice:
      return true;
    default:
      return false;
  }
}

flatbuffers::Offset<void> writeRelocation(flatbuffers::FlatBufferBuilder& b,
                                          std::span<const RelocationBody> messages) {
  std::vector<uint64_t> keys, versions, ops, more;
  std::vector<uint32_t> nodes;
  std::vector<int64_t> clocks;
  std::vector<float> values, state;
  for (const RelocationBody& body : messages)
    keys.push_back(relocationKey(body));
  const wire::Body kind = relocationWireBody(messages.front());
  switch (kind) {
    case wire::Body::RelocLocalize:
      return wire::CreateRelocLocalizeDirect(b, &keys).Union();
    case wire::Body::RelocHandOver:
      for (const RelocationBody& body : messages) {
        const auto& m = as<HandOver>(body);
        nodes.push_back(m.to);
        versions.push_back(m.version);
        more.push_back(m.from_version);
      }
      return wire::CreateRelocHandOverDirect(b, &keys, &nodes, &versions, &more).Union();
    case wire::Body::RelocTransfer:
      for (const RelocationBody& body : messages) {
        const auto& m = as<Transfer>(body);
        versions.push_back(m.version);
        more.push_back(m.row.updates);
        values.insert(values.end(), m.row.values.begin(), m.row.values.end());
        nodes.push_back(static_cast<uint32_t>(m.row.state.size()));
        state.insert(state.end(), m.row.state.begin(), m.row.state.end());
      }
      return wire::CreateRelocTransferDirect(b, &keys, &versions, &more, &values, &nodes, &state)
          .Union();
    case wire::Body::RelocPush:
      for (const RelocationBody& body : messages) {
        const auto& m = as<KeyPush>(body);
        nodes.push_back(m.origin);
        ops.push_back(m.op);
        clocks.push_back(m.clock);
        values.insert(values.end(), m.grad.begin(), m.grad.end());
      }
      return wire::CreateRelocPushDirect(b, &keys, &nodes, &ops, &clocks, &values).Union();
    case wire::Body::RelocPull:
      for (const RelocationBody& body : messages) {
        const auto& m = as<KeyPull>(body);
        nodes.push_back(m.origin);
        ops.push_back(m.op);
      }
      return wire::CreateRelocPullDirect(b, &keys, &nodes, &ops).Union();
    case wire::Body::RelocPushApplied:
      for (const RelocationBody& body : messages) {
        const auto& m = as<PushApplied>(body);
        ops.push_back(m.op);
        nodes.push_back(m.owner);
        versions.push_back(m.version);
      }
      return wire::CreateRelocPushAppliedDirect(b, &keys, &ops, &nodes, &versions).Union();
    case wire::Body::RelocPullAnswer:
      for (const RelocationBody& body : messages) {
        const auto& m = as<PullAnswer>(body);
        ops.push_back(m.op);
        nodes.push_back(m.owner);
        versions.push_back(m.version);
        values.insert(values.end(), m.values.begin(), m.values.end());
      }
      return wire::CreateRelocPullAnswerDirect(b, &keys, &ops, &nodes, &versions, &values).Union();
    case wire::Body::RelocRefusal: {
      std::vector<uint8_t> kinds;
      std::vector<flatbuffers::Offset<flatbuffers::String>> reasons;
      for (const RelocationBody& body : messages) {
        const auto& m = as<Refusal>(body);
        kinds.push_back(static_cast<uint8_t>(m.refused));
        ops.push_back(m.op);
        reasons.push_back(b.CreateString(m.reason));
      }
      return wire::CreateRelocRefusalDirect(b, &kinds, &keys, &ops, &reasons).Union();
    }
    default:
      break;
  }
  // Notices.
  const int notice = relocationBatchKind(messages.front()) - 100;
  for (const RelocationBody& body : messages) {
    std::visit(
        [&](const auto& m) {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, LocalizeAccepted>) {
            versions.push_back(m.version);
            nodes.push_back(m.giver);
          } else if constexpr (std::is_same_v<T, TransferLost> || std::is_same_v<T, RowLost>) {
            versions.push_back(m.version);
            nodes.push_back(m.with);
          } else if constexpr (std::is_same_v<T, TransferQuery> || std::is_same_v<T, NoHandOver>) {
            versions.push_back(m.version);
          } else if constexpr (std::is_same_v<T, OpLost>) {
            ops.push_back(m.op);
            nodes.push_back(m.with);
          }
        },
        body);
  }
  return wire::CreateRelocNoticeDirect(
             b, static_cast<uint8_t>(notice), &keys, versions.empty() ? nullptr : &versions,
             nodes.empty() ? nullptr : &nodes, ops.empty() ? nullptr : &ops)
      .Union();
}

flatbuffers::Offset<void> writeFrameRefusal(flatbuffers::FlatBufferBuilder& b,
                                            const std::string& reason) {
  const std::vector<uint8_t> kinds = {kRefusedFrame};
  const std::vector<uint64_t> zero = {0};
  const std::vector<flatbuffers::Offset<flatbuffers::String>> reasons = {b.CreateString(reason)};
  return wire::CreateRelocRefusalDirect(b, &kinds, &zero, &zero, &reasons).Union();
}

std::optional<std::string> readRelocation(const wire::Message& message, const KeySpace& space,
                                          RelocationFrame& out) {
  std::vector<RelocationBody> got;
  const auto uneven = [](const char* table) {
    return fmt::format("{}: its vectors differ in length", table);
  };
  size_t floats = 0;
  switch (message.body_type()) {
    case wire::Body::RelocLocalize: {
      const auto* m = message.body_as_RelocLocalize();
      if (m->keys() == nullptr) return std::string("RelocLocalize without keys");
      for (const uint64_t key : *m->keys())
        got.emplace_back(LocalizeRequest{key});
      break;
    }
    case wire::Body::RelocHandOver: {
      const auto* m = message.body_as_RelocHandOver();
      const size_t n = sizeOf(m->keys());
      if (n == 0 || !allSized(n, m->to(), m->versions(), m->from_versions())) {
        return uneven("RelocHandOver");
      }
      for (size_t i = 0; i < n; ++i) {
        got.emplace_back(HandOver{m->keys()->Get(i), m->to()->Get(i), m->versions()->Get(i),
                                  m->from_versions()->Get(i)});
      }
      break;
    }
    case wire::Body::RelocTransfer: {
      const auto* m = message.body_as_RelocTransfer();
      const size_t n = sizeOf(m->keys());
      if (n == 0 || !allSized(n, m->versions(), m->updates(), m->state_floats())) {
        return uneven("RelocTransfer");
      }
      if (auto error = keysInSpace(m->keys(), space, floats)) return "RelocTransfer: " + *error;
      if (sizeOf(m->values()) != floats) {
        return fmt::format("RelocTransfer: {} floats of values for rows of {}", sizeOf(m->values()),
                           floats);
      }
      size_t state_total = 0;
      for (const uint32_t s : *m->state_floats())
        state_total += s;
      if (sizeOf(m->state()) != state_total) {
        return fmt::format("RelocTransfer: {} floats of state where the lengths say {}",
                           sizeOf(m->state()), state_total);
      }
      size_t at = 0, state_at = 0;
      for (size_t i = 0; i < n; ++i) {
        const Key key = m->keys()->Get(i);
        Transfer t;
        t.key = key;
        t.version = m->versions()->Get(i);
        t.row.updates = m->updates()->Get(i);
        t.row.values = slice(m->values(), at, space.length(key));
        if (m->state_floats()->Get(i) > 0) {
          t.row.state = slice(m->state(), state_at, m->state_floats()->Get(i));
        }
        got.emplace_back(std::move(t));
      }
      break;
    }
    case wire::Body::RelocPush: {
      const auto* m = message.body_as_RelocPush();
      const size_t n = sizeOf(m->keys());
      if (n == 0 || !allSized(n, m->origins(), m->ops(), m->clocks())) {
        return uneven("RelocPush");
      }
      if (auto error = keysInSpace(m->keys(), space, floats)) return "RelocPush: " + *error;
      if (sizeOf(m->values()) != floats) {
        return fmt::format("RelocPush: {} floats of gradients for rows of {}", sizeOf(m->values()),
                           floats);
      }
      size_t at = 0;
      for (size_t i = 0; i < n; ++i) {
        const Key key = m->keys()->Get(i);
        got.emplace_back(KeyPush{key, m->origins()->Get(i), m->ops()->Get(i), m->clocks()->Get(i),
                                 slice(m->values(), at, space.length(key))});
      }
      break;
    }
    case wire::Body::RelocPull: {
      const auto* m = message.body_as_RelocPull();
      const size_t n = sizeOf(m->keys());
      if (n == 0 || !allSized(n, m->origins(), m->ops())) return uneven("RelocPull");
      for (size_t i = 0; i < n; ++i)
        got.emplace_back(KeyPull{m->keys()->Get(i), m->origins()->Get(i), m->ops()->Get(i)});
      break;
    }
    case wire::Body::RelocPushApplied: {
      const auto* m = message.body_as_RelocPushApplied();
      const size_t n = sizeOf(m->keys());
      if (n == 0 || !allSized(n, m->ops(), m->owners(), m->versions())) {
        return uneven("RelocPushApplied");
      }
      for (size_t i = 0; i < n; ++i) {
        got.emplace_back(PushApplied{m->keys()->Get(i), m->ops()->Get(i), m->owners()->Get(i),
                                     m->versions()->Get(i)});
      }
      break;
    }
    case wire::Body::RelocPullAnswer: {
      const auto* m = message.body_as_RelocPullAnswer();
      const size_t n = sizeOf(m->keys());
      if (n == 0 || !allSized(n, m->ops(), m->owners(), m->versions())) {
        return uneven("RelocPullAnswer");
      }
      if (auto error = keysInSpace(m->keys(), space, floats)) return "RelocPullAnswer: " + *error;
      if (sizeOf(m->values()) != floats) {
        return fmt::format("RelocPullAnswer: {} floats of values for rows of {}",
                           sizeOf(m->values()), floats);
      }
      size_t at = 0;
      for (size_t i = 0; i < n; ++i) {
        const Key key = m->keys()->Get(i);
        got.emplace_back(PullAnswer{key, m->ops()->Get(i), m->owners()->Get(i),
                                    m->versions()->Get(i),
                                    slice(m->values(), at, space.length(key))});
      }
      break;
    }
    case wire::Body::RelocRefusal: {
      const auto* m = message.body_as_RelocRefusal();
      const size_t n = sizeOf(m->keys());
      if (n == 0 || !allSized(n, m->kinds(), m->ops(), m->reasons())) {
        return uneven("RelocRefusal");
      }
      for (size_t i = 0; i < n; ++i) {
        const uint8_t kind = m->kinds()->Get(i);
        const flatbuffers::String* reason = m->reasons()->Get(i);
        const std::string text = reason == nullptr ? std::string() : reason->str();
        if (kind == kRefusedFrame) {
          out.frame_refusals.push_back(text);
          continue;
        }
        if (kind > static_cast<uint8_t>(RefusedKind::kNotice)) {
          return fmt::format("RelocRefusal: unknown refused kind {}", kind);
        }
        got.emplace_back(
            Refusal{static_cast<RefusedKind>(kind), m->keys()->Get(i), m->ops()->Get(i), text});
      }
      break;
    }
    case wire::Body::RelocNotice: {
      const auto* m = message.body_as_RelocNotice();
      const size_t n = sizeOf(m->keys());
      if (n == 0) return std::string("RelocNotice without keys");
      const auto* keys = m->keys();
      switch (m->kind()) {
        case kAccepted:
        case kTransferLost:
        case kRowLost:
          if (!allSized(n, m->versions(), m->nodes())) return uneven("RelocNotice");
          for (size_t i = 0; i < n; ++i) {
            const Key key = keys->Get(i);
            const uint64_t version = m->versions()->Get(i);
            const NodeId node = m->nodes()->Get(i);
            if (m->kind() == kAccepted) {
              got.emplace_back(LocalizeAccepted{key, version, node});
            } else if (m->kind() == kTransferLost) {
              got.emplace_back(TransferLost{key, version, node});
            } else {
              got.emplace_back(RowLost{key, version, node});
            }
          }
          break;
        case kTransferQuery:
        case kNoHandOver:
          if (!allSized(n, m->versions())) return uneven("RelocNotice");
          for (size_t i = 0; i < n; ++i) {
            if (m->kind() == kTransferQuery) {
              got.emplace_back(TransferQuery{keys->Get(i), m->versions()->Get(i)});
            } else {
              got.emplace_back(NoHandOver{keys->Get(i), m->versions()->Get(i)});
            }
          }
          break;
        case kOpLost:
          if (!allSized(n, m->ops(), m->nodes())) return uneven("RelocNotice");
          for (size_t i = 0; i < n; ++i)
            got.emplace_back(OpLost{keys->Get(i), m->ops()->Get(i), m->nodes()->Get(i)});
          break;
        default:
          return fmt::format("RelocNotice: unknown notice kind {}", m->kind());
      }
      break;
    }
    default:
      return fmt::format("{} is not a relocation message", wire::EnumNameBody(message.body_type()));
  }
  for (RelocationBody& body : got)
    out.messages.push_back(std::move(body));
  return std::nullopt;
}

}  // namespace chorus::ps
