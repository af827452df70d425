#include "worker/model/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/alloc/caching_allocator.h"
#include "kernels/compress/codec_spec.h"
#include "kernels/compress/payload.h"
#include "kernels/compress/powersgd_codec.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_gemm.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/half_codec.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/lm_head.h"
#include "kernels/cuda/multi_tensor.h"
#include "kernels/cuda/nccl_comm.h"
#include "kernels/cuda/powersgd_payload.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/token_topk_payload.h"
#include "worker/model/nccl_device_channel.h"
#include "worker/model/nccl_device_collective.h"

namespace pipetrain {
namespace {

// The device memory of one backend: cudaMalloc under a caching allocator
// keyed by the backend's stream. Shared by the backend and every tensor it
// made (their deleters hold it), so it lives until the last tensor is gone,
// even past the backend.
CachingAllocator::Options MemoryOptions(int device) {
  CachingAllocator::Options options;
  options.name = "CUDA backend memory";
  // Shared with the kernels' scratch cache and any other backend on this
  // device (a profile's): an out-of-memory in one empties the others.
  options.pool = CudaDevicePool(device);
  return options;
}

struct DeviceMemory {
  explicit DeviceMemory(int device) : device(device) {}
  // The cache frees its blocks with cudaFree, which needs their device
  // current, on whichever thread drops the last tensor.
  ~DeviceMemory() {
    int previous = 0;
    const bool saved = cudaGetDevice(&previous) == cudaSuccess;
    cudaSetDevice(device);
    cache.EmptyCache();
    if (saved) cudaSetDevice(previous);
  }
  const int device;
  CudaDeviceRawAllocator raw;
  CachingAllocator cache{&raw, MemoryOptions(device)};
};

// A codec spec the device codecs serve: a linear or piecewise stage
// (kernels/cuda/quantize.h), token_topk (token_topk_payload.h), token_topk
// followed by one of the two, powersgd alone (powersgd_payload.h), or fp16
// or bf16 alone (half_codec.h); nullopt for any other valid spec.
struct DeviceCodec {
  std::optional<double> token_keep;  // token_topk first, keeping this share
  TokenTopKInner quantizer;          // kRaw: none (token_topk alone, the others)
  std::optional<int> powersgd_rank;  // powersgd alone
  std::optional<HalfFormat> half;    // fp16 or bf16 alone
};

absl::StatusOr<std::optional<DeviceCodec>> DeviceCodecFor(const std::string& spec) {
  ASSIGN_OR_RETURN(std::vector<CodecStage> stages, ParseCodecSpec(spec));
  DeviceCodec codec;
  if (stages.size() == 1 && stages[0].name == "powersgd") {
    codec.powersgd_rank = static_cast<int>(stages[0].params.at("rank"));
    return codec;
  }
  if (stages.size() == 1 && (stages[0].name == "fp16" || stages[0].name == "bf16")) {
    codec.half = stages[0].name == "fp16" ? HalfFormat::kFp16 : HalfFormat::kBf16;
    return codec;
  }
  size_t next = 0;
  if (!stages.empty() && stages[0].name == "token_topk") {
    codec.token_keep = stages[0].params.at("keep");
    next = 1;
  }
  if (stages.size() > next + 1) return std::nullopt;
  if (stages.size() == next)
    return codec.token_keep.has_value() ? std::optional(codec) : std::nullopt;
  const CodecStage& stage = stages[next];
  if (stage.name == "linear") {
    codec.quantizer.kind = TokenTopKInner::Kind::kLinear;
  } else if (stage.name == "piecewise") {
    codec.quantizer.kind = TokenTopKInner::Kind::kPiecewise;
  } else {
    return std::nullopt;
  }
  codec.quantizer.bits = static_cast<int>(stage.params.at("bits"));
  return codec;
}

// The tensors' data pointers (float* or const float*, as TensorPtr is
// const) and element counts: the tables the multi-tensor kernels take
// (kernels/cuda/multi_tensor.h). Every tensor is on the device or empty.
template <typename TensorPtr>
auto DeviceTable(const char* op, const std::vector<TensorPtr>& tensors) {
  using Data = decltype(std::declval<TensorPtr>()->data());
  std::pair<std::vector<Data>, std::vector<int64_t>> table;
  for (TensorPtr t : tensors) {
    PT_CHECK(t->on_device() || t->numel() == 0) << op << " of a host tensor";
    table.first.push_back(t->data());
    table.second.push_back(t->numel());
  }
  return table;
}

// A copy queued on a backend's stream into pinned host memory; Wait waits
// for the event recorded after it. The source needs no keeping alive: its
// block is reused on the same stream only, behind the copy.
class StreamDownload final : public PendingDownload {
 public:
  // `done` may be null when `status` is an error.
  StreamDownload(int device, Tensor host, cudaEvent_t done, absl::Status status)
      : device_(device), host_(std::move(host)), done_(done), status_(std::move(status)) {}
  ~StreamDownload() override {
    // The copy may still be in flight: wait before the pinned block can be
    // freed and handed out again.
    if (done_ != nullptr) {
      cudaSetDevice(device_);
      cudaEventSynchronize(done_);
      cudaEventDestroy(done_);
    }
  }
  StreamDownload(const StreamDownload&) = delete;
  StreamDownload& operator=(const StreamDownload&) = delete;

  absl::StatusOr<Tensor> Wait() override {
    RETURN_IF_ERROR(status_);
    // Another thread calls this: its current device may not be ours.
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_));
    return std::move(host_);
  }

 private:
  int device_;
  Tensor host_;
  cudaEvent_t done_;
  absl::Status status_;
};

