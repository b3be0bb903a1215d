// The parameter server of asynchronous training (world.strategy = "async"), as the sites see it.
//
// Site leaders push updates and pull parameters with no global barrier. The server holds the
// parameters and a version (0 after Init, +1 per applied update). A push carries the version
// its update was computed from (base_version); it is applied only if
//   current_version - base_version <= max_staleness
// (else refused: accepted = false, nothing changes, and the site should pull and go on). Applying
// an update is, for every i, params[i] += weight * decoded[i] (float32, this exact expression,
// in index order), with decoded = Decode(encoded) (world/codec.h).
//
// Every push, applied or refused, is appended to the server's operation log (durable: fsynced
// before the reply) with: update id (0, 1, ... in the order the server decided them), site, base
// version, the data range (first_step, last_step: the site's local steps whose work the update
// holds), applied version (-1 if refused), the XXH3-64 of the encoded bytes, their size and the
// weight. The log's order is the order updates were applied: re-executing it reproduces the
// parameters bitwise (`atoll replay`).
//
// Implementations: the coordinator (world/coordinator.h hosts one per run, over gRPC) and the
// replay driver (train/replay.h), which serves the logged order to re-executed sites.
//
// Thread-safety: implementations are thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace atl {

struct PsUpdate {
  int site = 0;
  int64_t base_version = 0;
  int64_t first_step = 0, last_step = 0;  // the site's local steps (inclusive) of this update
  float weight = 1.0f;                    // params += weight * decoded
  std::vector<uint8_t> encoded;           // world/codec.h form
};

struct PsPushResult {
  bool accepted = false;
  int64_t update_id = 0;
  int64_t applied_version = -1;  // the version this update produced; -1 if refused
  int64_t current_version = 0;   // the server's version after deciding this update
};

struct PsLogEntry {
  int64_t update_id = 0;
  int site = 0;
  int64_t base_version = 0;
  int64_t first_step = 0, last_step = 0;
  int64_t applied_version = -1;
  uint64_t checksum = 0;  // Hash64 of the encoded bytes
  uint64_t bytes = 0;
  float weight = 1.0f;
};

class ParameterServer {
 public:
  virtual ~ParameterServer() = default;
  // Sets the initial parameters (version 0) if no site has; otherwise checks that the count
  // matches and the XXH3-64 of the floats equals the first site's (a different model or seed is
  // kInvalidArgument). max_staleness is fixed by the first caller. Returns the last step of
  // this site's pushes the server has decided so far (0: none): a process that takes over a lost
  // site (a rejoin) starts after it; the coordinator then logs a rejoin record.
  virtual StatusOr<int64_t> Init(std::span<const float> params, int64_t max_staleness) = 0;
  // Copies the current parameters into params (size must match); returns their version.
  virtual StatusOr<int64_t> Pull(std::span<float> params) = 0;
  // Decides (applies or refuses) the update and logs it. A bad update (size, codec, checksum of
  // its decoding) is kInvalidArgument / kCorruption and changes nothing.
  virtual StatusOr<PsPushResult> Push(const PsUpdate& update) = 0;
};

// Applies a decoded update: params[i] += weight * decoded[i] for i = 0, 1, ... (float32: the
// product rounded, then the sum rounded; compiled with FP contraction off, so never a fused
// multiply-add, whatever -march). The coordinator and the replay driver both call this, so they
// compute the same bits on any machine.
// REQUIRES: params.size() == decoded.size().
void ApplyUpdate(std::span<float> params, std::span<const float> decoded, float weight);

}  // namespace atl

namespace atl {

// The operation log as written by the coordinator: <state_dir>/ops.jsonl, one JSON object per
// line: first {"t":"init","count":N,"checksum":"<hex of XXH3-64 of the initial floats>",
// "max_staleness":S}, then one {"t":"update", ...PsLogEntry fields...} per decided push, in
// update-id order, and a {"t":"rejoin"} record where a new process took a lost site over. A torn
// last line is dropped; any other bad line is kCorruption naming it.
//
// As written (world/coordinator/ps_service.cc through world/coordinator/durable_log.h, read back
// by ReadOpLog in world/ps.cc):
//   {"t":"init","count":N,"checksum":"<16 hex>","max_staleness":S,"site":s,"build":B,"cpu":C,
//    "time":T}  (build, cpu: the first site's BuildId() and CpuDescription(), core/build_info.h;
//    absent in logs of older builds)
//   {"t":"update","update_id":I,"site":s,"base_version":B,"first_step":F,"last_step":L,
//    "applied_version":V,"checksum":"<16 hex: Hash64 of the encoded bytes>","bytes":N,
//    "weight":W,"time":T}
//   {"t":"rejoin","site":s,"step":L,"version":V,"next_update":I,"time":T}: a new process for
//    site s initialized (Init) after the site's pushes up to step L, when the server was at
//    version V and the next update id was I; it trains on from step L + 1.
//   {"t":"build","site":s,"build":B,"cpu":C,"time":T}: site s's process runs another build or
//    CPU than the init record's (once per process), so a replay cannot be bitwise for it.
// (keys as nlohmann::json writes them: in alphabetical order; readers must not rely on order).
// "site" of init is the first caller; "time" (Unix seconds) is informational and ignored.
// weight W is the float32 widened to double, written as the shortest decimal that reads back as
// that double (nlohmann::json), so reading it as a double and narrowing gives the same float32
// bits; ReadOpLog refuses (kCorruption) a weight that is not exactly a float32 or not finite.
// update_id must run 0, 1, 2, ... and the applied versions (those not -1) 1, 2, 3, ... (else
// kCorruption); a log without its init line is kCorruption.
struct OpLog {
  uint64_t count = 0;          // parameters
  uint64_t init_checksum = 0;  // of the version-0 floats
  int64_t max_staleness = 0;
  std::string build, cpu;  // of the site that initialized the server ("" when not logged)
  struct SiteBuild {
    int site = 0;
    std::string build, cpu;
  };
  std::vector<SiteBuild> other_builds;  // sites that ran another build or CPU than the init's
  std::vector<PsLogEntry> entries;
  struct Rejoin {
    int site = 0;
    int64_t step = 0, version = 0, next_update = 0;
  };
  std::vector<Rejoin> rejoins;
};
StatusOr<OpLog> ReadOpLog(const std::string& path);
// The same for a log already read (ReadLog); `path` names it in messages.
struct LogContents;
StatusOr<OpLog> ParseOpLog(const LogContents& contents, const std::string& path);

}  // namespace atl
