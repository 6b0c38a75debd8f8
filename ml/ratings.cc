#include "ml/ratings.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <new>
#include <random>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "ml/dataset.h"
#include "ml/rng.h"
#include "ml/text_lines.h"
#include "sampling/alias_sampler.h"

namespace chorus::ml {

namespace {

// Names to dense ids in order of first appearance.
class DenseIds {
 public:
  explicit DenseIds(const char* what) : what_(what) {}
  uint32_t idOf(std::string_view name, const TextLines& lines) {
    key_.assign(name);
    if (auto it = ids_.find(key_); it != ids_.end()) return it->second;
    if (ids_.size() >= std::numeric_limits<uint32_t>::max()) {
      throw DataError(fmt::format("{}more than {} {}s (ids are 32-bit)", lines.where(),
                                  std::numeric_limits<uint32_t>::max() - 1, what_));
    }
    const auto id = static_cast<uint32_t>(ids_.size());
    ids_.emplace(key_, id);
    return id;
  }
  size_t size() const { return ids_.size(); }

 private:
  const char* what_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::string key_;
};

// A finite number filling all of `text`.
bool parseNumber(std::string_view text, double& value) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() && end == text.data() + text.size() && std::isfinite(value);
}

}  // namespace

RatingsData readRatings(const std::string& path, double testShare, uint64_t seed) {
  if (!(testShare >= 0.0 && testShare < 1.0)) {
    throw std::invalid_argument(fmt::format("the test share must be in [0, 1), not {}", testShare));
  }
  TextLines lines(path);
  RatingsData data;
  data.source = path;
  data.name = std::filesystem::path(path).filename().string();
  DenseIds users("user"), items("item");
  Rng split(mixSeed(seed, 0x5EED));
  std::string_view line;
  std::vector<std::string_view> fields;
  std::string_view separator;
  const char* form = "";
  // A file too large for this machine's memory ends with an error naming it, not a crash.
  try {
    while (lines.next(line)) {
      if (trimmed(line).empty()) continue;
      const bool first = separator.empty();
      if (first) {
        // The first line decides the form for the whole file.
        if (line.find("::") != std::string_view::npos) {
          separator = "::";
          form = "user::item::rating[::timestamp]";
        } else if (line.find(',') == std::string_view::npos && line.find('\t') != line.npos) {
          separator = "\t";
          form = "user<TAB>item<TAB>rating[<TAB>timestamp]";
        } else {
          separator = ",";
          form = "user,item,rating[,timestamp]";
        }
      }
      splitFields(line, separator, fields);
      if (fields.size() != 3 && fields.size() != 4) {
        throw DataError(fmt::format("{}expected {} (3 or 4 fields), found {} field{}",
                                    lines.where(), form, fields.size(),
                                    fields.size() == 1 ? "" : "s"));
      }
      for (auto& field : fields)
        field = trimmed(field);
      double value = 0.0;
      if (!parseNumber(fields[2], value)) {
        if (first && separator != "::") continue;  // the header
        throw DataError(
            fmt::format("{}rating '{}' is not a finite number", lines.where(), fields[2]));
      }
      if (fields[0].empty() || fields[1].empty()) {
        throw DataError(
            fmt::format("{}empty {} field", lines.where(), fields[0].empty() ? "user" : "item"));
      }
      Rating r;
      r.row = users.idOf(fields[0], lines);
      r.col = items.idOf(fields[1], lines);
      r.value = static_cast<float>(value);
      (split.uniform() < testShare ? data.test : data.train).push_back(r);
    }
  } catch (const std::bad_alloc&) {
    throw DataError(
        fmt::format("{}out of memory after {} ratings: the file is too large for this "
                    "machine",
                    lines.where(), data.train.size() + data.test.size()));
  }
  if (data.train.empty() && data.test.empty()) {
    throw DataError(fmt::format("{}: empty file, no ratings", path));
  }
  if (data.train.empty()) {
    throw DataError(
        fmt::format("{}: every rating went to the test part: lower the test share", path));
  }
  data.rows = users.size();
  data.cols = items.size();
  return data;
}

