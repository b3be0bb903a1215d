// Helpers shared by the data tests (header-only; not part of atoll_data's API).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace atl::testing_util {

// Runs every test from the repository root (as ctest does) even when the binary is started from
// elsewhere with ATOLL_SOURCE_DIR set, so that relative paths like .cache/ resolve.
class RepoRootEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (const char* src = std::getenv("ATOLL_SOURCE_DIR"); src != nullptr && src[0] != '\0')
      std::filesystem::current_path(src);
  }
};

// A fresh directory under the system temp directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("atoll_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string path() const { return path_.string(); }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

  // Writes `bytes` verbatim to <dir>/<name> and returns the path.
  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::string p = File(name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace atl::testing_util
