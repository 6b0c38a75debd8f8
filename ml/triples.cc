#include "ml/triples.h"

#include <fmt/format.h>

#include <charconv>
#include <filesystem>
#include <limits>
#include <new>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ml/dataset.h"
#include "ml/text_lines.h"

namespace chorus::ml {

namespace fs = std::filesystem;

namespace {

// Names to dense ids. Frozen: a name not yet known is an error (dictionaries given); open: it
// gets the next id (no dictionaries).
class NameIds {
 public:
  NameIds(std::string what, std::vector<std::string>& names)
      : what_(std::move(what)), names_(names) {}

  // Reads a dictionary: `index<TAB>name` lines, indices 0..n-1 each once, in any order.
  void readDictionary(const std::string& path) {
    TextLines lines(path);
    std::string_view line;
    std::vector<std::string_view> fields;
    // (index, name, where) in file order; placed by index once the count is known, so that an
    // index far beyond the dictionary's size is refused before anything is sized by it.
    struct Entry {
      uint64_t index;
      std::string name;
      std::string where;
    };
    std::vector<Entry> entries;
    while (lines.next(line)) {
      if (trimmed(line).empty()) continue;
      splitFields(line, "\t", fields);
      if (fields.size() != 2) {
        throw DataError(fmt::format("{}expected `index<TAB>name`, found {} tab-separated field{}",
                                    lines.where(), fields.size(), fields.size() == 1 ? "" : "s"));
      }
      const std::string_view indexText = trimmed(fields[0]);
      const std::string_view name = trimmed(fields[1]);
      uint64_t index = 0;
      const auto [end, ec] =
          std::from_chars(indexText.data(), indexText.data() + indexText.size(), index);
      if (ec != std::errc() || end != indexText.data() + indexText.size()) {
        throw DataError(
            fmt::format("{}index '{}' is not a whole number", lines.where(), indexText));
      }
      if (name.empty()) throw DataError(fmt::format("{}empty {} name", lines.where(), what_));
      if (index >= std::numeric_limits<uint32_t>::max()) {
        throw DataError(
            fmt::format("{}index {} is too large (ids are 32-bit)", lines.where(), index));
      }
      entries.push_back({index, std::string(name), lines.where()});
    }
    if (entries.empty()) throw DataError(fmt::format("{}: empty dictionary", path));
    std::vector<std::optional<std::string>> byIndex(entries.size());
    for (Entry& e : entries) {
      if (e.index >= entries.size()) {
        throw DataError(
            fmt::format("{}index {} is out of range: the dictionary has {} entries, "
                        "so its indices must be 0..{}",
                        e.where, e.index, entries.size(), entries.size() - 1));
      }
      if (byIndex[e.index]) {
        throw DataError(fmt::format("{}index {} appears twice (also for '{}')", e.where, e.index,
                                    *byIndex[e.index]));
      }
      auto [it, inserted] = ids_.try_emplace(e.name, static_cast<uint32_t>(e.index));
      if (!inserted) {
        throw DataError(fmt::format("{}{} '{}' appears twice (indices {} and {})", e.where, what_,
                                    e.name, it->second, e.index));
      }
      byIndex[e.index] = std::move(e.name);
    }
    names_.clear();
    names_.reserve(byIndex.size());
    for (auto& name : byIndex)
      names_.push_back(std::move(*name));
    frozen_ = true;
  }

  // The id of `name`; a new id when open, DataError at `lines`' current line when frozen.
  uint32_t idOf(std::string_view name, const TextLines& lines) {
    // Heterogeneous lookup needs C++20 transparent hashing; a key string per lookup is cheap
    // next to reading the line.
    key_.assign(name);
    if (auto it = ids_.find(key_); it != ids_.end()) return it->second;
    if (frozen_) {
      throw DataError(
          fmt::format("{}{} '{}' is not in the {} dictionary", lines.where(), what_, name, what_));
    }
    if (names_.size() >= std::numeric_limits<uint32_t>::max()) {
      throw DataError(fmt::format("{}more than {} {}s (ids are 32-bit)", lines.where(),
                                  std::numeric_limits<uint32_t>::max() - 1, what_));
    }
    const auto id = static_cast<uint32_t>(names_.size());
    ids_.emplace(key_, id);
    names_.push_back(key_);
    return id;
  }

 private:
  std::string what_;
  std::vector<std::string>& names_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::string key_;
  bool frozen_ = false;
};

std::vector<Triple> readSplit(const std::string& path, NameIds& entities, NameIds& relations) {
  TextLines lines(path);
  std::vector<Triple> triples;
  std::string_view line;
  std::vector<std::string_view> fields;
  // A file too large for this machine's memory ends with an error naming it, not a crash.
  try {
    while (lines.next(line)) {
      if (trimmed(line).empty()) continue;
      splitFields(line, "\t", fields);
      if (fields.size() != 3) {
        throw DataError(
            fmt::format("{}expected `head<TAB>relation<TAB>tail`, found {} tab-separated field{}",
                        lines.where(), fields.size(), fields.size() == 1 ? "" : "s"));
      }
      for (auto& field : fields) {
        field = trimmed(field);
        if (field.empty()) throw DataError(fmt::format("{}empty field", lines.where()));
      }
      Triple t;
      t.head = entities.idOf(fields[0], lines);
      t.relation = relations.idOf(fields[1], lines);
      t.tail = entities.idOf(fields[2], lines);
      triples.push_back(t);
    }
  } catch (const std::bad_alloc&) {
    throw DataError(
        fmt::format("{}out of memory after {} triples: the file is too large for this "
                    "machine",
                    lines.where(), triples.size()));
  }
  if (triples.empty()) throw DataError(fmt::format("{}: empty file, no triples", path));
  return triples;
}

bool exists(const std::string& dir, const std::string& name) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / name, ec) ||
         fs::is_regular_file(fs::path(dir) / (name + ".gz"), ec);
}

}  // namespace

KgData readTriples(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw DataError(fmt::format("{}: no such folder", dir));
  KgData data;
  data.source = dir;
  data.name = fs::path(dir).lexically_normal().filename().string();
  if (data.name.empty()) {
    data.name = fs::path(dir).lexically_normal().parent_path().filename().string();
  }
  NameIds entities("entity", data.entityNames);
  NameIds relations("relation", data.relationNames);
  const bool entityDict = exists(dir, "entities.dict");
  const bool relationDict = exists(dir, "relations.dict");
  if (entityDict != relationDict) {
    throw DataError(fmt::format(
        "{}: has {} but not {}: give both dictionaries or neither (then ids follow first "
        "appearance)",
        dir, entityDict ? "entities.dict" : "relations.dict",
        entityDict ? "relations.dict" : "entities.dict"));
  }
  if (entityDict) {
    entities.readDictionary(plainOrGz(dir, "entities.dict"));
    relations.readDictionary(plainOrGz(dir, "relations.dict"));
  }
  data.train = readSplit(plainOrGz(dir, "train.txt"), entities, relations);
  data.valid = readSplit(plainOrGz(dir, "valid.txt"), entities, relations);
  data.test = readSplit(plainOrGz(dir, "test.txt"), entities, relations);
  return data;
}

KgData loadKnowledgeGraph(const std::string& name, const std::string& dataDir) {
  KgData data = readTriples(findDataDir(name, dataDir));
  data.name = name;
  return data;
}

}  // namespace chorus::ml
