// ForwardingBackend (testonly): a Backend that hands every call to another
// one. Tests subclass it and override the few calls they want to observe or
// change (fault injection, a stand-in device codec), leaving the arithmetic
// to the inner backend, usually CpuBackend().
//
//   class CountingUploads : public ForwardingBackend {
//    public:
//     CountingUploads() : ForwardingBackend(CpuBackend()) {}
//     Tensor Upload(const Tensor& host) override { ++uploads; return inner()->Upload(host); }
//     int uploads = 0;
//   };
//
// Thread-safety: that of the inner backend.
#ifndef PIPETRAIN_WORKER_MODEL_FORWARDING_BACKEND_H_
#define PIPETRAIN_WORKER_MODEL_FORWARDING_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/model/backend.h"

namespace pipetrain {

class ForwardingBackend : public Backend {
 public:
  // `inner` is not owned and must outlive this backend.
  explicit ForwardingBackend(Backend* inner) : inner_(inner) {}

  Backend* inner() const { return inner_; }

  BackendKind kind() const override { return inner_->kind(); }
  std::string Describe() const override { return inner_->Describe(); }
  absl::Status status() const override { return inner_->status(); }
  DeviceFacts device_facts() const override { return inner_->device_facts(); }
  void Synchronize() override { inner_->Synchronize(); }
  void SetOpTiming(bool on) override { inner_->SetOpTiming(on); }
  OpTimes TakeOpTimes() override { return inner_->TakeOpTimes(); }

  Tensor Zeros(const Shape& shape) override { return inner_->Zeros(shape); }
  Tensor Empty(const Shape& shape) override { return inner_->Empty(shape); }
  Tensor Upload(const Tensor& host) override { return inner_->Upload(host); }
  Tensor UploadAsync(const Tensor& host) override { return inner_->UploadAsync(host); }
  Tensor Download(const Tensor& t) override { return inner_->Download(t); }
  std::unique_ptr<PendingDownload> StartDownload(const Tensor& t) override {
    return inner_->StartDownload(t);
  }
  void CopyFromHost(const Tensor& host, Tensor* dst) override { inner_->CopyFromHost(host, dst); }
  void Fill(Tensor* t, float value) override { inner_->Fill(t, value); }
  absl::StatusOr<std::string> NewDeviceGroupId() override { return inner_->NewDeviceGroupId(); }
  absl::StatusOr<std::unique_ptr<DeviceChannel>> JoinDeviceGroup(const DeviceGroupSpec& group,
                                                                 int stage) override {
    return inner_->JoinDeviceGroup(group, stage);
  }
  absl::StatusOr<std::unique_ptr<DeviceCollective>> JoinDeviceCollective(
      const DeviceCollectiveSpec& spec) override {
    return inner_->JoinDeviceCollective(spec);
  }
  absl::StatusOr<std::string> EncodeOnDevice(const Tensor& t, const std::string& spec,
                                             absl::Span<const float> scores,
                                             CodecState* state) override {
    return inner_->EncodeOnDevice(t, spec, scores, state);
  }
  absl::StatusOr<Tensor> DecodeOnDevice(const std::string& spec, const std::string& payload,
                                        const Shape& shape) override {
    return inner_->DecodeOnDevice(spec, payload, shape);
  }

