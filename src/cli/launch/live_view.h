// `atoll launch`'s live view of a world: every site's latest step from DIR/site-N/metrics.jsonl,
// as one table redrawn in place on a terminal, or a compact line every 5 s into a log file.
//
// Thread-safety: one thread uses a LiveView.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"

namespace atl::cli {

// One site's latest step, from its metrics.jsonl.
struct SiteRow {
  bool has = false;
  int64_t step = 0;
  double loss = 0, tokens_per_s = 0, step_ms = 0, wan_ms = 0;
  uint64_t wan_bytes = 0, sync_bytes = 0;
  int64_t sdc_events = 0;  // lines of the site's events.jsonl (train/metrics.h)
  std::string last_sdc;    // the last one, in short
};
SiteRow ReadSiteRow(const std::string& metrics_path);
// Adds the site's silent-data-corruption events (its events.jsonl) to row.
void ReadSiteEvents(const std::string& events_path, SiteRow* row);
// Whether the coordinator's log (DIR/coordinator.log) records that site `site` registered.
bool SiteRegistered(const std::string& coordinator_log, int site);

class LiveView {
 public:
  LiveView(const std::string& dir, const RunConfig& cfg, bool quiet);
  // Reads every site's latest metrics and draws (rate-limited; `force` draws now).
  void Update(bool force);
  // Ends the in-place table (what follows goes below it).
  void Finish();
  // Before printing something else: nothing to do (the table is redrawn below it next time).
  void Interrupt() { drawn_lines_ = 0; }
  // A site lost (the world goes on without it), and back (a new process took it over).
  void MarkLost(int site);
  void MarkBack(int site);

 private:
  struct Totals {
    int64_t min_step = 0;
    double loss = 0, tokens_per_s = 0, wan_ms = 0, step_ms = 0;
    uint64_t wan_bytes = 0, sync_bytes = 0;
    bool any = false;
  };
  std::vector<SiteRow> Rows() const;
  Totals Sum(const std::vector<SiteRow>& rows) const;
  std::string Header(double now, const Totals& t) const;
  bool Lost(int site) const;
  void Draw(double now);
  void Line(double now);

  std::string dir_;
  int sites_, ranks_;
  int64_t steps_;
  bool quiet_, tty_;
  double start_s_;
  double last_draw_s_ = -1e9;
  int drawn_lines_ = 0;
  std::vector<int> lost_;
};

}  // namespace atl::cli
