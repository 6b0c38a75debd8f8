#include "run/cluster_checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>
#include <xxhash.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "ml/checkpoint.h"
#include "run/training_run.h"

namespace chorus::run {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'C', 'H', 'R', 'S', 'N', 'O', 'D', 'E'};
// magic, version, reserved, total length
constexpr size_t kPrefix = 8 + 4 + 4 + 8;
constexpr size_t kChecksum = 8;
constexpr uint32_t kMaxText = 4096;
constexpr uint32_t kMaxSections = 64;
// A header is read from at most this many bytes (readNodeCheckpointHeader).
constexpr size_t kMaxHeaderBytes = kPrefix + 4 * (4 + kMaxText) + 4 * 4 + 3 * 8;

template <typename T>
void put(std::string& out, T value) {
  static_assert(std::is_trivially_copyable_v<T>);
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only, as ml/checkpoint.h
  out.append(bytes, sizeof(T));
}

void putText(std::string& out, std::string_view text) {
  put<uint32_t>(out, static_cast<uint32_t>(text.size()));
  out.append(text);
}

// Reads fields off a byte range; every read is bounds-checked and names the file.
class Reader {
 public:
  Reader(std::string_view bytes, const std::string& path) : bytes_(bytes), path_(path) {}

  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  std::string text(const char* what) {
    const auto length = get<uint32_t>(what);
    if (length > kMaxText) {
      throw NodeCheckpointError(fmt::format("{}: corrupt node checkpoint ({} of {} bytes): {}",
                                            path_, length, what, kRemedy));
    }
    need(length, what);
    std::string out(bytes_.substr(at_, length));
    at_ += length;
    return out;
  }
  // `count` elements of T, copied out.
  template <typename T>
  std::vector<T> array(uint64_t count, const char* what) {
    if (count > (bytes_.size() - at_) / sizeof(T)) need(bytes_.size() + 1, what);
    std::vector<T> out(count);
    if (count > 0) std::memcpy(out.data(), bytes_.data() + at_, count * sizeof(T));
    at_ += count * sizeof(T);
    return out;
  }
  size_t offset() const { return at_; }

  static constexpr const char* kRemedy =
      "remove this cut's folder to resume from the cut before it";

 private:
  void need(size_t n, const char* what) const {
    if (n > bytes_.size() - at_) {
      throw NodeCheckpointError(
          fmt::format("{}: corrupt node checkpoint: its {} runs past the end "
                      "of its contents; {}",
                      path_, what, kRemedy));
    }
  }

  std::string_view bytes_;
  const std::string& path_;
  size_t at_ = 0;
};

// Up to `limit` bytes of the regular file at `path` (ml::readFileUpTo), or NodeCheckpointError.
std::string readRegularFile(const std::string& path, size_t limit) {
  node::Result<std::string> bytes = ml::readFileUpTo(path, limit);
  if (bytes.ok()) return std::move(bytes).value();
  if (bytes.status().code() == node::ErrorCode::kInvalidArgument) {
    throw NodeCheckpointError(fmt::format(
        "{} (a node checkpoint is a file a node wrote with --checkpoint-every)", bytes.message()));
  }
  throw NodeCheckpointError(fmt::format("node checkpoint: {}", bytes.message()));
}

// The fixed prefix: magic, version and the total length, checked against `available` bytes
// (the file's size). Returns the total length.
uint64_t checkPrefix(Reader& in, size_t available, const std::string& path) {
  if (available < sizeof kMagic) {
    throw NodeCheckpointError(fmt::format("{}: truncated node checkpoint ({} bytes): {}", path,
                                          available, Reader::kRemedy));
  }
  const auto magic = in.get<uint64_t>("magic");
  if (std::memcmp(&magic, kMagic, sizeof kMagic) != 0) {
    throw NodeCheckpointError(fmt::format(
        "{}: not a chorus node checkpoint (bad magic; a cut folder holds the files nodes wrote "
        "with --checkpoint-every)",
        path));
  }
  if (available < kPrefix) {
    throw NodeCheckpointError(fmt::format("{}: truncated node checkpoint ({} bytes): {}", path,
                                          available, Reader::kRemedy));
  }
  const auto version = in.get<uint32_t>("version");
  if (version > kNodeCheckpointVersion || version == 0) {
    throw NodeCheckpointError(
        fmt::format("{}: node checkpoint format version {}, and this chorus reads version {}: "
                    "resume with the chorus build that wrote it",
                    path, version, kNodeCheckpointVersion));
  }
  (void)in.get<uint32_t>("reserved field");
  return in.get<uint64_t>("length");
}

