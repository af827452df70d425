// Backend: where a unit's tensors live and where its ops run (the CUDA
// issue, scope 4: "the same unit code runs on either backend").
//
// Units (unit.h) allocate every tensor and call every op through their
// Backend, so one unit implementation serves the CPU backend (cpu_backend.h:
// the kernels/cpu ops, bitwise what the units computed before backends
// existed) and the CUDA backend (cuda_backend.h: the kernels/cuda twins of
// the same ops, cuBLAS for GEMMs).
//
// Memory: Zeros/Upload return tensors on the backend's device (host tensors
// for the CPU backend, Tensor::OnDevice ones for CUDA). Op pointers are on
// the backend's device; token and target arrays (int32) are on the HOST
// (TokenBatch keeps them there), and a device backend copies them over.
// Units take their input and return their output on the backend's device,
// except the head's dL/dloss, a [1] host tensor, and the head's loss, a [1]
// tensor that a device backend leaves on the device until it is read (one
// float crosses; see HeadUnit and LossValue in unit.h).
//
// Errors: the CPU ops cannot fail. A device backend's ops can (a launch, a
// copy, out of memory); the first error sticks (status() returns it), later
// ops do nothing, and whoever drives the units (LocalTrainer, StageRuntime)
// checks status() after each step and fails it with that error. Results
// computed after an error are garbage and must not be used.
//
// Ordering: ops run in call order. A device backend queues them on one
// stream; Download and the scalar-returning ops wait for the queued work.
// StartDownload does not wait: it queues a copy and returns a handle that
// another thread may wait on (the runtime's background sends).
//
// Op timing (for the per-kernel table of the training-step benchmark): off
// by default; when on, each op's time is added under its name ("gelu_forward",
// "linear_backward", "upload", ...). CPU: the call's wall time. CUDA: the
// device time between events recorded before and after the op's queued work
// (an op that waits inside, such as a download, includes its wait).
//
// Thread-safety: a Backend is used by one thread at a time (the one driving
// its units); the CPU backend is shared by all threads and safe for that
// (its op timing included).
#ifndef PIPETRAIN_WORKER_MODEL_BACKEND_H_
#define PIPETRAIN_WORKER_MODEL_BACKEND_H_

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/tensor.h"
#include "kernels/compress/codec.h"
#include "kernels/cpu/adamw.h"
#include "worker/model/device_channel.h"
#include "worker/model/device_collective.h"

namespace pipetrain {

enum class BackendKind { kCpu, kCuda };

// What a device backend runs on (empty for the CPU backend).
struct DeviceFacts {
  std::string name;          // e.g. "NVIDIA H100 80GB HBM3"
  int64_t memory_bytes = 0;  // device memory
  int sm_count = 0;          // streaming multiprocessors
  int index = 0;             // the device ordinal (e.g. 1 for cuda:1)
  // The GPU's PCI address ("0000:3B:00.0"): the same in every process of a
  // host whatever ordinal CUDA_VISIBLE_DEVICES gives the GPU; empty on the
  // CPU.
  std::string pci_bus_id;
};

// Total time and call count of one op (see "Op timing" above).
struct OpTime {
  int64_t calls = 0;
  double seconds = 0;
};
using OpTimes = std::map<std::string, OpTime>;

// A host copy of a tensor being made while its caller goes on
// (Backend::StartDownload).
class PendingDownload {
 public:
  virtual ~PendingDownload() = default;
  // Waits for the copy and returns it: a host tensor of the source's shape.
  // The device's error if the copy failed (INTERNAL naming the call). Call
  // at most once, from any thread.
  virtual absl::StatusOr<Tensor> Wait() = 0;
};

// Whether backends fill Empty's tensors with NaN: PIPETRAIN_POISON_EMPTY=1
// in the environment (.bazelrc sets it for every `bazel test`, and the
// workers a test starts inherit it; jobs and benchmarks run without it).
inline bool PoisonEmptyRequested() {
  const char* value = std::getenv("PIPETRAIN_POISON_EMPTY");
  return value != nullptr && std::string(value) == "1";
}

class Backend {
 public:
  virtual ~Backend() = default;

