// Minimal stand-in of the sparse-mf branch's reader (see ml/triples.h): drop at merge.
#include "ml/triples.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <unordered_map>

#include "ml/dataset.h"

namespace chorus::ml {

namespace {

using NameIds = std::unordered_map<std::string, uint32_t>;

void readDict(const std::string& path, NameIds& ids, std::vector<std::string>& names) {
  std::ifstream in(path);
  std::string line;
  size_t lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    if (line.empty()) continue;
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) throw DataError(fmt::format("{}:{}: no tab", path, lineNo));
    const std::string name = line.substr(tab + 1);
    if (ids.count(name) != 0 || std::stoul(line.substr(0, tab)) != names.size()) {
      throw DataError(
          fmt::format("{}:{}: indices must be 0, 1, 2, ... with unique names", path, lineNo));
    }
    ids.emplace(name, static_cast<uint32_t>(names.size()));
    names.push_back(name);
  }
}

uint32_t idOf(const std::string& name, NameIds& ids, std::vector<std::string>& names, bool fixed,
              const std::string& where) {
  auto it = ids.find(name);
  if (it != ids.end()) return it->second;
  if (fixed) throw DataError(fmt::format("{}: '{}' is not in the dictionary", where, name));
  ids.emplace(name, static_cast<uint32_t>(names.size()));
  names.push_back(name);
  return static_cast<uint32_t>(names.size() - 1);
}

}  // namespace

KgData readTriples(const std::string& dir) {
  namespace fs = std::filesystem;
  KgData data;
  data.source = dir;
  data.name = fs::path(dir).filename().string();
  if (data.name.empty()) data.name = fs::path(dir).parent_path().filename().string();
  NameIds entityIds, relationIds;
  const bool entityDict = fs::exists(fs::path(dir) / "entities.dict");
  const bool relationDict = fs::exists(fs::path(dir) / "relations.dict");
  if (entityDict) readDict((fs::path(dir) / "entities.dict").string(), entityIds, data.entityNames);
  if (relationDict)
    readDict((fs::path(dir) / "relations.dict").string(), relationIds, data.relationNames);
  for (auto [file, out] : {std::pair{"train.txt", &data.train}, std::pair{"valid.txt", &data.valid},
                           std::pair{"test.txt", &data.test}}) {
    const std::string path = (fs::path(dir) / file).string();
    std::ifstream in(path);
    if (!in)
      throw DataError(fmt::format("{}: cannot open (a triple folder holds {})", path,
                                  "train.txt, valid.txt and test.txt"));
    std::string line;
    size_t lineNo = 0;
    while (std::getline(in, line)) {
      ++lineNo;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) continue;
      const size_t a = line.find('\t');
      const size_t b = a == std::string::npos ? a : line.find('\t', a + 1);
      if (b == std::string::npos || line.find('\t', b + 1) != std::string::npos) {
        throw DataError(fmt::format("{}:{}: expected head<TAB>relation<TAB>tail", path, lineNo));
      }
      const std::string where = fmt::format("{}:{}", path, lineNo);
      Triple t;
      t.head = idOf(line.substr(0, a), entityIds, data.entityNames, entityDict, where);
      t.relation =
          idOf(line.substr(a + 1, b - a - 1), relationIds, data.relationNames, relationDict, where);
      t.tail = idOf(line.substr(b + 1), entityIds, data.entityNames, entityDict, where);
      out->push_back(t);
    }
  }
  if (data.train.empty()) throw DataError(fmt::format("{}/train.txt: no triples", dir));
  return data;
}

}  // namespace chorus::ml