NodeCheckpointHeader readHeader(Reader& in) {
  NodeCheckpointHeader h;
  h.cluster = in.text("cluster name");
  h.node = in.get<uint32_t>("node id");
  h.nodes = in.get<uint32_t>("node count");
  h.mode = in.text("mode");
  h.model = in.text("model");
  h.fingerprint = in.get<uint64_t>("model fingerprint");
  h.cut = in.get<int64_t>("cut");
  h.seed = in.get<uint64_t>("seed");
  return h;
}

}  // namespace

uint64_t modelFingerprint(std::string_view model_spec, size_t parameters) {
  std::string text(model_spec);
  put<uint64_t>(text, parameters);
  return XXH3_64bits(text.data(), text.size());
}

std::string encodeNodeCheckpoint(const NodeCheckpoint& c) {
  const NodeCheckpointHeader& h = c.header;
  for (const std::string* text : {&h.cluster, &h.mode, &h.model}) {
    if (text->size() > kMaxText) {
      throw NodeCheckpointError(fmt::format("node checkpoint field '{}' is longer than {} bytes",
                                            text->substr(0, 40), kMaxText));
    }
  }
  if (c.floats.size() > kMaxSections || c.words.size() > kMaxSections) {
    throw NodeCheckpointError("node checkpoint with too many arrays");
  }
  std::string out;
  out.append(kMagic, sizeof kMagic);
  put<uint32_t>(out, kNodeCheckpointVersion);
  put<uint32_t>(out, 0);
  put<uint64_t>(out, 0);  // the length, set below
  putText(out, h.cluster);
  put<uint32_t>(out, h.node);
  put<uint32_t>(out, h.nodes);
  putText(out, h.mode);
  putText(out, h.model);
  put<uint64_t>(out, h.fingerprint);
  put<int64_t>(out, h.cut);
  put<uint64_t>(out, h.seed);
  put<uint32_t>(out, static_cast<uint32_t>(c.floats.size()));
  for (const auto& [name, values] : c.floats) {
    putText(out, name);
    put<uint64_t>(out, values.size());
    out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
  put<uint32_t>(out, static_cast<uint32_t>(c.words.size()));
  for (const auto& [name, values] : c.words) {
    putText(out, name);
    put<uint64_t>(out, values.size());
    out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(uint64_t));
  }
  const uint64_t total = out.size() + kChecksum;
  std::memcpy(out.data() + 16, &total, sizeof total);
  put<uint64_t>(out, XXH3_64bits(out.data(), out.size()));
  return out;
}

NodeCheckpoint decodeNodeCheckpoint(std::string_view bytes, const std::string& path) {
  Reader in(bytes, path);
  const uint64_t total = checkPrefix(in, bytes.size(), path);
  if (total != bytes.size()) {
    throw NodeCheckpointError(fmt::format(
        "{}: node checkpoint is {} bytes but its header says {} ({}): {}", path, bytes.size(),
        total,
        bytes.size() < total ? "truncated: its node stopped while writing it, or it was cut"
                             : "trailing garbage",
        Reader::kRemedy));
  }
  if (total < kPrefix + kChecksum) {
    throw NodeCheckpointError(fmt::format("{}: corrupt node checkpoint (a length of {} bytes): {}",
                                          path, total, Reader::kRemedy));
  }
  uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - kChecksum, kChecksum);
  const uint64_t actual = XXH3_64bits(bytes.data(), bytes.size() - kChecksum);
  if (stored != actual) {
    throw NodeCheckpointError(
        fmt::format("{}: node checkpoint checksum mismatch (stored {:016x}, computed {:016x}): the "
                    "file is corrupt; {}",
                    path, stored, actual, Reader::kRemedy));
  }
  Reader body(bytes.substr(0, bytes.size() - kChecksum), path);
  (void)checkPrefix(body, bytes.size(), path);
  NodeCheckpoint c;
  c.header = readHeader(body);
  c.header.version = kNodeCheckpointVersion;
  auto sections = [&](auto& into, const char* kind) {
    using T = typename std::decay_t<decltype(into)>::mapped_type::value_type;
    const auto count = body.get<uint32_t>(kind);
    if (count > kMaxSections) {
      throw NodeCheckpointError(fmt::format("{}: corrupt node checkpoint ({} {} arrays): {}", path,
                                            count, kind, Reader::kRemedy));
    }
    for (uint32_t i = 0; i < count; ++i) {
      std::string name = body.text("array name");
      const auto length = body.get<uint64_t>("array length");
      std::vector<T> values = body.array<T>(length, "array");
      if (!into.emplace(std::move(name), std::move(values)).second) {
        throw NodeCheckpointError(
            fmt::format("{}: corrupt node checkpoint (an array twice): {}", path, Reader::kRemedy));
      }
    }
  };
  sections(c.floats, "float");
  sections(c.words, "integer");
  if (body.offset() != bytes.size() - kChecksum) {
    throw NodeCheckpointError(
        fmt::format("{}: corrupt node checkpoint ({} bytes after its last array): {}", path,
                    bytes.size() - kChecksum - body.offset(), Reader::kRemedy));
  }
  // The checksum says the file is as written, not that a run wrote it: meaning checks follow.
  if (c.header.cut <= 0 || c.header.cut > ml::kMaxCheckpointStep || c.header.nodes == 0 ||
      c.header.node >= c.header.nodes) {
    throw NodeCheckpointError(
        fmt::format("{}: node checkpoint of node {} of {} at cut {}, which no run writes: {}", path,
                    c.header.node, c.header.nodes, c.header.cut, Reader::kRemedy));
  }
  return c;
}