class CudaBackendImpl final : public Backend {
 public:
  CudaBackendImpl(const CudaDeviceInfo& info, cudaStream_t stream, CublasHandle cublas,
                  AttentionImpl attention, FlashKernel flash_kernel)
      : device_(info.index),
        facts_{info.name, info.total_memory_bytes, info.sm_count, info.index, info.pci_bus_id},
        stream_(stream),
        cublas_(std::move(cublas)),
        attention_(attention),
        flash_kernel_(flash_kernel),
        poison_empty_(PoisonEmptyRequested()) {}
  ~CudaBackendImpl() override {
    // The destroying thread's current device may be another one.
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    for (const TimedOp& op : pending_) DestroyEvents(op);
    for (const StagedUpload& staged : staged_) {
      cudaEventDestroy(staged.done);
      PinnedHostCachingAllocator().Free(staged.block);
    }
    // The cuBLAS handle is bound to the stream: it goes first.
    cublas_ = CublasHandle();
    // The kernels' scratch and the staging blocks cached for this stream:
    // a profiling backend (one per ProfileModel call) left about a
    // gigabyte cached under a handle no one asks for again.
    ReleaseStreamCaches(stream_);
    cudaStreamDestroy(stream_);
    // The tensor cache goes when its last tensor does (DeviceMemory).
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string Describe() const override {
    return absl::StrCat(
        "cuda:", device_, " (", facts_.name, "), ", GemmModeName(cublas_.mode()), " GEMMs",
        cublas_.mode() == GemmMode::kBf16
            ? absl::StrCat(" (", Bf16OperandsName(cublas_.bf16_operands()), ")")
            : "",
        attention_ == AttentionImpl::kGemm ? ", GEMM attention"
        : attention_ == AttentionImpl::kFlash
            ? absl::StrCat(", flash attention (", FlashKernelName(flash_kernel_), ")")
            : "");
  }
  std::string PathsTaken() const override {
    // The count is the process's (every CUDA backend in it).
    if (cublas_.bias_epilogue() != BiasEpilogue::kCublasLt) return "";
    return absl::StrCat("bias epilogue: ", BiasEpilogueProducts(), " products through cuBLASLt");
  }
  absl::Status status() const override { return status_; }
  DeviceFacts device_facts() const override { return facts_; }
  void SetOpTiming(bool on) override { timing_ = on; }
  OpTimes TakeOpTimes() override;
  void Synchronize() override {
    Run("synchronize", [&] { return SynchronizeStream(); });
  }

  Tensor Zeros(const Shape& shape) override;
  Tensor Empty(const Shape& shape) override;
  Tensor Upload(const Tensor& host) override;
  Tensor UploadAsync(const Tensor& host) override;
  Tensor Download(const Tensor& t) override;
  std::unique_ptr<PendingDownload> StartDownload(const Tensor& t) override;
  absl::StatusOr<std::string> EncodeOnDevice(const Tensor& t, const std::string& spec,
                                             absl::Span<const float> scores,
                                             CodecState* state) override;
  absl::StatusOr<Tensor> DecodeOnDevice(const std::string& spec, const std::string& payload,
                                        const Shape& shape) override;
  absl::StatusOr<std::string> NewDeviceGroupId() override;
  absl::StatusOr<std::unique_ptr<DeviceChannel>> JoinDeviceGroup(const DeviceGroupSpec& group,
                                                                 int stage) override;
  absl::StatusOr<std::unique_ptr<DeviceCollective>> JoinDeviceCollective(
      const DeviceCollectiveSpec& spec) override;
  void CopyFromHost(const Tensor& host, Tensor* dst) override;
  void Fill(Tensor* t, float value) override;

  void LayerNormForward(const float* x, const float* w, const float* b, int n, int c, float eps,
                        float* y, float* mean, float* rstd) override {
    Run("layernorm_forward",
        [&] { return LayerNormForwardCuda(x, w, b, n, c, eps, y, mean, rstd, stream_); });
  }
  void LayerNormBackward(const float* x, const float* w, const float* mean, const float* rstd,
                         const float* dy, int n, int c, float* dx, float* dw, float* db) override {
    Run("layernorm_backward",
        [&] { return LayerNormBackwardCuda(x, w, mean, rstd, dy, n, c, dx, dw, db, stream_); });
  }
  void LayerNormBackwardResidual(const float* x, const float* w, const float* mean,
                                 const float* rstd, const float* dy, const float* residual, int n,
                                 int c, float* dx, float* dw, float* db) override {
    Run("layernorm_backward", [&] {
      return LayerNormBackwardResidualCuda(x, w, mean, rstd, dy, residual, n, c, dx, dw, db,
                                           stream_);
    });
  }
  void LinearForwardResidual(const float* x, const float* w, const float* b, const float* residual,
                             int n, int in, int out, float* y) override {
    Run("linear_forward",
        [&] { return LinearForwardResidualCuda(cublas_, x, w, b, residual, n, in, out, y); });
  }
  void LinearForward(const float* x, const float* w, const float* b, int n, int in, int out,
                     float* y) override {
    Run("linear_forward", [&] { return LinearForwardCuda(cublas_, x, w, b, n, in, out, y); });
  }
  void LinearBackward(const float* x, const float* w, const float* dy, int n, int in, int out,
                      float* dx, float* dw, float* db) override {
    Run("linear_backward",
        [&] { return LinearBackwardCuda(cublas_, x, w, dy, n, in, out, dx, dw, db); });
  }
  // The GEMM without its bias, then the bias added in the GELU's pass: one
  // pass over y fewer than LinearForward and GeluForward.
  void LinearGeluForward(const float* x, const float* w, const float* b, int n, int in, int out,
                         float* y, float* g) override {
    if (b == nullptr) return Backend::LinearGeluForward(x, w, b, n, in, out, y, g);
    Run("linear_forward", [&] { return LinearForwardCuda(cublas_, x, w, nullptr, n, in, out, y); });
    Run("bias_gelu_forward", [&] { return BiasGeluForwardCuda(b, n, out, y, g, stream_); });
  }
  void GeluForward(const float* x, int64_t n, float* y) override {
    Run("gelu_forward", [&] { return GeluForwardCuda(x, n, y, stream_); });
  }
  void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) override {
    Run("gelu_backward", [&] { return GeluBackwardCuda(x, dy, n, dx, stream_); });
  }
  void Add(const float* a, const float* b, int64_t n, float* out) override {
    Run("add", [&] { return AddCuda(a, b, n, out, stream_); });
  }
  void AddInPlace(float* acc, const float* x, int64_t n) override {
    Run("add_in_place", [&] { return AddInPlaceCuda(acc, x, n, stream_); });
  }
  void Subtract(const float* a, const float* b, int64_t n, float* out) override {
    Run("subtract", [&] { return SubtractCuda(a, b, n, out, stream_); });
  }
  // kFlash keeps each row's log-sum-exp, unless the caller reads the
  // probabilities or the heads are too wide for its tiles; then kGemm's.
  bool UsesFlash(int seq_len, int c, int heads, bool probabilities) const {
    return attention_ == AttentionImpl::kFlash && !probabilities &&
           FlashAttentionSupports(seq_len, c, heads);
  }
  int64_t AttentionSavedFloats(int batch, int seq_len, int c, int heads,
                               bool probabilities) const override {
    const int64_t rows = int64_t{batch} * heads * seq_len;
    return UsesFlash(seq_len, c, heads, probabilities) ? rows : rows * seq_len;
  }
  void AttentionForward(const float* qkv, int batch, int seq_len, int c, int heads,
                        bool probabilities, float* out, float* saved) override {
    Run("attention_forward", [&] {
      if (UsesFlash(seq_len, c, heads, probabilities)) {
        return FlashAttentionForwardCuda(qkv, batch, seq_len, c, heads, out, saved, stream_,
                                         flash_kernel_);
      }
      return attention_ != AttentionImpl::kReference
                 ? AttentionGemmForwardCuda(cublas_, qkv, batch, seq_len, c, heads, out, saved)
                 : AttentionForwardCuda(qkv, batch, seq_len, c, heads, out, saved, stream_);
    });
  }
  // The caller's `scratch` is the CPU kernel's seq_len^2 floats; the GPU
  // kernels keep dS for every (batch, head) at once, so they get a block of
  // batch * heads * seq_len^2 floats from the cache instead (flash: D,
  // batch * heads * seq_len floats).
  void AttentionBackward(const float* qkv, const float* out, const float* saved, bool probabilities,
                         const float* dout, int batch, int seq_len, int c, int heads, float* dqkv,
                         float* /*scratch*/) override {
    if (!status_.ok() || batch == 0) return;  // a negative one: the kernels' error
    if (UsesFlash(seq_len, c, heads, probabilities)) {
      Tensor row_dots = Allocate({int64_t{batch} * heads, seq_len}, /*zero=*/false);
      Run("attention_backward", [&] {
        return FlashAttentionBackwardCuda(qkv, out, saved, dout, batch, seq_len, c, heads, dqkv,
                                          row_dots.data(), stream_, flash_kernel_);
      });
      return;
    }
    Tensor ds = Allocate({int64_t{batch} * heads, seq_len, seq_len}, /*zero=*/false);
    Run("attention_backward", [&] {
      return attention_ != AttentionImpl::kReference
                 ? AttentionGemmBackwardCuda(cublas_, qkv, saved, dout, batch, seq_len, c, heads,
                                             dqkv, ds.data())
                 : AttentionBackwardCuda(qkv, saved, dout, batch, seq_len, c, heads, dqkv,
                                         ds.data(), stream_);
    });
  }
  void EmbeddingForward(const int32_t* host_tokens, const float* wte, const float* wpe, int batch,
                        int seq_len, int c, int vocab, float* out) override {
    const Tensor tokens = UploadIds(host_tokens, int64_t{batch} * seq_len);
    Run("embedding_forward", [&] {
      return EmbeddingForwardCuda(Ids(tokens), wte, wpe, batch, seq_len, c, vocab, out, stream_);
    });
  }
  void EmbeddingBackward(const int32_t* host_tokens, const float* dout, int batch, int seq_len,
                         int c, int vocab, float* dwte, float* dwpe) override {
    // The rows grouped by token, built here where the ids are (the kernel
    // then does O(rows * c) work; kernels/cuda/embedding.h).
    const int64_t rows = int64_t{batch} * seq_len;
    const TokenRowGroups grouped = rows >= 0 && rows <= std::numeric_limits<int32_t>::max()
                                       ? GroupRowsByToken(host_tokens, rows, vocab)
                                       : TokenRowGroups{};
    const Tensor index =
        UploadIds(grouped.index.data(), static_cast<int64_t>(grouped.index.size()));
    Run("embedding_backward", [&] {
      // Negative or beyond int32 rows (no index built) fail here with
      // INVALID_ARGUMENT.
      return EmbeddingBackwardCuda(Ids(index), grouped.groups, dout, batch, seq_len, c, dwte, dwpe,
                                   stream_);
    });
  }
  // Rows padded to 64 floats (256 bytes): the LM head's products run over
  // the padded width on 16-byte aligned rows (kernels/cuda/lm_head.h; an
  // odd vocabulary kept cuBLAS off its fast bf16 kernels), and the
  // cross-entropy's rows start on 128-byte lines.
  int LogitsRowStride(int vocab) const override {
    constexpr int kRowAlign = 64;
    const int64_t padded = (int64_t{vocab} + kRowAlign - 1) / kRowAlign * kRowAlign;
    return padded <= std::numeric_limits<int>::max() ? static_cast<int>(padded) : vocab;
  }
  float SoftmaxCrossEntropyForward(const float* logits, const int32_t* host_targets, int n,
                                   int vocab, int ld, float* probs) override;
  void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* host_targets, int n,
                                   int vocab, int ld, float dloss, float* dlogits) override {
    const Tensor targets = UploadIds(host_targets, n);
    Run("cross_entropy_backward", [&] {
      return SoftmaxCrossEntropyBackwardCuda(probs, Ids(targets), n, vocab, ld, dloss, dlogits,
                                             stream_);
    });
  }
  void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n, int64_t step,
                   const AdamWConfig& config, bool apply_decay) override {
    Run("adamw",
        [&] { return AdamWUpdateCuda(param, grad, m, v, n, step, config, apply_decay, stream_); });
  }
  void AdamWUpdateAll(const std::vector<AdamWTensor>& tensors, int64_t step,
                      const AdamWConfig& config) override {
    Run("adamw", [&] {
      return AdamWUpdateAllCuda(tensors.data(), static_cast<int>(tensors.size()), step, config,
                                stream_);
    });
  }
  std::vector<double> SumsOfSquares(const std::vector<const Tensor*>& tensors) override;
  void ScaleInPlace(const std::vector<Tensor*>& tensors, float scale) override;
  void ZeroAll(const std::vector<Tensor*>& tensors) override;
  void LmHeadForward(const float* x, const float* wte, int n, int d, int vocab, int ld,
                     float* logits) override {
    Run("lm_head_forward",
        [&] { return LmHeadForwardCuda(cublas_, x, wte, n, d, vocab, ld, logits); });
  }
  void LmHeadBackward(const float* x, const float* wte, float* dlogits, int n, int d, int vocab,
                      int ld, float* dx, float* dwte) override {
    Run("lm_head_backward",
        [&] { return LmHeadBackwardCuda(cublas_, x, wte, dlogits, n, d, vocab, ld, dx, dwte); });
  }
  Tensor HeadLossForward(Tensor logits, const int32_t* host_targets, int n, int d, int vocab,
                         int ld, Tensor* saved) override;
  void LmHeadLossBackward(const Tensor& saved, const int32_t* host_targets, float dloss,
                          const float* x, const float* wte, int n, int d, int vocab, int ld,
                          float* dx, float* dwte) override {
    if (!SavesBf16LossGradient(d, ld)) {
      Backend::LmHeadLossBackward(saved, host_targets, dloss, x, wte, n, d, vocab, ld, dx, dwte);
      return;
    }
    PT_CHECK(saved.numel() == int64_t{n} * ld / 2)
        << "the head's bf16 gradient has " << saved.numel() << " floats";
    Run("lm_head_loss_backward", [&] {
      return LmHeadBackwardBf16Cuda(cublas_, reinterpret_cast<const uint16_t*>(saved.data()), dloss,
                                    x, wte, n, d, vocab, ld, dx, dwte);
    });
  }
  void Sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
             const float* b, int ldb, float beta, float* c, int ldc) override {
    Run("sgemm", [&] {
      return SgemmCuda(cublas_, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    });
  }

 private:
  // Runs `op` (named `name` for op timing) unless an earlier op failed;
  // keeps the first error.
  template <typename Op>
  void Run(const char* name, Op&& op) {
    if (!status_.ok()) return;
    // The current device is per host thread, and a worker drives its
    // backend from a job thread, not the one that created it.
    absl::Status s = CudaStatus(cudaSetDevice(device_), "cudaSetDevice", __FILE__, __LINE__);
    TimedOp timed{name};
    if (s.ok() && timing_) s = RecordEvent(&timed.start);
    if (s.ok()) s = op();
    if (s.ok() && timing_) s = RecordEvent(&timed.end);
    if (s.ok() && timing_) {
      pending_.push_back(timed);
    } else {
      DestroyEvents(timed);
    }
    if (!s.ok()) status_ = std::move(s);
  }

  // Runs `call` (returning an absl::StatusOr) on this backend's device,
  // outside Run: its data errors (INVALID_ARGUMENT for a non-finite value
  // or a malformed payload) fail this call only; a device failure
  // (INTERNAL) sticks as in Run. Not timed.
  template <typename Call>
  auto RunFallible(Call&& call) -> decltype(call()) {
    RETURN_IF_ERROR(status_);
    status_ = CudaStatus(cudaSetDevice(device_), "cudaSetDevice", __FILE__, __LINE__);
    RETURN_IF_ERROR(status_);
    auto result = call();
    if (result.status().code() == absl::StatusCode::kInternal) status_ = result.status();
    return result;
  }

  // An op's events while op timing is on.
  struct TimedOp {
    const char* name;
    cudaEvent_t start = nullptr;
    cudaEvent_t end = nullptr;
  };
  absl::Status RecordEvent(cudaEvent_t* event);
  static void DestroyEvents(const TimedOp& op);
  // A pinned staging block of UploadAsync and the event recorded after its
  // copy: the block is freed once the event has completed.
  struct StagedUpload {
    cudaEvent_t done;
    void* block;
  };
  // Frees the staging blocks whose copies are done (all of them when
  // `all`: the caller has synchronised the stream), oldest first.
  absl::Status ReleaseStaging(bool all);
  // The n host ids (token ids, targets) on this device, without waiting
  // for queued work: UploadAsync stages them in pinned memory before it
  // returns (the host array may change then), as the bits of a float
  // tensor, which Ids reads back as int32. The tensor goes back to the
  // cache when the caller drops it, after queuing the op that reads it.
  Tensor UploadIds(const int32_t* host, int64_t n);
  static const int32_t* Ids(const Tensor& t) { return reinterpret_cast<const int32_t*>(t.data()); }
  absl::Status SynchronizeStream();
  // The cross-entropy's forward queued (no wait): the mean loss as a [1]
  // device tensor; the probabilities into probs, or, with a non-null
  // gradient, the bf16 gradient (cross_entropy.h) instead.
  Tensor QueueCrossEntropy(const float* logits, const int32_t* host_targets, int n, int vocab,
                           int ld, float* probs, uint16_t* gradient);
  // Whether HeadLossForward keeps the head's loss gradient in bf16 (as
  // pairs in floats): when the bf16 products multiply copies at the head's
  // strides (lm_head.h's LmHeadBackwardBf16Cuda needs it) and ld is even.
  bool SavesBf16LossGradient(int d, int ld) const {
    return ld % 2 == 0 && MultipliesBf16Copies(cublas_, {ld, d});
  }
  // A tensor of `shape` from the cache, zero-filled if `zero` (else
  // uninitialised); with null storage after an error (backend.h).
  Tensor Allocate(const Shape& shape, bool zero);
  // EncodeOnDevice for "powersgd:rank=<rank>" (t non-empty, on this device).
  absl::StatusOr<std::string> EncodePowerSgd(const Tensor& t, int rank, CodecState* state);

  int device_;
  DeviceFacts facts_;
  cudaStream_t stream_;
  CublasHandle cublas_;
  const AttentionImpl attention_;
  // kFlash's kernels (flash_attention.h; PIPETRAIN_FLASH_KERNEL).
  const FlashKernel flash_kernel_;
  // PIPETRAIN_POISON_EMPTY (backend.h): Empty fills NaN.
  const bool poison_empty_;
  std::shared_ptr<DeviceMemory> memory_ = std::make_shared<DeviceMemory>(device_);
  absl::Status status_;
  bool timing_ = false;
  std::vector<TimedOp> pending_;     // recorded, not yet read
  std::deque<StagedUpload> staged_;  // in stream order
};

