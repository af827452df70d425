// Every unit kind run on the CUDA backend against the same unit on the CPU
// backend (the reference): forward output (the head's loss), input gradient
// and every parameter gradient, from the same deterministic initialisation
// and inputs; and CUDA run to run bitwise. GPU cases SKIP without a device.
//
// Tolerance |gpu - cpu| <= atol + rtol * |cpu|, atol = rtol * max|cpu| of
// the compared tensor, rtol = 1e-4 (fp32 GEMMs). Why: each kernel alone
// meets u * sqrt(k) * 16 (about 1e-5 of its output's scale for the k <= 4d
// = 256 products here; kernels/cuda/linear_test.cc), and a unit chains up to
// eight kernels (LayerNorm, GEMM, attention, GEMM, residual and back), each
// passing on its input's error; the errors are relative to the tensor's
// scale, not to each element (a small element is a sum of large terms that
// cancel), hence atol from the maximum. TF32 is checked separately with
// rtol = 1e-2 (10-bit mantissa inputs, 2^-10 per product, times the chain),
// and bf16 with rtol = 5e-2 (7-bit mantissa inputs, 2^-8 per product: four
// times TF32's, times the same chain).
// Written without a GPU: the first run on one may tighten them.
#include "worker/model/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/philox.h"
#include "gtest/gtest.h"
#include "kernels/compress/codec_spec.h"
#include "kernels/compress/token_topk_codec.h"
#include "kernels/cuda/parity_testing.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/unit.h"

namespace pipetrain {
namespace {

// Empty allocations filled with NaN on CUDA (cuda_backend.h), set before any
// backend is made: an op that leaves part of its output unwritten fails.
const bool kPoisonEmpty = [] {
  setenv("PIPETRAIN_POISON_EMPTY", "1", /*overwrite=*/1);
  return true;
}();

using testing::AllClose;

// The token_topk codec a valid spec names.
std::unique_ptr<TokenTopKCodec> MakeTokenTopKFromSpec(const std::string& spec) {
  std::unique_ptr<Codec> codec = MakeCodec(spec).value();
  return std::unique_ptr<TokenTopKCodec>(static_cast<TokenTopKCodec*>(codec.release()));
}

// Shapes off every block size: T = 33, B * T = 99 rows, vocab 97.
GptConfig SmallConfig() {
  GptConfig c;
  c.vocab_size = 97;
  c.max_seq_len = 40;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 64;
  return c;
}

TokenBatch Batch(const GptConfig& c, int batch, int seq_len, uint64_t seed) {
  TokenBatch b{batch, seq_len, {}, {}};
  for (int i = 0; i < batch * seq_len; ++i) {
    b.inputs.push_back(static_cast<int32_t>(UniformIndex(seed, i, 0, 0, c.vocab_size)));
    b.targets.push_back(static_cast<int32_t>(UniformIndex(seed, i, 1, 0, c.vocab_size)));
  }
  return b;
}

Tensor Normal(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::Zeros(shape);
  FillNormal(seed, 7, 0.0f, 1.0f, t.data(), t.numel());
  return t;
}

std::vector<float> Host(Backend* backend, const Tensor& t) {
  return backend->Download(t).ToVector();
}

::testing::AssertionResult Close(const std::string& what, const std::vector<float>& gpu,
                                 const std::vector<float>& cpu, float rtol) {
  float scale = 0.0f;
  for (float v : cpu) scale = std::max(scale, std::fabs(v));
  return AllClose(what, gpu, cpu, rtol * scale, rtol);
}

// What one unit produced on one backend, on the host.
struct UnitRun {
  std::vector<float> y, dx;
  std::vector<std::vector<float>> grads;  // parameters() order
};

UnitRun RunUnit(const GptConfig& config, int index, Backend* backend, const TokenBatch& batch) {
  std::unique_ptr<Unit> unit = MakeUnit(config, index, backend);
  InitializeParameters(unit.get(), /*seed=*/1234);
  const Shape act = {batch.batch, batch.seq_len, config.d_model};
  const bool head = unit->kind() == UnitKind::kHead;
  UnitContext ctx;
  Tensor y = unit->Forward(backend->Upload(Normal(act, 5)), batch, &ctx);
  // dL/dy: the head's is a host scalar; other units' a random tensor.
  Tensor dy = head ? Tensor::FromVector({1}, {0.25f}) : backend->Upload(Normal(act, 6));
  Tensor dx = unit->Backward(dy, batch, ctx);
  UnitRun run;
  // The head's loss stays on the device too (unit.h): Host reads it.
  run.y = Host(backend, y);
  if (!dx.is_null()) run.dx = Host(backend, dx);
  for (Parameter* p : unit->parameters()) run.grads.push_back(Host(backend, p->grad));
  EXPECT_TRUE(backend->status().ok()) << backend->status();
  return run;
}

class CudaBackendTest : public testing::CudaTest {};

void ExpectUnitsMatch(GemmMode mode, float rtol,
                      AttentionImpl attention = AttentionImpl::kReference) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0, mode, attention);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  const GptConfig config = SmallConfig();
  const TokenBatch batch = Batch(config, 3, 33, 9);
  for (int index = 0; index < NumUnits(config); ++index) {
    const std::string name = absl::StrCat(UnitName(config, index), " ", GemmModeName(mode));
    const UnitRun want = RunUnit(config, index, CpuBackend(), batch);
    const UnitRun got = RunUnit(config, index, cuda->get(), batch);
    EXPECT_TRUE(Close(name + " y", got.y, want.y, rtol));
    EXPECT_TRUE(Close(name + " dx", got.dx, want.dx, rtol));
    ASSERT_EQ(got.grads.size(), want.grads.size());
    for (size_t p = 0; p < want.grads.size(); ++p) {
      EXPECT_TRUE(Close(absl::StrCat(name, " grad ", p), got.grads[p], want.grads[p], rtol));
    }
  }
}

