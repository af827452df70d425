#include "cli/progress.h"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// Collects what a ProgressReporter writes, via an in-memory FILE*.
class CapturedStream {
 public:
  CapturedStream() : file_(open_memstream(&buffer_, &size_)) {}
  ~CapturedStream() {
    if (file_ != nullptr) std::fclose(file_);
    std::free(buffer_);
  }
  CapturedStream(const CapturedStream&) = delete;
  CapturedStream& operator=(const CapturedStream&) = delete;

  std::FILE* file() const { return file_; }
  // Everything written so far (open_memstream updates the buffer on fflush).
  std::string Text() {
    std::fflush(file_);
    return std::string(buffer_, size_);
  }

 private:
  char* buffer_ = nullptr;
  size_t size_ = 0;
  std::FILE* file_;
};

ProgressSample Sample(int64_t step, int64_t total, float loss) {
  ProgressSample s;
  s.step = step;
  s.total_steps = total;
  s.loss = loss;
  s.tokens_per_second = 1234.4;
  s.eta_seconds = 65;
  return s;
}

TEST(FormatDurationTest, Zero_Seconds) { EXPECT_EQ(FormatDuration(0), "0s"); }

TEST(FormatDurationTest, JustUnderMinute_RoundsToSeconds) {
  EXPECT_EQ(FormatDuration(59.4), "59s");
}

TEST(FormatDurationTest, RoundsUpToMinute_MinutesForm) { EXPECT_EQ(FormatDuration(59.5), "1m00s"); }

TEST(FormatDurationTest, OneMinute_MinutesForm) { EXPECT_EQ(FormatDuration(60), "1m00s"); }

TEST(FormatDurationTest, MinutesAndSeconds_PadsSeconds) {
  EXPECT_EQ(FormatDuration(185), "3m05s");
}

TEST(FormatDurationTest, LastSecondBeforeHour_MinutesForm) {
  EXPECT_EQ(FormatDuration(3599), "59m59s");
}

TEST(FormatDurationTest, OneHour_HoursForm) { EXPECT_EQ(FormatDuration(3600), "1h00m"); }

TEST(FormatDurationTest, HoursAndMinutes_DropsSeconds) {
  EXPECT_EQ(FormatDuration(7325), "2h02m");
}

TEST(FormatDurationTest, ManyHours_NoDayUnit) { EXPECT_EQ(FormatDuration(100 * 3600 + 60), "100h01m"); }

TEST(FormatDurationTest, Negative_Unknown) { EXPECT_EQ(FormatDuration(-1), "?"); }

TEST(FormatDurationTest, Infinite_Unknown) {
  EXPECT_EQ(FormatDuration(std::numeric_limits<double>::infinity()), "?");
}

TEST(FormatDurationTest, Nan_Unknown) {
  EXPECT_EQ(FormatDuration(std::numeric_limits<double>::quiet_NaN()), "?");
}

TEST(FormatDurationTest, TooLargeForInt64_Unknown) {
  // An ETA past int64 seconds cannot be rounded to an integer; it must not
  // print a wrapped negative number.
  EXPECT_EQ(FormatDuration(1e30), "?");
}

TEST(RenderProgressTest, NoBarNoVal_PlainLine) {
  EXPECT_EQ(RenderProgress(Sample(3, 10, 5.12346f), 0),
            "step 3/10 | loss 5.1235 | 1234 tok/s | ETA 1m05s");
}

TEST(RenderProgressTest, WithVal_AddsValField) {
  ProgressSample s = Sample(3, 10, 5.0f);
  s.val_loss = 4.5f;
  EXPECT_EQ(RenderProgress(s, 0), "step 3/10 | loss 5.0000 | val 4.5000 | 1234 tok/s | ETA 1m05s");
}

TEST(RenderProgressTest, WithBar_PrefixesProportionalBar) {
  EXPECT_EQ(RenderProgress(Sample(1, 4, 5.0f), 8),
            "[##......] step 1/4 | loss 5.0000 | 1234 tok/s | ETA 1m05s");
}

TEST(RenderProgressTest, WithBarAndVal_BothPresent) {
  ProgressSample s = Sample(5, 10, 2.25f);
  s.val_loss = 2.5f;
  EXPECT_EQ(RenderProgress(s, 4),
            "[##..] step 5/10 | loss 2.2500 | val 2.5000 | 1234 tok/s | ETA 1m05s");
}

TEST(RenderProgressTest, Complete_FullBar) {
  EXPECT_EQ(RenderProgress(Sample(10, 10, 1.0f), 5),
            "[#####] step 10/10 | loss 1.0000 | 1234 tok/s | ETA 1m05s");
}

TEST(RenderProgressTest, ZeroTotalSteps_FullBar) {
  EXPECT_EQ(RenderProgress(Sample(0, 0, 1.0f), 3),
            "[###] step 0/0 | loss 1.0000 | 1234 tok/s | ETA 1m05s");
}

TEST(RenderProgressTest, StepBeyondTotal_BarClampedFull) {
  EXPECT_EQ(RenderProgress(Sample(20, 10, 1.0f), 4),
            "[####] step 20/10 | loss 1.0000 | 1234 tok/s | ETA 1m05s");
}