absl::Status CudaBackendImpl::RecordEvent(cudaEvent_t* event) {
  CUDA_RETURN_IF_ERROR(cudaEventCreate(event));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(*event, stream_));
  return absl::OkStatus();
}

void CudaBackendImpl::DestroyEvents(const TimedOp& op) {
  if (op.start != nullptr) cudaEventDestroy(op.start);
  if (op.end != nullptr) cudaEventDestroy(op.end);
}

OpTimes CudaBackendImpl::TakeOpTimes() {
  OpTimes times;
  for (const TimedOp& op : pending_) {
    float ms = 0;
    if (status_.ok()) {  // not through Run: that would time this too
      absl::Status s =
          CudaStatus(cudaEventSynchronize(op.end), "cudaEventSynchronize", __FILE__, __LINE__);
      if (s.ok()) {
        s = CudaStatus(cudaEventElapsedTime(&ms, op.start, op.end), "cudaEventElapsedTime",
                       __FILE__, __LINE__);
      }
      if (!s.ok()) status_ = std::move(s);
    }
    OpTime& t = times[op.name];
    ++t.calls;
    t.seconds += ms / 1e3;
    DestroyEvents(op);
  }
  pending_.clear();
  return times;
}

absl::Status CudaBackendImpl::SynchronizeStream() {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return ReleaseStaging(/*all=*/true);
}

