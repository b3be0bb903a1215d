// Files that a crash cannot corrupt, and read-only mappings.
//
// WriteFileAtomic writes to "<path>.tmp.<pid>", fsyncs it, renames it over <path> and fsyncs
// the directory: a reader sees the old file or the new one, never a torn one.
//
// Thread-safety: functions are thread-safe for distinct paths. MappedFile is immutable after Open.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace atl {

Status WriteFileAtomic(const std::string& path, std::string_view contents);
StatusOr<std::string> ReadFile(const std::string& path);
bool FileExists(const std::string& path);
// mkdir -p.
Status MakeDirs(const std::string& path);
// fsync a directory so a rename inside it is durable.
Status SyncDir(const std::string& path);
// Atomically replaces directory `to` by directory `from` (rename; an old `to` is moved aside
// and removed after the rename). Both on the same file system.
Status ReplaceDir(const std::string& from, const std::string& to);

// A read-only memory mapping of a whole file.
class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  static StatusOr<MappedFile> Open(const std::string& path);
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace atl
