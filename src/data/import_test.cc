// atoll data import: nanoGPT's and llm.c's token files (every header check, directory discovery,
// the vocabulary bound, what lands in train.bin / val.bin / meta.json), and text corpora of any
// UTF-8 files (recursive listing, strict UTF-8).
#include "data/import.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file.h"
#include "data/corpus.h"
#include "data/dataset.h"
#include "data/test_util.h"
#include "data/tokenizer.h"
#include "data/utf8.h"

namespace atl {
namespace {

using testing_util::TempDir;

const auto* const kRepoRoot =
    ::testing::AddGlobalTestEnvironment(new testing_util::RepoRootEnvironment);

std::string Le16s(const std::vector<uint16_t>& ids) {
  std::string s;
  for (uint16_t v : ids) s += {char(v & 0xff), char(v >> 8)};
  return s;
}

// count: the header's token count (default: the true one).
std::string LlmcFile(const std::vector<uint16_t>& ids, int32_t magic = kLlmcMagic,
                     int32_t version = 1, int64_t count = INT64_MIN) {
  std::vector<int32_t> header(kLlmcHeaderInts, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count != INT64_MIN ? int32_t(count) : int32_t(ids.size());
  std::string s(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  return s + Le16s(ids);
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::vector<uint16_t> Tokens(const std::string& path) {
  auto f = TokenFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return {};
  return {f->tokens().begin(), f->tokens().end()};
}

// The status's message, expected to be an InvalidArgument.
std::string Refusal(const Status& st) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  return st.message();
}

TEST(ImportParse, NanoGptIsRawLittleEndianIds) {
  const std::vector<uint16_t> ids = {0, 1, 50256, 258, 65535};
  auto got = ParseNanoGptBin(Bytes(Le16s(ids)), "x.bin");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, ids);
  EXPECT_TRUE(ParseNanoGptBin(Bytes(""), "empty.bin")->empty());
  EXPECT_NE(Refusal(ParseNanoGptBin(Bytes("abc"), "odd.bin").status()).find("odd.bin: 3 bytes"),
            std::string::npos);
}

TEST(ImportParse, LlmcHeaderIsChecked) {
  const std::vector<uint16_t> ids = {5, 6, 7, 50256};
  auto got = ParseLlmcBin(Bytes(LlmcFile(ids)), "a.bin");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, ids);
  EXPECT_TRUE(ParseLlmcBin(Bytes(LlmcFile({})), "none.bin")->empty());
  struct Case {
    std::string bytes, says;
  };
  for (const Case& c : {
           Case{LlmcFile(ids).substr(0, 1000), "shorter than llm.c's 1024-byte header"},
           Case{LlmcFile(ids, 12345), "magic 12345"},
           Case{LlmcFile(ids, kLlmcMagic, 2), "version 2 holds uint32 ids"},
           Case{LlmcFile(ids, kLlmcMagic, 7), "version 7"},
           Case{LlmcFile(ids, kLlmcMagic, 1, 5), "the header says 5 tokens"},
           Case{LlmcFile(ids, kLlmcMagic, 1, INT32_MIN), "the header says -2147483648 tokens"},
           Case{LlmcFile(ids) + "x", "the header says 4 tokens"},
           Case{Le16s(ids) + std::string(1100, '\0'), "magic"},
       }) {
    EXPECT_NE(Refusal(ParseLlmcBin(Bytes(c.bytes), "b.bin").status()).find(c.says),
              std::string::npos)
        << c.says;
  }
}

TEST(ImportParse, NanoGptRefusesFilesWithAKnownHeader) {
  EXPECT_NE(
      Refusal(ParseNanoGptBin(Bytes(LlmcFile({1, 2})), "l.bin").status()).find("--format llmc"),
      std::string::npos);
  EXPECT_NE(
      Refusal(
          ParseNanoGptBin(Bytes(std::string("ATOLTOK1") + std::string(16, '\0')), "a.bin").status())
          .find("an atoll token file already"),
      std::string::npos);
}

TEST(Import, SplitsMatchWholeWordsAndNeverShareAFile) {
  TempDir in, out;
  in.Write("data_train_0.bin", LlmcFile({1}));
  in.Write("interval_train.bin", LlmcFile({2}));  // "val" inside a word: train only
  in.Write("data_val_0.bin", LlmcFile({3}));
  in.Write("trainval.bin", LlmcFile({4}));  // neither
  ImportOptions o;
  o.format = TokenFormat::kLlmc;
  o.dir = in.path();
  o.out_dir = out.File("x");
  auto r = ImportTokenFiles(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->train_files,
            (std::vector<std::string>{in.File("data_train_0.bin"), in.File("interval_train.bin")}));
  EXPECT_EQ(r->val_files, (std::vector<std::string>{in.File("data_val_0.bin")}));
  o.dir.clear();
  o.train = {in.File("data_train_0.bin"), in.File("data_val_0.bin")};
  o.val = {in.File("data_val_0.bin")};
  EXPECT_NE(Refusal(ImportTokenFiles(o).status()).find("in both splits"), std::string::npos);
  // Never into the input's own directory.
  o.train = {in.File("data_train_0.bin")};
  o.out_dir = in.path();
  EXPECT_NE(Refusal(ImportTokenFiles(o).status()).find("holds the input"), std::string::npos);
}

TEST(ImportParse, Formats) {
  EXPECT_EQ(*ParseTokenFormat("nanogpt"), TokenFormat::kNanoGpt);
  EXPECT_EQ(*ParseTokenFormat("llmc"), TokenFormat::kLlmc);
  EXPECT_FALSE(ParseTokenFormat("hf").ok());
}

TEST(Import, NanoGptDirectory) {
  TempDir in, out;
  in.Write("train.bin", Le16s({1, 2, 3, 4, 5}));
  in.Write("val.bin", Le16s({9, 8}));
  in.Write("meta.pkl", "not read");
  ImportOptions o;
  o.dir = in.path();
  o.out_dir = out.path();
  auto r = ImportTokenFiles(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->train_tokens, 5u);
  EXPECT_EQ(r->val_tokens, 2u);
  EXPECT_EQ(Tokens(out.File("train.bin")), (std::vector<uint16_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(Tokens(out.File("val.bin")), (std::vector<uint16_t>{9, 8}));
  auto meta = nlohmann::json::parse(*ReadFile(out.File("meta.json")));
  EXPECT_EQ(meta["imported_from"], "nanogpt");
  EXPECT_EQ(meta["sources"]["train"][0]["path"], in.File("train.bin"));
  EXPECT_EQ(meta["sources"]["train"][0]["tokens"], 5);
  EXPECT_EQ(meta["tokens"]["val"], 2);
}

TEST(Import, LlmcShardsInNameOrderAndExplicitFiles) {
  TempDir in, out, out2;
  in.Write("fineweb_train_000002.bin", LlmcFile({20, 21}));
  in.Write("fineweb_train_000001.bin", LlmcFile({10, 11, 12}));
  in.Write("fineweb_val_000000.bin", LlmcFile({7}));
  in.Write("README", "x");
  ImportOptions o;
  o.format = TokenFormat::kLlmc;
  o.dir = in.path();
  o.out_dir = out.path();
  auto r = ImportTokenFiles(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Tokens(out.File("train.bin")), (std::vector<uint16_t>{10, 11, 12, 20, 21}));
  EXPECT_EQ(Tokens(out.File("val.bin")), (std::vector<uint16_t>{7}));
  // Files named explicitly, in the order given.
  o.dir.clear();
  o.train = {in.File("fineweb_train_000002.bin"), in.File("fineweb_train_000001.bin")};
  o.val = {in.File("fineweb_val_000000.bin")};
  o.out_dir = out2.path();
  ASSERT_TRUE(ImportTokenFiles(o).ok());
  EXPECT_EQ(Tokens(out2.File("train.bin")), (std::vector<uint16_t>{20, 21, 10, 11, 12}));
}

TEST(Import, RefusalsNameWhatIsWrongAndWriteNothing) {
  TempDir in, out;
  in.Write("train.bin", Le16s({1, 2, 50257, 3}));
  in.Write("val.bin", Le16s({1}));
  ImportOptions o;
  o.dir = in.path();
  o.out_dir = out.File("data");
  // An id outside the vocabulary: the file and the position.
  std::string why = Refusal(ImportTokenFiles(o).status());
  EXPECT_NE(why.find("train.bin: token 50257 at position 2"), std::string::npos) << why;
  EXPECT_FALSE(std::filesystem::exists(out.File("data")));
  o.vocab_size = 50258;
  EXPECT_TRUE(ImportTokenFiles(o).ok());
  // A missing split, a wrong format, a file that is not there.
  TempDir only_train;
  only_train.Write("train.bin", Le16s({1}));
  o.dir = only_train.path();
  why = Refusal(ImportTokenFiles(o).status());
  EXPECT_NE(why.find("no val.bin"), std::string::npos) << why;
  o.format = TokenFormat::kLlmc;
  o.dir = in.path();
  why = Refusal(ImportTokenFiles(o).status());
  EXPECT_NE(why.find("shorter than llm.c's 1024-byte header"), std::string::npos) << why;
  o.dir.clear();
  o.train = {in.File("nope.bin")};
  o.val = {in.File("val.bin")};
  EXPECT_EQ(ImportTokenFiles(o).status().code(), StatusCode::kNotFound);
  o.train.clear();
  EXPECT_NE(Refusal(ImportTokenFiles(o).status()).find("--train"), std::string::npos);
  o.vocab_size = 70000;
  EXPECT_NE(Refusal(ImportTokenFiles(o).status()).find("--vocab-size"), std::string::npos);
}

TEST(Utf8, FirstInvalidByte) {
  constexpr size_t kOk = std::string_view::npos;
  EXPECT_EQ(FirstInvalidUtf8(""), kOk);
  EXPECT_EQ(FirstInvalidUtf8("plain ascii\n"), kOk);
  EXPECT_EQ(FirstInvalidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), kOk);  // é € 😀
  EXPECT_EQ(FirstInvalidUtf8("\xef\xbf\xbd"), kOk);                               // U+FFFD itself
  EXPECT_EQ(FirstInvalidUtf8("ab\x80"), 2u);                 // a lone continuation byte
  EXPECT_EQ(FirstInvalidUtf8("a\xc0\xaf"), 1u);              // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8("\xe0\x80\xaf"), 0u);           // overlong, 3 bytes
  EXPECT_EQ(FirstInvalidUtf8("x\xed\xa0\x80"), 1u);          // a surrogate
  EXPECT_EQ(FirstInvalidUtf8("\xf4\x90\x80\x80"), 0u);       // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("\xf5\x80\x80\x80"), 0u);       // never a lead byte
  EXPECT_EQ(FirstInvalidUtf8("ok\xe2\x82"), 2u);             // truncated
  EXPECT_EQ(FirstInvalidUtf8("\xe2\x28\xa1"), 0u);           // a bad continuation
  EXPECT_EQ(FirstInvalidUtf8(std::string("a\0b", 3)), kOk);  // NUL is UTF-8
}

class ImportTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Tokenizer::Load(DefaultEncoderDir()).ok())
      GTEST_SKIP() << "the GPT-2 tokenizer data is missing: run scripts/setup.sh";
  }
  PrepareOptions Options(const std::string& input, const std::string& out) {
    PrepareOptions o;
    o.inputs = {input};
    o.out_dir = out;
    o.val_every = 2;
    o.encoder_dir = DefaultEncoderDir();
    o.progress = false;
    o.any_files = true;
    return o;
  }
};

