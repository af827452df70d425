#include "worker/model/model_gemm_probe.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/philox.h"

namespace pipetrain {
namespace {

// A device (or host) tensor of N(0, 1) values on `backend`: one block of
// kRandomBlock draws, repeated. The products' time does not depend on
// the values being distinct, and drawing each of GPT-2's 100 million
// operand values on one host core would cost seconds of each run.
constexpr int64_t kRandomBlock = int64_t{1} << 20;
Tensor RandomOn(Backend* backend, const Shape& shape, uint64_t stream) {
  Tensor host = Tensor::Uninitialized(shape);  // filled next
  const int64_t numel = host.numel(), block = std::min(numel, kRandomBlock);
  FillNormal(7, stream, 0, 1, host.data(), block);
  for (int64_t at = block; at < numel; at += block) {
    std::memcpy(host.data() + at, host.data(),
                static_cast<size_t>(std::min(block, numel - at)) * sizeof(float));
  }
  return backend->Upload(host);
}

// The fastest of `reps` calls of `op`, each to the backend's Synchronize,
// after one untimed call.
double FastestSeconds(Backend* backend, int reps, const std::function<void()>& op) {
  op();
  backend->Synchronize();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    op();
    backend->Synchronize();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

std::vector<ModelGemmTiming> MeasureModelGemms(Backend* backend, const GptConfig& config,
                                               int tokens, int reps) {
  const int n = tokens, d = config.d_model, V = config.vocab_size;
  const int ld = backend->LogitsRowStride(V);
  std::vector<ModelGemmTiming> rows;
  struct Layer {
    const char* name;
    int in, out;
    bool gelu;  // its forward is LinearGeluForward, as MlpUnit calls it
  };
  const Layer layers[] = {{"attn.c_attn", d, 3 * d, false},
                          {"attn.c_proj", d, d, false},
                          {"mlp.c_fc", d, 4 * d, true},
                          {"mlp.c_proj", 4 * d, d, false}};
  const int widest = 4 * d;
  const Tensor x = RandomOn(backend, {n, widest}, 1), dy = RandomOn(backend, {n, widest}, 2);
  const Tensor w = RandomOn(backend, {widest, widest}, 3), b = RandomOn(backend, {widest}, 4);
  const Tensor residual = RandomOn(backend, {n, d}, 5);
  Tensor y = backend->Empty({n, widest}), dx = backend->Empty({n, widest});
  Tensor gelu_out = backend->Empty({n, widest});
  Tensor dw = backend->Zeros({widest, widest}), db = backend->Zeros({widest});
  for (const Layer& l : layers) {
    const std::string shape = absl::StrCat(n, " x ", l.in, " -> ", l.out);
    const double flops = 2.0 * n * l.in * l.out;
    // A block's last layers add the residual in their product, as the
    // units call them (one rank, no streaming: the probe's case).
    const bool adds_residual = l.out == d;
    // c_fc through the op the model calls: on CUDA its GEMM leaves the
    // bias to the fused bias-GELU pass (timed with it; the name says so),
    // where LinearForward with the bias would first broadcast it into y.
    rows.push_back({absl::StrCat(l.name, l.gelu ? " forward + GELU" : " forward"), shape, flops,
                    FastestSeconds(backend, reps, [&] {
                      if (l.gelu) {
                        backend->LinearGeluForward(x.data(), w.data(), b.data(), n, l.in, l.out,
                                                   y.data(), gelu_out.data());
                      } else if (adds_residual) {
                        backend->LinearForwardResidual(x.data(), w.data(), b.data(),
                                                       residual.data(), n, l.in, l.out, y.data());
                      } else {
                        backend->LinearForward(x.data(), w.data(), b.data(), n, l.in, l.out,
                                               y.data());
                      }
                    })});
    rows.push_back(
        {absl::StrCat(l.name, " backward"), shape, 2 * flops, FastestSeconds(backend, reps, [&] {
           backend->LinearBackward(x.data(), w.data(), dy.data(), n, l.in, l.out, dx.data(),
                                   dw.data(), db.data());
         })});
  }
  const Tensor wte = RandomOn(backend, {V, d}, 6);
  Tensor dwte = backend->Zeros({V, d});
  Tensor logits = backend->Empty({n, ld});
  const std::string head_shape = absl::StrCat(n, " x ", d, " -> ", V, " (rows of ", ld, ")");
  const double head_flops = 2.0 * n * d * V;
  rows.push_back({"lm_head forward", head_shape, head_flops, FastestSeconds(backend, reps, [&] {
                    backend->LmHeadForward(x.data(), wte.data(), n, d, V, ld, logits.data());
                  })});
  // The backward from what the loss keeps, as HeadUnit calls it: on the
  // CUDA backend with bf16 copies, the products straight from the saved
  // bf16 gradient; by default the cross-entropy's backward pass first.
  std::vector<int32_t> targets(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((int64_t{i} * 7919) % V);
  Tensor saved;
  backend->HeadLossForward(std::move(logits), targets.data(), n, d, V, ld, &saved);
  rows.push_back(
      {"lm_head backward", head_shape, 2 * head_flops, FastestSeconds(backend, reps, [&] {
         backend->LmHeadLossBackward(saved, targets.data(), 1.0f, x.data(), wte.data(), n, d, V, ld,
                                     y.data(), dwte.data());
       })});
  if (!backend->status().ok()) return {};
  return rows;
}

}  // namespace pipetrain