  virtual BackendKind kind() const = 0;
  // e.g. "cpu", "cuda:0 (NVIDIA H100 80GB HBM3), fp32 GEMMs".
  virtual std::string Describe() const = 0;
  // The optional fast paths taken so far, where one may silently fall back
  // (the GPU checks ask for them): e.g. "bias epilogue: 96 products through
  // cuBLASLt". Empty when the backend has none to report (the CPU's).
  virtual std::string PathsTaken() const { return ""; }
  // OK, or the first error an op hit (see the file comment).
  virtual absl::Status status() const = 0;
  virtual DeviceFacts device_facts() const = 0;
  // Waits for all queued work (for timing; CPU: returns at once).
  virtual void Synchronize() = 0;
  // Starts or stops op timing (see above); stopping keeps what was timed.
  virtual void SetOpTiming(bool on) = 0;
  // The op times since the last call, and clears them (CUDA: waits for the
  // queued work first).
  virtual OpTimes TakeOpTimes() = 0;

  // --- Memory.
  // A zero-filled tensor of `shape` on this backend's device.
  virtual Tensor Zeros(const Shape& shape) = 0;
  // A tensor of `shape` on this backend's device whose contents are
  // unspecified: for an op's output that the op writes entirely (the
  // outputs of every op below except the gradients they accumulate into:
  // LayerNorm's and Linear's dw, db, the embedding's dwte, dwpe, AddInPlace's
  // acc, and Sgemm's C when beta != 0). Backends skip the fill (it was 6 %
  // of a CPU stage's time, and GPT-2's activations are gigabytes per step)
  // unless PoisonEmptyRequested() when they are made: then they fill NaN,
  // so that a unit reading an element no op wrote fails the test.
  // Default: Zeros.
  virtual Tensor Empty(const Shape& shape) { return Zeros(shape); }
  // This backend's copy of host tensor `host` (CPU: `host` itself, shared).
  virtual Tensor Upload(const Tensor& host) = 0;
  // As Upload, without waiting for queued work: the copy queues behind it,
  // later ops behind the copy. CPU: `host` itself, shared (the caller must
  // not write it afterwards). CUDA: `host` is first copied into pinned
  // staging memory (so the caller may reuse it at once), then DMA'd; the
  // staging block goes back to the cache once its copy is done.
  virtual Tensor UploadAsync(const Tensor& host) = 0;
  // A host copy of `t` (CPU: `t` itself, shared); waits for queued work.
  virtual Tensor Download(const Tensor& t) = 0;
  // Starts a host copy of `t` (a tensor of this backend: on the CPU a host
  // tensor, on CUDA one on its device; a host tensor there is a programming
  // error and aborts) as it is once the work queued so far has run; ops called later that
  // write `t` do not change the copy. Returns without waiting for queued
  // work. CPU: copies now. CUDA: queues the copy on the stream into pinned
  // host memory (later ops queue behind it, so a later write cannot race it)
  // and returns; errors surface in Wait and in status().
  virtual std::unique_ptr<PendingDownload> StartDownload(const Tensor& t) = 0;
  // Copies host tensor `host` into `dst` on this device (equal numel).
  virtual void CopyFromHost(const Tensor& host, Tensor* dst) = 0;
  virtual void Fill(Tensor* t, float value) = 0;