TEST_F(CudaBackendTest, EveryUnit_Fp32_MatchesCpuBackend) {
  ExpectUnitsMatch(GemmMode::kFp32, 1e-4f);
}

TEST_F(CudaBackendTest, EveryUnit_Tf32_MatchesCpuBackend) {
  ExpectUnitsMatch(GemmMode::kTf32, 1e-2f);
}

TEST_F(CudaBackendTest, EveryUnit_Bf16_MatchesCpuBackend) {
  ExpectUnitsMatch(GemmMode::kBf16, 5e-2f);
}

// The same with attention through cuBLAS batched GEMMs (attention_gemm.h),
// at the same tolerances: the GEMMs change the order of attention's sums,
// as they do the linear layers'.
TEST_F(CudaBackendTest, EveryUnit_Fp32_GemmAttention_MatchesCpuBackend) {
  ExpectUnitsMatch(GemmMode::kFp32, 1e-4f, AttentionImpl::kGemm);
}

TEST_F(CudaBackendTest, EveryUnit_Tf32_GemmAttention_MatchesCpuBackend) {
  ExpectUnitsMatch(GemmMode::kTf32, 1e-2f, AttentionImpl::kGemm);
}

// Flash attention (flash_attention.h) rounds attention's products' inputs
// to bf16 in every GEMM mode, so its units get the bf16 mode's tolerance
// in fp32 mode too.
TEST_F(CudaBackendTest, EveryUnit_Fp32_FlashAttention_MatchesCpuBackend) {
  ExpectUnitsMatch(GemmMode::kFp32, 5e-2f, AttentionImpl::kFlash);
}

TEST_F(CudaBackendTest, EveryUnit_Bf16_FlashAttention_MatchesCpuBackend) {
  ExpectUnitsMatch(GemmMode::kBf16, 5e-2f, AttentionImpl::kFlash);
}

