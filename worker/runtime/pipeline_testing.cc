#include "worker/runtime/pipeline_testing.h"

#include <algorithm>
#include <map>
#include <optional>
#include <thread>

#include "coordinator/planner/compression_marking.h"
#include "coordinator/planner/fused_embedding_sync.h"
#include "gtest/gtest.h"
#include "worker/data/synthetic_text.h"
#include "worker/model/weights_io.h"
#include "worker/runtime/data_parallel_testing.h"
#include "worker/runtime/in_process_device_channel.h"
#include "worker/runtime/in_process_device_collective.h"
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

TrainConfig WithClippingAndCosine(TrainConfig c) {
  c.grad_clip = 0.05f;
  c.lr_schedule = LrSchedule::kCosine;
  c.warmup_steps = 3;
  c.min_lr = c.adam.lr / 10;
  return c;
}

void ExpectRunMatchesLocal(const TrainConfig& c, const RunOutput& pipe, const RunOutput& local,
                           const std::string& what, double weights_relative) {
  ASSERT_EQ(pipe.losses.size(), local.losses.size()) << what;
  ExpectLossesClose(pipe.losses, local.losses, what + " losses");
  ExpectLossesClose(pipe.val_losses, local.val_losses, what + " validation losses");
  EXPECT_EQ(pipe.val_losses.size(), 3u) << what;  // after steps 4, 8 and 10
  ExpectWeightsClose(pipe.weights, local.weights, c.model.d_model, what, weights_relative);
}

void ExpectResumedMatches(const TrainConfig& c, const RunOutput& resumed, const RunOutput& whole,
                          int step, const std::string& what, double weights_relative) {
  ASSERT_LE(step, static_cast<int>(whole.losses.size())) << what;
  const std::vector<float> losses(whole.losses.begin() + step, whole.losses.end());
  // The validation passes after `step` (every eval_interval steps and last).
  const size_t passes_before = step / c.eval_interval;
  ASSERT_LE(passes_before, whole.val_losses.size()) << what;
  const std::vector<float> val_losses(whole.val_losses.begin() + passes_before,
                                      whole.val_losses.end());
  if (weights_relative == 0) {
    EXPECT_EQ(resumed.losses, losses) << what;
    EXPECT_EQ(resumed.val_losses, val_losses) << what;
    EXPECT_EQ(resumed.weights, whole.weights) << what;
    return;
  }
  ASSERT_EQ(resumed.losses.size(), losses.size()) << what;
  ExpectLossesClose(resumed.losses, losses, what + " losses");
  ExpectLossesClose(resumed.val_losses, val_losses, what + " validation losses");
  ExpectWeightsClose(resumed.weights, whole.weights, c.model.d_model, what, weights_relative);
}

Dataset MakeDataset() {
  std::string text = GenerateEnglishText(5, 100000);
  return Dataset::Create(std::vector<uint16_t>(text.begin(), text.end()), 16, 0.1).value();
}

namespace {

bool EvaluatesAfter(const TrainConfig& c, int step, int iterations) {
  return c.eval_interval > 0 && (step % c.eval_interval == 0 || step == iterations);
}

}  // namespace

RunOutput RunLocal(const TrainConfig& c, const Dataset& data, Backend* backend, int iterations) {
  auto trainer = LocalTrainer::Create(c, &data, backend).value();
  RunOutput out;
  for (int i = 0; i < iterations; ++i) {
    out.losses.push_back(trainer->Step().value().loss);
    if (EvaluatesAfter(c, i + 1, iterations)) {
      out.val_losses.push_back(trainer->Evaluate().value());
    }
  }
  for (Parameter* p : trainer->model().parameters()) {
    out.weights[p->name] = backend->Download(p->value).ToVector();
  }
  return out;
}

