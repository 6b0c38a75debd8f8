#include "ml/kge_workload.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "ml/dataset.h"

namespace chorus::ml {

std::string findTripleDir(const std::string& name, const std::string& dataDir) {
  namespace fs = std::filesystem;
  // A graph findDataDir() knows (wn18rr) follows the data-set location rules of every other
  // data set; any other name is a folder of the user's.
  if (name == "wn18rr") return findDataDir(name, dataDir);
  std::vector<std::pair<fs::path, std::string>> candidates;
  if (!dataDir.empty()) {
    candidates.emplace_back(fs::path(dataDir), "--data-dir");
    candidates.emplace_back(fs::path(dataDir) / name, "--data-dir");
  } else {
    // Read once per call from the trainer thread; nothing in chorus sets the environment.
    if (const char* env = std::getenv("CHORUS_DATA");  // NOLINT(concurrency-mt-unsafe)
        env != nullptr && *env != '\0') {
      candidates.emplace_back(fs::path(env) / name, "$CHORUS_DATA");
    }
    candidates.emplace_back(fs::path(CHORUS_SOURCE_DIR) / "data" / name, "source tree");
  }
  std::vector<std::string> looked;
  for (const auto& [dir, origin] : candidates) {
    std::vector<std::string> missing;
    for (const char* file : {"train.txt", "valid.txt", "test.txt"}) {
      // The sparse-mf branch's reader also reads gzip-compressed splits (data/wn18rr has them).
      if (!fs::is_regular_file(dir / file) &&
          !fs::is_regular_file(dir / (std::string(file) + ".gz"))) {
        missing.emplace_back(file);
      }
    }
    if (missing.empty()) return dir.string();
    looked.push_back(
        fmt::format("  {} ({}): no {}", dir.string(), origin, fmt::join(missing, ", ")));
  }
  throw DataError(fmt::format(
      "knowledge graph '{}' not found. Looked in:\n{}\nA triple folder holds train.txt, "
      "valid.txt and test.txt (head<TAB>relation<TAB>tail per line); pass it with --data-dir. "
      "WN18RR is distributed with the RotatE code "
      "(https://github.com/DeepGraphLearning/KnowledgeGraphEmbedding, data/wn18rr).",
      name, fmt::join(looked, "\n")));
}

namespace {

size_t checkedSize(size_t n, const char* what) {
  if (n == 0) throw std::invalid_argument(fmt::format("the knowledge graph has no {}", what));
  return n;
}

}  // namespace

KgeWorkload::KgeWorkload(const KgData& data, const KgeConfig& config, uint64_t seed)
    : data_(data),
      model_(config, checkedSize(data.entities(), "entities"),
             checkedSize(data.relations(), "relations"), seed),
      known_({data.train, data.valid, data.test}) {}

std::string KgeWorkload::spec() const {
  return model_.config().spec(data_.entities(), data_.relations());
}

std::vector<SparseTable*> KgeWorkload::tables() {
  return {&model_.entities(), &model_.relations()};
}

double KgeWorkload::computeGradients(std::span<const size_t> points, Rng& rng,
                                     std::span<SparseGradAccumulator> grads) {
  drawStep(points, rng);
  return computeDrawnGradients(grads);
}

void KgeWorkload::drawStep(std::span<const size_t> points, Rng& rng) {
  batch_.resize(points.size());
  for (size_t i = 0; i < points.size(); ++i)
    batch_[i] = data_.train[points[i]];
  model_.drawNegatives(batch_, rng);
}

void KgeWorkload::stepRows(std::span<std::vector<RowKey>> rows) {
  model_.stepRows(batch_, rows[0], rows[1]);
}

double KgeWorkload::computeDrawnGradients(std::span<SparseGradAccumulator> grads) {
  return model_.computeDrawnGradients(batch_, grads[0], grads[1]);
}

std::optional<size_t> KgeWorkload::sampledTable() const {
  if (model_.config().allNegatives) return std::nullopt;
  return size_t{0};
}

size_t KgeWorkload::sampledRowsPerStep(size_t points) const {
  return model_.negativeDraws(points);
}

void KgeWorkload::drawStepWith(std::span<const size_t> points, std::span<const RowKey> sampled) {
  if (!sampledTable()) throw std::logic_error("--negatives all samples no rows");
  if (sampled.size() != model_.negativeDraws(points.size())) {
    throw std::invalid_argument(fmt::format("a step of {} triples takes {} negatives, not {}",
                                            points.size(), model_.negativeDraws(points.size()),
                                            sampled.size()));
  }
  batch_.resize(points.size());
  for (size_t i = 0; i < points.size(); ++i)
    batch_[i] = data_.train[points[i]];
  model_.setNegatives(sampled);
}

void KgeWorkload::stepRowsUnsampled(std::span<std::vector<RowKey>> rows) {
  model_.stepRows(batch_, rows[0], rows[1], /*withNegatives=*/false);
}

void KgeWorkload::pointRows(std::span<const size_t> points,
                            std::span<std::vector<RowKey>> rows) const {
  if (model_.config().allNegatives) return;
  std::vector<Triple> batch(points.size());
  for (size_t i = 0; i < points.size(); ++i)
    batch[i] = data_.train[points[i]];
  std::vector<RowKey> relations;
  model_.stepRows(batch, rows[0], relations, /*withNegatives=*/false);
}

std::vector<std::string> KgeWorkload::evalSplits() const {
  if (data_.valid.empty()) return {"test"};
  return {"valid", "test"};
}

KgeRanking KgeWorkload::rank(const std::string& split) const {
  if (split == "valid") return evaluateFiltered(model_, data_.valid, known_);
  if (split == "test") return evaluateFiltered(model_, data_.test, known_);
  throw std::invalid_argument("unknown evaluation split '" + split + "'");
}

std::vector<NamedMetric> KgeWorkload::evaluate(const std::string& split) {
  const KgeRanking r = rank(split);
  return {{"mrr", r.mrr},         {"hits@1", r.hits1},       {"hits@3", r.hits3},
          {"hits@10", r.hits10},  {"mean_rank", r.meanRank}, {"tail_mrr", r.tailMrr},
          {"head_mrr", r.headMrr}};
}

}  // namespace chorus::ml