// What flash keeps: each row's log-sum-exp, unless the caller reads the
// probabilities or a head is wider than its tiles.
TEST_F(CudaBackendTest, FlashAttention_SavesRowStatisticsOnly) {
  absl::StatusOr<std::unique_ptr<Backend>> flash =
      CreateCudaBackend(0, GemmMode::kBf16, AttentionImpl::kFlash);
  absl::StatusOr<std::unique_ptr<Backend>> gemm =
      CreateCudaBackend(0, GemmMode::kBf16, AttentionImpl::kGemm);
  ASSERT_TRUE(flash.ok() && gemm.ok());
  EXPECT_EQ((*flash)->AttentionSavedFloats(2, 1024, 768, 12, false), 2 * 12 * 1024);
  EXPECT_EQ((*flash)->AttentionSavedFloats(2, 1024, 768, 12, true), 2 * 12 * 1024 * 1024);
  EXPECT_EQ((*flash)->AttentionSavedFloats(1, 8, 512, 2, false), 2 * 8 * 8);  // head_dim 256
  EXPECT_EQ((*gemm)->AttentionSavedFloats(2, 1024, 768, 12, false), 2 * 12 * 1024 * 1024);
  EXPECT_NE((*flash)->Describe().find("flash attention"), std::string::npos)
      << (*flash)->Describe();
}

// Asked for token importance, a flash backend keeps the probabilities
// (kGemm's kernels) and the scores match the CPU's.
TEST_F(CudaBackendTest, FlashAttention_TokenImportanceKeepsProbabilities) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda =
      CreateCudaBackend(0, GemmMode::kFp32, AttentionImpl::kFlash);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  const GptConfig config = SmallConfig();
  const TokenBatch batch = Batch(config, 2, 33, 5);
  auto scores = [&](Backend* backend) {
    std::unique_ptr<Unit> attn = MakeUnit(config, 1, backend);  // attn_0
    InitializeParameters(attn.get(), 7);
    attn->KeepTokenImportance();
    UnitContext ctx;
    attn->Forward(backend->Upload(Normal({2, 33, config.d_model}, 3)), batch, &ctx);
    return attn->TokenImportance(ctx);
  };
  const std::vector<float> want = scores(CpuBackend());
  ASSERT_EQ(want.size(), 2u * 33);
  EXPECT_TRUE(Close("An", scores(cuda->get()), want, 1e-4f));
}

// Every unit twice on one backend, seq_len `seq_len`: bitwise the same.
void ExpectUnitsRepeatBitwise(GemmMode mode, AttentionImpl attention, int seq_len) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0, mode, attention);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  const GptConfig config = SmallConfig();
  const TokenBatch batch = Batch(config, 2, seq_len, 3);
  for (int index = 0; index < NumUnits(config); ++index) {
    const UnitRun a = RunUnit(config, index, cuda->get(), batch);
    const UnitRun b = RunUnit(config, index, cuda->get(), batch);
    EXPECT_EQ(a.y, b.y) << UnitName(config, index);
    EXPECT_EQ(a.dx, b.dx) << UnitName(config, index);
    EXPECT_EQ(a.grads, b.grads) << UnitName(config, index);
  }
}

TEST_F(CudaBackendTest, EveryUnit_TwoRuns_BitwiseEqual) {
  ExpectUnitsRepeatBitwise(GemmMode::kFp32, AttentionImpl::kReference, 17);
}

TEST_F(CudaBackendTest, EveryUnit_FlashAttention_TwoRuns_BitwiseEqual) {
  ExpectUnitsRepeatBitwise(GemmMode::kBf16, AttentionImpl::kFlash, 33);
}

TEST_F(CudaBackendTest, Describe_NamesDeviceAndMode) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0, GemmMode::kTf32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ((*cuda)->kind(), BackendKind::kCuda);
  EXPECT_NE((*cuda)->Describe().find("cuda:0"), std::string::npos) << (*cuda)->Describe();
  EXPECT_EQ((*cuda)->Describe().find("GEMM attention"), std::string::npos);
  cuda = CreateCudaBackend(0, GemmMode::kTf32, AttentionImpl::kGemm);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_NE((*cuda)->Describe().find("tf32 GEMMs, GEMM attention"), std::string::npos)
      << (*cuda)->Describe();
}

