// A temporary folder per test for hand-written metrics files, and the small readers the report
// tests share.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace chorus::report {

class ReportFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("chorus-report-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `text` to DIR/relative, creating its folders.
  void write(const std::filesystem::path& relative, const std::string& text) {
    std::filesystem::create_directories((dir_ / relative).parent_path());
    std::ofstream(dir_ / relative) << text;
  }

  // The whole of DIR/relative ("" when it does not exist).
  std::string read(const std::filesystem::path& relative) const {
    std::ifstream in(dir_ / relative);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  // One metrics line: {FIELDS} and a newline.
  static std::string line(const std::string& fields) { return "{" + fields + "}\n"; }
  // A step line (`step`, or `round` or `clock` as files written before say) at `time`
  // seconds, with more fields after a comma when given.
  static std::string stepLine(const std::string& event, int step, double time,
                              const std::string& more = "") {
    return line("\"event\":\"" + event + "\",\"time\":" + std::to_string(time) + ",\"" + event +
                "\":" + std::to_string(step) + (more.empty() ? "" : "," + more));
  }

  static bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  }

  std::filesystem::path dir_;
};

}  // namespace chorus::report
