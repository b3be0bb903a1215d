#include "world/ps.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/file.h"
#include "core/hash.h"

namespace atl {

// No FMA: with -march=native GCC (and clang) would contract `p + w * d` into a fused
// multiply-add, whose rounding differs from a multiply then an add, so the result would depend on
// the CPU the binary was built for. Rounded twice, every IEEE machine gives the same bits.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
void ApplyUpdate(std::span<float> params, std::span<const float> decoded, float weight) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  const size_t n = params.size();
  float* p = params.data();
  const float* d = decoded.data();
  for (size_t i = 0; i < n; ++i) p[i] += weight * d[i];
}

namespace {

using Json = nlohmann::json;

uint64_t HexField(const Json& j, const char* key) {
  const std::string s = j.at(key).get<std::string>();
  uint64_t v = 0;
  if (!HexToHash(s, &v))
    throw std::runtime_error(fmt::format("{} '{}' is not 16 hex digits", key, s));
  return v;
}

}  // namespace

StatusOr<OpLog> ReadOpLog(const std::string& path) {
  ATOLL_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  // A last line without its newline was torn by a crash mid-append (never acknowledged).
  const size_t end = text.rfind('\n');
  const size_t good = end == std::string::npos ? 0 : end + 1;
  OpLog log;
  bool have_init = false;
  int64_t version = 0;
  size_t pos = 0;
  int line = 0;
  while (pos < good) {
    const size_t nl = text.find('\n', pos);
    const std::string_view l(text.data() + pos, nl - pos);
    pos = nl + 1;
    ++line;
    auto bad = [&](const std::string& what) {
      return Status::Corruption(fmt::format("{} line {}: {}", path, line, what));
    };
    if (l.empty()) continue;
    Json j = Json::parse(l, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("t") || !j["t"].is_string())
      return bad(fmt::format("not an op log record: {}", l.substr(0, 200)));
    const std::string t = j["t"].get<std::string>();
    try {
      if (t == "init") {
        if (have_init) return bad("a second init record");
        have_init = true;
        log.count = j.at("count").get<uint64_t>();
        log.init_checksum = HexField(j, "checksum");
        log.max_staleness = j.at("max_staleness").get<int64_t>();
        if (log.max_staleness < 0) return bad("max_staleness is negative");
        continue;
      }
      if (t == "rejoin") {
        if (!have_init) return bad("a rejoin before the init record");
        OpLog::Rejoin r;
        r.site = j.at("site").get<int>();
        r.step = j.at("step").get<int64_t>();
        r.version = j.at("version").get<int64_t>();
        r.next_update = j.at("next_update").get<int64_t>();
        log.rejoins.push_back(r);
        continue;
      }
      if (t != "update") return bad(fmt::format("unknown record type '{}'", t));
      if (!have_init) return bad("an update before the init record");
      PsLogEntry e;
      e.update_id = j.at("update_id").get<int64_t>();
      e.site = j.at("site").get<int>();
      e.base_version = j.at("base_version").get<int64_t>();
      e.first_step = j.at("first_step").get<int64_t>();
      e.last_step = j.at("last_step").get<int64_t>();
      e.applied_version = j.at("applied_version").get<int64_t>();
      e.checksum = HexField(j, "checksum");
      e.bytes = j.at("bytes").get<uint64_t>();
      const double w = j.at("weight").get<double>();
      e.weight = float(w);
      if (!std::isfinite(w) || double(e.weight) != w)
        return bad(fmt::format("weight {} is not a finite float32", w));
      const int64_t expected = log.entries.empty() ? 0 : log.entries.back().update_id + 1;
      if (e.update_id != expected)
        return bad(fmt::format("update_id {} out of order (expected {})", e.update_id, expected));
      // Applied updates produce versions 1, 2, 3, ... in log order.
      if (e.applied_version != -1) {
        if (e.applied_version != version + 1)
          return bad(fmt::format("applied_version {} out of order (expected -1 or {})",
                                 e.applied_version, version + 1));
        version = e.applied_version;
      }
      log.entries.push_back(e);
    } catch (const std::exception& ex) {
      return bad(fmt::format("{} record: {}", t, ex.what()));
    }
  }
  if (!have_init) return Status::Corruption(fmt::format("{}: no init record", path));
  return log;
}

}  // namespace atl