  void LayerNormForward(const float* x, const float* w, const float* b, int n, int c, float eps,
                        float* y, float* mean, float* rstd) override {
    inner_->LayerNormForward(x, w, b, n, c, eps, y, mean, rstd);
  }
  void LayerNormBackward(const float* x, const float* w, const float* mean, const float* rstd,
                         const float* dy, int n, int c, float* dx, float* dw, float* db) override {
    inner_->LayerNormBackward(x, w, mean, rstd, dy, n, c, dx, dw, db);
  }
  void LinearForward(const float* x, const float* w, const float* b, int n, int in, int out,
                     float* y) override {
    inner_->LinearForward(x, w, b, n, in, out, y);
  }
  void LinearBackward(const float* x, const float* w, const float* dy, int n, int in, int out,
                      float* dx, float* dw, float* db) override {
    inner_->LinearBackward(x, w, dy, n, in, out, dx, dw, db);
  }
  void GeluForward(const float* x, int64_t n, float* y) override { inner_->GeluForward(x, n, y); }
  void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) override {
    inner_->GeluBackward(x, dy, n, dx);
  }
  void Add(const float* a, const float* b, int64_t n, float* out) override {
    inner_->Add(a, b, n, out);
  }
  void AddInPlace(float* acc, const float* x, int64_t n) override { inner_->AddInPlace(acc, x, n); }
  void Subtract(const float* a, const float* b, int64_t n, float* out) override {
    inner_->Subtract(a, b, n, out);
  }
  int64_t AttentionSavedFloats(int batch, int seq_len, int c, int heads,
                               bool probabilities) const override {
    return inner_->AttentionSavedFloats(batch, seq_len, c, heads, probabilities);
  }
  void AttentionForward(const float* qkv, int batch, int seq_len, int c, int heads,
                        bool probabilities, float* out, float* saved) override {
    inner_->AttentionForward(qkv, batch, seq_len, c, heads, probabilities, out, saved);
  }
  void AttentionBackward(const float* qkv, const float* out, const float* saved, bool probabilities,
                         const float* dout, int batch, int seq_len, int c, int heads, float* dqkv,
                         float* scratch) override {
    inner_->AttentionBackward(qkv, out, saved, probabilities, dout, batch, seq_len, c, heads, dqkv,
                              scratch);
  }
  void EmbeddingForward(const int32_t* host_tokens, const float* wte, const float* wpe, int batch,
                        int seq_len, int c, int vocab, float* out) override {
    inner_->EmbeddingForward(host_tokens, wte, wpe, batch, seq_len, c, vocab, out);
  }
  void EmbeddingBackward(const int32_t* host_tokens, const float* dout, int batch, int seq_len,
                         int c, int vocab, float* dwte, float* dwpe) override {
    inner_->EmbeddingBackward(host_tokens, dout, batch, seq_len, c, vocab, dwte, dwpe);
  }
  int LogitsRowStride(int vocab) const override { return inner_->LogitsRowStride(vocab); }
  float SoftmaxCrossEntropyForward(const float* logits, const int32_t* host_targets, int n,
                                   int vocab, int ld, float* probs) override {
    return inner_->SoftmaxCrossEntropyForward(logits, host_targets, n, vocab, ld, probs);
  }
  void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* host_targets, int n,
                                   int vocab, int ld, float dloss, float* dlogits) override {
    inner_->SoftmaxCrossEntropyBackward(probs, host_targets, n, vocab, ld, dloss, dlogits);
  }
  void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n, int64_t step,
                   const AdamWConfig& config, bool apply_decay) override {
    inner_->AdamWUpdate(param, grad, m, v, n, step, config, apply_decay);
  }
  void AdamWUpdateAll(const std::vector<AdamWTensor>& tensors, int64_t step,
                      const AdamWConfig& config) override {
    inner_->AdamWUpdateAll(tensors, step, config);
  }
  void ZeroAll(const std::vector<Tensor*>& tensors) override { inner_->ZeroAll(tensors); }
  std::vector<double> SumsOfSquares(const std::vector<const Tensor*>& tensors) override {
    return inner_->SumsOfSquares(tensors);
  }
  void ScaleInPlace(const std::vector<Tensor*>& tensors, float scale) override {
    inner_->ScaleInPlace(tensors, scale);
  }
  void LmHeadForward(const float* x, const float* wte, int n, int d, int vocab, int ld,
                     float* logits) override {
    inner_->LmHeadForward(x, wte, n, d, vocab, ld, logits);
  }
  void LmHeadBackward(const float* x, const float* wte, float* dlogits, int n, int d, int vocab,
                      int ld, float* dx, float* dwte) override {
    inner_->LmHeadBackward(x, wte, dlogits, n, d, vocab, ld, dx, dwte);
  }
  // HeadLossForward and LmHeadLossBackward are left to their defaults, a
  // pair that calls the forwarded ops above (so the inner backend's own
  // pair, which keeps a state of its own, is never half used). So are the
  // fused ops (LinearGeluForward, LinearForwardResidual,
  // LayerNormBackwardResidual): their defaults call the ops they combine,
  // so a subclass that overrides one of those sees every call (the inner
  // backend's fusion, and its rounding order, is then not used).
  void Sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
             const float* b, int ldb, float beta, float* c, int ldc) override {
    inner_->Sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

 private:
  Backend* inner_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_FORWARDING_BACKEND_H_
