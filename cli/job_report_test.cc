#include "cli/job_report.h"

#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

v1::Job SucceededJob(int steps) {
  v1::Job job;
  job.set_id("job-1");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.mutable_progress()->set_step(steps);
  job.mutable_progress()->set_loss(2.5f);
  for (int i = 0; i < steps; ++i) job.mutable_progress()->add_loss_history(i < steps - 20 ? 9 : 2);
  return job;
}

// plan.micro_batches is per replica: with replicas the line says so (a
// re-plan from 2 replicas to 1 doubles it, the global batch unchanged).
TEST(FormatPlanMicroBatches, PerReplicaWithReplicasAndTensorRanks) {
  v1::Plan plan;
  plan.set_micro_batches(8);
  EXPECT_EQ(FormatPlanMicroBatches(plan), "8 micro-batches");
  plan.set_data_parallel(1);
  plan.set_tensor_parallel(1);
  EXPECT_EQ(FormatPlanMicroBatches(plan), "8 micro-batches");
  plan.set_micro_batches(4);
  plan.set_data_parallel(2);
  EXPECT_EQ(FormatPlanMicroBatches(plan), "4 micro-batches per replica x 2 replicas");
  plan.set_tensor_parallel(2);
  EXPECT_EQ(FormatPlanMicroBatches(plan),
            "4 micro-batches per replica x 2 replicas, 2 tensor ranks per stage");
}

TEST(FormatJobOutcome, FinalLossAndTheMeanOfTheLastSteps) {
  v1::Job job = SucceededJob(30);
  job.mutable_progress()->mutable_loss_history()->Set(29, 4);  // the tail: 19 x 2 and a 4
  EXPECT_EQ(FormatJobOutcome(job),
            "job job-1 SUCCEEDED after 30 steps, final loss 2.5000 (mean of the last 20 steps "
            "2.1000)\n");
}

TEST(FormatJobOutcome, ValidationReasonAndWeightsWhenThere) {
  v1::Job job = SucceededJob(1);  // one step: no mean
  job.mutable_progress()->set_val_step(1);
  job.mutable_progress()->set_val_loss(3.25f);
  job.set_reason("done early");
  job.set_weights_path("/out/w.safetensors");
  EXPECT_EQ(FormatJobOutcome(job),
            "job job-1 SUCCEEDED after 1 steps, final loss 2.5000\n"
            "validation loss 3.2500 after step 1\n"
            "reason: done early\n"
            "weights: /out/w.safetensors\n");
}

// A reason can carry a worker's error message (a join-token holder's
// text): its escape sequences and line breaks are printed inert.
TEST(FormatJobOutcome, ReasonWithTerminalControls_PrintedInert) {
  v1::Job job = SucceededJob(1);
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_reason("worker w-2: \x1b]0;pwned\x07\r\nfake");
  EXPECT_TRUE(Has(FormatJobOutcome(job), "reason: worker w-2: \\x1b]0;pwned\\x07\\x0d\\x0afake\n"))
      << FormatJobOutcome(job);
}

// A job whose checkpoint writes fail says so at its end: a run that
// looked healthy would have redone every step since at a recovery.
TEST(FormatJobOutcome, CheckpointWritesFailing_Said) {
  v1::Job job = SucceededJob(1);
  job.mutable_progress()->set_checkpoint_failures(3);
  job.mutable_progress()->set_checkpoint_error("step 30, stage 0: No space left on device");
  EXPECT_TRUE(Has(FormatJobOutcome(job),
                  "checkpoints: 3 writes failed since the start (none complete); the last: step "
                  "30, stage 0: No space left on device\n"))
      << FormatJobOutcome(job);
  job.mutable_progress()->set_checkpoint_step(20);
  EXPECT_TRUE(Has(FormatJobOutcome(job), "3 writes failed since the complete one of step 20;"))
      << FormatJobOutcome(job);
}

