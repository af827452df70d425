// The linear and piecewise quantization codecs on the GPU, the CUDA twins of
// kernels/compress/linear_codec.h (acctfm eq. 4-5) and piecewise_codec.h
// (acctfm eq. 6-12). Read those headers for the math and the payload layout;
// this file produces and reads the SAME payloads:
//   - *EncodeCuda returns a payload byte-identical to the CPU codec's Encode
//     of the same values (so the CPU Decode reads it), and
//   - *DecodeCuda reads a CPU (or GPU) payload into device memory with
//     values bit-identical to the CPU codec's Decode.
// Why exact parity is possible: the only reduction is max|x|, which is exact
// in any order; every per-element quantity is computed in double with the
// CPU's expressions (IEEE division, rounding half away from zero), and the
// per-tensor constants (piecewise cluster table and decode levels) are
// computed on the host with the CPU's code paths. nvcc runs with
// -fmad=false so that no multiply-add is contracted into an FMA on the
// device (a contracted FMA rounds once instead of twice).
//
// Two layers:
//   - Body kernels on device pointers (MaxAbsScanCuda, *PackCuda,
//     *UnpackCuda): the bit-packed codes only, for callers that keep the
//     body on the device (e.g. to send it over NCCL).
//   - Payload functions (*EncodeCuda, *DecodeCuda): the common header
//     (kernels/compress/payload.h) + parameters + body, as a host string.
//
// Determinism: max|x| is reduced per block then by one block (no atomics on
// floats); the "first bad element" flags use an integer atomicMin, whose
// result does not depend on the order. Equal inputs give equal outputs.
//
// Memory: each call's scratch (a few KiB plus the body) comes from the
// device's scratch cache keyed by `stream` (stream_scratch.h): no cudaMalloc
// or cudaFree, which would wait for the whole device, once warm.
//
// Synchronisation: functions that return a host result or a data-dependent
// status (MaxAbsScanCuda, the *Encode/*Decode functions, LinearUnpackCuda)
// wait for `stream`; PiecewisePackCuda, LinearPackCuda and
// PiecewiseUnpackCuda only queue work on it.
//
// Thread-safety: no shared state; calls on different streams may run
// concurrently.
#ifndef PIPETRAIN_KERNELS_CUDA_QUANTIZE_H_
#define PIPETRAIN_KERNELS_CUDA_QUANTIZE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace pipetrain {

// max|x| over the finite elements of x[0, n), and the index of the first
// non-finite element (-1 when all are finite); first_non_finite_value is
// that element (NaN or +-Inf), 0 when there is none.
struct MaxAbsScan {
  float max_abs = 0.0f;
  int64_t first_non_finite = -1;
  float first_non_finite_value = 0.0f;
};

// Requires n >= 0 and x a device pointer to n floats (may be null when
// n == 0). Waits for `stream`. INVALID_ARGUMENT if n < 0; INTERNAL on a
// CUDA failure; RESOURCE_EXHAUSTED when no scratch fits on the device.
absl::StatusOr<MaxAbsScan> MaxAbsScanCuda(const float* x, int64_t n,
                                          cudaStream_t stream = nullptr);

// OK when x[0, n) (device) is all finite, else the CPU CheckFinite's error
// for its first non-finite element, naming `codec` (NonFiniteError). Waits
// for `stream`; INTERNAL on a CUDA failure.
absl::Status CheckFiniteCuda(const float* x, int64_t n, absl::string_view codec,
                             cudaStream_t stream = nullptr);

// --- Body kernels (device pointers; body holds PackedBytes(n, bits_per_code)
// bytes: linear `bits`, piecewise `clusters + 1` bits per code) ---

// Linear codes of x[0, n) with the float32 `step` of eq. (4), as the CPU
// codec packs them (offset binary, LSB first, last byte zero-padded).
// Requires 2 <= bits <= 16, finite step >= 0, x finite. INVALID_ARGUMENT for
// n < 0, bits out of range, or a negative/non-finite step; INTERNAL if the
// launch fails. Queues work only.
absl::Status LinearPackCuda(const float* x, int64_t n, int bits, float step, uint8_t* body,
                            cudaStream_t stream = nullptr);

// out[i] = (code_i - qmax) * step for the n codes in `body`. Waits for
// `stream` to check the codes: INVALID_ARGUMENT "element i has out-of-range
// code c" for the first all-ones code, or "element i decodes beyond the
// float32 range" (only from a corrupt step), exactly as the CPU Decode
// (`out` then holds unspecified values). Argument errors as LinearPackCuda.
absl::Status LinearUnpackCuda(const uint8_t* body, int64_t n, int bits, float step, float* out,
                              cudaStream_t stream = nullptr);

// Piecewise codes (sign << N | level) of x[0, n) for M = `max_abs` and
// N = `clusters`. Requires 1 <= clusters <= 8, finite max_abs >= max|x|.
// INVALID_ARGUMENT for n < 0, clusters out of range or a negative/non-finite
// max_abs; INTERNAL if the launch fails. Queues work only.
absl::Status PiecewisePackCuda(const float* x, int64_t n, int clusters, float max_abs,
                               uint8_t* body, cudaStream_t stream = nullptr);

// out[i] = +-level(code_i) (every code is valid). Errors as
// PiecewisePackCuda. Queues work only.
absl::Status PiecewiseUnpackCuda(const uint8_t* body, int64_t n, int clusters, float max_abs,
                                 float* out, cudaStream_t stream = nullptr);

// --- Payloads (host strings; x and out are device pointers) ---

// The payload of MakeLinearCodec(bits)->Encode(x) for the tensor of `shape`
// whose NumElements(shape) values are at x. INVALID_ARGUMENT for bits
// outside 2..16 (the CPU factory's message) or a non-finite element
// ("linear:bits=B: element i is nan; only finite values can be encoded",
// as the CPU codec); INTERNAL on CUDA failures. Waits for `stream`.
absl::StatusOr<std::string> LinearEncodeCuda(const float* x, const Shape& shape, int bits,
                                             cudaStream_t stream = nullptr);

// Decodes a linear payload with `bits` into out[0, numel) and returns its
// shape. INVALID_ARGUMENT with the CPU Decode's messages for every payload
// error, for bits outside 2..16, and when the payload's numel exceeds
// `capacity` (the number of floats at out). INTERNAL on CUDA failures.
// Waits for `stream`.
absl::StatusOr<Shape> LinearDecodeCuda(absl::string_view payload, int bits, float* out,
                                       int64_t capacity, cudaStream_t stream = nullptr);

// As LinearEncodeCuda for MakePiecewiseCodec(clusters) (1..8).
absl::StatusOr<std::string> PiecewiseEncodeCuda(const float* x, const Shape& shape, int clusters,
                                                cudaStream_t stream = nullptr);

// As LinearDecodeCuda for MakePiecewiseCodec(clusters).
absl::StatusOr<Shape> PiecewiseDecodeCuda(absl::string_view payload, int clusters, float* out,
                                          int64_t capacity, cudaStream_t stream = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_QUANTIZE_H_
