// A fresh folder under the system's temp folder for one test, removed with everything in it
// when the test ends; files are written in the real formats, plain or gzip.
#pragma once

#include <stdlib.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace chorus::ml::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "chorus-ml-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The path of `name` inside the folder.
  std::string file(const std::string& name) const {
    return (std::filesystem::path(path_) / name).string();
  }
  // The folder.
  const std::string& path() const { return path_; }
  // Writes `text` to `name` (gzip-compressed when the name ends in .gz); returns the path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string path = file(name);
    if (name.size() > 3 && name.substr(name.size() - 3) == ".gz") {
      gzFile gz = gzopen(path.c_str(), "wb");
      gzwrite(gz, text.data(), static_cast<unsigned>(text.size()));
      gzclose(gz);
    } else {
      std::ofstream(path, std::ios::binary) << text;
    }
    return path;
  }
  // Removes `name` from the folder.
  void remove(const std::string& name) const { std::filesystem::remove(file(name)); }

 private:
  std::string path_;
};

}  // namespace chorus::ml::testing
