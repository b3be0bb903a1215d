#include "train/metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/file.h"
#include "core/log.h"

namespace atl {

std::string MetricsJson(const StepMetrics& m) {
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  j["lr"] = m.lr;
  j["grad_norm"] = m.grad_norm;
  j["tokens"] = m.tokens;
  // Rounded: they are measurements, not results.
  j["tokens_per_s"] = std::round(m.tokens_per_s * 10) / 10;
  j["step_ms"] = std::round(m.step_ms * 1000) / 1000;
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  if (m.site) j["site"] = *m.site;
  if (m.wan_ms) j["wan_ms"] = std::round(*m.wan_ms * 1000) / 1000;
  if (m.wan_bytes_sent) j["wan_bytes_sent"] = *m.wan_bytes_sent;
  if (m.sync_bytes_sent) j["sync_bytes_sent"] = *m.sync_bytes_sent;
  if (m.outer_rounds) j["outer_rounds"] = *m.outer_rounds;
  for (const std::string& e : m.sdc) j["sdc"].push_back(nlohmann::ordered_json::parse(e));
  return j.dump();
}

MetricsLog::~MetricsLog() {
  if (f_ != nullptr) std::fclose(f_);
  if (events_ != nullptr) std::fclose(events_);
}

namespace {

// Opens a JSON-lines file keyed by "step" for appending, keeping the lines of steps up to
// keep_through (0: none).
StatusOr<std::FILE*> OpenSteps(const std::string& path, int64_t keep_through) {
  std::string kept;
  if (keep_through > 0 && FileExists(path)) {
    ATOLL_ASSIGN_OR_RETURN(std::string old, ReadFile(path));
    std::istringstream in(old);
    std::string line;
    while (std::getline(in, line)) {
      try {
        auto j = nlohmann::json::parse(line);
        if (j.contains("step") && j["step"].is_number_integer() &&
            j["step"].get<int64_t>() <= keep_through)
          kept += line + "\n";
      } catch (const nlohmann::json::exception&) {
        // A torn last line of a killed run: drop it.
      }
    }
  }
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(path, kept));
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return Status::IoError(fmt::format("opening {} for appending", path));
  return f;
}

}  // namespace

Status MetricsLog::Open(const std::string& path, int64_t keep_through,
                        const std::string& events_path) {
  path_ = path;
  events_path_ = events_path;
  ATOLL_ASSIGN_OR_RETURN(f_, OpenSteps(path, keep_through));
  if (!events_path.empty()) {
    ATOLL_ASSIGN_OR_RETURN(events_, OpenSteps(events_path, keep_through));
  }
  return Status::Ok();
}

Status MetricsLog::Append(const StepMetrics& m) {
  const std::string line = MetricsJson(m) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    return Status::IoError(fmt::format("writing {}", path_));
  if (events_ == nullptr || m.sdc.empty()) return Status::Ok();
  std::string lines;
  for (const std::string& e : m.sdc) {
    nlohmann::ordered_json j;
    j["step"] = m.step;
    j["event"] = "sdc";
    const nlohmann::ordered_json event = nlohmann::ordered_json::parse(e);
    for (const auto& [k, v] : event.items()) j[k] = v;
    lines += j.dump() + "\n";
  }
  if (std::fwrite(lines.data(), 1, lines.size(), events_) != lines.size() ||
      std::fflush(events_) != 0)
    return Status::IoError(fmt::format("writing {}", events_path_));
  return Status::Ok();
}

std::string FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = int64_t(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

ProgressBar::ProgressBar(int64_t first_step, int64_t total, std::FILE* stream)
    : out_(stream),
      tty_(::isatty(::fileno(stream)) != 0),
      first_(first_step),
      total_(total),
      start_s_(NowSeconds()) {}

void ProgressBar::Update(const StepMetrics& m) {
  ema_tokens_per_s_ =
      ema_tokens_per_s_ == 0 ? m.tokens_per_s : 0.9 * ema_tokens_per_s_ + 0.1 * m.tokens_per_s;
  const int64_t done = m.step - first_;
  const double elapsed = NowSeconds() - start_s_;
  const double eta = done > 0 ? elapsed / double(done) * double(total_ - m.step) : NAN;
  const std::string val = m.val_loss ? fmt::format(" | val {:.4f}", *m.val_loss) : "";
  if (tty_) {
    // Redraw at most 10 times a second (fast steps would flood a slow terminal), but always
    // for the last step and for validation.
    const double now = NowSeconds();
    if (now - last_draw_s_ < 0.1 && m.step != total_ && !m.val_loss) return;
    last_draw_s_ = now;
    constexpr int kWidth = 24;
    const int filled = int(kWidth * double(m.step) / double(total_));
    const std::string bar =
        std::string(size_t(filled), '#') + std::string(size_t(kWidth - filled), '.');
    std::fprintf(out_, "\r[%s] %lld/%lld loss %.4f | %.0f tok/s | ETA %s   ", bar.c_str(),
                 (long long)m.step, (long long)total_, m.loss, ema_tokens_per_s_,
                 FormatDuration(eta).c_str());
    drawn_ = true;
    if (m.val_loss) {
      std::fprintf(out_, "\nstep %lld: val loss %.4f\n", (long long)m.step, *m.val_loss);
      drawn_ = false;
    }
    std::fflush(out_);
    return;
  }
  const int64_t every = std::max<int64_t>(1, (total_ - first_) / 20);
  if (m.val_loss || m.step == total_ || done == 1 || done % every == 0) {
    std::fprintf(out_, "step %lld/%lld loss %.4f lr %.3g grad_norm %.3f | %.0f tok/s | ETA %s%s\n",
                 (long long)m.step, (long long)total_, m.loss, m.lr, m.grad_norm, ema_tokens_per_s_,
                 FormatDuration(eta).c_str(), val.c_str());
    std::fflush(out_);
  }
}

void ProgressBar::Finish() {
  if (tty_ && drawn_) std::fputc('\n', out_);
  drawn_ = false;
  std::fflush(out_);
}

}  // namespace atl
