// NvmeDir: a scratch directory for NVMe slot files in tests (never linked
// into production targets).
//
// Thread-safety: none needed; one owner.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace kvtier::testing {

// A directory under the working directory (the build tree: /tmp may be a
// tmpfs, which has no O_DIRECT), named `prefix`-<pid>, removed with its
// contents on destruction.
class NvmeDir {
 public:
  explicit NvmeDir(const std::string& prefix)
      : path_(std::filesystem::current_path() / (prefix + "-" + std::to_string(getpid()))) {
    std::filesystem::create_directories(path_);
  }
  ~NvmeDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  NvmeDir(const NvmeDir&) = delete;
  NvmeDir& operator=(const NvmeDir&) = delete;
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace kvtier::testing
