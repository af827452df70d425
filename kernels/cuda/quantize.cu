// Device side of quantize.h: the max|x| scan and the pack/unpack kernels.
// The payload framing is host code in quantize.cc.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/first_index_flag.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/quantize.h"

namespace pipetrain {
namespace {

constexpr unsigned long long kNoBadElement = FirstIndexFlag::kNone;
constexpr int kMaxClusters = 8;  // piecewise_codec.h: kPiecewiseMaxClusters

// --- max|x| and the first non-finite index ---

// Per-thread maximum over finite values and first non-finite index (a
// thread's indices increase, so its first one is its smallest), then one
// partial maximum per block. atomicMin on integers is order-independent.
__global__ void MaxAbsPartialKernel(const float* x, int64_t n, float* partial,
                                    unsigned long long* first_bad) {
  __shared__ float scratch[33];
  float m = 0.0f;
  unsigned long long bad = kNoBadElement;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = x[i];
    if (isfinite(v)) {
      m = fmaxf(m, fabsf(v));
    } else if (bad == kNoBadElement) {
      bad = static_cast<unsigned long long>(i);
    }
  }
  if (bad != kNoBadElement) atomicMin(first_bad, bad);
  m = cuda_reduce::BlockReduce(m, 0.0f, scratch, cuda_reduce::MaxOp());
  if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

// One block: the maximum of `count` partials into *result.
__global__ void MaxAbsFinalKernel(const float* partial, int count, float* result) {
  __shared__ float scratch[33];
  float m = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) m = fmaxf(m, partial[i]);
  m = cuda_reduce::BlockReduce(m, 0.0f, scratch, cuda_reduce::MaxOp());
  if (threadIdx.x == 0) *result = m;
}

// --- Coders: the code of element i, as the CPU Encode computes it ---

struct LinearCoder {
  const float* x;
  float step;
  int64_t qmax;
  // eq. (5): double division of the float32 value by the float32 step,
  // rounded half away from zero (llround, as std::llround), clamped.
  __device__ uint32_t operator()(int64_t i) const {
    int64_t q = 0;
    if (step > 0.0f) {
      q = llround(static_cast<double>(x[i]) / step);
      q = q < -qmax ? -qmax : (q > qmax ? qmax : q);
    }
    return static_cast<uint32_t>(q + qmax);
  }
};

// The CPU codec's ClusterTable for one M (computed on the host).
struct PiecewiseTable {
  double c[kMaxClusters];      // C_k, eq. (7)
  double u[kMaxClusters];      // U_k, eq. (8) with (12)
  double j_max[kMaxClusters];  // 2^(N-1-k)
  uint32_t first[kMaxClusters];
  double max_abs;
  int n;
};

struct PiecewiseCoder {
  const float* x;
  PiecewiseTable t;
  // eq. (9) clamped, then eq. (6), with the CPU's double expressions.
  __device__ uint32_t operator()(int64_t i) const {
    const float v = x[i];
    const uint32_t sign = v < 0.0f ? 1u : 0u;
    uint32_t level = 0;
    if (t.max_abs > 0.0) {
      const double a = fabsf(v);
      const double kf = floor(a * t.n / t.max_abs);
      const int k = static_cast<int>(fmin(fmax(kf, 0.0), static_cast<double>(t.n - 1)));
      const double j = round((a - t.c[k]) / t.u[k]);
      level = t.first[k] + static_cast<uint32_t>(fmin(fmax(j, 0.0), t.j_max[k]));
    }
    return (sign << t.n) | level;
  }
};

// One thread per output byte: ORs in the codes of every element whose bits
// overlap it (BitWriter's LSB-first layout). Bits past the last element
// stay zero, like BitWriter::Finish's padding.
template <typename Coder>
__global__ void PackKernel(Coder coder, int64_t n, int bits, int64_t bytes, uint8_t* body) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < bytes;
       b += stride) {
    const int64_t first_bit = b * 8;
    const int64_t last = min(n - 1, (first_bit + 7) / bits);
    uint64_t byte = 0;
    for (int64_t e = first_bit / bits; e <= last; ++e) {
      const uint64_t code = coder(e);
      const int64_t shift = e * bits - first_bit;  // negative: the code began earlier
      byte |= shift >= 0 ? (code << shift) : (code >> -shift);
    }
    body[b] = static_cast<uint8_t>(byte & 0xff);
  }
}