// Op timing names each op and measures device time.
TEST_F(CudaBackendTest, OpTiming_UnitForward_TimesEachOp) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Backend* b = cuda->get();
  const GptConfig config = SmallConfig();
  std::unique_ptr<Unit> mlp = MakeUnit(config, 2, b);  // mlp_0
  InitializeParameters(mlp.get(), 1);
  const TokenBatch batch = Batch(config, 2, 33, 4);
  const Tensor x = b->Upload(Normal({2, 33, config.d_model}, 8));
  b->SetOpTiming(true);
  UnitContext ctx;
  mlp->Forward(x, batch, &ctx);
  b->SetOpTiming(false);
  const OpTimes times = b->TakeOpTimes();
  ASSERT_TRUE(b->status().ok()) << b->status();
  // fc1's bias and GELU run as one fused op (LinearGeluForward), so there
  // is no separate gelu_forward.
  EXPECT_EQ(times.at("linear_forward").calls, 2);
  EXPECT_EQ(times.at("bias_gelu_forward").calls, 1);
  EXPECT_EQ(times.count("gelu_forward"), 0u);
  EXPECT_EQ(times.at("layernorm_forward").calls, 1);
  EXPECT_GT(times.at("linear_forward").seconds, 0.0);
  EXPECT_TRUE(b->TakeOpTimes().empty());
}

// Gradient clipping's passes on the device: the sums against the CPU
// backend's element-order doubles (within 1e-10 relative: only the order
// differs; kernels/cuda/multi_tensor_test.cc says why), an empty tensor's 0,
// and the scaling bitwise the CPU's, each timed as one op.
TEST_F(CudaBackendTest, SumsOfSquaresAndScale_MatchCpuBackend_OneOpEach) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Backend* b = cuda->get();
  std::vector<Tensor> host = {Normal({3, 1000, 7}, 31), Normal({0}, 32), Normal({300001}, 33)};
  std::vector<Tensor> device;
  for (const Tensor& t : host) device.push_back(b->Upload(t));
  std::vector<const Tensor*> host_view, device_view;
  std::vector<Tensor*> host_out, device_out;
  for (size_t i = 0; i < host.size(); ++i) {
    host_view.push_back(&host[i]);
    device_view.push_back(&device[i]);
    host_out.push_back(&host[i]);
    device_out.push_back(&device[i]);
  }
  b->SetOpTiming(true);
  const std::vector<double> got = b->SumsOfSquares(device_view);
  b->ScaleInPlace(device_out, 0.8125f);
  b->SetOpTiming(false);
  ASSERT_TRUE(b->status().ok()) << b->status();
  const std::vector<double> want = CpuBackend()->SumsOfSquares(host_view);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-10 * want[i]) << "tensor " << i;
  }
  EXPECT_EQ(got[1], 0.0);
  CpuBackend()->ScaleInPlace(host_out, 0.8125f);
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_EQ(Host(b, device[i]), host[i].ToVector()) << "tensor " << i;
  }
  const OpTimes times = b->TakeOpTimes();
  EXPECT_EQ(times.at("sums_of_squares").calls, 1);
  EXPECT_EQ(times.at("scale").calls, 1);
}

// A unit's ZeroGrads is one multi-tensor launch (op "fill" once), and
// every gradient reads back as zeros.
TEST_F(CudaBackendTest, ZeroGrads_OneFillForTheUnit_AllZero) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Backend* b = cuda->get();
  const GptConfig config = SmallConfig();
  std::unique_ptr<Unit> mlp = MakeUnit(config, 2, b);  // mlp_0
  InitializeParameters(mlp.get(), 3);
  for (Parameter* p : mlp->parameters())
    b->AddInPlace(p->grad.data(), p->value.data(), p->grad.numel());
  b->Synchronize();
  b->TakeOpTimes();
  b->SetOpTiming(true);
  mlp->ZeroGrads();
  b->SetOpTiming(false);
  const OpTimes times = b->TakeOpTimes();
  ASSERT_TRUE(b->status().ok()) << b->status();
  EXPECT_EQ(times.at("fill").calls, 1);
  for (Parameter* p : mlp->parameters()) {
    EXPECT_EQ(Host(b, p->grad), std::vector<float>(p->grad.numel(), 0.0f)) << p->name;
  }
}

