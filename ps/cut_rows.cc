#include "ps/cut_rows.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "node/finite.h"
#include "run/cluster_checkpoint.h"

namespace chorus::ps {

CutRows copyCutRows(const KeyStore& store, std::span<const Key> keys) {
  CutRows rows;
  rows.keys.assign(keys.begin(), keys.end());
  rows.updates.reserve(keys.size());
  for (Key key : keys) {
    std::optional<KeyEntry> row = store.copyRow(key);  // once per cut: a copy is fine
    if (!row) throw std::logic_error(fmt::format("cut: key {} is not held here", key));
    rows.values.insert(rows.values.end(), row->values.begin(), row->values.end());
    rows.state.insert(rows.state.end(), row->state.begin(), row->state.end());
    rows.updates.push_back(row->updates);
  }
  return rows;
}

void putCutRows(CutRows rows, run::NodeCheckpoint& part) {
  part.words["keys"] = std::move(rows.keys);
  part.words["updates"] = std::move(rows.updates);
  part.floats["values"] = std::move(rows.values);
  part.floats["state"] = std::move(rows.state);
}

void restoreCutRows(KeyStore& store, const run::NodeCheckpoint& cut, const std::string& path,
                    const std::string& remedy) {
  auto fail = [&](const std::string& what) {
    return run::NodeCheckpointError(fmt::format("{}: {}; {}", path, what, remedy));
  };
  auto words = [&](const char* name) -> const std::vector<uint64_t>& {
    auto it = cut.words.find(name);
    if (it == cut.words.end()) throw fail(fmt::format("no '{}' array (not a PS checkpoint)", name));
    return it->second;
  };
  auto floats = [&](const char* name) -> const std::vector<float>& {
    auto it = cut.floats.find(name);
    if (it == cut.floats.end()) {
      throw fail(fmt::format("no '{}' array (not a PS checkpoint)", name));
    }
    return it->second;
  };
  const std::vector<uint64_t>& keys = words("keys");
  const std::vector<uint64_t>& updates = words("updates");
  const std::vector<float>& values = floats("values");
  const std::vector<float>& state = floats("state");
  if (keys != store.ownedKeys() || updates.size() != keys.size()) {
    throw fail(
        fmt::format("holds {} key(s), not the {} this node owns", keys.size(), store.size()));
  }
  size_t value_at = 0, state_at = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    std::optional<KeyEntry> row = store.extract(keys[i]);
    const size_t n = row->values.size(), m = row->state.size();
    if (value_at + n > values.size() || state_at + m > state.size()) {
      throw fail("its values or optimizer state are shorter than its keys' rows");
    }
    std::copy_n(values.begin() + static_cast<ptrdiff_t>(value_at), n, row->values.begin());
    std::copy_n(state.begin() + static_cast<ptrdiff_t>(state_at), m, row->state.begin());
    row->updates = updates[i];
    value_at += n;
    state_at += m;
    if (auto error = store.insert(keys[i], std::move(*row))) throw fail(*error);
  }
  if (value_at != values.size() || state_at != state.size()) {
    throw fail("its values or optimizer state are longer than its keys' rows");
  }
  if (const std::optional<size_t> bad = node::firstNonFinite(values)) {
    throw fail(fmt::format("value {} is not finite", *bad));
  }
}

}  // namespace chorus::ps
