// `atoll data prepare` as a function: split rule, separators, determinism, and bad input.
#include "data/corpus.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "data/dataset.h"
#include "data/test_util.h"

namespace atl {
namespace {

using testing_util::TempDir;

const ::testing::Environment* const kRepoRoot =
    ::testing::AddGlobalTestEnvironment(new testing_util::RepoRootEnvironment);

constexpr const char* kSetupHint = "run scripts/setup.sh to install the GPT-2 tokenizer data";

std::vector<uint16_t> Tokens(const std::string& path) {
  auto f = TokenFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return {};
  return {f->tokens().begin(), f->tokens().end()};
}

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::Load(DefaultEncoderDir());
    ASSERT_TRUE(tok.ok()) << tok.status().ToString() << "\n" << kSetupHint;
    tokenizer_ = std::make_unique<Tokenizer>(std::move(tok).value());
    docs_ = {"First document.\n", "Second one, it's here.", "", "Fourth:  numbers 12 34\n\n",
             "Fifth and last."};
    for (size_t i = 0; i < docs_.size(); ++i) corpus_.Write(fmt::format("doc{}.txt", i), docs_[i]);
    corpus_.Write("notes.md", "not a document");
  }

  PrepareOptions Options(const std::string& out) const {
    PrepareOptions o;
    o.inputs = {corpus_.path()};
    o.out_dir = out;
    o.val_every = 2;
    o.encoder_dir = DefaultEncoderDir();
    o.progress = false;
    return o;
  }

  std::vector<uint16_t> Joined(std::initializer_list<size_t> which) const {
    std::vector<uint16_t> out;
    for (size_t i : which) {
      out.push_back(Tokenizer::kEndOfText);
      for (int id : tokenizer_->Encode(docs_[i])) out.push_back(uint16_t(id));
    }
    return out;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::string> docs_;
  TempDir corpus_;
  TempDir out_;
};

TEST_F(PrepareTest, SplitsEveryNthDocumentAndSeparatesWithEndOfText) {
  auto r = PrepareDataset(Options(out_.path()));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->documents, 5u);
  EXPECT_EQ(r->train_documents, 3u);
  EXPECT_EQ(r->val_documents, 2u);
  // Documents 2 and 4 (1-based) go to val; an empty document is just its separator.
  EXPECT_EQ(Tokens(out_.File("train.bin")), Joined({0, 2, 4}));
  EXPECT_EQ(Tokens(out_.File("val.bin")), Joined({1, 3}));
  EXPECT_EQ(r->train_tokens, Joined({0, 2, 4}).size());

  auto meta = nlohmann::json::parse(ReadFile(out_.File("meta.json")).value());
  EXPECT_EQ(meta["sources"], 5);
  EXPECT_EQ(meta["tokens"]["train"], r->train_tokens);
  EXPECT_EQ(meta["tokens"]["val"], r->val_tokens);
  EXPECT_EQ(meta["split"]["val_every"], 2);
  EXPECT_EQ(meta["files"][1]["split"], "val");
  EXPECT_EQ(meta["tokenizer"]["encoder.json"].get<std::string>().size(), 16u);
  EXPECT_EQ(meta["tokenizer"]["vocab.bpe"].get<std::string>().size(), 16u);
}

TEST_F(PrepareTest, OutputDoesNotDependOnThreadCount) {
  TempDir other;
  PrepareOptions one = Options(out_.path());
  one.threads = 1;
  PrepareOptions three = Options(other.path());
  three.threads = 3;
  ASSERT_TRUE(PrepareDataset(one).ok());
  ASSERT_TRUE(PrepareDataset(three).ok());
  for (const char* f : {"train.bin", "val.bin"})
    EXPECT_EQ(ReadFile(out_.File(f)).value(), ReadFile(other.File(f)).value()) << f;
}

TEST_F(PrepareTest, ExplicitFilesKeepTheirOrder) {
  PrepareOptions o = Options(out_.path());
  o.inputs = {corpus_.File("doc4.txt"), corpus_.File("doc0.txt")};
  auto r = PrepareDataset(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Tokens(out_.File("train.bin")), Joined({4}));
  EXPECT_EQ(Tokens(out_.File("val.bin")), Joined({0}));
}

TEST_F(PrepareTest, BadInputIsRefusedWithAClearMessage) {
  PrepareOptions o = Options(out_.path());
  o.inputs = {corpus_.File("missing.txt")};
  auto r = PrepareDataset(o);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("missing.txt"), std::string::npos);

  TempDir empty;
  o.inputs = {empty.path()};
  r = PrepareDataset(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("no *.txt"), std::string::npos);

  o = Options(out_.path());
  o.val_every = 1;
  EXPECT_EQ(PrepareDataset(o).status().code(), StatusCode::kInvalidArgument);

  o = Options(out_.path());
  o.encoder_dir = empty.path();
  r = PrepareDataset(o);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("encoder.json"), std::string::npos);
  EXPECT_EQ(r.status().ExitCode(), 2);
  EXPECT_FALSE(FileExists(out_.File("train.bin")));
}

}  // namespace
}  // namespace atl
