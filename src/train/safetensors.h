// Reading and writing safetensors files (https://github.com/huggingface/safetensors#format):
//
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   JSON: {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..],
//             "data_offsets": [begin, end]}, ...}, padded with spaces so the data is 8-aligned
//   rest      the tensors' bytes, little-endian; offsets relative to the start of this region
//
// The reader trusts nothing: the header length, the JSON, every dtype, shape and offset are
// checked (offsets in range, sizes equal to numel * dtype size, tensors neither overlapping nor
// leaving holes), and errors are kCorruption naming the file and the tensor.
//
// Thread-safety: SafetensorsWriter is not thread-safe; a SafetensorsFile is immutable after Open.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/file.h"
#include "core/status.h"

namespace atl {

// The dtypes read and written. atoll writes F32 and F64; F16 and BF16 come in other tools' files
// (Hugging Face checkpoints: train/hf_import.h), and so may integer and boolean tensors (an older
// transformers' attention mask buffers), which a reader skips or refuses by name.
enum class SafetensorsDType {
  kF32,
  kF64,
  kF16,
  kBF16,
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64
};
// Whether d is F32, F64, F16 or BF16.
bool SafetensorsFloat(SafetensorsDType d);
const char* SafetensorsDTypeName(SafetensorsDType d);
size_t SafetensorsDTypeSize(SafetensorsDType d);

// Builds a safetensors file; tensors are laid out in the order they are added. Tensor bytes are
// not copied: they are read when the file is serialized or written.
class SafetensorsWriter {
 public:
  // REQUIRES: data (numel * SafetensorsDTypeSize(dtype) bytes) stays valid until Serialize/Write.
  void Add(std::string name, SafetensorsDType dtype, std::vector<int64_t> shape, const void* data);
  void AddFloats(std::string name, std::vector<int64_t> shape, const float* data) {
    Add(std::move(name), SafetensorsDType::kF32, std::move(shape), data);
  }
  void SetMetadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
  }
  // The complete file, in memory.
  std::string Serialize() const;
  // Writes the file to `path` durably: to a temporary name, fsync, rename, fsync the directory.
  Status Write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    SafetensorsDType dtype;
    std::vector<int64_t> shape;
    const void* data;
    size_t begin, end;
  };
  // The 8-byte length and the padded JSON header.
  std::string Header() const;
  std::vector<Entry> entries_;
  size_t data_size_ = 0;
  std::map<std::string, std::string> metadata_;
};

struct TensorView {
  std::string name;
  SafetensorsDType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data;  // into the mapping; not necessarily aligned (use memcpy)
  size_t size;          // bytes
  size_t numel() const;
};

// A verified, memory-mapped safetensors file.
class SafetensorsFile {
 public:
  static StatusOr<SafetensorsFile> Open(const std::string& path);
  // From bytes already in memory, which must outlive the result; `name` stands for the path in
  // messages.
  static StatusOr<SafetensorsFile> Parse(std::string_view bytes, const std::string& name);

  const std::string& path() const { return path_; }
  // Tensors in data order.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* Find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  MappedFile file_;
  std::string path_;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace atl
