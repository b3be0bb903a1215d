#include "data/dataset.h"

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/hash.h"
#include "core/rng.h"

namespace atl {

// The file format is little-endian and tokens are read in place from the mapping.
static_assert(std::endian::native == std::endian::little,
              "token files assume a little-endian host");

namespace {

constexpr char kMagic[8] = {'A', 'T', 'O', 'L', 'T', 'O', 'K', '1'};
constexpr size_t kHeaderSize = 24;

uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

StatusOr<TokenFile> TokenFile::Open(const std::string& path) {
  TokenFile f;
  ATOLL_ASSIGN_OR_RETURN(f.file_, MappedFile::Open(path));
  // The mapping is page-aligned and the header 24 bytes, so the tokens are 2-byte aligned.
  ATOLL_ASSIGN_OR_RETURN(f.tokens_,
                         ParseTokenFile({f.file_.data(), f.file_.size()}, path, &f.checksum_));
  return f;
}

StatusOr<std::span<const uint16_t>> ParseTokenFile(std::span<const uint8_t> bytes,
                                                   const std::string& path, uint64_t* checksum) {
  const uint8_t* data = bytes.data();
  const size_t size = bytes.size();
  if (size < kHeaderSize)
    return Status::Corruption(
        fmt::format("token file {}: {} bytes, shorter than the {}-byte header (truncated?)", path,
                    size, kHeaderSize));
  if (std::memcmp(data, kMagic, sizeof kMagic) != 0)
    return Status::Corruption(
        fmt::format("token file {}: bad magic (expected ATOLTOK1; not a token file?)", path));
  const uint64_t count = LoadU64(data + 8);
  const uint64_t stored_checksum = LoadU64(data + 16);
  const uint64_t payload = size - kHeaderSize;
  if (count > payload / 2 || payload != count * 2)
    return Status::Corruption(fmt::format(
        "token file {}: header says {} tokens ({} bytes) but {} bytes follow the header{}", path,
        count, count * 2, payload, payload < count * 2 ? " (truncated)" : ""));
  *checksum = Hash64(data + kHeaderSize, payload);
  if (*checksum != stored_checksum)
    return Status::Corruption(
        fmt::format("token file {}: checksum mismatch (header {}, tokens hash to {}): corrupted",
                    path, HashToHex(stored_checksum), HashToHex(*checksum)));
  return std::span<const uint16_t>(reinterpret_cast<const uint16_t*>(data + kHeaderSize),
                                   size_t(count));
}

Status WriteTokenFile(const std::string& path, std::span<const uint16_t> tokens) {
  const size_t bytes = tokens.size() * sizeof(uint16_t);
  std::string contents(kHeaderSize + bytes, '\0');
  const uint64_t count = tokens.size();
  const uint64_t checksum = Hash64(tokens.data(), bytes);
  std::memcpy(contents.data(), kMagic, sizeof kMagic);
  std::memcpy(contents.data() + 8, &count, sizeof count);
  std::memcpy(contents.data() + 16, &checksum, sizeof checksum);
  if (bytes > 0) std::memcpy(contents.data() + kHeaderSize, tokens.data(), bytes);
  return WriteFileAtomic(path, contents).WithContext("writing token file");
}

Sampler::Sampler(std::span<const uint16_t> tokens, uint64_t seed, int seq_len)
    : tokens_(tokens), seed_(seed), seq_len_(seq_len) {
  if (seq_len <= 0 || tokens.size() <= size_t(seq_len)) {
    // A violated REQUIRES is a bug in the caller, which must validate data against the config.
    std::fprintf(stderr,
                 "atoll: Sampler needs seq_len > 0 and more than seq_len tokens "
                 "(seq_len %d, %zu tokens)\n",
                 seq_len, tokens.size());
    std::abort();
  }
}

uint64_t Sampler::WindowStart(uint64_t step, uint64_t position) const {
  return RandomBelow(seed_, step, RngPurpose::kDataSample, position,
                     tokens_.size() - size_t(seq_len_));
}

void Sampler::Window(uint64_t step, uint64_t position, int32_t* inputs, int32_t* targets) const {
  const uint16_t* w = tokens_.data() + WindowStart(step, position);
  for (int i = 0; i < seq_len_; ++i) {
    inputs[i] = w[i];
    targets[i] = w[i + 1];
  }
}

size_t Sampler::NumEvalWindows() const { return tokens_.size() / (size_t(seq_len_) + 1); }

void Sampler::EvalWindow(size_t i, int32_t* inputs, int32_t* targets) const {
  const uint16_t* w = tokens_.data() + i * (size_t(seq_len_) + 1);
  for (int k = 0; k < seq_len_; ++k) {
    inputs[k] = w[k];
    targets[k] = w[k + 1];
  }
}

}  // namespace atl
