#include "train/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>

namespace atl {

namespace {
// Far above any real header (GPT-2 124M's is ~15 KB), far below anything that could exhaust
// memory when a corrupted length is believed.
constexpr uint64_t kMaxHeader = uint64_t{100} << 20;

struct DTypeInfo {
  SafetensorsDType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {SafetensorsDType::kF32, "F32", 4},   {SafetensorsDType::kF64, "F64", 8},
    {SafetensorsDType::kF16, "F16", 2},   {SafetensorsDType::kBF16, "BF16", 2},
    {SafetensorsDType::kBool, "BOOL", 1}, {SafetensorsDType::kU8, "U8", 1},
    {SafetensorsDType::kI8, "I8", 1},     {SafetensorsDType::kI16, "I16", 2},
    {SafetensorsDType::kU16, "U16", 2},   {SafetensorsDType::kI32, "I32", 4},
    {SafetensorsDType::kU32, "U32", 4},   {SafetensorsDType::kI64, "I64", 8},
    {SafetensorsDType::kU64, "U64", 8},
};
constexpr bool InEnumOrder() {
  for (size_t i = 0; i < std::size(kDTypes); ++i)
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  return std::size(kDTypes) == static_cast<size_t>(SafetensorsDType::kU64) + 1;
}
static_assert(InEnumOrder(), "kDTypes: one entry per SafetensorsDType, in the enum's order");
const DTypeInfo& Info(SafetensorsDType d) { return kDTypes[static_cast<int>(d)]; }
}  // namespace

const char* SafetensorsDTypeName(SafetensorsDType d) { return Info(d).name; }
size_t SafetensorsDTypeSize(SafetensorsDType d) { return Info(d).size; }
bool SafetensorsFloat(SafetensorsDType d) {
  return d == SafetensorsDType::kF32 || d == SafetensorsDType::kF64 ||
         d == SafetensorsDType::kF16 || d == SafetensorsDType::kBF16;
}

size_t TensorView::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

void SafetensorsWriter::Add(std::string name, SafetensorsDType dtype, std::vector<int64_t> shape,
                            const void* data) {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  const size_t bytes = n * SafetensorsDTypeSize(dtype);
  entries_.push_back(
      {std::move(name), dtype, std::move(shape), data, data_size_, data_size_ + bytes});
  data_size_ += bytes;
}

std::string SafetensorsWriter::Header() const {
  // ordered_json keeps the tensors in data order, which makes the header readable.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", SafetensorsDTypeName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {e.begin, e.end}}};
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(char((n >> (8 * i)) & 0xff));
  out += json;
  return out;
}

std::string SafetensorsWriter::Serialize() const {
  std::string out = Header();
  out.reserve(out.size() + data_size_);
  for (const auto& e : entries_) out.append(static_cast<const char*>(e.data), e.end - e.begin);
  return out;
}

Status SafetensorsWriter::Write(const std::string& path) const {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError(fmt::format("creating {}: {}", tmp, std::strerror(errno)));
  auto write_all = [&](const void* p, size_t size) -> bool {
    const char* c = static_cast<const char*>(p);
    while (size > 0) {
      ssize_t w = ::write(fd, c, size);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      c += w;
      size -= size_t(w);
    }
    return true;
  };
  const std::string header = Header();
  bool ok = write_all(header.data(), header.size());
  for (const auto& e : entries_) ok = ok && write_all(e.data, e.end - e.begin);
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    return Status::IoError(fmt::format("writing {}: {}", tmp, std::strerror(err)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s =
        Status::IoError(fmt::format("renaming {} to {}: {}", tmp, path, std::strerror(errno)));
    ::unlink(tmp.c_str());
    return s;
  }
  const auto parent = std::filesystem::path(path).parent_path();
  return SyncDir(parent.empty() ? "." : parent.string());
}

StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  auto mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  SafetensorsFile f;
  ATOLL_ASSIGN_OR_RETURN(
      f,
      Parse(std::string_view(reinterpret_cast<const char*>(mapped->data()), mapped->size()), path));
  f.file_ = std::move(*mapped);  // the views point into the mapping, which a move keeps
  return f;
}

StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string_view bytes, const std::string& name) {
  auto bad = [&](const std::string& what) {
    return Status::Corruption(fmt::format("{}: {}", name, what));
  };
  if (bytes.size() < 8)
    return bad(
        fmt::format("{} bytes is too short for a safetensors header (truncated?)", bytes.size()));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  if (n > kMaxHeader || n > bytes.size() - 8)
    return bad(
        fmt::format("header length {} exceeds the file's {} bytes (truncated?)", n, bytes.size()));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, n));
  } catch (const nlohmann::json::exception& e) {
    return bad(fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) return bad("header is not a JSON object");
  const uint8_t* data = reinterpret_cast<const uint8_t*>(bytes.data()) + 8 + n;
  const size_t data_size = bytes.size() - 8 - n;

  SafetensorsFile f;
  f.path_ = name;
  struct Span {
    uint64_t begin, end;
  };
  std::vector<Span> spans;
  for (const auto& [key, info] : header.items()) {
    if (key == "__metadata__") {
      if (!info.is_object()) return bad("__metadata__ is not an object");
      for (const auto& [mk, mv] : info.items()) {
        if (!mv.is_string()) return bad(fmt::format("__metadata__.{} is not a string", mk));
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    auto bad_tensor = [&, &key = key](const std::string& what) {
      return bad(fmt::format("tensor {}: {}", key, what));
    };
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets"))
      return bad_tensor("entry needs dtype, shape and data_offsets");
    TensorView t;
    t.name = key;
    const auto& dt = info["dtype"];
    const DTypeInfo* known = nullptr;
    for (const DTypeInfo& d : kDTypes)
      if (dt == d.name) known = &d;
    if (known == nullptr) return bad_tensor(fmt::format("unsupported dtype {}", dt.dump()));
    t.dtype = known->dtype;
    const auto& shape = info["shape"];
    if (!shape.is_array()) return bad_tensor("shape is not an array");
    size_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40))
        return bad_tensor(fmt::format("bad dimension {}", d.dump()));
      t.shape.push_back(d.get<int64_t>());
      // Checked before multiplying: two dimensions of 2^32 would wrap to 0 elements.
      const size_t dim = d.get<size_t>();
      if (dim != 0 && numel > (size_t{1} << 40) / dim) return bad_tensor("too many elements");
      numel *= dim;
    }
    const auto& off = info["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      return bad_tensor("data_offsets is not [begin, end]");
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e) return bad_tensor(fmt::format("data_offsets [{}, {}) run backwards", b, e));
    if (e - b != numel * SafetensorsDTypeSize(t.dtype))
      return bad_tensor(fmt::format("{} bytes for shape {} of {} (expected {})", e - b,
                                    shape.dump(), SafetensorsDTypeName(t.dtype),
                                    numel * SafetensorsDTypeSize(t.dtype)));
    t.size = e - b;
    t.data = nullptr;
    spans.push_back({b, e});
    f.tensors_.push_back(std::move(t));
  }
  // In data order, the tensors tile the data region exactly: no overlap, no hole, nothing past
  // the end (a truncated file names the first tensor it cut), no trailing bytes.
  std::vector<size_t> order(spans.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return spans[a].begin < spans[b].begin; });
  std::vector<TensorView> sorted;
  uint64_t expect = 0;
  for (size_t i : order) {
    TensorView& t = f.tensors_[i];
    if (spans[i].end > data_size)
      return bad(
          fmt::format("tensor {}: data_offsets [{}, {}) outside the {} data bytes "
                      "(truncated?)",
                      t.name, spans[i].begin, spans[i].end, data_size));
    if (spans[i].begin != expect)
      return bad(fmt::format("tensor {}: starts at byte {}, expected {} (overlap or hole)", t.name,
                             spans[i].begin, expect));
    t.data = data + spans[i].begin;
    expect = spans[i].end;
    sorted.push_back(std::move(t));
  }
  if (expect != data_size)
    return bad(fmt::format("{} bytes after the last tensor", data_size - expect));
  f.tensors_ = std::move(sorted);
  return f;
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace atl