absl::Status CudaBackendImpl::ReleaseStaging(bool all) {
  while (!staged_.empty()) {
    const StagedUpload& front = staged_.front();
    if (!all) {
      const cudaError_t done = cudaEventQuery(front.done);
      if (done == cudaErrorNotReady) {
        // Not an error, but it may be left as the thread's last error, which
        // the next launch check would report (CudaEvent::Query clears it
        // too). Later blocks are later on the stream: stop here.
        cudaGetLastError();
        break;
      }
      CUDA_RETURN_IF_ERROR(done);
    }
    cudaEventDestroy(front.done);
    PinnedHostCachingAllocator().Free(front.block);
    staged_.pop_front();
  }
  return absl::OkStatus();
}

Tensor CudaBackendImpl::UploadIds(const int32_t* host, int64_t n) {
  static_assert(sizeof(int32_t) == sizeof(float), "ids travel as float-sized words");
  Tensor bits = Tensor::Zeros({n});
  if (n > 0) std::memcpy(bits.data(), host, static_cast<size_t>(n) * sizeof(int32_t));
  return UploadAsync(bits);
}

Tensor CudaBackendImpl::Zeros(const Shape& shape) { return Allocate(shape, /*zero=*/true); }

Tensor CudaBackendImpl::Empty(const Shape& shape) { return Allocate(shape, /*zero=*/false); }