// StartDownload queues the copy behind earlier work and ahead of later work:
// the copy holds the value at the call (a later in-place add does not reach
// it), another thread may wait for it, and an empty tensor copies to empty.
TEST_F(CudaBackendTest, StartDownload_OrderedOnTheStream_WaitFromAnotherThread) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Backend* b = cuda->get();
  const Tensor x = Normal({3, 1000, 7}, 11);  // 21000 floats: off every block size
  Tensor d = b->Zeros(x.shape());
  b->AddInPlace(d.data(), b->Upload(x).data(), x.numel());  // queued, not yet run
  std::unique_ptr<PendingDownload> pending = b->StartDownload(d);
  b->AddInPlace(d.data(), d.data(), d.numel());  // doubles d after the copy
  absl::StatusOr<Tensor> copy;
  std::thread waiter([&] { copy = pending->Wait(); });
  waiter.join();
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_FALSE(copy->on_device());
  EXPECT_EQ(copy->shape(), x.shape());
  EXPECT_EQ(copy->ToVector(), x.ToVector());
  std::vector<float> doubled = x.ToVector();
  for (float& v : doubled) v *= 2;
  EXPECT_EQ(Host(b, d), doubled);
  absl::StatusOr<Tensor> empty = b->StartDownload(b->Zeros({0, 4}))->Wait();
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_TRUE(b->status().ok()) << b->status();
}

// UploadAsync copies the host data at the call (the caller may overwrite its
// tensor at once), queues behind earlier work, and recycles its pinned
// staging blocks only after their copies: many uploads of mixed sizes in
// flight, each checked exactly after later ops on the same stream.
// An upload behind long queued work finds the previous upload's copy not
// done yet; that "not ready" answer must not be left for the next launch
// check to report (it made the backend fail with "device not ready").
TEST_F(CudaBackendTest, UploadAsync_BehindBusyStream_LaterOpsStillWork) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Backend* b = cuda->get();
  constexpr int kN = 4096;  // a GEMM of ~137 GFLOP: milliseconds of queued work
  Tensor a = b->Zeros({kN, kN});
  Tensor c = b->Zeros({kN, kN});
  b->Sgemm(false, false, kN, kN, kN, 1.0f, a.data(), kN, a.data(), kN, 0.0f, c.data(), kN);
  const Tensor x = Normal({1000}, 23);
  Tensor first = b->UploadAsync(x);
  Tensor second = b->UploadAsync(x);  // queries the first copy's event: not ready
  Tensor sum = b->Zeros({1000});
  b->Add(first.data(), second.data(), 1000, sum.data());  // a launch, checked
  ASSERT_TRUE(b->status().ok()) << b->status();
  std::vector<float> want = x.ToVector();
  for (float& v : want) v += v;
  EXPECT_EQ(Host(b, sum), want);
}

TEST_F(CudaBackendTest, UploadAsync_ManyInFlight_EachExact) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Backend* b = cuda->get();
  std::vector<std::vector<float>> want;
  std::vector<Tensor> got;
  Tensor host = Tensor::Zeros({1});
  for (int i = 0; i < 40; ++i) {
    const Shape shape = {1 + (i * 7919) % 5000, 3};  // 3 to 15000 floats, off every block size
    host = Normal(shape, 100 + i);
    want.push_back(host.ToVector());
    got.push_back(b->UploadAsync(host));
    host.Fill(-1.0f);  // must not reach the device copy
    // Work behind the copy that reads it: y = x + x, exact in fp32.
    Tensor twice = b->Zeros(shape);
    b->Add(got.back().data(), got.back().data(), twice.numel(), twice.data());
    got.back() = twice;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    for (float& v : want[i]) v *= 2;
    EXPECT_EQ(Host(b, got[i]), want[i]) << "upload " << i;
  }
  EXPECT_TRUE(b->UploadAsync(Tensor::Zeros({0, 3})).numel() == 0);
  EXPECT_TRUE(b->status().ok()) << b->status();
}

