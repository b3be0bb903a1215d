// What a training run reports: DIR/metrics.jsonl for programs, a progress bar for people.
//
// metrics.jsonl holds one JSON object per optimizer step, appended and flushed as the step ends:
//   {"step": 12, "loss": 5.93, "lr": 0.0006, "grad_norm": 1.42, "tokens": 768,
//    "tokens_per_s": 5123.4, "step_ms": 11.9, "val_loss": 6.01}
// and, with several sites, "site", "wan_ms", "wan_bytes_sent" (and "sync_bytes_sent",
// "outer_rounds" for the low-communication and asynchronous strategies), and on a step where a
// corruption detector raised an alarm, "sdc": [{"site", "rank", "detector", "what", ...}]
// (train/sdc/monitor.h).
// step counts completed steps (1..train.steps, as checkpoint-<step> does); tokens is cumulative;
// val_loss appears on the steps where validation ran. loss, lr, grad_norm and val_loss are
// deterministic (the same bits for the same config and seed); tokens_per_s and step_ms are not.
//
// The progress bar redraws one line in place (\r) when stderr is a terminal; otherwise it prints
// a plain line now and then (about 20 per run, plus every validation), so logs stay readable.
//
// Thread-safety: not thread-safe; owned by the trainer.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace atl {

struct StepMetrics {
  int64_t step = 0;  // completed steps
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  uint64_t tokens = 0;
  double tokens_per_s = 0;
  double step_ms = 0;
  std::optional<double> val_loss;
  // Several sites (world.sites > 1): this site, and what crossing sites cost it.
  std::optional<int> site;
  std::optional<double> wan_ms;  // the step's time blocked on the WAN (all-reduce or exchange)
  std::optional<uint64_t> wan_bytes_sent;  // bytes the leader sent to other sites so far
  // What the sync strategy would have sent by now for the same progress (its ring all-reduce of
  // the float32 gradient every step: 2 (sites - 1) / sites of it per leader); not for sync.
  std::optional<uint64_t> sync_bytes_sent;
  std::optional<int64_t> outer_rounds;  // exchanges completed (diloco, streaming) / pushes (async)
  // What the corruption detectors found this step (train/sdc/monitor.h): one JSON object each,
  // written as the array "sdc".
  std::vector<std::string> sdc;
};

// One JSON line (no newline).
std::string MetricsJson(const StepMetrics& m);

class MetricsLog {
 public:
  MetricsLog() = default;
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Opens `path` for appending. Lines of an earlier run whose step is greater than keep_through
  // are dropped first (a resumed run rewrites the steps after its checkpoint); keep_through = 0
  // starts a new file. events_path (optional) is the events log, kept the same way: each sdc
  // event of a step as its own line, {"step": 40, "event": "sdc", "site": 0, "rank": 1,
  // "detector": ..., ...}, for tools that follow a run's incidents (the live view).
  Status Open(const std::string& path, int64_t keep_through, const std::string& events_path = "");
  Status Append(const StepMetrics& m);

 private:
  std::FILE* f_ = nullptr;
  std::FILE* events_ = nullptr;
  std::string path_, events_path_;
};

class ProgressBar {
 public:
  // Steps first_step + 1 .. total will be reported. `stream` is usually stderr.
  ProgressBar(int64_t first_step, int64_t total, std::FILE* stream);
  void Update(const StepMetrics& m);
  // Ends the in-place line, if any.
  void Finish();
  bool is_tty() const { return tty_; }

 private:
  std::FILE* out_;
  bool tty_;
  int64_t first_, total_;
  double start_s_;
  double ema_tokens_per_s_ = 0;
  double last_draw_s_ = 0;
  bool drawn_ = false;
};

// "1h02m", "3m05s", "12s".
std::string FormatDuration(double seconds);

}  // namespace atl
