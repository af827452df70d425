#include "worker/model/cpu_backend.h"

#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <utility>

#include "common/annotated_mutex.h"
#include "common/logging.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/linear.h"

namespace pipetrain {
namespace {

// A copy made at once: Wait returns it.
class CopiedDownload final : public PendingDownload {
 public:
  explicit CopiedDownload(Tensor copy) : copy_(std::move(copy)) {}
  absl::StatusOr<Tensor> Wait() override { return std::move(copy_); }

 private:
  Tensor copy_;
};

// Each op forwards to the kernels/cpu function of the same name (the
// qualified ::pipetrain:: names pick the free functions, not the members).
class CpuBackendImpl final : public Backend {
 public:
  // Runs `op`, timing it under `name` when op timing is on (an atomic flag
  // read: nothing else happens when it is off).
  template <typename Op>
  void Timed(const char* name, Op&& op) {
    if (!timing_.load(std::memory_order_relaxed)) return op();
    const auto start = std::chrono::steady_clock::now();
    op();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    AnnotatedMutexLock lock(&mu_);
    OpTime& t = times_[name];
    ++t.calls;
    t.seconds += took.count();
  }

  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string Describe() const override { return "cpu"; }
  absl::Status status() const override { return absl::OkStatus(); }
  DeviceFacts device_facts() const override { return {}; }
  void Synchronize() override {}
  void SetOpTiming(bool on) override { timing_.store(on, std::memory_order_relaxed); }
  OpTimes TakeOpTimes() override {
    AnnotatedMutexLock lock(&mu_);
    OpTimes out;
    out.swap(times_);
    return out;
  }

  Tensor Zeros(const Shape& shape) override {
    Tensor t;
    Timed("zeros", [&] { t = Tensor::Zeros(shape); });
    return t;
  }
  Tensor Empty(const Shape& shape) override {
    Tensor t;
    Timed("empty", [&] {
      t = poison_empty_ ? Tensor::Filled(shape, std::numeric_limits<float>::quiet_NaN())
                        : Tensor::Uninitialized(shape);
    });
    return t;
  }
  Tensor Upload(const Tensor& host) override { return host; }
  Tensor UploadAsync(const Tensor& host) override { return host; }
  Tensor Download(const Tensor& t) override { return t; }
  // A deep copy: the caller may write `t` (e.g. a gradient) while another
  // thread still reads the copy.
  std::unique_ptr<PendingDownload> StartDownload(const Tensor& t) override {
    Tensor copy;
    Timed("download", [&] { copy = t.Clone(); });
    return std::make_unique<CopiedDownload>(std::move(copy));
  }
  void CopyFromHost(const Tensor& host, Tensor* dst) override { dst->CopyFrom(host); }
  void Fill(Tensor* t, float value) override {
    Timed("fill", [&] { t->Fill(value); });
  }

  void LayerNormForward(const float* x, const float* w, const float* b, int n, int c, float eps,
                        float* y, float* mean, float* rstd) override {
    Timed("layernorm_forward",
          [&] { ::pipetrain::LayerNormForward(x, w, b, n, c, eps, y, mean, rstd); });
  }
  void LayerNormBackward(const float* x, const float* w, const float* mean, const float* rstd,
                         const float* dy, int n, int c, float* dx, float* dw, float* db) override {
    Timed("layernorm_backward",
          [&] { ::pipetrain::LayerNormBackward(x, w, mean, rstd, dy, n, c, dx, dw, db); });
  }
  void LinearForward(const float* x, const float* w, const float* b, int n, int in, int out,
                     float* y) override {
    Timed("linear_forward", [&] { ::pipetrain::LinearForward(x, w, b, n, in, out, y); });
  }
  void LinearBackward(const float* x, const float* w, const float* dy, int n, int in, int out,
                      float* dx, float* dw, float* db) override {
    Timed("linear_backward",
          [&] { ::pipetrain::LinearBackward(x, w, dy, n, in, out, dx, dw, db); });
  }
  void GeluForward(const float* x, int64_t n, float* y) override {
    Timed("gelu_forward", [&] { ::pipetrain::GeluForward(x, n, y); });
  }
  void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) override {
    Timed("gelu_backward", [&] { ::pipetrain::GeluBackward(x, dy, n, dx); });
  }
  void Add(const float* a, const float* b, int64_t n, float* out) override {
    Timed("add", [&] { ::pipetrain::Add(a, b, n, out); });
  }
  void AddInPlace(float* acc, const float* x, int64_t n) override {
    Timed("add_in_place", [&] { ::pipetrain::AddInPlace(acc, x, n); });
  }
  void Subtract(const float* a, const float* b, int64_t n, float* out) override {
    Timed("subtract", [&] { ::pipetrain::Subtract(a, b, n, out); });
  }
  // Always keeps the probabilities (the default AttentionSavedFloats).
  void AttentionForward(const float* qkv, int batch, int seq_len, int c, int heads,
                        bool /*probabilities*/, float* out, float* saved) override {
    Timed("attention_forward",
          [&] { ::pipetrain::AttentionForward(qkv, batch, seq_len, c, heads, out, saved); });
  }
  void AttentionBackward(const float* qkv, const float* /*out*/, const float* saved,
                         bool /*probabilities*/, const float* dout, int batch, int seq_len, int c,
                         int heads, float* dqkv, float* scratch) override {
    Timed("attention_backward", [&] {
      ::pipetrain::AttentionBackward(qkv, saved, dout, batch, seq_len, c, heads, dqkv, scratch);
    });
  }
  void EmbeddingForward(const int32_t* host_tokens, const float* wte, const float* wpe, int batch,
                        int seq_len, int c, int /*vocab*/, float* out) override {
    Timed("embedding_forward",
          [&] { ::pipetrain::EmbeddingForward(host_tokens, wte, wpe, batch, seq_len, c, out); });
  }
  void EmbeddingBackward(const int32_t* host_tokens, const float* dout, int batch, int seq_len,
                         int c, int /*vocab*/, float* dwte, float* dwpe) override {
    Timed("embedding_backward", [&] {
      ::pipetrain::EmbeddingBackward(host_tokens, dout, batch, seq_len, c, dwte, dwpe);
    });
  }
  float SoftmaxCrossEntropyForward(const float* logits, const int32_t* host_targets, int n,
                                   int vocab, int ld, float* probs) override {
    float loss = 0;
    Timed("cross_entropy_forward", [&] {
      loss = ::pipetrain::SoftmaxCrossEntropyForward(logits, host_targets, n, vocab, ld, probs);
    });
    return loss;
  }
  void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* host_targets, int n,
                                   int vocab, int ld, float dloss, float* dlogits) override {
    Timed("cross_entropy_backward", [&] {
      ::pipetrain::SoftmaxCrossEntropyBackward(probs, host_targets, n, vocab, ld, dloss, dlogits);
    });
  }
  void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n, int64_t step,
                   const AdamWConfig& config, bool apply_decay) override {
    Timed("adamw",
          [&] { ::pipetrain::AdamWUpdate(param, grad, m, v, n, step, config, apply_decay); });
  }
  void Sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
             const float* b, int ldb, float beta, float* c, int ldc) override {
    Timed("sgemm", [&] {
      ::pipetrain::Sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    });
  }

 private:
  std::atomic<bool> timing_{false};
  const bool poison_empty_ = PoisonEmptyRequested();  // Empty fills NaN (backend.h)
  AnnotatedMutex mu_;
  OpTimes times_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

Backend* CpuBackend() {
  static Backend* const backend = new CpuBackendImpl();  // never destroyed
  return backend;
}

}  // namespace pipetrain
