#include "core/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace atl {

namespace {
std::string Errno() { return std::strerror(errno); }

std::string DirOf(const std::string& path) {
  auto parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}
}  // namespace

Status SyncDir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Status::IoError(fmt::format("opening directory {}: {}", path, Errno()));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Status::IoError(fmt::format("fsync of directory {}: {}", path, Errno()));
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError(fmt::format("creating {}: {}", tmp, Errno()));
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = Status::IoError(fmt::format("writing {}: {}", tmp, Errno()));
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0) {
    Status s = Status::IoError(fmt::format("fsync of {}: {}", tmp, Errno()));
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Status::IoError(fmt::format("renaming {} to {}: {}", tmp, path, Errno()));
    ::unlink(tmp.c_str());
    return s;
  }
  return SyncDir(DirOf(path));
}

StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(fmt::format("{}: no such file", path));
    return Status::IoError(fmt::format("opening {}: {}", path, Errno()));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = Status::IoError(fmt::format("reading {}: {}", path, Errno()));
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Status::IoError(fmt::format("creating directory {}: {}", path, ec.message()));
  return Status::Ok();
}

Status ReplaceDir(const std::string& from, const std::string& to) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string old;
  if (fs::exists(to, ec)) {
    old = fmt::format("{}.old.{}", to, ::getpid());
    fs::remove_all(old, ec);
    if (::rename(to.c_str(), old.c_str()) != 0)
      return Status::IoError(fmt::format("moving aside {}: {}", to, Errno()));
  }
  if (::rename(from.c_str(), to.c_str()) != 0)
    return Status::IoError(fmt::format("renaming {} to {}: {}", from, to, Errno()));
  ATOLL_RETURN_IF_ERROR(SyncDir(DirOf(to)));
  if (!old.empty()) fs::remove_all(old, ec);
  return Status::Ok();
}

MappedFile::~MappedFile() {
  if (data_ != nullptr && size_ > 0) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(o.data_), size_(o.size_), path_(std::move(o.path_)) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr && size_ > 0) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = o.data_;
    size_ = o.size_;
    path_ = std::move(o.path_);
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(fmt::format("{}: no such file", path));
    return Status::IoError(fmt::format("opening {}: {}", path, Errno()));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Status::IoError(fmt::format("stat of {}: {}", path, Errno()));
  }
  MappedFile m;
  m.path_ = path;
  m.size_ = size_t(st.st_size);
  if (m.size_ > 0) {
    void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      m.size_ = 0;
      return Status::IoError(fmt::format("mmap of {}: {}", path, Errno()));
    }
    m.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return m;
}

}  // namespace atl
