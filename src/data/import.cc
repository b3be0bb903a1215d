#include "data/import.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/hash.h"
#include "data/dataset.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

uint16_t Le16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
int32_t Le32(const uint8_t* p) {
  return int32_t(uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) |
                 (uint32_t(p[3]) << 24));
}

// Appends the little-endian uint16 ids of `payload` (an even number of bytes) to *ids.
void AppendIds(std::span<const uint8_t> payload, std::vector<uint16_t>* ids) {
  const size_t n = payload.size() / 2;
  ids->reserve(ids->size() + n);
  for (size_t i = 0; i < n; ++i) ids->push_back(Le16(payload.data() + 2 * i));
}

const char* FormatName(TokenFormat f) { return f == TokenFormat::kLlmc ? "llmc" : "nanogpt"; }

// Whether a file name has `word` as a whole part between '_', '.', '-' or its ends
// ("fineweb_train_000001.bin" has "train"; "interval_train.bin" has no "val").
bool HasWord(const std::string& name, const std::string& word) {
  const auto sep = [](char c) { return c == '_' || c == '.' || c == '-'; };
  for (size_t at = name.find(word); at != std::string::npos; at = name.find(word, at + 1)) {
    const size_t end = at + word.size();
    if ((at == 0 || sep(name[at - 1])) && (end == name.size() || sep(name[end]))) return true;
  }
  return false;
}

// A directory's source files of one split.
StatusOr<std::vector<std::string>> Discover(TokenFormat format, const std::string& dir,
                                            const char* split) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::InvalidArgument(fmt::format("{}: not a directory", dir));
  std::vector<std::string> found;
  if (format == TokenFormat::kNanoGpt) {
    const std::string path = (fs::path(dir) / fmt::format("{}.bin", split)).string();
    std::error_code missing;  // not an error here: reported below as a missing split
    if (fs::is_regular_file(path, missing)) found.push_back(path);
  } else {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (e.is_regular_file() && name.size() > 4 && name.ends_with(".bin") && HasWord(name, split))
        found.push_back(e.path().string());
    }
    std::sort(found.begin(), found.end());
  }
  if (ec) return Status::InvalidArgument(fmt::format("listing {}: {}", dir, ec.message()));
  if (found.empty())
    return Status::InvalidArgument(
        format == TokenFormat::kNanoGpt
            ? fmt::format("{}: no {}.bin (nanoGPT's prepare.py writes train.bin and val.bin)", dir,
                          split)
            : fmt::format("{}: no *{}*.bin file (llm.c writes e.g. tinyshakespeare_{}.bin)", dir,
                          split, split));
  return found;
}

// The id bytes of a nanoGPT file, after its checks.
StatusOr<std::span<const uint8_t>> NanoGptPayload(std::span<const uint8_t> bytes,
                                                  const std::string& path) {
  // Headerless ids cannot be told from anything else; refuse the two headers we know.
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "ATOLTOK1", 8) == 0)
    return Status::InvalidArgument(fmt::format(
        "{}: an atoll token file already (use its directory as data.dir), not nanoGPT's", path));
  if (bytes.size() >= 4 && Le32(bytes.data()) == kLlmcMagic)
    return Status::InvalidArgument(
        fmt::format("{}: starts with llm.c's magic 20240520: --format llmc", path));
  if (bytes.size() % 2 != 0)
    return Status::InvalidArgument(fmt::format(
        "{}: {} bytes, an odd number: not nanoGPT's uint16 tokens", path, bytes.size()));
  return bytes;
}

// The id bytes of an llm.c file, after its header's checks.
StatusOr<std::span<const uint8_t>> LlmcPayload(std::span<const uint8_t> bytes,
                                               const std::string& path) {
  const size_t header = kLlmcHeaderInts * 4;
  if (bytes.size() < header)
    return Status::InvalidArgument(fmt::format("{}: {} bytes, shorter than llm.c's {}-byte header",
                                               path, bytes.size(), header));
  const int32_t magic = Le32(bytes.data()), version = Le32(bytes.data() + 4);
  const int32_t count = Le32(bytes.data() + 8);
  if (magic != kLlmcMagic)
    return Status::InvalidArgument(fmt::format(
        "{}: magic {} is not llm.c's token file magic {} (nanoGPT's headerless ids? --format "
        "nanogpt; llm.c's evaluation files, e.g. hellaswag_val.bin, are not token files)",
        path, magic, kLlmcMagic));
  if (version == 2)
    return Status::InvalidArgument(fmt::format(
        "{}: llm.c version 2 holds uint32 ids (LLaMA 3's vocabulary); atoll's token files hold "
        "uint16 ids (GPT-2's)",
        path));
  if (version != 1)
    return Status::InvalidArgument(
        fmt::format("{}: llm.c version {}: only version 1 (uint16 ids) is known", path, version));
  if (count < 0 || bytes.size() - header != 2 * uint64_t(count))
    return Status::InvalidArgument(
        fmt::format("{}: the header says {} tokens, the file holds {} bytes after it", path, count,
                    bytes.size() - header));
  return bytes.subspan(header);
}

struct Split {
  std::vector<uint16_t> ids;
  nlohmann::ordered_json sources = nlohmann::ordered_json::array();
};

