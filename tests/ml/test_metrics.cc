// JSON-lines metrics and the progress reporter.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "ml/metrics.h"

namespace chorus::ml {
namespace {

TEST(Metrics, OneJsonObjectPerLineWithEscaping) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("chorus-metrics-" + std::to_string(::getpid())))
          .string();
  {
    MetricsWriter writer(path);
    writer.write(MetricsEvent("step").add("epoch", 1).add("loss", 0.5).add("note", "a\"b\n"));
    writer.write(MetricsEvent("summary")
                     .add("loss", std::nan(""))
                     .addBool("done", true)
                     .addRaw("confusion", "[1,2]"));
  }
  std::ifstream in(path);
  std::string first, second, third;
  std::getline(in, first);
  std::getline(in, second);
  EXPECT_FALSE(std::getline(in, third));
  std::filesystem::remove(path);
  EXPECT_EQ(first.rfind("{\"event\":\"step\",\"time\":", 0), 0u) << first;
  EXPECT_NE(first.find(",\"epoch\":1,\"loss\":0.5,\"note\":\"a\\\"b\\n\"}"), std::string::npos)
      << first;
  EXPECT_NE(second.find("\"loss\":null,\"done\":true,\"confusion\":[1,2]}"), std::string::npos)
      << second;
}

// A rejoining node appends to its earlier life's file; a new run starts the file afresh.
TEST(Metrics, AppendKeepsEarlierLinesAndTruncateDropsThem) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("chorus-metrics-append-" + std::to_string(::getpid())))
                               .string();
  auto lines = [&] {
    std::ifstream in(path);
    size_t n = 0;
    for (std::string line; std::getline(in, line);)
      ++n;
    return n;
  };
  { MetricsWriter(path).write(MetricsEvent("first")); }
  { MetricsWriter(path, true).write(MetricsEvent("second")); }
  EXPECT_EQ(lines(), 2u);
  { MetricsWriter(path).write(MetricsEvent("new run")); }
  EXPECT_EQ(lines(), 1u);
  std::filesystem::remove(path);
}

TEST(Metrics, UnwritablePathIsAnError) {
  EXPECT_THROW(MetricsWriter("/nonexistent/chorus/metrics.jsonl"), std::runtime_error);
  MetricsWriter disabled("");
  EXPECT_FALSE(disabled.enabled());
  EXPECT_NO_THROW(disabled.write(MetricsEvent("x")));
}

TEST(Progress, PlainModePrintsLinesAndLiveModeRedraws) {
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buffer, &size);
  {
    ProgressReporter plain(out, false, std::chrono::hours(1));
    plain.update("first");
    plain.update("second (suppressed by the interval)");
    plain.line("epoch done");
  }
  std::fflush(out);
  EXPECT_EQ(std::string(buffer, size), "first\nepoch done\n");
  std::fclose(out);
  std::free(buffer);

  out = open_memstream(&buffer, &size);
  {
    ProgressReporter live(out, true);
    live.update("step 1");
    live.line("epoch done");
    live.update("step 2");
    live.finish();
  }
  std::fflush(out);
  EXPECT_EQ(std::string(buffer, size), "\rstep 1\x1b[K\r\x1b[Kepoch done\n\rstep 2\x1b[K\n");
  std::fclose(out);
  std::free(buffer);
}

}  // namespace
}  // namespace chorus::ml