  // --- Codecs on the device (DESIGN.md §6), so that a compressed tensor
  // crosses to the host as its payload, not as fp32.
  // The payload MakeCodec(spec)->Encode would make of t's values with
  // `state`, computed where t lives: byte for byte, except powersgd, whose
  // factors agree within rounding (the GEMMs sum in another order, in the
  // backend's GEMM mode: TF32- or bf16-rounded inputs on such a backend). token_topk
  // codecs: EncodeWithScores when `scores`, one per token on the host, is
  // non-empty; other codecs ignore it. `state` (may be null: a cold start,
  // nothing kept) is the link's codec state, PowerSGD's warm-started Q, held
  // on this device: a CodecState passed only to this backend's
  // EncodeOnDevice, never to a CPU codec. Waits for queued work.
  // UNIMPLEMENTED when this backend has no device twin of `spec` (the CPU
  // backend never has; CUDA has one for "linear:bits=B", "piecewise:bits=N",
  // "token_topk:keep=K", token_topk followed by one of the two,
  // "powersgd:rank=R", "fp16" and "bf16", for non-empty tensors on its
  // device): the caller then
  // encodes a host copy. Otherwise the CPU codec's errors (INVALID_ARGUMENT
  // for a non-finite value) or the device's (INTERNAL; status() has it too).
  virtual absl::StatusOr<std::string> EncodeOnDevice(const Tensor& /*t*/,
                                                     const std::string& /*spec*/,
                                                     absl::Span<const float> /*scores*/,
                                                     CodecState* /*state*/) {
    return absl::UnimplementedError(absl::StrCat(Describe(), " has no device codec"));
  }
  // A tensor of `shape` on this device holding MakeCodec(spec)->Decode of
  // `payload`, value for value; waits for queued work. UNIMPLEMENTED as
  // EncodeOnDevice; INVALID_ARGUMENT with the CPU codec's message for a
  // malformed payload, and for one of another element count than `shape`.
  virtual absl::StatusOr<Tensor> DecodeOnDevice(const std::string& /*spec*/,
                                                const std::string& /*payload*/,
                                                const Shape& /*shape*/) {
    return absl::UnimplementedError(absl::StrCat(Describe(), " has no device codec"));
  }

  // --- Device groups (plan.proto DeviceGroup; device_channel.h): NCCL
  // between the GPUs of one host.
  // A fresh communicator id to report at registration (DeviceInfo.
  // nccl_unique_id): NcclUniqueId::ToBytes. Its bootstrap root listens in
  // this process until a group created with it is complete. UNIMPLEMENTED
  // where the backend cannot join groups (the CPU backend).
  virtual absl::StatusOr<std::string> NewDeviceGroupId() {
    return absl::UnimplementedError(absl::StrCat(Describe(), " cannot join device groups"));
  }
  // Joins `group` as `stage` (DeviceGroupRank's rules) and returns its
  // channel, whose tensors live on this backend's device and are ordered
  // with its ops. Blocks until every member has joined, or group's join
  // deadline (DEADLINE_EXCEEDED) or cancel check (CANCELLED) ends the wait.
  // The backend must outlive the channel. UNIMPLEMENTED as
  // NewDeviceGroupId; INVALID_ARGUMENT for a bad group or id; INTERNAL if
  // the device or NCCL fails.
  virtual absl::StatusOr<std::unique_ptr<DeviceChannel>> JoinDeviceGroup(
      const DeviceGroupSpec& /*group*/, int /*stage*/) {
    return absl::UnimplementedError(absl::StrCat(Describe(), " cannot join device groups"));
  }
  // Joins the replica group `spec` (plan.proto ReplicaDeviceGroup;
  // CheckDeviceCollectiveSpec's rules; spec.id as NewDeviceGroupId makes
  // them) and returns its collective, whose sums run on this backend's
  // device, ordered with its ops (device_collective.h). Blocks until every
  // member has joined, or the join deadline (DEADLINE_EXCEEDED) or cancel
  // check (CANCELLED) ends the wait. The backend must outlive the
  // collective. Errors as JoinDeviceGroup.
  virtual absl::StatusOr<std::unique_ptr<DeviceCollective>> JoinDeviceCollective(
      const DeviceCollectiveSpec& /*spec*/) {
    return absl::UnimplementedError(absl::StrCat(Describe(), " cannot join device groups"));
  }