Tensor CudaBackendImpl::Allocate(const Shape& shape, bool zero) {
  const int64_t n = NumElements(shape);
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  float* ptr = nullptr;
  if (n > 0) {
    Run(zero ? "zeros" : "allocate", [&]() -> absl::Status {
      // Blocks are reused on this backend's stream only, after the work
      // queued before their Free (stream order; caching_allocator.h).
      absl::StatusOr<void*> block = memory_->cache.Allocate(bytes, StreamIdOf(stream_));
      if (!block.ok()) return block.status();
      ptr = static_cast<float*>(*block);
      if (zero) CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ptr, 0, bytes, stream_));
      // 0xFFFFFFFF is a NaN: an element no op writes shows in the results.
      if (!zero && poison_empty_) CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ptr, 0xFF, bytes, stream_));
      return absl::OkStatus();
    });
  }
  // After an error ptr is null: the tensor is unusable, and the caller
  // sees status() before using results (backend.h).
  if (ptr == nullptr) return Tensor::OnDevice(shape, nullptr);
  std::shared_ptr<DeviceMemory> memory = memory_;
  return Tensor::OnDevice(
      shape, std::shared_ptr<float>(ptr, [memory](float* p) { memory->cache.Free(p); }));
}

Tensor CudaBackendImpl::Upload(const Tensor& host) {
  // No zero fill: the copy overwrites every element.
  Tensor t = Allocate(host.shape(), /*zero=*/false);
  CopyFromHost(host, &t);
  return t;
}

