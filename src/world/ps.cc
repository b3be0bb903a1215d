#include "world/ps.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/file.h"
#include "core/hash.h"
#include "core/json_int.h"
#include "world/coordinator/durable_log.h"

// No FMA (core/fp_exact.h): `p + w * d` contracted into a fused multiply-add rounds once instead
// of twice, so the result would depend on the CPU the binary was built for. Rounded twice, every
// IEEE machine gives the same bits.
#include "core/fp_exact.h"

namespace atl {

void ApplyUpdate(std::span<float> params, std::span<const float> decoded, float weight) {
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
  if (!FileExists(path))
    return Status::NotFound(fmt::format("{}: no such file (not an asynchronous run?)", path));
  // A last line without its newline was torn by a crash mid-append (never acknowledged): left out.
  ATOLL_ASSIGN_OR_RETURN(const LogContents contents, ReadLog(path, "op log record"));
  return ParseOpLog(contents, path);
}

StatusOr<OpLog> ParseOpLog(const LogContents& contents, const std::string& path) {
  OpLog log;
  bool have_init = false;
  int64_t version = 0;
  for (const LogRecord& r : contents.records) {
    const Json& j = r.json;
    auto bad = [&](const std::string& what) {
      return Status::Corruption(fmt::format("{} line {}: {}", path, r.line, what));
    };
    const std::string t = j["t"].get<std::string>();
    try {
      if (t == "init") {
        if (have_init) return bad("a second init record");
        have_init = true;
        log.count = JsonIntAt<uint64_t>(j, "count");
        log.init_checksum = HexField(j, "checksum");
        log.max_staleness = JsonIntAt<int64_t>(j, "max_staleness");
        if (log.max_staleness < 0) return bad("max_staleness is negative");
        log.build = j.value("build", "");
        log.cpu = j.value("cpu", "");
        continue;
      }
      if (t == "build") {
        if (!have_init) return bad("a build record before the init record");
        const int site = JsonIntAt<int>(j, "site");
        if (site < 0) return bad(fmt::format("build record of site {}", site));
        log.other_builds.push_back(
            {site, j.at("build").get<std::string>(), j.at("cpu").get<std::string>()});
        continue;
      }
      if (t == "rejoin") {
        if (!have_init) return bad("a rejoin before the init record");
        OpLog::Rejoin rj;
        rj.site = JsonIntAt<int>(j, "site");
        rj.step = JsonIntAt<int64_t>(j, "step");
        rj.version = JsonIntAt<int64_t>(j, "version");
        rj.next_update = JsonIntAt<int64_t>(j, "next_update");
        log.rejoins.push_back(rj);
        continue;
      }
      if (t != "update") return bad(fmt::format("unknown record type '{}'", t));
      if (!have_init) return bad("an update before the init record");
      PsLogEntry e;
      e.update_id = JsonIntAt<int64_t>(j, "update_id");
      e.site = JsonIntAt<int>(j, "site");
      e.base_version = JsonIntAt<int64_t>(j, "base_version");
      e.first_step = JsonIntAt<int64_t>(j, "first_step");
      e.last_step = JsonIntAt<int64_t>(j, "last_step");
      e.applied_version = JsonIntAt<int64_t>(j, "applied_version");
      e.checksum = HexField(j, "checksum");
      e.bytes = JsonIntAt<uint64_t>(j, "bytes");
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
