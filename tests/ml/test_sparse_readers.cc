// The sparse data readers on small files in the real formats (knowledge-graph triples with and
// without dictionaries, CSV and MovieLens ratings, plain and gzip), and on malformed variants:
// every error names the file and, where there is one, the line.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "ml/dataset.h"
#include "ml/ratings.h"
#include "ml/sparse_stats.h"
#include "ml/triples.h"
#include "tests/ml/temp_dir.h"

#ifndef CHORUS_SOURCE_DIR
#define CHORUS_SOURCE_DIR "."
#endif

namespace chorus::ml {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

// The DataError message of `f`, or "" when it does not throw one.
template <typename F>
std::string dataError(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_HAS(call, text)                                                          \
  do {                                                                                        \
    const std::string message = dataError([&] { (void)(call); });                             \
    EXPECT_NE(message.find(text), std::string::npos)                                          \
        << "expected a DataError containing \"" << (text) << "\", got \"" << message << "\""; \
  } while (0)

// A small graph: 4 entities, 2 relations, with dictionaries in another order than appearance.
void writeGraph(const TempDir& dir, bool dicts, bool gz = false) {
  const std::string ext = gz ? ".gz" : "";
  dir.write("train.txt" + ext, "a\tlikes\tb\nb\tlikes\tc\n\nc\tknows\ta\n");
  dir.write("valid.txt" + ext, "a\tknows\tc\n");
  dir.write("test.txt" + ext, "d\tlikes\ta\r\n");  // CRLF line end, entity first seen here
  if (dicts) {
    dir.write("entities.dict" + ext, "3\ta\n0\tb\n1\tc\n2\td\n");
    dir.write("relations.dict", "1\tlikes\n0\tknows\n");
  }
}

TEST(ReadTriples, WithoutDictionariesIdsFollowFirstAppearance) {
  TempDir dir;
  writeGraph(dir, false);
  const KgData kg = readTriples(dir.path());
  ASSERT_EQ(kg.entities(), 4u);
  ASSERT_EQ(kg.relations(), 2u);
  EXPECT_EQ(kg.entityNames, (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(kg.relationNames, (std::vector<std::string>{"likes", "knows"}));
  ASSERT_EQ(kg.train.size(), 3u);  // the blank line is skipped
  EXPECT_EQ(kg.train[2], (Triple{2, 1, 0}));
  EXPECT_EQ(kg.valid, (std::vector<Triple>{{0, 1, 2}}));
  EXPECT_EQ(kg.test, (std::vector<Triple>{{3, 0, 0}}));
  EXPECT_EQ(kg.source, dir.path());
}

TEST(ReadTriples, WithDictionariesIdsAreTheirIndicesAndGzipReadsAlike) {
  for (bool gz : {false, true}) {
    TempDir dir;
    writeGraph(dir, true, gz);
    const KgData kg = readTriples(dir.path());
    EXPECT_EQ(kg.entityNames, (std::vector<std::string>{"b", "c", "d", "a"}));
    EXPECT_EQ(kg.relationNames, (std::vector<std::string>{"knows", "likes"}));
    EXPECT_EQ(kg.train[0], (Triple{3, 1, 0}));
    EXPECT_EQ(kg.test[0], (Triple{2, 1, 3}));
  }
}

TEST(ReadTriples, BadInputNamesFileAndLine) {
  {
    TempDir dir;
    writeGraph(dir, false);
    dir.write("train.txt", "a\tlikes\tb\na likes b\n");
    EXPECT_ERROR_HAS(readTriples(dir.path()),
                     "train.txt:2: expected `head<TAB>relation<TAB>tail`, found 1");
    dir.write("train.txt", "a\tlikes\tb\textra\n");
    EXPECT_ERROR_HAS(readTriples(dir.path()), "train.txt:1: expected");
    dir.write("train.txt", "a\t\tb\n");
    EXPECT_ERROR_HAS(readTriples(dir.path()), "train.txt:1: empty field");
    dir.write("train.txt", "");
    EXPECT_ERROR_HAS(readTriples(dir.path()), "train.txt: empty file");
    dir.remove("train.txt");
    EXPECT_ERROR_HAS(readTriples(dir.path()), "train.txt: cannot open");
  }
  {
    TempDir dir;
    writeGraph(dir, true);
    dir.write("valid.txt", "a\tknows\tc\nzebra\tknows\tc\n");
    EXPECT_ERROR_HAS(readTriples(dir.path()),
                     "valid.txt:2: entity 'zebra' is not in the entity dictionary");
    writeGraph(dir, true);
    dir.write("test.txt", "a\thates\tb\n");
    EXPECT_ERROR_HAS(readTriples(dir.path()),
                     "test.txt:1: relation 'hates' is not in the relation");
    writeGraph(dir, true);
    dir.write("entities.dict", "0\ta\n1\tb\n1\tc\n");
    EXPECT_ERROR_HAS(readTriples(dir.path()), "entities.dict:3: index 1 appears twice");
    dir.write("entities.dict", "0\ta\n2\tb\n");
    EXPECT_ERROR_HAS(readTriples(dir.path()),
                     "entities.dict:2: index 2 is out of range: the dictionary has 2 entries");
    // A far index is refused before anything is sized by it (fuzz_triples found the 880 MB).
    dir.write("entities.dict", "0\ta\n22000000\tb\n");
    EXPECT_ERROR_HAS(readTriples(dir.path()), "entities.dict:2: index 22000000 is out of range");
    dir.write("entities.dict", "0\ta\nx\tb\n");
    EXPECT_ERROR_HAS(readTriples(dir.path()), "entities.dict:2: index 'x' is not a whole number");
    dir.write("entities.dict", "0\ta\n1\ta\n");
    EXPECT_ERROR_HAS(readTriples(dir.path()), "entities.dict:2: entity 'a' appears twice");
    dir.write("entities.dict", "");
    EXPECT_ERROR_HAS(readTriples(dir.path()), "entities.dict: empty dictionary");
    dir.remove("relations.dict");
    EXPECT_ERROR_HAS(readTriples(dir.path()), "has entities.dict but not relations.dict");
  }
  {
    // A gzip file cut short.
    TempDir dir;
    writeGraph(dir, false);
    std::string big;
    for (int i = 0; i < 20000; ++i)
      big += "e" + std::to_string(i) + "\tr\te" + std::to_string(i * 7 % 20000) + "\n";
    const std::string path = dir.write("train.txt.gz", big);
    fs::resize_file(path, fs::file_size(path) / 2);
    EXPECT_ERROR_HAS(readTriples(dir.path()), "train.txt.gz: corrupt or truncated gzip data");
  }
  EXPECT_ERROR_HAS(readTriples("/nonexistent/chorus"), "no such folder");
}

TEST(ReadTriples, TheRepositoryHoldsWn18rr) {
  const KgData kg = readTriples(std::string(CHORUS_SOURCE_DIR) + "/data/wn18rr");
  EXPECT_EQ(kg.name, "wn18rr");
  EXPECT_EQ(kg.entities(), 40943u);
  EXPECT_EQ(kg.relations(), 11u);
  EXPECT_EQ(kg.train.size(), 86835u);
  EXPECT_EQ(kg.valid.size(), 3034u);
  EXPECT_EQ(kg.test.size(), 3134u);
  EXPECT_EQ(kg.entityNames[0], "00260881");
  EXPECT_EQ(kg.relationNames[0], "_hypernym");
  EXPECT_EQ(kg.train[0], (Triple{0, 0, 1}));  // 00260881 _hypernym 00260622
  // The skew the data set's README states: the top 1% of entities take about 12% of the
  // entity accesses of the training set, the top 10% about 37%.
  const KgAccessStats stats = kgAccessStats(kg, 0.0);
  const sampling::SkewSummary skew = sampling::skewSummary(stats.entities);
  EXPECT_NEAR(skew.top1, 0.12, 0.02);
  EXPECT_NEAR(skew.top10, 0.37, 0.03);
}

TEST(FindDataDir, KnowsWn18rrAndTheDataDirFlag) {
  TempDir dir;
  fs::create_directories(dir.file("wn18rr"));
  TempDir graph;  // unused name: only the folder layout matters
  for (const char* name : {"train.txt", "valid.txt", "test.txt"})
    std::ofstream(dir.file(std::string("wn18rr/") + name)) << "a\tr\tb\n";
  EXPECT_EQ(findDataDir("wn18rr", dir.path()), dir.file("wn18rr"));
  EXPECT_EQ(findDataDir("wn18rr", dir.file("wn18rr")), dir.file("wn18rr"));
  EXPECT_EQ(loadKnowledgeGraph("wn18rr", dir.path()).train.size(), 1u);
  EXPECT_ERROR_HAS(findDataDir("wn18rr", graph.path()), "data set 'wn18rr' not found");
  // Without --data-dir a build finds the repository's copy (unless $CHORUS_DATA has one).
  if (std::getenv("CHORUS_DATA") == nullptr) {
    EXPECT_EQ(fs::path(findDataDir("wn18rr", "")), fs::path(CHORUS_SOURCE_DIR) / "data" / "wn18rr");
  }
}

TEST(KgAccessStats, UniformNegativesAddNOverEntitiesPerTriple) {
  KgData kg;
  kg.entityNames = {"a", "b", "c", "d"};
  kg.relationNames = {"r", "s"};
  kg.train = {{0, 0, 1}, {0, 0, 2}, {1, 1, 0}};
  const KgAccessStats stats = kgAccessStats(kg, 8.0);
  // Entity 0: 3 data accesses, + 3 triples x 8 draws / 4 entities.
  EXPECT_DOUBLE_EQ(stats.entities[0], 3.0 + 6.0);
  EXPECT_DOUBLE_EQ(stats.entities[3], 6.0);
  EXPECT_DOUBLE_EQ(stats.relations[0], 2.0);
  EXPECT_DOUBLE_EQ(stats.relations[1], 1.0);
  EXPECT_EQ(skewLines(stats).size(), 2u);
}

TEST(ReadRatings, CsvWithHeaderAndMovieLensForms) {
  TempDir dir;
  const std::string csv =
      dir.write("ratings.csv",
                "userId,movieId,rating,timestamp\nu1,m9,4.5,964982703\nu2,m9,3,1\n"
                "u1,m3,-1e-1,1\n");
  RatingsData data = readRatings(csv, 0.0, 1);
  EXPECT_EQ(data.rows, 2u);
  EXPECT_EQ(data.cols, 2u);
  ASSERT_EQ(data.train.size(), 3u);
  EXPECT_TRUE(data.test.empty());
  EXPECT_EQ(data.train[2].row, 0u);
  EXPECT_EQ(data.train[2].col, 1u);
  EXPECT_FLOAT_EQ(data.train[2].value, -0.1f);
  EXPECT_TRUE(std::isnan(data.noiseSigma));
  const std::string ml1m = dir.write("ratings.dat.gz",
                                     "1::1193::5::978300760\n1::661::3::978302109\n"
                                     "2::1193::4::978298413\n");
  data = readRatings(ml1m, 0.0, 1);
  EXPECT_EQ(data.rows, 2u);
  EXPECT_EQ(data.cols, 2u);
  EXPECT_EQ(data.train[2].col, 0u);
  EXPECT_FLOAT_EQ(data.train[2].value, 4.0f);
  // Three fields without a header also read (the first line's rating is a number).
  data = readRatings(dir.write("plain.csv", "a,b,1\nb,a,2\n"), 0.0, 1);
  EXPECT_EQ(data.train.size(), 2u);
}

TEST(ReadRatings, TheTestSplitIsSeededAndHasTheShare) {
  TempDir dir;
  std::string text = "user,item,rating\n";
  for (int i = 0; i < 20000; ++i)
    text += std::to_string(i % 97) + "," + std::to_string(i % 89) + ",1\n";
  const std::string path = dir.write("r.csv", text);
  const RatingsData a = readRatings(path, 0.2, 5), b = readRatings(path, 0.2, 5);
  const RatingsData c = readRatings(path, 0.2, 6);
  EXPECT_EQ(a.test.size(), b.test.size());
  EXPECT_NE(a.test.size(), c.test.size());
  EXPECT_NEAR(static_cast<double>(a.test.size()) / 20000.0, 0.2, 0.015);
  EXPECT_THROW(readRatings(path, 1.0, 1), std::invalid_argument);
}

TEST(ReadRatings, BadInputNamesFileAndLine) {
  TempDir dir;
  EXPECT_ERROR_HAS(readRatings(dir.write("a.csv", "user,item,rating\n1,2,3\n1,2\n"), 0.0, 1),
                   "a.csv:3: expected user,item,rating[,timestamp] (3 or 4 fields), found 2");
  EXPECT_ERROR_HAS(readRatings(dir.write("b.csv", "user,item,rating\n1,2,3\n1,2,good\n"), 0.0, 1),
                   "b.csv:3: rating 'good' is not a finite number");
  EXPECT_ERROR_HAS(readRatings(dir.write("c.csv", "user,item,rating\n1,2,nan\n"), 0.0, 1),
                   "c.csv:2: rating 'nan' is not a finite number");
  EXPECT_ERROR_HAS(readRatings(dir.write("d.csv", "user,item,rating\n,2,3\n"), 0.0, 1),
                   "d.csv:2: empty user field");
  EXPECT_ERROR_HAS(readRatings(dir.write("e.dat", "1::2::3::4::5\n"), 0.0, 1),
                   "e.dat:1: expected user::item::rating[::timestamp] (3 or 4 fields), found 5");
  EXPECT_ERROR_HAS(readRatings(dir.write("f.dat", "1::2::3\n1::2::x\n"), 0.0, 1),
                   "f.dat:2: rating 'x' is not a finite number");
  EXPECT_ERROR_HAS(readRatings(dir.write("g.csv", ""), 0.0, 1), "g.csv: empty file, no ratings");
  EXPECT_ERROR_HAS(readRatings(dir.write("h.csv", "user,item,rating\n"), 0.0, 1),
                   "h.csv: empty file, no ratings");
  EXPECT_ERROR_HAS(readRatings(dir.write("i.csv", std::string("1,2,3\n\0\0\0", 9)), 0.0, 1),
                   "i.csv: holds a NUL byte");
  EXPECT_ERROR_HAS(readRatings(dir.file("missing.csv"), 0.0, 1), "missing.csv: cannot open");
  std::string big;
  for (int i = 0; i < 50000; ++i)
    big += std::to_string(i) + "," + std::to_string(i % 13) + ",3.5\n";
  const std::string gz = dir.write("j.csv.gz", big);
  fs::resize_file(gz, fs::file_size(gz) / 2);
  EXPECT_ERROR_HAS(readRatings(gz, 0.0, 1), "j.csv.gz: corrupt or truncated gzip data");
}

TEST(ReadRatings, WrittenCsvReadsBackExactly) {
  TempDir dir;
  ZipfRatingsOptions o;
  o.rows = 50;
  o.cols = 40;
  o.cells = 500;
  o.rank = 3;
  const RatingsData data = makeZipfRatings(o);
  writeRatingsCsv(dir.file("train.csv"), data.train);
  const RatingsData back = readRatings(dir.file("train.csv"), 0.0, 1);
  ASSERT_EQ(back.train.size(), data.train.size());
  for (size_t i = 0; i < data.train.size(); ++i)
    ASSERT_EQ(back.train[i].value, data.train[i].value) << i;  // bit-exact floats
  EXPECT_THROW(writeRatingsCsv("/nonexistent/chorus/x.csv", data.train), std::runtime_error);
}

}  // namespace
}  // namespace chorus::ml