Tensor CudaBackendImpl::UploadAsync(const Tensor& host) {
  PT_CHECK(!host.on_device()) << "UploadAsync of a device tensor";
  Tensor t = Allocate(host.shape(), /*zero=*/false);
  if (host.numel() == 0) return t;
  Run("upload", [&]() -> absl::Status {
    RETURN_IF_ERROR(ReleaseStaging(/*all=*/false));
    // From pageable memory cudaMemcpyAsync may wait for the stream; from
    // pinned memory it is a DMA queued behind the stream's work.
    const size_t bytes = static_cast<size_t>(host.size_bytes());
    ASSIGN_OR_RETURN(void* block,
                     PinnedHostCachingAllocator().Allocate(bytes, StreamIdOf(stream_)));
    std::memcpy(block, host.data(), bytes);
    cudaEvent_t done = nullptr;
    const char* call = "cudaMemcpyAsync";
    cudaError_t e = cudaMemcpyAsync(t.data(), block, bytes, cudaMemcpyHostToDevice, stream_);
    if (e == cudaSuccess) {
      call = "cudaEventCreateWithFlags";
      e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    }
    if (e == cudaSuccess) {
      call = "cudaEventRecord";
      e = cudaEventRecord(done, stream_);
    }
    if (e != cudaSuccess) {
      // Free the block only once nothing can still read it.
      cudaStreamSynchronize(stream_);
      if (done != nullptr) cudaEventDestroy(done);
      PinnedHostCachingAllocator().Free(block);
      return CudaStatus(e, call, __FILE__, __LINE__);
    }
    staged_.push_back({done, block});
    return absl::OkStatus();
  });
  return t;
}

void CudaBackendImpl::CopyFromHost(const Tensor& host, Tensor* dst) {
  PT_CHECK(!host.on_device() && dst->on_device() && host.numel() == dst->numel())
      << "CopyFromHost " << ShapeToString(host.shape()) << " into " << ShapeToString(dst->shape());
  if (host.numel() == 0) return;
  Run("copy_from_host", [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst->data(), host.data(), host.size_bytes(),
                                         cudaMemcpyHostToDevice, stream_));
    return SynchronizeStream();
  });
}

Tensor CudaBackendImpl::Download(const Tensor& t) {
  PT_CHECK(t.on_device()) << "Download of a host tensor";
  // Uninitialised: the copy overwrites every element.
  Tensor host = Tensor::OnHost(
      t.shape(), std::shared_ptr<float>(new float[t.numel()], std::default_delete<float[]>()));
  if (t.numel() == 0) return host;
  Run("download", [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host.data(), t.data(), t.size_bytes(), cudaMemcpyDeviceToHost, stream_));
    return SynchronizeStream();
  });
  // After a device error (now or earlier: Run then skips the copy) the
  // values are unknown: NaN, never uninitialised memory (a caller such as
  // LossValue may read them before it checks status()).
  if (!status_.ok()) {
    std::fill(host.data(), host.data() + host.numel(), std::numeric_limits<float>::quiet_NaN());
  }
  return host;
}

std::unique_ptr<PendingDownload> CudaBackendImpl::StartDownload(const Tensor& t) {
  PT_CHECK(t.on_device()) << "StartDownload of a host tensor through the CUDA backend";
  const size_t bytes = static_cast<size_t>(t.size_bytes());
  Tensor host;
  cudaEvent_t done = nullptr;
  Run("download", [&]() -> absl::Status {
    // Pinned memory, so the copy is a DMA that neither blocks this thread
    // nor stages through a driver buffer (kernels/cuda/pinned_buffer.h).
    // Blocks are keyed by this stream: one comes back to the cache only
    // when the host tensor dies, after its reader is done with it.
    if (bytes == 0) {
      host = Tensor::Zeros(t.shape());
    } else {
      CachingAllocator* pinned = &PinnedHostCachingAllocator();
      absl::StatusOr<void*> block = pinned->Allocate(bytes, StreamIdOf(stream_));
      if (!block.ok()) return block.status();
      host = Tensor::OnHost(t.shape(),
                            std::shared_ptr<float>(static_cast<float*>(*block),
                                                   [pinned](float* p) { pinned->Free(p); }));
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(host.data(), t.data(), bytes, cudaMemcpyDeviceToHost, stream_));
    }
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(done, stream_));
    return absl::OkStatus();
  });
  if (!status_.ok()) {
    // The copy may be queued: `host`'s pinned block goes back to the cache
    // on return, so nothing may still write it.
    if (!host.is_null()) cudaStreamSynchronize(stream_);
    if (done != nullptr) cudaEventDestroy(done);
    return std::make_unique<StreamDownload>(device_, Tensor(), nullptr, status_);
  }
  return std::make_unique<StreamDownload>(device_, std::move(host), done, absl::OkStatus());
}

absl::StatusOr<std::string> CudaBackendImpl::NewDeviceGroupId() {
  // A worker without an id joins no device group (its links stay on gRPC).
  RETURN_IF_ERROR(CheckNcclForDeviceGroups());
  ASSIGN_OR_RETURN(NcclUniqueId id, NcclUniqueId::Create());
  return id.ToBytes();
}

absl::StatusOr<std::unique_ptr<DeviceChannel>> CudaBackendImpl::JoinDeviceGroup(
    const DeviceGroupSpec& group, int stage) {
  RETURN_IF_ERROR(status_);
  RETURN_IF_ERROR(CheckNcclForDeviceGroups());
  // The channel allocates what it receives from this backend's cache, in
  // this stream's order (nccl_device_channel.h).
  return CreateNcclDeviceChannel(group, stage, device_, stream_,
                                 [this](const Shape& shape) { return Allocate(shape, false); });
}