TEST(RenderProgressTest, NegativeStep_BarClampedEmpty) {
  EXPECT_EQ(RenderProgress(Sample(-5, 10, 1.0f), 4),
            "[....] step -5/10 | loss 1.0000 | 1234 tok/s | ETA 1m05s");
}

TEST(RenderProgressTest, UnknownEta_QuestionMark) {
  ProgressSample s = Sample(1, 2, 1.0f);
  s.eta_seconds = std::numeric_limits<double>::infinity();
  EXPECT_EQ(RenderProgress(s, 0), "step 1/2 | loss 1.0000 | 1234 tok/s | ETA ?");
}

TEST(ProgressReporterTest, NonTerminalUpdate_OnePlainLineEach) {
  CapturedStream out;
  ProgressReporter reporter(out.file(), /*terminal=*/false);
  reporter.Update(Sample(1, 2, 3.0f));
  EXPECT_EQ(out.Text(), "step 1/2 | loss 3.0000 | 1234 tok/s | ETA 1m05s\n");
  reporter.Update(Sample(2, 2, 2.0f));
  EXPECT_EQ(out.Text(),
            "step 1/2 | loss 3.0000 | 1234 tok/s | ETA 1m05s\n"
            "step 2/2 | loss 2.0000 | 1234 tok/s | ETA 1m05s\n");
}

TEST(ProgressReporterTest, NonTerminalMessageAndFinish_PlainLinesNoEscapes) {
  CapturedStream out;
  ProgressReporter reporter(out.file(), /*terminal=*/false);
  reporter.Update(Sample(1, 2, 3.0f));
  reporter.Message("eval: val 2.0");
  reporter.Finish();
  EXPECT_EQ(out.Text(),
            "step 1/2 | loss 3.0000 | 1234 tok/s | ETA 1m05s\n"
            "eval: val 2.0\n");
}

TEST(ProgressReporterTest, TerminalUpdate_RedrawsInPlaceWithBar) {
  CapturedStream out;
  ProgressReporter reporter(out.file(), /*terminal=*/true);
  reporter.Update(Sample(5, 10, 1.0f));
  reporter.Update(Sample(10, 10, 0.5f));
  const std::string bar5 = "[" + std::string(15, '#') + std::string(15, '.') + "] ";
  const std::string bar10 = "[" + std::string(30, '#') + "] ";
  EXPECT_EQ(out.Text(), "\r" + bar5 + "step 5/10 | loss 1.0000 | 1234 tok/s | ETA 1m05s\x1b[K" +
                            "\r" + bar10 +
                            "step 10/10 | loss 0.5000 | 1234 tok/s | ETA 1m05s\x1b[K");
}

TEST(ProgressReporterTest, TerminalUpdateWithValLoss_LeavesAPersistentLine) {
  CapturedStream out;
  ProgressReporter reporter(out.file(), /*terminal=*/true);
  ProgressSample eval = Sample(10, 20, 1.0f);
  eval.val_loss = 0.75f;
  reporter.Update(eval);
  reporter.Finish();  // nothing left to end: the eval line ended itself
  EXPECT_EQ(out.Text(),
            "\rstep 10/20 | loss 1.0000 | val 0.7500 | 1234 tok/s | ETA 1m05s\x1b[K\n");
}

TEST(ProgressReporterTest, TerminalMessageAfterBar_ClearsLineFirst) {
  CapturedStream out;
  ProgressReporter reporter(out.file(), /*terminal=*/true);
  reporter.Update(Sample(0, 10, 1.0f));
  const std::string drawn = out.Text();
  reporter.Message("eval");
  EXPECT_EQ(out.Text(), drawn + "\r\x1b[Keval\n");
}

TEST(ProgressReporterTest, TerminalMessageWithoutBar_JustTheLine) {
  CapturedStream out;
  ProgressReporter reporter(out.file(), /*terminal=*/true);
  reporter.Message("hello");
  reporter.Message("again");
  EXPECT_EQ(out.Text(), "hello\nagain\n");
}

TEST(ProgressReporterTest, TerminalFinishAfterBar_EndsLineOnce) {
  CapturedStream out;
  ProgressReporter reporter(out.file(), /*terminal=*/true);
  reporter.Update(Sample(0, 10, 1.0f));
  const std::string drawn = out.Text();
  reporter.Finish();
  reporter.Finish();
  EXPECT_EQ(out.Text(), drawn + "\n");
}

TEST(ProgressReporterTest, TerminalFinishWithoutBar_WritesNothing) {
  CapturedStream out;
  ProgressReporter reporter(out.file(), /*terminal=*/true);
  reporter.Finish();
  EXPECT_EQ(out.Text(), "");
}

TEST(ProgressReporterTest, TerminalFinishAfterMessage_WritesNothingMore) {
  CapturedStream out;
  ProgressReporter reporter(out.file(), /*terminal=*/true);
  reporter.Update(Sample(0, 10, 1.0f));
  reporter.Message("done");
  const std::string before = out.Text();
  reporter.Finish();
  EXPECT_EQ(out.Text(), before);
}

}  // namespace
}  // namespace pipetrain
