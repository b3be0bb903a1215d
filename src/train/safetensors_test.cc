#include "train/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>

namespace atl {
namespace {

std::string Build() {
  static const float a[6] = {1, 2, 3, 4, 5, 6};
  static const double b[2] = {-1.5, 1e300};
  static const float c[1] = {7};
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  w.AddFloats("layer.a", {2, 3}, a);
  w.Add("layer.b", SafetensorsDType::kF64, {2}, b);
  w.AddFloats("scalar", {}, c);
  return w.Serialize();
}

TEST(Safetensors, HeaderFollowsTheFormat) {
  const std::string bytes = Build();
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian host
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data must start 8-aligned";
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["layer.a"]["dtype"], "F32");
  EXPECT_EQ(header["layer.a"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["layer.a"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(header["layer.b"]["data_offsets"], nlohmann::json({24, 40}));
  EXPECT_EQ(header["scalar"]["data_offsets"], nlohmann::json({40, 44}));
  EXPECT_EQ(bytes.size(), 8 + n + 44);
}

// Every dtype of the format reads back with its name and element size (atoll writes F32 and F64;
// Hugging Face files bring the others: train/hf_import.h).
TEST(Safetensors, EveryDtypeRoundTripsWithItsSize) {
  const std::pair<SafetensorsDType, size_t> dtypes[] = {
      {SafetensorsDType::kF32, 4},  {SafetensorsDType::kF64, 8},  {SafetensorsDType::kF16, 2},
      {SafetensorsDType::kBF16, 2}, {SafetensorsDType::kBool, 1}, {SafetensorsDType::kU8, 1},
      {SafetensorsDType::kI8, 1},   {SafetensorsDType::kI16, 2},  {SafetensorsDType::kU16, 2},
      {SafetensorsDType::kI32, 4},  {SafetensorsDType::kU32, 4},  {SafetensorsDType::kI64, 8},
      {SafetensorsDType::kU64, 8}};
  const char* names[] = {"F32", "F64", "F16", "BF16", "BOOL", "U8", "I8",
                         "I16", "U16", "I32", "U32",  "I64",  "U64"};
  uint8_t bytes[24];
  for (size_t i = 0; i < sizeof bytes; ++i) bytes[i] = uint8_t(i * 37 + 1);
  SafetensorsWriter w;
  for (size_t i = 0; i < std::size(dtypes); ++i) {
    EXPECT_EQ(SafetensorsDTypeSize(dtypes[i].first), dtypes[i].second) << names[i];
    EXPECT_STREQ(SafetensorsDTypeName(dtypes[i].first), names[i]);
    w.Add(names[i], dtypes[i].first, {3}, bytes);
  }
  const std::string file = w.Serialize();
  auto f = SafetensorsFile::Parse(file, "all.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  for (size_t i = 0; i < std::size(dtypes); ++i) {
    const TensorView* t = f->Find(names[i]);
    ASSERT_NE(t, nullptr) << names[i];
    EXPECT_EQ(t->dtype, dtypes[i].first);
    EXPECT_EQ(t->size, 3 * dtypes[i].second);
    EXPECT_EQ(std::memcmp(t->data, bytes, t->size), 0) << names[i];
    EXPECT_EQ(SafetensorsFloat(t->dtype), i < 4) << names[i];
  }
}

TEST(Safetensors, RoundTripsThroughAFile) {
  const std::string path = ::testing::TempDir() + "/rt.safetensors";
  static const float a[6] = {1, 2, 3, 4, 5, 6};
  static const double b[2] = {-1.5, 1e300};
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  w.AddFloats("layer.a", {2, 3}, a);
  w.Add("layer.b", SafetensorsDType::kF64, {2}, b);
  ASSERT_TRUE(w.Write(path).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  const TensorView* ta = f->Find("layer.a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->numel(), 6u);
  EXPECT_EQ(std::memcmp(ta->data, a, sizeof a), 0);
  const TensorView* tb = f->Find("layer.b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, SafetensorsDType::kF64);
  EXPECT_EQ(std::memcmp(tb->data, b, sizeof b), 0);
  EXPECT_EQ(f->Find("nope"), nullptr);
}

// LevelDB-style: every truncation is refused, and names the file.
TEST(Safetensors, EveryTruncationIsRefused) {
  const std::string bytes = Build();
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto f = SafetensorsFile::Parse(std::string_view(bytes).substr(0, len), "t.safetensors");
    ASSERT_FALSE(f.ok()) << "truncated to " << len;
    EXPECT_EQ(f.status().code(), StatusCode::kCorruption);
    EXPECT_NE(f.status().message().find("t.safetensors"), std::string::npos);
  }
  // Cut inside the data: the message names the first tensor that lost bytes.
  auto f = SafetensorsFile::Parse(std::string_view(bytes).substr(0, bytes.size() - 10), "t");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("tensor layer.b"), std::string::npos) << f.status().message();
}

TEST(Safetensors, MalformedHeadersAreRefusedNamingTheTensor) {
  auto make = [](const std::string& json, size_t data_bytes) {
    std::string out(8, '\0');
    const uint64_t n = json.size();
    std::memcpy(out.data(), &n, 8);
    return out + json + std::string(data_bytes, '\0');
  };
  struct Case {
    std::string json;
    size_t data;
    std::string expect;
  };
  const Case cases[] = {
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "tensor x"},
      {"{\"x\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
       "unsupported dtype"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "bad dimension"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "backwards"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
       4, "overlap"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "tensor x"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "after the last"},
      {"[1,2]", 0, "not a JSON object"},
      {"{\"x\":", 0, "not valid JSON"},
      {"{\"__metadata__\":{\"a\":1}}", 0, "__metadata__.a"},
  };
  for (const auto& c : cases) {
    const std::string bytes = make(c.json, c.data);
    auto f = SafetensorsFile::Parse(bytes, "m.safetensors");
    ASSERT_FALSE(f.ok()) << c.json;
    EXPECT_EQ(f.status().code(), StatusCode::kCorruption);
    EXPECT_NE(f.status().message().find(c.expect), std::string::npos)
        << c.json << " -> " << f.status().message();
  }
  // A header length beyond the file.
  std::string huge(8, '\xff');
  EXPECT_FALSE(SafetensorsFile::Parse(huge, "h").ok());
}

TEST(Safetensors, MissingFileIsNotFound) {
  auto f = SafetensorsFile::Open("/nonexistent/x.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace atl

namespace atl {
namespace {

// Found by review: two dimensions of 2^32 made 2^64 elements, which wrapped to 0, so a header
// claiming them over 0 bytes was accepted.
TEST(Safetensors, RefusesAShapeWhoseElementCountWraps) {
  const std::string header =
      R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes += header;
  auto f = SafetensorsFile::Parse(bytes, "wrap.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("too many elements"), std::string::npos)
      << f.status().ToString();
}

}  // namespace
}  // namespace atl