absl::StatusOr<std::unique_ptr<DeviceCollective>> CudaBackendImpl::JoinDeviceCollective(
    const DeviceCollectiveSpec& spec) {
  RETURN_IF_ERROR(status_);
  RETURN_IF_ERROR(CheckNcclForDeviceGroups());
  // Flat blocks of several gradients come from this backend's cache, in
  // this stream's order (nccl_device_collective.h).
  return CreateNcclDeviceCollective(spec, device_, stream_,
                                    [this](const Shape& shape) { return Allocate(shape, false); });
}

absl::StatusOr<std::string> CudaBackendImpl::EncodeOnDevice(const Tensor& t,
                                                            const std::string& spec,
                                                            absl::Span<const float> scores,
                                                            CodecState* state) {
  if (!t.on_device()) return absl::UnimplementedError("a host tensor is encoded on the host");
  if (t.numel() == 0) return absl::UnimplementedError("an empty tensor is encoded on the host");
  ASSIGN_OR_RETURN(std::optional<DeviceCodec> codec, DeviceCodecFor(spec));
  if (!codec.has_value()) return absl::UnimplementedError("no device codec for " + spec);
  if (codec->powersgd_rank.has_value()) return EncodePowerSgd(t, *codec->powersgd_rank, state);
  const TokenTopKInner& q = codec->quantizer;
  return RunFallible([&]() -> absl::StatusOr<std::string> {
    if (codec->half.has_value()) return HalfEncodeCuda(*codec->half, t.data(), t.shape(), stream_);
    if (codec->token_keep.has_value()) {
      return TokenTopKEncodeCuda(t.data(), t.shape(), *codec->token_keep, q, scores, stream_);
    }
    return q.kind == TokenTopKInner::Kind::kPiecewise
               ? PiecewiseEncodeCuda(t.data(), t.shape(), q.bits, stream_)
               : LinearEncodeCuda(t.data(), t.shape(), q.bits, stream_);
  });
}

// The link's Q stays on this device in state->powersgd_q; a Q of another
// shape or place (a fresh state) means a cold start, as the CPU codec's
// StartQ. The new Q is written beside the warm start, never over it, and
// replaces it only once the encode succeeded: a refused encode (a Q that
// overflows float) keeps the link's state, as the CPU codec does, instead
// of leaving an Inf warm start that every later encode would carry.
absl::StatusOr<std::string> CudaBackendImpl::EncodePowerSgd(const Tensor& t, int rank,
                                                            CodecState* state) {
  const PowerSgdMatrix m = PowerSgdMatrixOf(t.shape());
  const Shape q_shape{m.cols, rank};
  const bool warm =
      state != nullptr && state->powersgd_q.on_device() && state->powersgd_q.shape() == q_shape;
  const float* q_warm = warm ? state->powersgd_q.data() : nullptr;
  Tensor q = Allocate(q_shape, /*zero=*/false);
  ASSIGN_OR_RETURN(std::string payload, RunFallible([&]() -> absl::StatusOr<std::string> {
                     return PowerSgdEncodePayloadCuda(cublas_, t.data(), t.shape(), rank, q_warm,
                                                      q.data());
                   }));
  if (state != nullptr) state->powersgd_q = std::move(q);
  return payload;
}

absl::StatusOr<Tensor> CudaBackendImpl::DecodeOnDevice(const std::string& spec,
                                                       const std::string& payload,
                                                       const Shape& shape) {
  if (NumElements(shape) == 0) {
    return absl::UnimplementedError("an empty tensor is decoded on the host");
  }
  ASSIGN_OR_RETURN(std::optional<DeviceCodec> codec, DeviceCodecFor(spec));
  if (!codec.has_value()) return absl::UnimplementedError("no device codec for " + spec);
  // The size the payload announces is checked before any decoder reads
  // further (as DecodeWireTensorWith does on the host): its header is a
  // peer's, and a token_topk mask of a few GiB announcing 2^35 tokens
  // would make the host hold 8 bytes per kept token before the output's
  // capacity is compared.
  absl::StatusOr<Shape> announced = PeekPayloadShape(payload);
  if (!announced.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot decode its ", spec, " payload: ", announced.status().message()));
  }
  if (NumElements(*announced) != NumElements(shape)) {
    return absl::InvalidArgumentError(absl::StrCat("payload announces shape ",
                                                   ShapeToString(*announced), "; expected ",
                                                   ShapeToString(shape)));
  }
  const TokenTopKInner& q = codec->quantizer;
  Tensor out = Allocate(shape, /*zero=*/false);
  ASSIGN_OR_RETURN(
      const Shape decoded, RunFallible([&]() -> absl::StatusOr<Shape> {
        if (codec->powersgd_rank.has_value()) {
          return PowerSgdDecodePayloadCuda(cublas_, payload, *codec->powersgd_rank, out.data(),
                                           out.numel());
        }
        if (codec->half.has_value()) {
          return HalfDecodeCuda(*codec->half, payload, out.data(), out.numel(), stream_);
        }
        if (codec->token_keep.has_value()) {
          return TokenTopKDecodeCuda(payload, *codec->token_keep, q, out.data(), out.numel(),
                                     stream_);
        }
        return q.kind == TokenTopKInner::Kind::kPiecewise
                   ? PiecewiseDecodeCuda(payload, q.bits, out.data(), out.numel(), stream_)
                   : LinearDecodeCuda(payload, q.bits, out.data(), out.numel(), stream_);
      }));
  if (NumElements(decoded) != out.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("payload decodes to ", ShapeToString(decoded),
                                                   "; expected ", ShapeToString(shape)));
  }
  return out;
}