NodeCheckpoint loadNodeCheckpoint(const std::string& path) {
  return decodeNodeCheckpoint(readRegularFile(path, std::numeric_limits<size_t>::max()), path);
}

NodeCheckpointHeader readNodeCheckpointHeader(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  const std::string bytes = readRegularFile(path, kMaxHeaderBytes);
  Reader in(bytes, path);
  const uint64_t total = checkPrefix(in, bytes.size(), path);
  if (ec || total != size) {
    throw NodeCheckpointError(fmt::format(
        "{}: node checkpoint is {} bytes but its header says {} (truncated: its node stopped "
        "while writing it, or it was cut): {}",
        path, ec ? 0 : size, total, Reader::kRemedy));
  }
  NodeCheckpointHeader header = readHeader(in);
  return header;
}

std::string cutFolder(const std::string& dir, int64_t cut) {
  return (fs::path(dir) / fmt::format("cut-{}", cut)).string();
}

std::string nodeCheckpointPath(const std::string& dir, int64_t cut, NodeId node) {
  return (fs::path(cutFolder(dir, cut)) / fmt::format("node-{}.ckpt", node)).string();
}

namespace {

// The cuts of `dir` (folders named cut-<positive number>), newest first.
std::vector<int64_t> cutsIn(const std::string& dir) {
  std::vector<int64_t> cuts;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("cut-") || !entry.is_directory(ec)) continue;
    int64_t cut = 0;
    const char* first = name.data() + 4;
    const char* last = name.data() + name.size();
    auto [end, error] = std::from_chars(first, last, cut);
    if (error == std::errc() && end == last && cut > 0) cuts.push_back(cut);
  }
  if (ec) {
    throw NodeCheckpointError(
        fmt::format("--resume {}: cannot list the checkpoint folder: {}", dir, ec.message()));
  }
  std::sort(cuts.rbegin(), cuts.rend());
  return cuts;
}

void syncFolder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

std::string writeNodeCheckpoint(const std::string& dir, const NodeCheckpoint& checkpoint,
                                int64_t every) {
  const NodeCheckpointHeader& h = checkpoint.header;
  const std::string folder = cutFolder(dir, h.cut);
  std::error_code ec;
  if (fs::create_directories(folder, ec)) syncFolder(dir);  // the new folder's entry, durable
  if (ec) {
    throw NodeCheckpointError(
        fmt::format("--checkpoint-dir {}: cannot create {}: {}", dir, folder, ec.message()));
  }
  const std::string path = nodeCheckpointPath(dir, h.cut, h.node);
  try {
    ml::writeFileAtomically(path, encodeNodeCheckpoint(checkpoint));
  } catch (const ml::CheckpointError& e) {
    throw NodeCheckpointError(e.what());
  }
  // This node's files of cuts older than the kKeptCuts newest; a folder left empty goes too.
  if (every > 0) {
    for (int64_t cut : cutsIn(dir)) {
      if (cut > h.cut - kKeptCuts * every) continue;
      fs::remove(nodeCheckpointPath(dir, cut, h.node), ec);
      fs::remove(cutFolder(dir, cut), ec);  // only when empty (fails otherwise: fine)
    }
  }
  return path;
}