TEST(FormatJobOutcome, StillGoingOrNotStarted) {
  v1::Job job = SucceededJob(30);
  job.set_state(v1::JOB_STATE_RUNNING);
  job.mutable_spec()->mutable_training()->set_steps(100);
  EXPECT_EQ(
      FormatJobOutcome(job).rfind("job job-1 RUNNING at step 30 of 100, loss 2.5000 (mean", 0), 0u)
      << FormatJobOutcome(job);
  v1::Job queued;
  queued.set_id("job-2");
  queued.set_state(v1::JOB_STATE_QUEUED);
  queued.set_reason("waiting for 2 READY workers (1 ready)");
  EXPECT_EQ(FormatJobOutcome(queued),
            "job job-2 QUEUED, no step yet\nreason: waiting for 2 READY workers (1 ready)\n");
}

TEST(StepTiming, FromATenthOfTheStepsOn) {
  StepTiming timing;
  const absl::Time t0 = absl::UnixEpoch();
  timing.Saw(9, 100, t0);  // before a tenth: start-up
  EXPECT_EQ(timing.SecondsPerStep(), 0);
  timing.Saw(10, 100, t0 + absl::Seconds(1));
  EXPECT_EQ(timing.SecondsPerStep(), 0);  // one sighting
  timing.Saw(50, 100, t0 + absl::Seconds(3));
  EXPECT_DOUBLE_EQ(timing.SecondsPerStep(), 2.0 / 40);
  EXPECT_EQ(timing.first_step, 10);
  EXPECT_EQ(timing.last_step, 50);
}

TEST(FormatPlanReport, StepTimeNextToThePrediction) {
  v1::Job job = SucceededJob(100);
  v1::Plan plan;
  plan.set_predicted_iteration_seconds(0.09);
  plan.set_profile_source("measured on cpu");
  StepTiming timing;
  timing.Saw(10, 100, absl::UnixEpoch());
  timing.Saw(90, 100, absl::UnixEpoch() + absl::Seconds(8));
  EXPECT_EQ(FormatPlanReport(job, plan, timing),
            "step time: measured 0.1000 s (steps 10-90), predicted 0.0900 s by the plan's "
            "simulation (-10%; measured on cpu)\n");
  // No prediction, or too few sightings: no line.
  EXPECT_EQ(FormatPlanReport(job, plan, StepTiming()), "");
  plan.set_predicted_iteration_seconds(0);
  EXPECT_EQ(FormatPlanReport(job, plan, timing), "");
}

TEST(FormatPlanReport, WithoutSightings_TheWorkersStepTime) {
  v1::Job job = SucceededJob(10);
  v1::Plan plan;
  plan.set_predicted_iteration_seconds(0.05);
  plan.set_profile_source("analytic");
  for (const char* id : {"w-1", "w-2"}) {
    v1::StageTime* t = job.mutable_progress()->add_stage_times();
    t->set_worker_id(id);
    t->set_steps(10);
    t->set_busy_seconds(0.3);
    t->set_idle_seconds(id[2] == '1' ? 0.1 : 0.2);  // w-2: 0.05 s a step, the slower
    plan.add_stages()->set_worker_id(id);
  }
  const std::string text = FormatPlanReport(job, plan, StepTiming());
  EXPECT_EQ(
      text.rfind("step time: measured 0.0500 s (the slowest worker's mean over this plan's steps), "
                 "predicted 0.0500 s by the plan's simulation (+0%; analytic)\n",
                 0),
      0u)
      << text;
}

TEST(FormatPlanReport, AutoLayoutFromTheLastPlansReason) {
  v1::Job job = SucceededJob(10);
  job.add_plan_history()->set_reason("initial plan; 2 replicas x 2 stages chosen by step time");
  EXPECT_EQ(FormatPlanReport(job, v1::Plan(), StepTiming()),
            "layout: 2 replicas x 2 stages chosen by step time\n");
  job.add_plan_history()->set_reason("worker w-3 is gone; 1 replica x 3 stages chosen by x");
  EXPECT_EQ(FormatPlanReport(job, v1::Plan(), StepTiming()),
            "layout (last plan): 1 replica x 3 stages chosen by x\n");
  job.add_plan_history()->set_reason("worker w-2 drained");  // a fixed layout names no choice
  EXPECT_EQ(FormatPlanReport(job, v1::Plan(), StepTiming()), "");
}