// The `bits`-bit code of element i (at most 16 bits: three bytes).
__device__ inline uint32_t CodeAt(const uint8_t* body, int64_t i, int bits) {
  const int64_t bit = i * bits;
  const int64_t byte0 = bit / 8;
  const int offset = static_cast<int>(bit % 8);
  const int need = (offset + bits + 7) / 8;
  uint64_t word = 0;
  for (int k = 0; k < need; ++k) word |= uint64_t{body[byte0 + k]} << (8 * k);
  return static_cast<uint32_t>((word >> offset) & ((uint64_t{1} << bits) - 1));
}

// eq. (5) decode in double, as the CPU; flags the first invalid element.
__global__ void LinearUnpackKernel(const uint8_t* body, int64_t n, int bits, float step,
                                   int64_t qmax, float* out, unsigned long long* first_bad) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const uint32_t code = CodeAt(body, i, bits);
    const double value = static_cast<double>(static_cast<int64_t>(code) - qmax) * step;
    if (code > static_cast<uint32_t>(2 * qmax) || fabs(value) > FLT_MAX) {
      atomicMin(first_bad, static_cast<unsigned long long>(i));
      continue;
    }
    out[i] = static_cast<float>(value);
  }
}

// The 2^N magnitude levels (computed on the host with the CPU's code).
struct PiecewiseLevels {
  float level[1 << kMaxClusters];
};

__global__ void PiecewiseUnpackKernel(const uint8_t* body, int64_t n, int clusters,
                                      PiecewiseLevels levels, float* out) {
  const uint32_t level_mask = (1u << clusters) - 1;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const uint32_t code = CodeAt(body, i, clusters + 1);
    const float magnitude = levels.level[code & level_mask];
    out[i] = (code >> clusters) ? -magnitude : magnitude;
  }
}

// --- Host helpers ---

// piecewise_codec.cc's IntervalWidth and FirstLevel, same expressions.
double IntervalWidth(double max_abs, int n, int k) {
  return max_abs / (n * std::ldexp(1.0, n - 1 - k));
}
uint32_t FirstLevel(int n, int k) { return (1u << n) - (1u << (n - k)); }

PiecewiseTable MakeTable(double max_abs, int n) {
  PiecewiseTable t{};
  for (int k = 0; k < n; ++k) {
    t.c[k] = max_abs / n * k;
    t.u[k] = IntervalWidth(max_abs, n, k);
    t.j_max[k] = std::ldexp(1.0, n - 1 - k);
    t.first[k] = FirstLevel(n, k);
  }
  t.max_abs = max_abs;
  t.n = n;
  return t;
}

// piecewise_codec.cc's Levels (decode side), into a kernel argument.
PiecewiseLevels MakeLevels(double max_abs, int n) {
  PiecewiseLevels levels{};
  for (int k = 0; k < n; ++k) {
    const uint32_t first = FirstLevel(n, k);
    const uint32_t end = k + 1 < n ? FirstLevel(n, k + 1) : (1u << n);
    for (uint32_t l = first; l < end; ++l) {
      const double v = max_abs / n * k + (l - first) * IntervalWidth(max_abs, n, k);
      levels.level[l] = static_cast<float>(std::min(v, max_abs));
    }
  }
  return levels;
}

absl::Status CheckArgs(const char* op, int64_t n, int bits, int min_bits, int max_bits,
                       float scale, const char* scale_name) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(op, ": element count ", n, " < 0"));
  if (bits < min_bits || bits > max_bits) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": bits=", bits, " is out of range; use ", min_bits, "..", max_bits));
  }
  if (!std::isfinite(scale) || scale < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", scale_name, " ", scale, " is not finite and >= 0"));
  }
  return absl::OkStatus();
}