RunOutput RunPipeline(const TrainConfig& c, const Dataset& data, const std::vector<Range>& forward,
                      const std::vector<Range>& backward, Schedule schedule,
                      const std::function<Backend*(int stage)>& backend_of,
                      const std::vector<DeviceLinkMember>* device_members,
                      const PipelineExtras& extras) {
  const int replicas = extras.replicas;
  const int tp = extras.tensor_parallel;
  const int iterations = extras.iterations;
  const int stages = static_cast<int>(forward.size());
  // Runtimes, tensor rank innermost (StageSetup::GlobalWorker): runtime g
  // is replica g / (stages tp), stage (g / tp) % stages, tensor rank g % tp.
  const int total = replicas * stages * tp;
  auto stage_of = [&](int g) { return (g / tp) % stages; };
  EXPECT_TRUE(tp == 1 || device_members == nullptr) << "device groups with tensor parallelism";
  const int units = NumUnits(c.model);
  const int replica_micro_batches = c.micro_batches / replicas;
  auto programs =
      CompileBiPartitionPrograms(forward, backward, units, replica_micro_batches, schedule).value();
  if (extras.fuse_embedding_sync) {
    EXPECT_TRUE(FuseEmbeddingSync(backward, &programs).ok());
  }
  if (!extras.forward_codec.empty() || !extras.backward_codec.empty()) {
    v1::CompressionSpec compression;
    compression.set_forward(extras.forward_codec.empty() ? "none" : extras.forward_codec);
    compression.set_backward(extras.backward_codec.empty() ? "none" : extras.backward_codec);
    MarkCompression(compression, &programs);
  }
  const int per = c.batch_size / c.micro_batches;
  auto eval_programs =
      CompileEvalPrograms(forward, units, (c.eval_windows + per - 1) / per).value();
  InProcessFabric fabric(total);
  InProcessDeviceHub hub(total, absl::Seconds(30));
  std::vector<std::unique_ptr<DeviceChannel>> channels(total);
  RunOutput out;
  if (device_members != nullptr) {
    const DeviceLinkPlan plan = PlanDeviceLinks(*device_members, &programs);
    for (int g = 0; g < total; ++g) {
      if (plan.group_of_stage[stage_of(g)] < 0) continue;
      channels[g] = hub.ChannelFor(g);
      out.grouped_stages.push_back(g);
    }
  }
  // One hub per (stage, tensor rank) of the replicas, for exact stages.
  std::map<int, std::unique_ptr<InProcessCollectiveHub>> replica_hubs;
  std::vector<std::unique_ptr<DeviceCollective>> replica_collectives(total);
  if (extras.replica_device_collectives && replicas > 1) {
    for (int g = 0; g < total; ++g) {
      const auto& compressed = extras.dp_compressed_stages;
      const bool exact =
          std::find(compressed.begin(), compressed.end(), stage_of(g)) == compressed.end();
      if (!exact) continue;
      std::unique_ptr<InProcessCollectiveHub>& hub = replica_hubs[g % (stages * tp)];
      if (hub == nullptr) {
        hub = std::make_unique<InProcessCollectiveHub>(replicas, absl::Seconds(30));
      }
      replica_collectives[g] = hub->CollectiveFor(g / (stages * tp));
    }
  }
  // A failed runtime wakes the others instead of letting them time out.
  auto shut_down = [&] {
    fabric.Shutdown();
    hub.Abort();  // the device links' receives too
    for (auto& [position, replica_hub] : replica_hubs) replica_hub->Abort();
  };
  auto backend_at = [&](int g) {
    Backend* b = backend_of != nullptr ? backend_of(stage_of(g)) : nullptr;
    return b != nullptr ? b : CpuBackend();
  };
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<StageRuntime>> runtimes;
  std::vector<v1::StepTrace> traces(total);
  std::vector<v1::Program> runtime_programs;
  for (int g = 0; g < total; ++g) {
    const int s = stage_of(g);
    runtime_programs.push_back(programs[s]);
    transports.push_back(fabric.Connect(g));
    StageSetup setup{"job-eq",
                     c,
                     s,
                     stages,
                     ToUnitRange(forward[s]),
                     ToUnitRange(backward[s]),
                     programs[s],
                     absl::Seconds(30),
                     eval_programs[s]};
    setup.replica = g / (stages * tp);
    setup.replicas = replicas;
    setup.tensor_rank = g % tp;
    setup.tensor_parallel = tp;
    setup.tensor_mode = extras.tensor_mode;
    setup.tensor_partitions = extras.tensor_partitions;
    setup.tensor_partitions_forward = extras.tensor_partitions_forward;
    setup.tensor_partitions_backward = extras.tensor_partitions_backward;
    setup.tensor_partition_tune_steps = extras.tensor_partition_tune_steps;
    if (extras.dp_bucket_bytes > 0) setup.data_parallel_bucket_bytes = extras.dp_bucket_bytes;
    if (extras.max_feedback_replicas > 0) {
      setup.max_feedback_replicas = extras.max_feedback_replicas;
    }
    for (int compressed : extras.dp_compressed_stages) {
      if (compressed != s) continue;
      setup.data_parallel_powersgd_rank = extras.dp_powersgd_rank;
      setup.data_parallel_quantizer = extras.dp_quantizer;
    }
    for (int t = 0; t < stages; ++t) {
      if (backward[t].end > backward[t].begin) setup.optimizer_stages.push_back(t);
    }
    setup.backend = backend_at(g);
    setup.device_channel = channels[g].get();
    setup.device_collective = replica_collectives[g].get();
    runtimes.push_back(StageRuntime::Create(setup, &data, transports[g].get()).value());
  }
  const int64_t first = extras.resume != nullptr ? extras.resume->step : 0;
  if (extras.resume != nullptr) {
    for (int g = 0; g < total; ++g) {
      const int s = stage_of(g);
      std::vector<UnitState> held;
      for (int u = 0; u < units; ++u) {
        const bool holds = (forward[s].begin <= u && u < forward[s].end) ||
                           (backward[s].begin <= u && u < backward[s].end);
        if (!holds) continue;
        auto it = extras.resume->units.find(u);
        if (it != extras.resume->units.end()) held.push_back(it->second);
      }
      EXPECT_TRUE(runtimes[g]->Restore(held, extras.resume->optimizer_steps).ok())
          << "runtime " << g;
    }
  }
  std::vector<std::optional<StageSnapshot>> snapshots(total);
  std::vector<std::vector<IterationResult>> results(total);
  std::vector<std::map<std::string, int64_t>> collectives(total), collective_bytes(total);
  std::vector<std::map<std::string, double>> phase_seconds(total);
  std::vector<std::vector<float>> val_losses(total);
  std::vector<absl::Status> errors(total);
  // Tensor parallelism: each runtime's weights gathered into unsplit tensors
  // (a collective of its tensor ranks, so on the runtimes' threads).
  std::vector<std::vector<Parameter>> unsplit(total);
  std::vector<std::thread> threads;
  for (int g = 0; g < total; ++g) {
    threads.emplace_back([&, g] {
      for (int i = first; i < iterations && errors[g].ok(); ++i) {
        auto r = runtimes[g]->RunIteration(i, i == extras.traced_iteration ? &traces[g] : nullptr);
        if (!r.ok()) {
          errors[g] = r.status();
          shut_down();
          break;
        }
        for (const auto& [purpose, stats] : r->collectives) {
          collectives[g][purpose] += stats.count;
          collective_bytes[g][purpose] += stats.wire_bytes;
        }
        for (const auto& [phase, seconds] : r->phase_seconds) phase_seconds[g][phase] += seconds;
        results[g].push_back(*r);
        if (EvaluatesAfter(c, i + 1, iterations)) {
          auto val = runtimes[g]->RunEval(i + 1);
          if (!val.ok()) {
            errors[g] = val.status();
            shut_down();
          } else if (val->has_value()) {
            val_losses[g].push_back(**val);
          }
        }
        const int s = stage_of(g);
        // Replica 0's runtimes, and with compressed data-parallel
        // gradients every replica's (their error feedback goes to replica 0).
        if (i + 1 == extras.snapshot_after &&
            (g < stages * tp || runtimes[g]->SnapshotsEveryReplica()) &&
            backward[s].end > backward[s].begin && errors[g].ok()) {
          absl::StatusOr<StageSnapshot> snapshot = runtimes[g]->Snapshot(i + 1);
          if (snapshot.ok()) {
            snapshots[g] = *std::move(snapshot);
          } else {
            errors[g] = snapshot.status();
            shut_down();
          }
        }
      }
      if (tp > 1 && errors[g].ok()) {
        absl::StatusOr<std::vector<Parameter>> copies =
            runtimes[g]->UnsplitParameterCopies(iterations);
        if (copies.ok()) {
          unsplit[g] = *std::move(copies);
        } else {
          errors[g] = copies.status();
          shut_down();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (extras.traced_iteration >= 0) {
    out.traces = std::move(traces);
    out.programs = std::move(runtime_programs);
  }
  for (int g = 0; g < total; ++g) {
    for (const auto& [purpose, count] : collectives[g]) out.collectives[purpose] += count;
    for (const auto& [purpose, bytes] : collective_bytes[g]) {
      out.collective_bytes[purpose] += bytes;
    }
    for (const auto& [phase, seconds] : phase_seconds[g]) out.phase_seconds[phase] += seconds;
    out.last_partitions.push_back(results[g].empty() ? std::map<std::string, std::pair<int, int>>()
                                                     : results[g].back().tensor_partitions);
    int64_t peak = 0;
    for (const IterationResult& r : results[g]) peak = std::max(peak, r.activation_bytes_peak);
    out.activation_bytes_peak.push_back(peak);
  }
  for (int g = 0; g < total; ++g) {
    if (!snapshots[g].has_value()) continue;
    // Tensor rank 0 of replica 0 gathers the stage's snapshot; the other
    // ranks only send.
    if (g % tp != 0 || g >= stages * tp) {
      EXPECT_TRUE(snapshots[g]->units.empty()) << "runtime " << g << " kept a snapshot";
      continue;
    }
    out.checkpoint.step = snapshots[g]->step;
    out.checkpoint.optimizer_steps = snapshots[g]->optimizer_steps;
    for (UnitState& state : snapshots[g]->units) {
      auto [it, inserted] = out.checkpoint.units.emplace(state.unit, state);
      if (inserted) continue;
      // Another tensor rank's copy of the same stage: bitwise the same.
      if (it->second.values.size() != state.values.size() ||
          it->second.m.size() != state.m.size()) {
        ADD_FAILURE() << "unit " << state.unit << ": runtime " << g << "'s snapshot differs";
        continue;
      }
      for (size_t i = 0; i < state.values.size(); ++i) {
        EXPECT_EQ(it->second.values[i].tensor.ToVector(), state.values[i].tensor.ToVector())
            << state.values[i].name << " (runtime " << g << ")";
        if (i >= state.m.size()) continue;
        EXPECT_EQ(it->second.m[i].tensor.ToVector(), state.m[i].tensor.ToVector());
        EXPECT_EQ(it->second.v[i].tensor.ToVector(), state.v[i].tensor.ToVector());
      }
    }
  }
  out.device_tensors = hub.sent();
  for (const auto& [position, replica_hub] : replica_hubs) out.device_sums += replica_hub->sums();
  EXPECT_EQ(hub.in_flight(), 0) << "device tensors sent and never received";
  for (int g = 0; g < total; ++g)
    EXPECT_TRUE(errors[g].ok()) << "runtime " << g << ": " << errors[g];
  int loss_stage = 0;  // the forward owner of head reports the losses
  while (forward[loss_stage].end != units) ++loss_stage;
  // Every replica's loss stage has the step's losses (all-gathered), on
  // every tensor rank.
  const int loss_runtime = loss_stage * tp;
  for (const IterationResult& r : results[loss_runtime]) {
    EXPECT_EQ(r.micro_batch_losses.size(), static_cast<size_t>(c.micro_batches));
    double sum = 0.0;  // LocalTrainer's mean: double sum, divided, as float
    for (float l : r.micro_batch_losses) sum += l;
    out.losses.push_back(static_cast<float>(sum / c.micro_batches));
  }
  for (int g = 0; g < total; ++g) {
    if (g == loss_runtime || stage_of(g) != loss_stage) continue;
    const std::vector<IterationResult>& of = results[g];
    EXPECT_EQ(of.size(), results[loss_runtime].size()) << "runtime " << g;
    for (size_t i = 0; i < std::min(of.size(), results[loss_runtime].size()); ++i) {
      EXPECT_EQ(of[i].micro_batch_losses, results[loss_runtime][i].micro_batch_losses)
          << "runtime " << g << " step " << i;
    }
  }
  out.val_losses = val_losses[loss_runtime];
  for (int g = 0; g < total; ++g) {
    if (stage_of(g) != loss_stage) {
      EXPECT_TRUE(val_losses[g].empty()) << "runtime " << g;
    } else {
      EXPECT_EQ(val_losses[g], out.val_losses) << "runtime " << g << "'s validation";
    }
  }
  for (int g = 0; g < total; ++g) {
    std::vector<Parameter> copies =
        tp > 1 ? std::move(unsplit[g])
               : HostParameterCopies(backend_at(g), runtimes[g]->parameters());
    // Only tensor rank 0 ends with the unsplit weights.
    if (tp > 1 && g % tp != 0) {
      EXPECT_TRUE(copies.empty()) << "runtime " << g << " kept unsplit weights";
      continue;
    }
    for (const Parameter& p : copies) {
      std::vector<float> values = p.value.ToVector();
      auto [it, inserted] = out.weights.emplace(p.name, values);
      if (!inserted) {
        EXPECT_EQ(it->second, values) << "copies of " << p.name << " (runtime " << g << ")";
      }
    }
  }
  // The unsplit weights hold the embedding stage's tied wte alone: the
  // head's stage's copy is compared here, shard by shard (tensor rank).
  if (tp > 1) {
    std::map<int, std::vector<float>> wte_of_rank;
    for (int g = 0; g < total; ++g) {
      for (const Parameter& p : HostParameterCopies(backend_at(g), runtimes[g]->parameters())) {
        if (p.name != "wte.weight") continue;
        std::vector<float> values = p.value.ToVector();
        auto [it, inserted] = wte_of_rank.emplace(g % tp, values);
        if (!inserted) {
          EXPECT_EQ(it->second, values) << "tied wte shards (runtime " << g << ")";
        }
      }
    }
    // The tensors every rank holds whole (LayerNorms, biases, wpe): each
    // rank's copy, and its last step's gradient, bitwise its stage and
    // replica's rank 0's (runtime g is rank g % tp of the group g / tp).
    // The unsplit weights above are rank 0's alone, so a rank that drifted
    // would go unnoticed there; and a gradient one ulp off changes the
    // moments long before it shows in a weight.
    std::map<std::pair<int, std::string>, std::pair<std::vector<float>, std::vector<float>>> whole;
    for (int g = 0; g < total; ++g) {
      Backend* backend = backend_at(g);
      for (const Parameter* p : runtimes[g]->parameters()) {
        if (p->shard.sharded()) continue;
        const auto on_host = [backend](const Tensor& t) {
          return (t.on_device() ? backend->Download(t) : t).ToVector();
        };
        auto copy = std::make_pair(on_host(p->value), on_host(p->grad));
        auto [it, inserted] = whole.emplace(std::make_pair(g / tp, p->name), copy);
        if (!inserted) {
          EXPECT_EQ(it->second.first, copy.first)
              << "tensor rank " << g % tp << "'s copy of " << p->name << " (runtime " << g << ")";
          EXPECT_EQ(it->second.second, copy.second) << "tensor rank " << g % tp << "'s gradient of "
                                                    << p->name << " (runtime " << g << ")";
        }
      }
    }
  }
  return out;
}

}  // namespace testing
}  // namespace pipetrain