Status ReadSplit(TokenFormat format, const std::vector<std::string>& files, int vocab, Split* out) {
  for (const std::string& path : files) {
    auto file = MappedFile::Open(path);
    if (!file.ok())
      return file.status().code() == StatusCode::kNotFound
                 ? file.status()
                 : Status::InvalidArgument(file.status().message());
    const std::span<const uint8_t> bytes(file->data(), file->size());
    // The ids are read from the mapping straight into the split: no copy per file.
    ATOLL_ASSIGN_OR_RETURN(
        const std::span<const uint8_t> payload,
        format == TokenFormat::kLlmc ? LlmcPayload(bytes, path) : NanoGptPayload(bytes, path));
    const size_t n = payload.size() / 2;
    for (size_t i = 0; i < n; ++i)
      if (const uint16_t id = Le16(payload.data() + 2 * i); id >= vocab)
        return Status::InvalidArgument(fmt::format(
            "{}: token {} at position {} is outside the vocabulary [0, {}) (--vocab-size)", path,
            id, i, vocab));
    out->sources.push_back({{"path", path},
                            {"bytes", bytes.size()},
                            {"tokens", n},
                            {"xxh3", HashToHex(Hash64(bytes.data(), bytes.size()))}});
    AppendIds(payload, &out->ids);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<TokenFormat> ParseTokenFormat(const std::string& name) {
  if (name == "nanogpt") return TokenFormat::kNanoGpt;
  if (name == "llmc") return TokenFormat::kLlmc;
  return Status::InvalidArgument(fmt::format("--format {}: expected nanogpt, llmc or text", name));
}

StatusOr<std::vector<uint16_t>> ParseNanoGptBin(std::span<const uint8_t> bytes,
                                                const std::string& path) {
  ATOLL_ASSIGN_OR_RETURN(const std::span<const uint8_t> payload, NanoGptPayload(bytes, path));
  std::vector<uint16_t> ids;
  AppendIds(payload, &ids);
  return ids;
}

StatusOr<std::vector<uint16_t>> ParseLlmcBin(std::span<const uint8_t> bytes,
                                             const std::string& path) {
  ATOLL_ASSIGN_OR_RETURN(const std::span<const uint8_t> payload, LlmcPayload(bytes, path));
  std::vector<uint16_t> ids;
  AppendIds(payload, &ids);
  return ids;
}

StatusOr<ImportResult> ImportTokenFiles(const ImportOptions& o) {
  if (o.out_dir.empty()) return Status::InvalidArgument("no output directory given (--out)");
  if (o.vocab_size < 1 || o.vocab_size > 65536)
    return Status::InvalidArgument(
        fmt::format("--vocab-size {}: must be in [1, 65536] (uint16 ids)", o.vocab_size));
  ImportResult r;
  r.train_files = o.train;
  r.val_files = o.val;
  if (!o.dir.empty()) {
    if (r.train_files.empty()) {
      ATOLL_ASSIGN_OR_RETURN(r.train_files, Discover(o.format, o.dir, "train"));
    }
    if (r.val_files.empty()) {
      ATOLL_ASSIGN_OR_RETURN(r.val_files, Discover(o.format, o.dir, "val"));
    }
  }
  if (r.train_files.empty() || r.val_files.empty())
    return Status::InvalidArgument(
        "give a directory, or the files of both splits (--train FILE, --val FILE)");
  // One file in both splits would leak validation data into training.
  for (const std::string& t : r.train_files)
    for (const std::string& v : r.val_files) {
      std::error_code ec;
      if (t == v || fs::equivalent(t, v, ec))
        return Status::InvalidArgument(fmt::format("{} is in both splits", t));
    }
  // Writing into the input directory would replace nanoGPT's train.bin / val.bin.
  for (const auto& list : {r.train_files, r.val_files})
    for (const std::string& f : list) {
      std::error_code ec;
      if (fs::equivalent(fs::absolute(f).parent_path(), o.out_dir, ec))
        return Status::InvalidArgument(fmt::format(
            "--out {} holds the input {}: import into another directory", o.out_dir, f));
    }
  Split train, val;
  // The ids are held once (the output is written from them): reserve what the files hold.
  for (auto [files, split] : {std::pair{&r.train_files, &train}, std::pair{&r.val_files, &val}}) {
    uintmax_t bytes = 0;
    for (const std::string& f : *files) {
      std::error_code ec;
      const uintmax_t n = fs::file_size(f, ec);
      if (!ec) bytes += n;
    }
    split->ids.reserve(size_t(bytes / 2));
  }
  ATOLL_RETURN_IF_ERROR(ReadSplit(o.format, r.train_files, o.vocab_size, &train));
  ATOLL_RETURN_IF_ERROR(ReadSplit(o.format, r.val_files, o.vocab_size, &val));
  r.train_tokens = train.ids.size();
  r.val_tokens = val.ids.size();
  ATOLL_RETURN_IF_ERROR(MakeDirs(o.out_dir));
  ATOLL_RETURN_IF_ERROR(WriteTokenFile(o.out_dir + "/train.bin", train.ids));
  ATOLL_RETURN_IF_ERROR(WriteTokenFile(o.out_dir + "/val.bin", val.ids));
  const nlohmann::ordered_json meta = {
      {"format",
       "ATOLTOK1: 24-byte header (magic, uint64 count, uint64 XXH3-64), uint16 LE tokens"},
      {"imported_from", FormatName(o.format)},
      {"vocab_size", o.vocab_size},
      {"tokens", {{"train", r.train_tokens}, {"val", r.val_tokens}}},
      {"sources", {{"train", train.sources}, {"val", val.sources}}},
      {"checksums",
       {{"train.bin", HashToHex(Hash64(train.ids.data(), train.ids.size() * 2))},
        {"val.bin", HashToHex(Hash64(val.ids.data(), val.ids.size() * 2))}}},
  };
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(o.out_dir + "/meta.json", meta.dump(2) + "\n")
                            .WithContext("writing meta.json"));
  return r;
}

}  // namespace atl
