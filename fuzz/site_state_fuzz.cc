// A site's state as a rejoining site fetches it from a peer or a resumed one reads it from a
// checkpoint: the low-communication strategies' (train/strategies/lowcomm.h), sync's
// (sync_state.h) and async's (async_client.h) decoders. What one accepts has the model's size
// and encodes back to bytes that decode to the same state, bit for bit.
#include <cstring>
#include <string>

#include "core/hash.h"
#include "fuzz/fuzz_util.h"
#include "train/strategies/async_client.h"
#include "train/strategies/lowcomm.h"
#include "train/strategies/sync_state.h"

namespace {

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  const uint8_t which = in.Take<uint8_t>() % 3;
  const size_t n = in.Take<uint8_t>();
  const bool fix_checksum = in.Bit();  // the async state's XXH3, which random bytes never match
  const int sites = 1 + in.Take<uint8_t>() % 8;
  std::string bytes(in.rest());
  if (which == 2 && fix_checksum && bytes.size() >= 8) {
    const uint64_t h = atl::Hash64(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &h, sizeof h);
  }
  if (which == 0) {
    auto s = atl::DecodeLowCommState(bytes, n);
    if (!s.ok()) return 0;
    FUZZ_CHECK(s->global.size() == n && s->momentum.size() == n && s->params.size() == n);
    auto t = atl::DecodeLowCommState(atl::EncodeLowCommState(*s), n);
    FUZZ_CHECK(t.ok());
    FUZZ_CHECK(t->completed == s->completed && t->rounds == s->rounds &&
               t->exchanges == s->exchanges && t->adam_steps == s->adam_steps);
    FUZZ_CHECK(SameBits(t->global, s->global) && SameBits(t->momentum, s->momentum) &&
               SameBits(t->params, s->params) && SameBits(t->residual, s->residual) &&
               SameBits(t->adam_m, s->adam_m) && SameBits(t->adam_v, s->adam_v));
  } else if (which == 1) {
    const size_t k = n % 3;
    auto s = atl::DecodeSyncState(bytes, n, k, sites);
    if (!s.ok()) return 0;
    FUZZ_CHECK(s->params.size() == n && s->m.size() == k && s->v.size() == k);
    FUZZ_CHECK(!s->live.empty() && int(s->live.size()) <= sites);
    for (size_t i = 0; i < s->live.size(); ++i)
      FUZZ_CHECK(s->live[i] >= 0 && s->live[i] < sites && (i == 0 || s->live[i] > s->live[i - 1]));
    auto t = atl::DecodeSyncState(atl::EncodeSyncState(s->step, s->optimizer_steps, s->generation,
                                                       s->live, s->params, s->m, s->v),
                                  n, k, sites);
    FUZZ_CHECK(t.ok());
    FUZZ_CHECK(t->step == s->step && t->optimizer_steps == s->optimizer_steps &&
               t->generation == s->generation && t->live == s->live);
    FUZZ_CHECK(SameBits(t->params, s->params) && SameBits(t->m, s->m) && SameBits(t->v, s->v));
  } else {
    auto s = atl::DecodeAsyncSiteState(bytes, n);
    if (!s.ok()) return 0;
    FUZZ_CHECK(s->residual.size() == n && s->adam_m.size() == n && s->adam_v.size() == n);
    auto t = atl::DecodeAsyncSiteState(atl::EncodeAsyncSiteState(*s), n);
    FUZZ_CHECK(t.ok());
    FUZZ_CHECK(t->completed == s->completed && t->pushes == s->pushes && t->refused == s->refused &&
               t->adam_steps == s->adam_steps);
    FUZZ_CHECK(SameBits(t->residual, s->residual) && SameBits(t->adam_m, s->adam_m) &&
               SameBits(t->adam_v, s->adam_v));
  }
  return 0;
}