TEST_F(ImportTextTest, EveryFileUnderTheDirectoryIsADocument) {
  TempDir in, out;
  std::filesystem::create_directories(in.File("sub/deeper"));
  std::filesystem::create_directories(in.File(".git"));
  in.Write("a.md", "# Title\n");
  in.Write("sub/b.py", "print('hi')\n");
  in.Write("sub/deeper/c", "no extension\n");
  in.Write(".hidden", "skipped");
  in.Write(".git/config", "skipped too");
  auto docs = ListDocuments({in.path()}, /*any_files=*/true);
  ASSERT_TRUE(docs.ok()) << docs.status().ToString();
  EXPECT_EQ(*docs, (std::vector<std::string>{in.File("a.md"), in.File("sub/b.py"),
                                             in.File("sub/deeper/c")}));
  // Without any_files, only *.txt (data prepare's rule): none here.
  EXPECT_FALSE(ListDocuments({in.path()}).ok());
  auto r = PrepareDataset(Options(in.path(), out.path()));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->documents, 3u);
  EXPECT_EQ(r->val_documents, 1u);  // the second file
  auto tok = Tokenizer::Load(DefaultEncoderDir());
  std::vector<uint16_t> val = {uint16_t(Tokenizer::kEndOfText)};
  for (int id : tok->Encode("print('hi')\n")) val.push_back(uint16_t(id));
  EXPECT_EQ(Tokens(out.File("val.bin")), val);
}

TEST_F(ImportTextTest, AFileThatIsNotUtf8IsRefusedByName) {
  TempDir in, out;
  in.Write("good.txt", "fine\n");
  in.Write("image.png", std::string("\x89PNG\r\n\x1a\n", 8));
  const std::string why = Refusal(PrepareDataset(Options(in.path(), out.File("data"))).status());
  EXPECT_NE(why.find("image.png: not UTF-8 text (an invalid byte at offset 0)"), std::string::npos)
      << why;
  EXPECT_FALSE(std::filesystem::exists(out.File("data")));
}

}  // namespace
}  // namespace atl