void writeRatingsCsv(const std::string& path, const std::vector<Rating>& ratings) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    throw std::runtime_error(
        fmt::format("{}: cannot write: {}", path, std::generic_category().message(errno)));
  }
  fmt::memory_buffer out;
  fmt::format_to(std::back_inserter(out), "user,item,rating\n");
  bool ok = true;
  for (size_t i = 0; i < ratings.size(); ++i) {
    // {} prints the shortest text that reads back as the same float.
    fmt::format_to(std::back_inserter(out), "{},{},{}\n", ratings[i].row, ratings[i].col,
                   ratings[i].value);
    if (out.size() > (size_t{1} << 20) || i + 1 == ratings.size()) {
      ok = ok && std::fwrite(out.data(), 1, out.size(), file) == out.size();
      out.clear();
    }
  }
  if (ratings.empty()) ok = std::fwrite(out.data(), 1, out.size(), file) == out.size();
  ok = (std::fclose(file) == 0) && ok;
  if (!ok) throw std::runtime_error(fmt::format("{}: write failed (disk full?)", path));
}

uint64_t zipfRatingsBytes(const ZipfRatingsOptions& o) {
  // Saturating: absurd sizes must compare as too large, not wrap around.
  const long double bytes =
      static_cast<long double>(o.cells) * sizeof(Rating) +
      static_cast<long double>(o.rows + o.cols) *
          (static_cast<long double>(std::max(o.rank, 0)) * sizeof(float)  // planted factors
           + 3 * sizeof(double) + sizeof(uint64_t)                        // alias sampler
           + sizeof(uint32_t));                                           // permutation
  return bytes >= 1.8e19L ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(bytes);
}

namespace {

uint64_t physicalMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || size <= 0) return uint64_t{8} << 30;  // unknown: assume 8 GiB
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(size);
}

void validateZipf(const ZipfRatingsOptions& o) {
  constexpr uint64_t kMaxIds = std::numeric_limits<uint32_t>::max();
  if (o.rows == 0 || o.rows > kMaxIds) {
    throw std::invalid_argument(fmt::format("--mf-rows must be in 1..{}, not {}", kMaxIds, o.rows));
  }
  if (o.cols == 0 || o.cols > kMaxIds) {
    throw std::invalid_argument(fmt::format("--mf-cols must be in 1..{}, not {}", kMaxIds, o.cols));
  }
  if (o.cells == 0) throw std::invalid_argument("--mf-cells must be at least 1");
  if (!(o.testShare >= 0.0 && o.testShare < 1.0)) {
    throw std::invalid_argument(fmt::format("--test-share must be in [0, 1), not {}", o.testShare));
  }
  if (o.rank < 1 || o.rank > 4096) {
    throw std::invalid_argument(
        fmt::format("--mf-planted-rank must be in 1..4096, not {}", o.rank));
  }
  if (!(o.rowExponent > 0.0 && o.rowExponent <= 10.0)) {
    throw std::invalid_argument(
        fmt::format("--zipf-row must be in (0, 10], not {}", o.rowExponent));
  }
  if (!(o.colExponent > 0.0 && o.colExponent <= 10.0)) {
    throw std::invalid_argument(
        fmt::format("--zipf-col must be in (0, 10], not {}", o.colExponent));
  }
  if (!(o.noiseSigma >= 0.0 && o.noiseSigma <= 1e6)) {
    throw std::invalid_argument(
        fmt::format("--noise-sigma must be in [0, 1e6], not {}", o.noiseSigma));
  }
  const uint64_t limit = o.memoryLimitBytes != 0 ? o.memoryLimitBytes : physicalMemory() / 10 * 8;
  const uint64_t need = zipfRatingsBytes(o);
  if (need > limit) {
    const long double cellBytes = static_cast<long double>(o.cells) * sizeof(Rating);
    const bool cellsDominate = cellBytes * 2 >= static_cast<long double>(need);
    throw std::invalid_argument(fmt::format(
        "generating {} cells of a {} x {} matrix (planted rank {}) needs {:.3g} GB, more than the "
        "limit of {:.3g} GB{}: lower {}",
        o.cells, o.rows, o.cols, o.rank, static_cast<double>(need) / 1e9,
        static_cast<double>(limit) / 1e9,
        o.memoryLimitBytes != 0 ? "" : " (80% of this machine's memory)",
        cellsDominate ? "--mf-cells (12 bytes per cell)"
                      : "--mf-rows / --mf-cols or --mf-planted-rank"));
  }
}

