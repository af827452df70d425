#include "worker/runtime/pipeline_testing.h"

#include <thread>

#include "gtest/gtest.h"
#include "worker/data/synthetic_text.h"
#include "worker/runtime/in_process_device_channel.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/train/local_trainer.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace testing {

TrainConfig SmallConfig() {
  TrainConfig c;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.d_model = 32;
  c.model.max_seq_len = 16;
  c.seq_len = 16;
  c.batch_size = 8;
  c.micro_batches = 4;
  c.adam.lr = 1e-3f;
  c.seed = 3;
  c.eval_interval = 4;
  c.eval_windows = 7;
  return c;
}

Dataset MakeDataset() {
  std::string text = GenerateEnglishText(5, 100000);
  return Dataset::Create(std::vector<uint16_t>(text.begin(), text.end()), 16, 0.1).value();
}

namespace {

bool EvaluatesAfter(const TrainConfig& c, int step) {
  return c.eval_interval > 0 && (step % c.eval_interval == 0 || step == kIterations);
}

}  // namespace

RunOutput RunLocal(const TrainConfig& c, const Dataset& data, Backend* backend) {
  auto trainer = LocalTrainer::Create(c, &data, backend).value();
  RunOutput out;
  for (int i = 0; i < kIterations; ++i) {
    out.losses.push_back(trainer->Step().value().loss);
    if (EvaluatesAfter(c, i + 1)) out.val_losses.push_back(trainer->Evaluate().value());
  }
  for (Parameter* p : trainer->model().parameters()) {
    out.weights[p->name] = backend->Download(p->value).ToVector();
  }
  return out;
}

RunOutput RunPipeline(const TrainConfig& c, const Dataset& data,
                      const std::vector<Range>& forward, const std::vector<Range>& backward,
                      Schedule schedule, const std::function<Backend*(int stage)>& backend_of,
                      const std::vector<DeviceLinkMember>* device_members) {
  const int stages = static_cast<int>(forward.size());
  const int units = NumUnits(c.model);
  auto programs =
      CompileBiPartitionPrograms(forward, backward, units, c.micro_batches, schedule).value();
  const int per = c.batch_size / c.micro_batches;
  auto eval_programs =
      CompileEvalPrograms(forward, units, (c.eval_windows + per - 1) / per).value();
  InProcessFabric fabric(stages);
  InProcessDeviceHub hub(stages, absl::Seconds(30));
  std::vector<std::unique_ptr<DeviceChannel>> channels(stages);
  RunOutput out;
  if (device_members != nullptr) {
    const DeviceLinkPlan plan = PlanDeviceLinks(*device_members, &programs);
    for (int s = 0; s < stages; ++s) {
      if (plan.group_of_stage[s] < 0) continue;
      channels[s] = hub.ChannelFor(s);
      out.grouped_stages.push_back(s);
    }
  }
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<StageRuntime>> runtimes;
  for (int s = 0; s < stages; ++s) {
    transports.push_back(fabric.Connect(s));
    StageSetup setup{"job-eq", c, s, stages, ToUnitRange(forward[s]), ToUnitRange(backward[s]),
                     programs[s], absl::Seconds(30), eval_programs[s]};
    for (int t = 0; t < stages; ++t) {
      if (backward[t].end > backward[t].begin) setup.optimizer_stages.push_back(t);
    }
    if (backend_of != nullptr && backend_of(s) != nullptr) setup.backend = backend_of(s);
    setup.device_channel = channels[s].get();
    runtimes.push_back(StageRuntime::Create(setup, &data, transports[s].get()).value());
  }
  std::vector<std::vector<IterationResult>> results(stages);
  std::vector<std::vector<float>> val_losses(stages);
  std::vector<absl::Status> errors(stages);
  std::vector<std::thread> threads;
  for (int s = 0; s < stages; ++s) {
    threads.emplace_back([&, s] {
      for (int i = 0; i < kIterations && errors[s].ok(); ++i) {
        auto r = runtimes[s]->RunIteration(i);
        if (!r.ok()) {
          errors[s] = r.status();
          fabric.Shutdown();  // wake the other stages instead of letting them time out
          break;
        }
        results[s].push_back(*r);
        if (!EvaluatesAfter(c, i + 1)) continue;
        auto val = runtimes[s]->RunEval(i + 1);
        if (!val.ok()) {
          errors[s] = val.status();
          fabric.Shutdown();
        } else if (val->has_value()) {
          val_losses[s].push_back(**val);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  out.device_tensors = hub.sent();
  EXPECT_EQ(hub.in_flight(), 0) << "device tensors sent and never received";
  for (int s = 0; s < stages; ++s) EXPECT_TRUE(errors[s].ok()) << errors[s];
  int loss_stage = 0;  // the forward owner of head reports the losses
  while (forward[loss_stage].end != units) ++loss_stage;
  for (const IterationResult& r : results[loss_stage]) {
    double sum = 0.0;  // LocalTrainer's mean: double sum, divided, as float
    for (float l : r.micro_batch_losses) sum += l;
    out.losses.push_back(static_cast<float>(sum / c.micro_batches));
  }
  out.val_losses = val_losses[loss_stage];
  for (int s = 0; s < stages; ++s) {
    if (s != loss_stage) {
      EXPECT_TRUE(val_losses[s].empty()) << "stage " << s;
    }
  }
  for (int s = 0; s < stages; ++s) {
    Backend* backend = backend_of != nullptr && backend_of(s) != nullptr ? backend_of(s)
                                                                           : CpuBackend();
    for (Parameter* p : runtimes[s]->parameters()) {
      std::vector<float> values = backend->Download(p->value).ToVector();
      auto [it, inserted] = out.weights.emplace(p->name, values);
      if (!inserted) {
        EXPECT_EQ(it->second, values) << "copies of " << p->name;
      }
    }
  }
  return out;
}

}  // namespace testing
}  // namespace pipetrain
