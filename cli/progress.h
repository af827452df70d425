// Training progress for people: on a terminal a single line redrawn in
// place (bar, step, loss, tokens/s, ETA), with steps that carry a validation
// loss left on screen as lines of their own; otherwise one plain line per
// step, which is what logs and CI want. Not thread-safe.
#ifndef PIPETRAIN_CLI_PROGRESS_H_
#define PIPETRAIN_CLI_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace pipetrain {

struct ProgressSample {
  int64_t step = 0;          // steps completed
  int64_t total_steps = 0;
  float loss = 0.0f;
  std::optional<float> val_loss;
  double tokens_per_second = 0.0;
  double eta_seconds = 0.0;
  int recoveries = 0;  // times the job resumed after losing a worker
  // The step val_loss was measured at, when an earlier one than `step` (a
  // job polled between steps sees its evaluation late); 0: at `step`.
  int64_t val_step = 0;
};

// "45s", "3m05s", "2h07m"; "?" when negative, not finite or beyond int64 seconds.
std::string FormatDuration(double seconds);

// The text of one progress line; with `bar_width` > 0 it starts with a bar
// such as "[#####.....] ". Pure: used by both modes and by tests.
std::string RenderProgress(const ProgressSample& sample, int bar_width);

class ProgressReporter {
 public:
  // `terminal` selects the redrawn bar; use isatty(fileno(out)).
  ProgressReporter(std::FILE* out, bool terminal) : out_(out), terminal_(terminal) {}
  void Update(const ProgressSample& sample);
  // Prints a whole line (e.g. an evaluation result) without breaking the bar.
  void Message(const std::string& line);
  // Ends the bar line so later output starts on a fresh line.
  void Finish();

 private:
  std::FILE* out_;
  bool terminal_;
  bool bar_drawn_ = false;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_PROGRESS_H_