  // --- Ops, each the twin of the kernels/cpu function of the same name
  // (same arguments and formulas; see those headers).
  virtual void LayerNormForward(const float* x, const float* w, const float* b, int n, int c,
                                float eps, float* y, float* mean, float* rstd) = 0;
  virtual void LayerNormBackward(const float* x, const float* w, const float* mean,
                                 const float* rstd, const float* dy, int n, int c, float* dx,
                                 float* dw, float* db) = 0;
  // LayerNormBackward, then dx += residual (n * c floats, the gradient the
  // block's skip connection passes on): this default makes the two calls;
  // the CUDA backend does both in one pass (kernels/cuda/layernorm.h),
  // bitwise the same.
  virtual void LayerNormBackwardResidual(const float* x, const float* w, const float* mean,
                                         const float* rstd, const float* dy, const float* residual,
                                         int n, int c, float* dx, float* dw, float* db) {
    LayerNormBackward(x, w, mean, rstd, dy, n, c, dx, dw, db);
    AddInPlace(dx, residual, int64_t{n} * c);
  }
  virtual void LinearForward(const float* x, const float* w, const float* b, int n, int in, int out,
                             float* y) = 0;
  virtual void LinearBackward(const float* x, const float* w, const float* dy, int n, int in,
                              int out, float* dx, float* dw, float* db) = 0;
  // y = LinearForward(x) + residual (n * out floats, not overlapping y):
  // the last layer of a residual block. This default makes the two calls
  // (LinearForward, then Add); the CUDA backend adds the residual in the
  // GEMM (kernels/cuda/linear.h's LinearForwardResidualCuda), rounding
  // the sums in another order.
  virtual void LinearForwardResidual(const float* x, const float* w, const float* b,
                                     const float* residual, int n, int in, int out, float* y) {
    LinearForward(x, w, b, n, in, out, y);
    Add(y, residual, int64_t{n} * out, y);
  }
  virtual void GeluForward(const float* x, int64_t n, float* y) = 0;
  // LinearForward into y [n, out], then GeluForward of y into g: the MLP's
  // first layer. A device backend adds the bias in the GELU's pass (the GPU
  // issue's fused bias + GELU); the default calls the two (so a
  // ForwardingBackend's overrides of them still see each call).
  virtual void LinearGeluForward(const float* x, const float* w, const float* b, int n, int in,
                                 int out, float* y, float* g) {
    LinearForward(x, w, b, n, in, out, y);
    GeluForward(y, int64_t{n} * out, g);
  }
  virtual void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) = 0;
  virtual void Add(const float* a, const float* b, int64_t n, float* out) = 0;
  virtual void AddInPlace(float* acc, const float* x, int64_t n) = 0;
  virtual void Subtract(const float* a, const float* b, int64_t n, float* out) = 0;
  // What AttentionForward keeps for AttentionBackward (its `saved`), in
  // floats. With `probabilities`, the attention probabilities [batch,
  // heads, seq_len, seq_len], for a caller that reads them
  // (AttentionUnit::TokenImportance, AccTFM's compression); without, what
  // the backend's attention needs: the same by default, each row's
  // log-sum-exp [batch, heads, seq_len] for a flash-style one
  // (cuda_backend.h AttentionImpl::kFlash). Linear in batch. Pass the same
  // `probabilities` to AttentionForward and AttentionBackward.
  virtual int64_t AttentionSavedFloats(int batch, int seq_len, int /*c*/, int heads,
                                       bool /*probabilities*/) const {
    return int64_t{batch} * heads * seq_len * seq_len;
  }
  virtual void AttentionForward(const float* qkv, int batch, int seq_len, int c, int heads,
                                bool probabilities, float* out, float* saved) = 0;
  // `out` is AttentionForward's output, `saved` what it kept. `scratch`
  // holds seq_len * seq_len floats: the CPU kernel's work space (a device
  // backend uses one of its own and may be passed null).
  virtual void AttentionBackward(const float* qkv, const float* out, const float* saved,
                                 bool probabilities, const float* dout, int batch, int seq_len,
                                 int c, int heads, float* dqkv, float* scratch) = 0;
  // `host_tokens`: batch * seq_len ids in [0, vocab), on the host.
  virtual void EmbeddingForward(const int32_t* host_tokens, const float* wte, const float* wpe,
                                int batch, int seq_len, int c, int vocab, float* out) = 0;
  virtual void EmbeddingBackward(const int32_t* host_tokens, const float* dout, int batch,
                                 int seq_len, int c, int vocab, float* dwte, float* dwpe) = 0;
  // The row stride (>= vocab) in which HeadUnit keeps the [n, vocab]
  // logits, probabilities and their gradient. The CPU packs them (vocab).
  // The CUDA backend pads each row to a multiple of 64 floats (GPT-2's
  // 50257 gives 50304): the LM head's products then run over the padded
  // width on aligned rows, which cuBLAS's bf16 tensor-core kernels need
  // (LmHeadForward below, kernels/cuda/lm_head.h). The cross-entropy
  // never reads the padding; the fused one that saves the bf16 gradient
  // (HeadLossForward) writes +0 there, which the products then multiply.
  virtual int LogitsRowStride(int vocab) const { return vocab; }
  // Overwrites logits with the softmax probabilities (probs may be logits)
  // and returns the mean cross-entropy on the host (a device backend waits).
  // Rows have stride ld >= vocab (kernels/cpu/cross_entropy.h).
  virtual float SoftmaxCrossEntropyForward(const float* logits, const int32_t* host_targets, int n,
                                           int vocab, int ld, float* probs) = 0;
  virtual void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* host_targets, int n,
                                           int vocab, int ld, float dloss, float* dlogits) = 0;
  // One AdamW update of n values (step >= 1), as kernels/cpu/adamw.h.
  virtual void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n,
                           int64_t step, const AdamWConfig& config, bool apply_decay) = 0;
  // AdamWUpdate of every tensor, bitwise the same results; a device
  // backend takes them in few launches (the CUDA backend: one per 48
  // tensors), not one each. The default calls AdamWUpdate in turn.
  virtual void AdamWUpdateAll(const std::vector<AdamWTensor>& tensors, int64_t step,
                              const AdamWConfig& config) {
    for (const AdamWTensor& t : tensors) {
      AdamWUpdate(t.param, t.grad, t.m, t.v, t.n, step, config, t.apply_decay);
    }
  }
  // Fill(t, 0) of each tensor; a device backend zeroes them in few
  // launches (the CUDA backend: one per 64 tensors), not one each.
  virtual void ZeroAll(const std::vector<Tensor*>& tensors) {
    for (Tensor* t : tensors) Fill(t, 0.0f);
  }
  // Gradient clipping's two passes (worker/train/grad_clip.h).
  // Each tensor's sum of squares in double, on the host. This default (the
  // CPU's) sums each tensor in element order, through Download; the CUDA
  // backend sums on the device in a fixed tree (kernels/cuda/multi_tensor.h:
  // the same bits run to run, within rounding of this order's double) and
  // waits once for all of them.
  virtual std::vector<double> SumsOfSquares(const std::vector<const Tensor*>& tensors) {
    std::vector<double> sums;
    for (const Tensor* t : tensors) {
      const Tensor host = t->on_device() ? Download(*t) : *t;
      double sum = 0;
      for (int64_t i = 0; i < host.numel(); ++i) sum += double(host[i]) * double(host[i]);
      sums.push_back(sum);
    }
    return sums;
  }
  // Every element of each tensor multiplied by scale, in place: one
  // rounded product each, so every backend gives the same bits. This
  // default goes through the host for a device tensor; the CUDA backend
  // scales on the device.
  virtual void ScaleInPlace(const std::vector<Tensor*>& tensors, float scale) {
    for (Tensor* t : tensors) {
      if (!t->on_device()) {
        for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] *= scale;
        continue;
      }
      Tensor host = Download(*t);
      for (int64_t i = 0; i < host.numel(); ++i) host.data()[i] *= scale;
      CopyFromHost(host, t);
    }
  }
  // The tied LM head's products (HeadUnit), logits and dlogits in rows of
  // stride ld >= vocab (LogitsRowStride):
  //   forward   logits[n, :vocab] = x[n, d] wte[vocab, d]^T
  //   backward  dx[n, d] = dlogits[n, :vocab] wte;  dwte += dlogits^T x
  // These defaults are the three Sgemm calls. The CUDA backend runs them
  // over ld classes (kernels/cuda/lm_head.h): it writes the logits'
  // padding columns and overwrites dlogits' with zeros; no caller reads
  // them.
  virtual void LmHeadForward(const float* x, const float* wte, int n, int d, int vocab, int ld,
                             float* logits) {
    Sgemm(false, true, n, vocab, d, 1.0f, x, d, wte, d, 0.0f, logits, ld);
  }
  virtual void LmHeadBackward(const float* x, const float* wte, float* dlogits, int n, int d,
                              int vocab, int ld, float* dx, float* dwte) {
    Sgemm(false, false, n, d, vocab, 1.0f, dlogits, ld, wte, d, 0.0f, dx, d);
    Sgemm(true, false, vocab, d, n, 1.0f, dlogits, ld, x, d, 1.0f, dwte, d);
  }
  // The head's loss and what its backward keeps (HeadUnit): the mean
  // cross-entropy of logits [n, ld] (LmHeadForward's, d the products'
  // inner width) as a [1] tensor on this backend's device (a device backend
  // does not wait for it), and in *saved the tensor LmHeadLossBackward
  // takes. The pair is one contract:
  // a backend that overrides one overrides both. This default overwrites
  // the logits with the probabilities (SoftmaxCrossEntropyForward) and
  // saves them. The CUDA backend with bf16 products on copies saves the
  // mean loss's gradient in bf16 instead (half the bytes, and no
  // cross-entropy pass in the backward: kernels/cuda/cross_entropy.h).
  virtual Tensor HeadLossForward(Tensor logits, const int32_t* host_targets, int n, int d,
                                 int vocab, int ld, Tensor* saved) {
    (void)d;
    const float loss =
        SoftmaxCrossEntropyForward(logits.data(), host_targets, n, vocab, ld, logits.data());
    *saved = std::move(logits);
    return Tensor::FromVector({1}, {loss});
  }
  // The head's backward from HeadLossForward's saved tensor: dlogits =
  // (probs - onehot(targets)) dloss / n (SoftmaxCrossEntropyBackward), then
  // LmHeadBackward. This default makes the fp32 dlogits and calls the two
  // (so a ForwardingBackend's overrides of them still see each call). The
  // CUDA backend with bf16 products on copies multiplies its saved bf16
  // gradient with dloss as the products' alpha (kernels/cuda/lm_head.h).
  virtual void LmHeadLossBackward(const Tensor& saved, const int32_t* host_targets, float dloss,
                                  const float* x, const float* wte, int n, int d, int vocab, int ld,
                                  float* dx, float* dwte) {
    Tensor dlogits = Empty({n, ld});
    SoftmaxCrossEntropyBackward(saved.data(), host_targets, n, vocab, ld, dloss, dlogits.data());
    LmHeadBackward(x, wte, dlogits.data(), n, d, vocab, ld, dx, dwte);
  }
  // Row-major C = alpha op(A) op(B) + beta C, as kernels/cpu/blas.h Sgemm.
  virtual void Sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                     int lda, const float* b, int ldb, float beta, float* c, int ldc) = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_BACKEND_H_