// A seeded random permutation of 0..n-1: Zipf rank -> id.
std::vector<uint32_t> rankToId(uint64_t n, uint64_t seed) {
  std::vector<uint32_t> ids(n);
  for (uint64_t i = 0; i < n; ++i)
    ids[i] = static_cast<uint32_t>(i);
  Rng rng(seed);
  rng.shuffle(ids.begin(), ids.end());
  return ids;
}

// n x rank entries of N(0, scale^2), row after row.
std::vector<float> plantedFactors(uint64_t n, int rank, double scale, uint64_t seed) {
  std::vector<float> factors(n * static_cast<uint64_t>(rank));
  Rng rng(seed);
  for (float& f : factors)
    f = static_cast<float>(scale * rng.normal());
  return factors;
}

}  // namespace

RatingsData makeZipfRatings(const ZipfRatingsOptions& o) {
  validateZipf(o);
  RatingsData data;
  data.name = "zipf-mf";
  data.source = fmt::format(
      "generated(seed={}, {} x {}, {} cells, zipf {}/{}, planted rank {}, noise sigma {})", o.seed,
      o.rows, o.cols, o.cells, o.rowExponent, o.colExponent, o.rank, o.noiseSigma);
  data.rows = o.rows;
  data.cols = o.cols;
  data.noiseSigma = o.noiseSigma;
  const auto rank = static_cast<size_t>(o.rank);
  // Entries of variance rank^-1/2 make dot(U_i, V_j), a sum of `rank` products of variance
  // 1/rank each, a signal of variance 1.
  const double scale = std::pow(static_cast<double>(o.rank), -0.25);
  const std::vector<float> u = plantedFactors(o.rows, o.rank, scale, mixSeed(o.seed, 1));
  const std::vector<float> v = plantedFactors(o.cols, o.rank, scale, mixSeed(o.seed, 2));
  const std::vector<uint32_t> rowIds = rankToId(o.rows, mixSeed(o.seed, 3));
  const std::vector<uint32_t> colIds = rankToId(o.cols, mixSeed(o.seed, 4));
  const sampling::AliasSampler rowRanks(sampling::zipfWeights(o.rows, o.rowExponent));
  const sampling::AliasSampler colRanks(sampling::zipfWeights(o.cols, o.colExponent));

  // Reserve what the split will need (expected count + 6 standard deviations), so the vectors
  // are never copied while growing.
  const double expectedTest = static_cast<double>(o.cells) * o.testShare;
  const double spread = 6.0 * std::sqrt(expectedTest * (1.0 - o.testShare)) + 16.0;
  const auto testReserve =
      static_cast<uint64_t>(std::min<double>(static_cast<double>(o.cells), expectedTest + spread));
  const auto trainReserve = static_cast<uint64_t>(std::min<double>(
      static_cast<double>(o.cells), static_cast<double>(o.cells) - expectedTest + spread));
  data.train.reserve(trainReserve);
  data.test.reserve(testReserve);

  std::mt19937_64 cellRng(mixSeed(o.seed, 5));  // the engine the alias samplers take
  Rng noise(mixSeed(o.seed, 6));
  Rng split(mixSeed(o.seed, 7));
  for (uint64_t c = 0; c < o.cells; ++c) {
    const uint32_t row = rowIds[rowRanks(cellRng)];
    const uint32_t col = colIds[colRanks(cellRng)];
    const float* ur = u.data() + row * rank;
    const float* vc = v.data() + col * rank;
    double signal = 0.0;
    for (size_t k = 0; k < rank; ++k)
      signal += static_cast<double>(ur[k]) * vc[k];
    Rating r{row, col, static_cast<float>(signal + o.noiseSigma * noise.normal())};
    (split.uniform() < o.testShare ? data.test : data.train).push_back(r);
  }
  return data;
}

}  // namespace chorus::ml
