#include "worker/collectives/tensor_parallel_chain_testing.h"

#include <memory>
#include <thread>

#include "worker/collectives/collectives.h"
#include "worker/collectives/tensor_parallel_comm.h"
#include "worker/model/attention_unit.h"
#include "worker/model/mlp_unit.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace testing {

GptConfig TensorParallelChainConfig(int d_model) {
  GptConfig c;
  c.vocab_size = 64;
  c.max_seq_len = 16;
  c.n_layer = 1;
  c.n_head = 4;
  c.d_model = d_model;
  return c;
}

TokenBatch TensorParallelChainBatch() {
  TokenBatch b;
  b.batch = 4;
  b.seq_len = 16;
  b.inputs.assign(b.batch * b.seq_len, 0);
  b.targets.assign(b.batch * b.seq_len, 0);
  return b;
}

std::vector<TensorParallelChainRun> RunTensorParallelChain(
    const GptConfig& config, uint64_t seed, int ranks, const std::string& compression,
    int partitions, bool stream, const Tensor& x, const Tensor& dy, const TokenBatch& batch,
    const std::function<Backend*(int rank)>& backend_of) {
  InProcessFabric fabric(ranks);
  std::vector<int> members(ranks);
  for (int r = 0; r < ranks; ++r) members[r] = r;
  std::vector<TensorParallelChainRun> runs(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      TensorParallelChainRun& run = runs[r];
      Backend* backend = backend_of(r);
      absl::StatusOr<TensorParallelCompression> codec =
          MakeTensorParallelCompression(compression, "compression");
      if (!codec.ok()) {
        run.status = codec.status();
        return;
      }
      std::unique_ptr<Transport> transport = fabric.Connect(r);
      Collectives collectives(transport.get(), CollectiveGroup{members, "tp"});
      CollectivesTensorParallelComm comm(&collectives, backend, *std::move(codec));
      comm.BeginIteration(0);
      AttentionUnit attn(config, 0, backend, &comm);
      MlpUnit mlp(config, 0, backend, &comm);
      for (Unit* u : std::initializer_list<Unit*>{&attn, &mlp}) {
        InitializeParameters(u, seed);
        u->set_tensor_parallel_partitions(partitions, partitions);
      }
      UnitContext attn_ctx, mlp_ctx;
      attn.set_stream_output(stream);
      const Tensor h = attn.Forward(backend->Upload(x), batch, &attn_ctx);
      if (stream) attn.PassPendingTo(&mlp);
      run.y = backend->Download(mlp.Forward(h, batch, &mlp_ctx));
      mlp.set_stream_output(stream);
      const Tensor dh = mlp.Backward(backend->Upload(dy), batch, mlp_ctx);
      if (stream) mlp.PassPendingTo(&attn);
      run.dx = backend->Download(attn.Backward(dh, batch, attn_ctx));
      if (comm.compresses()) {
        run.attn_kept = attn_ctx.saved.back().ToVector();
        run.mlp_kept = mlp_ctx.saved.back().ToVector();
      }
      for (Unit* u : std::initializer_list<Unit*>{&attn, &mlp}) {
        for (Parameter* p : u->parameters()) run.grads[p->name] = backend->Download(p->grad);
      }
      run.status = comm.status();
      if (run.status.ok()) run.status = backend->status();
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

}  // namespace testing
}  // namespace pipetrain