// The profile's source names the profiling worker's device and host and
// may quote its error; a layout reason may quote a worker's error: both
// printed inert, as the job's reason is.
TEST(FormatPlanReport, WorkerTextWithTerminalControls_PrintedInert) {
  v1::Job job = SucceededJob(100);
  job.add_plan_history()->set_reason("worker w-3: \x1b[2J; 1 replica x 3 stages chosen by x");
  v1::Plan plan;
  plan.set_predicted_iteration_seconds(0.09);
  plan.set_profile_source("measured on \x1b]0;pwned\x07 by w-1");
  StepTiming timing;
  timing.Saw(10, 100, absl::UnixEpoch());
  timing.Saw(90, 100, absl::UnixEpoch() + absl::Seconds(8));
  const std::string text = FormatPlanReport(job, plan, timing);
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_TRUE(Has(text, "(-10%; measured on \\x1b]0;pwned\\x07 by w-1)")) << text;
  job.mutable_plan_history(0)->set_reason("x; worker \x1b[2J chosen by x");
  EXPECT_EQ(FormatPlanReport(job, v1::Plan(), StepTiming()),
            "layout: worker \\x1b[2J chosen by x\n");
}

TEST(FormatPlanReport, CompressedStagesAndTensorPartitions) {
  v1::Job job = SucceededJob(10);
  job.mutable_spec()->mutable_compression()->mutable_data_parallel()->set_codec("powersgd:rank=4");
  v1::Plan plan;
  plan.set_data_parallel(2);
  plan.set_tensor_parallel(2);
  for (int g = 0; g < 8; ++g) plan.add_stages();  // 2 replicas x 2 stages x 2 ranks
  plan.set_data_parallel_powersgd_rank(4);
  plan.add_data_parallel_compressed_stages(0);
  plan.add_tensor_partitions_forward(1);
  plan.add_tensor_partitions_forward(2);
  plan.add_tensor_partitions_backward(4);
  plan.add_tensor_partitions_backward(1);
  const std::string text = FormatPlanReport(job, plan, StepTiming());
  EXPECT_TRUE(Has(text, "data-parallel all-reduce: powersgd rank 4 on stages [0] of 2\n")) << text;
  EXPECT_TRUE(Has(text, "tensor partitions per unit: forward [1,2], backward [4,1]\n")) << text;
  plan.set_data_parallel_powersgd_rank(0);
  plan.set_data_parallel_quantizer("bf16");
  EXPECT_TRUE(Has(FormatPlanReport(job, plan, StepTiming()),
                  "data-parallel all-reduce: bf16 on stages [0] of 2\n"));
  plan.clear_data_parallel_compressed_stages();  // the planner chose none
  EXPECT_TRUE(Has(FormatPlanReport(job, plan, StepTiming()),
                  "data-parallel all-reduce: bf16 on no stage of 2 (every stage's all-reduce went "
                  "raw)\n"));
  plan.set_data_parallel(1);  // re-planned onto one replica
  EXPECT_TRUE(Has(FormatPlanReport(job, plan, StepTiming()),
                  "data-parallel all-reduce: none (the plan has one replica)\n"));
  job.mutable_spec()->mutable_compression()->mutable_data_parallel()->set_codec("none");
  EXPECT_FALSE(Has(FormatPlanReport(job, plan, StepTiming()), "data-parallel"));
}

TEST(FormatPlanReport, EndsWithTheStageTable) {
  v1::Job job = SucceededJob(10);
  v1::StageTime* t = job.mutable_progress()->add_stage_times();
  t->set_worker_id("w-1");
  t->set_steps(10);
  t->set_busy_seconds(0.01);
  v1::Plan plan;
  plan.add_stages()->set_worker_id("w-1");
  const std::string text = FormatPlanReport(job, plan, StepTiming());
  EXPECT_EQ(text.rfind("per step, measured [predicted]", 0), 0u) << text;
  EXPECT_TRUE(Has(text, "  w-1    stage 0  1.0 ms")) << text;
}

}  // namespace
}  // namespace pipetrain