// The device codecs behind the runtime's sends and receives: payloads byte
// for byte the CPU codec's, decodes value for value; specs without a device
// twin answer UNIMPLEMENTED (the runtime then encodes on the host); a
// non-finite value or a malformed payload fails the call without making
// the backend unusable.
TEST_F(CudaBackendTest, DeviceCodecs_MatchTheCpuCodecsByteForByte) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Backend* b = cuda->get();
  const Shape shape = {3, 33, 65};  // 6435 values: off every block size
  const Tensor x = Normal(shape, 21);
  const Tensor on_device = b->Upload(x);
  for (const std::string spec :
       {"linear:bits=4", "linear:bits=8", "piecewise:bits=3", "piecewise:bits=1",
        "token_topk:keep=0.5", "token_topk:keep=0.5+piecewise:bits=3",
        "token_topk:keep=0.3+linear:bits=8", "token_topk:keep=1+piecewise:bits=4", "fp16",
        "bf16"}) {
    std::unique_ptr<Codec> cpu = MakeCodec(spec).value();
    const std::string want = cpu->Encode(x, nullptr).value();
    absl::StatusOr<std::string> got = b->EncodeOnDevice(on_device, spec, {}, nullptr);
    ASSERT_TRUE(got.ok()) << spec << ": " << got.status();
    EXPECT_EQ(*got, want) << spec;
    absl::StatusOr<Tensor> decoded = b->DecodeOnDevice(spec, want, shape);
    ASSERT_TRUE(decoded.ok()) << spec << ": " << decoded.status();
    EXPECT_EQ(Host(b, *decoded), cpu->Decode(want).value().ToVector()) << spec;
    // A payload of another element count is refused, by the size it
    // announces, before a decoder reads further.
    const absl::Status other_size = b->DecodeOnDevice(spec, want, {3, 33, 64}).status();
    EXPECT_EQ(other_size.code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_TRUE(absl::StrContains(other_size.message(), "payload announces shape")) << other_size;
    EXPECT_EQ(b->DecodeOnDevice(spec, want.substr(0, want.size() - 1), shape).status().code(),
              absl::StatusCode::kInvalidArgument)
        << spec;
  }
  // Token top-k by the caller's scores (the attention column sums), one per
  // token: the CPU's EncodeWithScores, byte for byte; a non-finite score is
  // the CPU's error.
  const int64_t tokens = 3 * 33;
  std::vector<float> scores = Normal({tokens}, 22).ToVector();
  scores[7] = scores[8];  // a tie: the lower token wins on both
  for (const std::string spec : {"token_topk:keep=0.5", "token_topk:keep=0.25+piecewise:bits=3"}) {
    const auto cpu = MakeTokenTopKFromSpec(spec);
    const std::string want = cpu->EncodeWithScores(x, scores, nullptr).value();
    absl::StatusOr<std::string> got = b->EncodeOnDevice(on_device, spec, scores, nullptr);
    ASSERT_TRUE(got.ok()) << spec << ": " << got.status();
    EXPECT_EQ(*got, want) << spec << " with scores";
  }
  std::vector<float> bad_scores = scores;
  bad_scores[5] = std::nanf("");
  absl::StatusOr<std::string> bad_score =
      b->EncodeOnDevice(on_device, "token_topk:keep=0.5", bad_scores, nullptr);
  EXPECT_EQ(bad_score.status().code(), absl::StatusCode::kInvalidArgument) << bad_score.status();
  EXPECT_EQ(bad_score.status().message(), MakeTokenTopKFromSpec("token_topk:keep=0.5")
                                              ->EncodeWithScores(x, bad_scores, nullptr)
                                              .status()
                                              .message());
  for (const std::string spec : {"token_topk:keep=0.5+fp16", "elem_topk:keep=0.1"}) {
    EXPECT_EQ(b->EncodeOnDevice(on_device, spec, {}, nullptr).status().code(),
              absl::StatusCode::kUnimplemented)
        << spec;
    EXPECT_EQ(b->DecodeOnDevice(spec, "", shape).status().code(), absl::StatusCode::kUnimplemented)
        << spec;
  }
  std::vector<float> bad = x.ToVector();
  bad[100] = std::nanf("");
  absl::StatusOr<std::string> rejected =
      b->EncodeOnDevice(b->Upload(Tensor::FromVector(shape, bad)), "piecewise:bits=3", {}, nullptr);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument) << rejected.status();
  rejected = b->EncodeOnDevice(b->Upload(Tensor::FromVector(shape, bad)),
                               "token_topk:keep=0.5+piecewise:bits=3", {}, nullptr);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument) << rejected.status();
  EXPECT_TRUE(b->status().ok()) << b->status();  // data errors do not stick
}

