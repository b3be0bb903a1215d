// Codec decoding (world/codec.h Decode, DecodeAdd): what the exchange and the parameter server
// run on every peer's message. The count comes from the message's own header, capped. An accepted
// message decodes to finite values, DecodeAdd agrees with Decode, and a refused one leaves the
// output untouched. The other half of the input encodes floats that must round-trip within the
// codec's error (exactly for none).
#include <cmath>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "world/codec.h"

namespace {

constexpr size_t kMaxCount = 1 << 16;

void Decoding(std::span<const uint8_t> msg) {
  uint64_t count = 0;
  if (msg.size() >= 16) std::memcpy(&count, msg.data() + 8, sizeof count);
  if (count > kMaxCount) count = kMaxCount;
  std::vector<float> out(count, 7.0f), sum(count, 1.0f);
  if (!atl::Decode(msg, out).ok()) {
    for (float x : out) FUZZ_CHECK(x == 7.0f);  // untouched
    FUZZ_CHECK(!atl::DecodeAdd(msg, 0.5f, sum).ok());
    return;
  }
  for (float x : out) FUZZ_CHECK(std::isfinite(x));
  FUZZ_CHECK(atl::DecodeAdd(msg, 0.5f, sum).ok());
  for (size_t i = 0; i < count; ++i) FUZZ_CHECK(sum[i] == 1.0f + 0.5f * out[i]);
}

void RoundTrip(atl::Codec codec, std::span<const uint8_t> raw) {
  std::vector<float> x(raw.size() / 4);
  if (!x.empty()) std::memcpy(x.data(), raw.data(), x.size() * 4);
  bool finite = true;
  for (float v : x) finite = finite && std::isfinite(v);
  std::vector<uint8_t> msg;
  atl::Encode(codec, x, &msg);
  FUZZ_CHECK(msg.size() == atl::EncodedBytes(codec, x.size()));
  std::vector<float> y(x.size());
  const bool ok = atl::Decode(msg, y).ok();
  if (!finite) {  // refused at the receiver, whatever the codec
    FUZZ_CHECK(!ok);
    return;
  }
  if (codec == atl::Codec::kNone)
    FUZZ_CHECK(ok && (x.empty() || std::memcmp(x.data(), y.data(), 4 * x.size()) == 0));
  // The quantized codecs may overflow to infinity for values near FLT_MAX (refused then);
  // what decodes is finite.
  if (ok)
    for (float v : y) FUZZ_CHECK(std::isfinite(v));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  const uint8_t mode = in.Take<uint8_t>();
  const std::span<const uint8_t> rest(in.data(), in.size());
  if (mode & 0x80)
    RoundTrip(static_cast<atl::Codec>(mode % 4), rest);
  else
    Decoding(rest);
  return 0;
}