CutChoice chooseResumeCut(const std::string& dir, uint32_t nodes) {
  CutChoice choice;
  const std::vector<int64_t> cuts = cutsIn(dir);
  for (int64_t cut : cuts) {
    std::vector<NodeId> missing;
    for (NodeId node = 0; node < nodes; ++node) {
      std::error_code ec;
      if (!fs::is_regular_file(nodeCheckpointPath(dir, cut, node), ec)) missing.push_back(node);
    }
    if (missing.empty()) {
      choice.cut = cut;
      return choice;
    }
    choice.skipped.push_back(
        fmt::format("cut {} in {} is incomplete: node(s) {} did not finish it; skipped", cut,
                    cutFolder(dir, cut), fmt::join(missing, ", ")));
  }
  throw NodeCheckpointError(fmt::format(
      "--resume {}: no cut that all {} nodes finished ({}): start without --resume, or point it "
      "at the --checkpoint-dir of this cluster's run",
      dir, nodes,
      cuts.empty() ? std::string("no cut-<step> folders")
                   : fmt::format("incomplete cuts: {}", fmt::join(cuts, ", "))));
}

void checkHeader(const NodeCheckpointHeader& got, const NodeCheckpointHeader& want,
                 const std::string& path) {
  if (got.cluster != want.cluster) {
    throw NodeCheckpointError(
        fmt::format("{}: written by cluster \"{}\", and this is cluster \"{}\": point --resume "
                    "at this cluster's checkpoint folder",
                    path, got.cluster, want.cluster));
  }
  if (got.nodes != want.nodes) {
    throw NodeCheckpointError(
        fmt::format("{}: written by a cluster of {} nodes, and this one has {}: resume with the "
                    "topology the checkpoints were written with",
                    path, got.nodes, want.nodes));
  }
  if (got.node != want.node) {
    throw NodeCheckpointError(fmt::format(
        "{}: holds node {}'s state, not node {}'s (a file copied or renamed): put node {}'s own "
        "file back, or remove this cut's folder to resume from the cut before it",
        path, got.node, want.node, want.node));
  }
  if (got.mode != want.mode) {
    throw NodeCheckpointError(
        fmt::format("{}: written in {} mode, and this node runs {} mode: resume with --mode {}",
                    path, got.mode, want.mode, got.mode));
  }
  if (got.fingerprint != want.fingerprint || got.model != want.model) {
    throw NodeCheckpointError(fmt::format(
        "{}: for model '{}', and this run builds '{}': resume with the --model, --hidden and "
        "--data the checkpoints were written with",
        path, got.model, want.model));
  }
  if (got.seed != want.seed) {
    throw NodeCheckpointError(fmt::format(
        "{}: written by a run with --seed {}, and this one has --seed {}: resume with the "
        "same --seed (it chose the shards and the shuffling)",
        path, got.seed, want.seed));
  }
  if (want.cut != 0 && got.cut != want.cut) {
    throw NodeCheckpointError(
        fmt::format("{}: says cut {}, but lies in the folder of cut {} (a file moved): put it "
                    "back, or remove this cut's folder",
                    path, got.cut, want.cut));
  }
}

void addCheckpointOptions(CLI::App& cmd, RunOptions& o) {
  cmd.add_option("--checkpoint-every", o.checkpoint_every,
                 "Whole-cluster checkpoints: every N steps (rounds, clocks; epochs for the sparse "
                 "models, whose PS runs need --technique classic or lapse) every node writes its "
                 "state to --checkpoint-dir as one cut, which --resume DIR restarts the whole "
                 "cluster from (docs/checkpoints.md); 0: none")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000'000}))
      ->capture_default_str();
  cmd.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "Folder of the --checkpoint-every cuts (DIR/cut-<step>/node-<id>.ckpt; every "
                 "node of a cluster must see the same folder to resume); default: "
                 "checkpoints/ under --out");
}