void CudaBackendImpl::Fill(Tensor* t, float value) {
  PT_CHECK(t->on_device()) << "Fill of a host tensor through the CUDA backend";
  if (t->numel() == 0) return;
  if (value == 0.0f) {
    Run("fill", [&]() -> absl::Status {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(t->data(), 0, t->size_bytes(), stream_));
      return absl::OkStatus();
    });
    return;
  }
  // Rare (LayerNorm gains at init go through CopyFromHost): a host copy.
  CopyFromHost(Tensor::FromVector(t->shape(), std::vector<float>(t->numel(), value)), t);
}

std::vector<double> CudaBackendImpl::SumsOfSquares(const std::vector<const Tensor*>& tensors) {
  // NaN until the sums arrive: a failed backend's caller sees no number.
  std::vector<double> sums(tensors.size(), std::numeric_limits<double>::quiet_NaN());
  if (tensors.empty()) return sums;
  const auto table = DeviceTable("SumsOfSquares", tensors);
  const auto& data = table.first;
  const auto& counts = table.second;
  // The doubles in a block of the stream-ordered cache (two floats each),
  // copied to the host in one wait.
  Tensor device_sums = Allocate({2 * static_cast<int64_t>(tensors.size())}, /*zero=*/false);
  Run("sums_of_squares", [&]() -> absl::Status {
    RETURN_IF_ERROR(SumsOfSquaresCuda(data.data(), counts.data(), static_cast<int>(data.size()),
                                      reinterpret_cast<double*>(device_sums.data()), stream_));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sums.data(), device_sums.data(),
                                         sums.size() * sizeof(double), cudaMemcpyDeviceToHost,
                                         stream_));
    return SynchronizeStream();
  });
  return sums;
}

void CudaBackendImpl::ZeroAll(const std::vector<Tensor*>& tensors) {
  const auto table = DeviceTable("ZeroAll", tensors);
  const auto& data = table.first;
  const auto& counts = table.second;
  // Named as the single Fill is, so per-op tables compare across commits.
  Run("fill", [&] {
    return ZeroAllCuda(data.data(), counts.data(), static_cast<int>(data.size()), stream_);
  });
}

void CudaBackendImpl::ScaleInPlace(const std::vector<Tensor*>& tensors, float scale) {
  const auto table = DeviceTable("ScaleInPlace", tensors);
  const auto& data = table.first;
  const auto& counts = table.second;
  Run("scale", [&] {
    return ScaleAllCuda(data.data(), counts.data(), static_cast<int>(data.size()), scale, stream_);
  });
}

Tensor CudaBackendImpl::QueueCrossEntropy(const float* logits, const int32_t* host_targets, int n,
                                          int vocab, int ld, float* probs, uint16_t* gradient) {
  const Tensor targets = UploadIds(host_targets, n);
  // From the stream-ordered cache, not a buffer of our own that grows with
  // cudaFree: a cudaFree waits for the whole device, NCCL kernels waiting
  // for a peer included (docs/architecture.md, NCCL in the data plane).
  Tensor row_losses = Allocate({n}, /*zero=*/false);
  Tensor loss = Allocate({1}, /*zero=*/false);
  Run("cross_entropy_forward", [&] {
    return gradient != nullptr
               ? SoftmaxCrossEntropyForwardBf16GradientCuda(logits, Ids(targets), n, vocab, ld,
                                                            gradient, row_losses.data(),
                                                            loss.data(), stream_)
               : SoftmaxCrossEntropyForwardCuda(logits, Ids(targets), n, vocab, ld, probs,
                                                row_losses.data(), loss.data(), stream_);
  });
  return loss;
}

float CudaBackendImpl::SoftmaxCrossEntropyForward(const float* logits, const int32_t* host_targets,
                                                  int n, int vocab, int ld, float* probs) {
  const Tensor host = Download(QueueCrossEntropy(logits, host_targets, n, vocab, ld, probs,
                                                 /*gradient=*/nullptr));
  return status_.ok() ? host[0] : 0.0f;  // after an error the copy did not run
}

Tensor CudaBackendImpl::HeadLossForward(Tensor logits, const int32_t* host_targets, int n, int d,
                                        int vocab, int ld, Tensor* saved) {
  // The loss is left on the device: the host reads it when it needs the
  // number (LossValue), not in the middle of the step.
  if (!SavesBf16LossGradient(d, ld)) {
    Tensor loss =
        QueueCrossEntropy(logits.data(), host_targets, n, vocab, ld, logits.data(), nullptr);
    *saved = std::move(logits);  // now the probabilities
    return loss;
  }
  // [n, ld] bf16 as pairs in floats; the fp32 logits go back to the cache
  // on return (stream order keeps them until the kernel has read them).
  Tensor gradient = Allocate({n, ld / 2}, /*zero=*/false);
  Tensor loss = QueueCrossEntropy(logits.data(), host_targets, n, vocab, ld, nullptr,
                                  reinterpret_cast<uint16_t*>(gradient.data()));
  *saved = std::move(gradient);
  return loss;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device, GemmMode mode,
                                                           AttentionImpl attention) {
  absl::StatusOr<CudaDeviceInfo> info = GetCudaDeviceInfo(device);
  if (!info.ok()) return info.status();
  RETURN_IF_ERROR(CheckKernelsRunOn(*info));
  const absl::StatusOr<FlashKernel> flash_kernel = FlashKernelFromEnvironment();
  if (!flash_kernel.ok()) return flash_kernel.status();
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  absl::StatusOr<CublasHandle> cublas = CublasHandle::Create(mode, stream);
  if (!cublas.ok()) {
    cudaStreamDestroy(stream);
    return cublas.status();
  }
  return std::unique_ptr<Backend>(
      new CudaBackendImpl(*info, stream, *std::move(cublas), attention, *flash_kernel));
}

}  // namespace pipetrain
