// The safetensors reader (train/safetensors.h SafetensorsFile::Parse). Every tensor it accepts
// lies inside the file, has numel * dtype size bytes, and a file written back from what was read
// reads back the same.
#include <string>

#include "fuzz/fuzz_util.h"
#include "train/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto file = atl::SafetensorsFile::Parse(bytes, "fuzz.safetensors");
  if (!file.ok()) return 0;
  atl::SafetensorsWriter writer;
  for (const auto& [k, v] : file->metadata()) writer.SetMetadata(k, v);
  for (const atl::TensorView& t : file->tensors()) {
    FUZZ_CHECK(t.data >= data && t.size <= size && t.data - data <= ptrdiff_t(size - t.size));
    FUZZ_CHECK(t.size == t.numel() * atl::SafetensorsDTypeSize(t.dtype));
    FUZZ_CHECK(file->Find(t.name) == &t);
    writer.Add(t.name, t.dtype, t.shape, t.data);
  }
  const std::string written = writer.Serialize();
  auto again = atl::SafetensorsFile::Parse(written, "written.safetensors");
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->tensors().size() == file->tensors().size());
  FUZZ_CHECK(again->metadata() == file->metadata());
  for (size_t i = 0; i < file->tensors().size(); ++i) {
    const atl::TensorView& a = file->tensors()[i];
    const atl::TensorView& b = again->tensors()[i];
    FUZZ_CHECK(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.size == b.size);
    FUZZ_CHECK(std::memcmp(a.data, b.data, a.size) == 0);
  }
  return 0;
}