std::string checkpointDir(const RunOptions& o) {
  if (o.checkpoint_every <= 0) return {};
  if (!o.checkpoint_dir.empty()) return o.checkpoint_dir;
  if (!o.out_dir.empty()) return (fs::path(o.out_dir) / "checkpoints").string();
  throw std::invalid_argument(
      "--checkpoint-every needs a folder: give --checkpoint-dir DIR, or --out DIR (the cuts then "
      "go to DIR/checkpoints)");
}

void validateCheckpointOptions(const RunOptions& o, bool rejoin) {
  if (o.checkpoint_every < 0) throw std::invalid_argument("--checkpoint-every must be >= 0");
  (void)checkpointDir(o);
  if (rejoin && resumesCluster(o)) {
    throw std::invalid_argument(fmt::format(
        "--resume {} restarts the whole cluster from a cut, --rejoin one node into a running "
        "one: give one of them",
        o.resume_path));
  }
}

bool resumesCluster(const RunOptions& o) {
  std::error_code ec;
  return !o.resume_path.empty() && fs::is_directory(o.resume_path, ec);
}

void planCuts(CutPlan& plan, const RunOptions& options, const NodeCheckpointHeader& header,
              int64_t rounds) {
  plan.dir = checkpointDir(options);
  plan.every = options.checkpoint_every;
  plan.header = header;
  plan.header.cut = 0;
  if (!resumesCluster(options)) return;
  const std::string& dir = options.resume_path;
  const CutChoice choice = chooseResumeCut(dir, header.nodes);
  plan.skipped = choice.skipped;
  NodeCheckpointHeader want = plan.header;
  want.cut = choice.cut;
  // The other nodes' files of the cut: the same run's (their owners check their contents).
  for (NodeId node = 0; node < header.nodes; ++node) {
    if (node == header.node) continue;
    const std::string path = nodeCheckpointPath(dir, choice.cut, node);
    NodeCheckpointHeader other = want;
    other.node = node;
    checkHeader(readNodeCheckpointHeader(path), other, path);
  }
  const std::string path = nodeCheckpointPath(dir, choice.cut, header.node);
  NodeCheckpoint own = loadNodeCheckpoint(path);
  checkHeader(own.header, want, path);
  auto progress = own.words.find(std::string(kProgressSection));
  if (progress == own.words.end() || progress->second.size() != 2 ||
      progress->second[0] != static_cast<uint64_t>(choice.cut) ||
      progress->second[1] > static_cast<uint64_t>(ml::kMaxCheckpointStep)) {
    throw NodeCheckpointError(fmt::format(
        "{}: its progress record (cut, batches drawn) is missing or does not fit cut {}: {}", path,
        choice.cut, Reader::kRemedy));
  }
  if (choice.cut >= rounds) {
    throw NodeCheckpointError(fmt::format(
        "{}: cut {} is at or past this run's last step ({} steps): resume with the --rounds or "
        "--epochs the checkpoints were written with, or more",
        path, choice.cut, rounds));
  }
  plan.resumed = std::move(own);
  plan.resumed_path = path;
}

void prepareCuts(NodeJob& job, const RunOptions& options, const std::string& cluster,
                 std::string_view mode, uint32_t nodes) {
  NodeCheckpointHeader h;
  h.cluster = cluster;
  h.node = job.node_id;
  h.nodes = nodes;
  h.mode = std::string(mode);
  h.model = job.model->spec().toString();
  h.fingerprint = modelFingerprint(h.model, job.model->size());
  h.seed = job.seed;
  planCuts(job.cuts, options, h, job.rounds);
  if (!job.cuts.resumed) return;
  NodeCheckpoint& own = *job.cuts.resumed;
  const std::string& path = job.cuts.resumed_path;
  auto optimizer = own.floats.find(std::string(kOptimizerSection));
  if (optimizer != own.floats.end() && !optimizer->second.empty() &&
      optimizer->second.size() != job.model->size()) {
    throw NodeCheckpointError(
        fmt::format("{}: holds {} optimizer state values for a model of {} parameters: {}", path,
                    optimizer->second.size(), job.model->size(), Reader::kRemedy));
  }
  if (auto params = own.floats.find("params"); params != own.floats.end()) {
    if (params->second.size() != job.model->size()) {
      throw NodeCheckpointError(fmt::format("{}: holds {} parameters, and the model has {}: {}",
                                            path, params->second.size(), job.model->size(),
                                            Reader::kRemedy));
    }
    std::copy(params->second.begin(), params->second.end(), job.model->params().begin());
  }
}

}  // namespace chorus::run
