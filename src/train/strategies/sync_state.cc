// The state a sync site's new process takes over (train/strategies/sync_state.h).
#include "train/strategies/sync_state.h"

#include <fmt/format.h>

#include <cstring>

namespace atl {

namespace {

constexpr char kMagic[8] = {'A', 'T', 'L', 'S', 'Y', 'N', 'C', '1'};

void Put(std::string* out, const void* p, size_t bytes) {
  out->append(static_cast<const char*>(p), bytes);
}
void PutInt(std::string* out, int64_t x) { Put(out, &x, sizeof x); }

// Reads from bytes at *at; false past the end.
bool Take(const std::string& bytes, size_t* at, void* p, size_t n) {
  if (bytes.size() - *at < n) return false;
  if (n > 0) std::memcpy(p, bytes.data() + *at, n);  // an empty vector's data() may be null
  *at += n;
  return true;
}

}  // namespace

std::string EncodeSyncState(int64_t step, int64_t optimizer_steps, int64_t generation,
                            const std::vector<int>& live, std::span<const float> params,
                            std::span<const float> m, std::span<const float> v) {
  std::string out;
  out.reserve(sizeof kMagic + 8 * (6 + live.size()) + 4 * (params.size() + 2 * m.size()));
  Put(&out, kMagic, sizeof kMagic);
  for (int64_t x : {step, optimizer_steps, generation, int64_t(live.size())}) PutInt(&out, x);
  for (int s : live) PutInt(&out, s);
  PutInt(&out, int64_t(params.size()));
  PutInt(&out, int64_t(m.size()));
  for (std::span<const float> f : {params, m, v}) Put(&out, f.data(), f.size_bytes());
  return out;
}

StatusOr<SyncState> DecodeSyncState(const std::string& bytes, size_t n, size_t k, int sites) {
  auto bad = [&](const std::string& why) {
    return Status::Corruption(
        fmt::format("a sync site's state of {} bytes: {}", bytes.size(), why));
  };
  size_t at = 0;
  char magic[sizeof kMagic];
  if (!Take(bytes, &at, magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof magic) != 0)
    return bad("not a sync state (bad magic)");
  SyncState st;
  int64_t live = 0;
  for (int64_t* x : {&st.step, &st.optimizer_steps, &st.generation, &live})
    if (!Take(bytes, &at, x, sizeof *x)) return bad("truncated header");
  if (live < 1 || live > sites)
    return bad(fmt::format("{} live sites in a world of {}", live, sites));
  for (int64_t i = 0; i < live; ++i) {
    int64_t s = 0;
    if (!Take(bytes, &at, &s, sizeof s)) return bad("truncated list of live sites");
    if (s < 0 || s >= sites || (!st.live.empty() && s <= st.live.back()))
      return bad(fmt::format("live site {} out of range or order (a world of {} sites)", s, sites));
    st.live.push_back(int(s));
  }
  int64_t np = 0, nk = 0;
  if (!Take(bytes, &at, &np, sizeof np) || !Take(bytes, &at, &nk, sizeof nk))
    return bad("truncated sizes");
  if (np != int64_t(n) || nk != int64_t(k))
    return bad(fmt::format("{} parameters and {} moments, this model has {} and {}", np, nk, n, k));
  if (bytes.size() - at != 4 * (n + 2 * k))
    return bad(fmt::format("{} bytes of tensors, {} expected", bytes.size() - at, 4 * (n + 2 * k)));
  st.params.resize(n);
  st.m.resize(k);
  st.v.resize(k);
  for (std::vector<float>* f : {&st.params, &st.m, &st.v})
    (void)Take(bytes, &at, f->data(), f->size() * sizeof(float));
  return st;
}

}  // namespace atl
