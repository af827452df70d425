#include "cli/progress.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace pipetrain {

std::string FormatDuration(double seconds) {
  // Beyond ~292 billion years llround has no int64 result; such an ETA is as
  // unknown as an infinite one.
  if (!std::isfinite(seconds) || seconds < 0 || seconds >= 9e18) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

std::string RenderProgress(const ProgressSample& p, int bar_width) {
  std::string out;
  if (bar_width > 0) {
    // Clamped: a step outside [0, total] must not size the bar negatively.
    const double frac =
        p.total_steps > 0 ? std::clamp(double(p.step) / p.total_steps, 0.0, 1.0) : 1.0;
    const int filled = static_cast<int>(frac * bar_width);
    out = "[" + std::string(filled, '#') + std::string(bar_width - filled, '.') + "] ";
  }
  out += absl::StrFormat("step %d/%d | loss %.4f", p.step, p.total_steps, p.loss);
  if (p.val_loss.has_value()) {
    out += absl::StrFormat(" | val %.4f", *p.val_loss);
    if (p.val_step > 0 && p.val_step != p.step) out += absl::StrFormat(" (step %d)", p.val_step);
  }
  out += absl::StrFormat(" | %.0f tok/s | ETA %s", p.tokens_per_second,
                         FormatDuration(p.eta_seconds));
  if (p.recoveries > 0)
    out += absl::StrFormat(" | %d recover%s", p.recoveries, p.recoveries == 1 ? "y" : "ies");
  return out;
}

void ProgressReporter::Update(const ProgressSample& sample) {
  if (terminal_ && sample.val_loss.has_value()) {
    // An evaluation result stays on screen as a line of its own; the next
    // update draws a fresh bar below it.
    std::fprintf(out_, "\r%s\x1b[K\n", RenderProgress(sample, 0).c_str());
    bar_drawn_ = false;
  } else if (terminal_) {
    // \r returns to column 0; \x1b[K clears what a longer line left behind.
    std::fprintf(out_, "\r%s\x1b[K", RenderProgress(sample, 30).c_str());
    bar_drawn_ = true;
  } else {
    std::fprintf(out_, "%s\n", RenderProgress(sample, 0).c_str());
  }
  std::fflush(out_);
}

void ProgressReporter::Message(const std::string& line) {
  if (bar_drawn_) std::fprintf(out_, "\r\x1b[K");
  std::fprintf(out_, "%s\n", line.c_str());
  bar_drawn_ = false;
  std::fflush(out_);
}

void ProgressReporter::Finish() {
  if (bar_drawn_) std::fprintf(out_, "\n");
  bar_drawn_ = false;
  std::fflush(out_);
}

}  // namespace pipetrain