template <typename Coder>
absl::Status LaunchPack(const Coder& coder, int64_t n, int bits, uint8_t* body,
                        cudaStream_t stream) {
  const int64_t bytes = (n * bits + 7) / 8;
  PackKernel<<<ElementwiseBlocks(bytes), kElementwiseThreads, 0, stream>>>(coder, n, bits, bytes,
                                                                           body);
  CUDA_CHECK_LAUNCH("PackKernel");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MaxAbsScan> MaxAbsScanCuda(const float* x, int64_t n, cudaStream_t stream) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("MaxAbsScanCuda: element count ", n, " < 0"));
  }
  MaxAbsScan scan;
  if (n == 0) return scan;
  const int blocks = ElementwiseBlocks(n);
  ASSIGN_OR_RETURN(StreamScratch partial_block,
                   StreamScratch::Create((blocks + 1) * sizeof(float), stream));
  ASSIGN_OR_RETURN(FirstIndexFlag flag, FirstIndexFlag::Create(stream));
  float* partial = partial_block.as<float>();
  MaxAbsPartialKernel<<<blocks, kElementwiseThreads, 0, stream>>>(x, n, partial, flag.get());
  CUDA_CHECK_LAUNCH("MaxAbsPartialKernel");
  MaxAbsFinalKernel<<<1, kElementwiseThreads, 0, stream>>>(partial, blocks, partial + blocks);
  CUDA_CHECK_LAUNCH("MaxAbsFinalKernel");
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&scan.max_abs, partial + blocks, sizeof(float),
                                       cudaMemcpyDeviceToHost, stream));
  ASSIGN_OR_RETURN(const int64_t first_bad, flag.Read());  // waits for the stream
  if (first_bad >= 0) {
    scan.first_non_finite = first_bad;
    CUDA_RETURN_IF_ERROR(cudaMemcpy(&scan.first_non_finite_value, x + first_bad, sizeof(float),
                                    cudaMemcpyDeviceToHost));
  }
  return scan;
}

absl::Status LinearPackCuda(const float* x, int64_t n, int bits, float step, uint8_t* body,
                            cudaStream_t stream) {
  RETURN_IF_ERROR(CheckArgs("LinearPackCuda", n, bits, 2, 16, step, "step"));
  if (n == 0) return absl::OkStatus();
  const LinearCoder coder{x, step, (int64_t{1} << (bits - 1)) - 1};
  return LaunchPack(coder, n, bits, body, stream);
}

absl::Status PiecewisePackCuda(const float* x, int64_t n, int clusters, float max_abs,
                               uint8_t* body, cudaStream_t stream) {
  RETURN_IF_ERROR(
      CheckArgs("PiecewisePackCuda", n, clusters, 1, kMaxClusters, max_abs, "max|R|"));
  if (n == 0) return absl::OkStatus();
  const PiecewiseCoder coder{x, MakeTable(max_abs, clusters)};
  return LaunchPack(coder, n, clusters + 1, body, stream);
}

absl::Status LinearUnpackCuda(const uint8_t* body, int64_t n, int bits, float step, float* out,
                              cudaStream_t stream) {
  constexpr const char* kOp = "LinearUnpackCuda";
  RETURN_IF_ERROR(CheckArgs(kOp, n, bits, 2, 16, step, "step"));
  if (n == 0) return absl::OkStatus();
  const int64_t qmax = (int64_t{1} << (bits - 1)) - 1;
  ASSIGN_OR_RETURN(FirstIndexFlag flag, FirstIndexFlag::Create(stream));
  LinearUnpackKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(
      body, n, bits, step, qmax, out, flag.get());
  CUDA_CHECK_LAUNCH("LinearUnpackKernel");
  ASSIGN_OR_RETURN(const int64_t first_bad, flag.Read());  // waits for the stream
  if (first_bad < 0) return absl::OkStatus();
  // Re-read the bad code (at most three bytes) to name it as the CPU does.
  const int64_t bit = static_cast<int64_t>(first_bad) * bits;
  const int64_t used = std::min<int64_t>(3, (n * bits + 7) / 8 - bit / 8);
  uint8_t bytes[3] = {0, 0, 0};
  CUDA_RETURN_IF_ERROR(cudaMemcpy(bytes, body + bit / 8, used, cudaMemcpyDeviceToHost));
  const uint32_t word = bytes[0] | (bytes[1] << 8) | (bytes[2] << 16);
  const uint32_t code = (word >> (bit % 8)) & ((1u << bits) - 1);
  const std::string name = absl::StrCat("linear:bits=", bits);
  if (code > static_cast<uint32_t>(2 * qmax)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": element ", first_bad, " has out-of-range code ", code));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": element ", first_bad, " decodes beyond the float32 range"));
}

absl::Status PiecewiseUnpackCuda(const uint8_t* body, int64_t n, int clusters, float max_abs,
                                 float* out, cudaStream_t stream) {
  RETURN_IF_ERROR(
      CheckArgs("PiecewiseUnpackCuda", n, clusters, 1, kMaxClusters, max_abs, "max|R|"));
  if (n == 0) return absl::OkStatus();
  PiecewiseUnpackKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(
      body, n, clusters, MakeLevels(max_abs, clusters), out);
  CUDA_CHECK_LAUNCH("PiecewiseUnpackKernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