// PowerSGD, the backward codec of Optimus-CC: its warm-started Q is kept on
// the device in the link's CodecState. Three encodes on one link decode (on
// the CPU) to what the CPU codec with its own state delivers, within the
// tolerance of kernels/cuda/powersgd_test.cc (the factors agree within
// rounding, not bitwise); device decodes of CPU payloads likewise; a
// non-finite value is the CPU's error and leaves the state alone.
TEST_F(CudaBackendTest, DeviceCodecs_PowerSgdWarmStarted_DecodesAsTheCpuCodec) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Backend* b = cuda->get();
  const Shape shape = {3, 33, 65};
  const std::string spec = "powersgd:rank=4";
  std::unique_ptr<Codec> cpu = MakeCodec(spec).value();
  CodecState cpu_state, device_state;
  auto close = [](const std::string& what, const std::vector<float>& got,
                  const std::vector<float>& want) {
    float scale = 0;
    for (float v : want) scale = std::max(scale, std::fabs(v));
    return AllClose(what, got, want, 1e-3f * scale, 1e-3f);
  };
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE(absl::StrCat("call ", call));
    const Tensor x = Normal(shape, 30 + call);
    const std::string want = cpu->Encode(x, &cpu_state).value();
    absl::StatusOr<std::string> got = b->EncodeOnDevice(b->Upload(x), spec, {}, &device_state);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want.size());
    ASSERT_TRUE(device_state.powersgd_q.on_device());
    EXPECT_TRUE(
        close("M^", cpu->Decode(*got).value().ToVector(), cpu->Decode(want).value().ToVector()));
    EXPECT_TRUE(close("Q", Host(b, device_state.powersgd_q), cpu_state.powersgd_q.ToVector()));
    absl::StatusOr<Tensor> decoded = b->DecodeOnDevice(spec, want, shape);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_TRUE(close("device decode", Host(b, *decoded), cpu->Decode(want).value().ToVector()));
  }
  std::vector<float> bad = Normal(shape, 40).ToVector();
  bad[17] = std::nanf("");
  const std::vector<float> q_before = Host(b, device_state.powersgd_q);
  absl::StatusOr<std::string> rejected =
      b->EncodeOnDevice(b->Upload(Tensor::FromVector(shape, bad)), spec, {}, &device_state);
  EXPECT_EQ(rejected.status(), cpu->Encode(Tensor::FromVector(shape, bad), nullptr).status());
  EXPECT_EQ(Host(b, device_state.powersgd_q), q_before);
  EXPECT_TRUE(b->status().ok()) << b->status();
  // Finite values whose factor Q overflows float: refused after Q was
  // computed, which wrote it over the warm start while the two shared
  // storage; the state must still be the last good Q, and the link must
  // still encode.
  const Tensor huge = Tensor::Filled(shape, 3e38f);
  rejected = b->EncodeOnDevice(b->Upload(huge), spec, {}, &device_state);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument) << rejected.status();
  EXPECT_EQ(cpu->Encode(huge, &cpu_state).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Host(b, device_state.powersgd_q), q_before);
  EXPECT_TRUE(b->status().ok()) << b->status();
  const Tensor after = Normal(shape, 41);
  const std::string want = cpu->Encode(after, &cpu_state).value();
  absl::StatusOr<std::string> got = b->EncodeOnDevice(b->Upload(after), spec, {}, &device_state);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(close("M^ after", cpu->Decode(*got).value().ToVector(),
                    cpu->Decode(want).value().ToVector()));
}

// An empty tensor is not decoded on the device: it goes to the host. The
// backend needs a device to exist, so this skips where there is none.
TEST_F(CudaBackendTest, DeviceCodecsOfEmptyShapes_Unimplemented) {
  auto cuda = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ((*cuda)->DecodeOnDevice("token_topk:keep=0.5", "", {0, 4}).status().code(),
            absl::StatusCode::kUnimplemented);
}

// Runs everywhere: without a GPU the error is a clear NOT_FOUND.
TEST(CudaBackendNoDeviceTest, CreateCudaBackend_BadIndex_Fails) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(-1, GemmMode::kFp32);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kInvalidArgument) << cuda.status();
  cuda = CreateCudaBackend(4096, GemmMode::kFp32);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kNotFound) << cuda.status();
}

}  // namespace
}  // namespace pipetrain
