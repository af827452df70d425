// The CUDA backend (backend.h): tensors in device memory and the
// kernels/cuda twins of the CPU ops, GEMMs through cuBLAS in fp32, TF32 or
// bf16 mode (GemmMode). Built only under --config=cuda.
//
// One backend per device and driving thread: it owns a stream (every op is
// queued on it, in call order) and a cuBLAS handle bound to that stream;
// kernels take their scratch from the stream's cache (stream_scratch.h),
// given back to CUDA when the backend goes (ReleaseStreamCaches). Memory: tensors
// come from a caching allocator over cudaMalloc (kernels/alloc), keyed by
// the backend's stream: a tensor whose last handle goes returns its block
// to the cache, and the block is reused only by later work on the same
// stream, which runs after every kernel that used it.
// Copies: Upload and Download are synchronous; UploadAsync stages the host
// data in pinned memory and returns, StartDownload queues a copy into
// pinned memory and returns a handle to wait on (backend.h).
//
// Errors stick (backend.h): the first failing CUDA/cuBLAS call's status is
// kept and returned by status(); later ops return at once.
//
// Empty (backend.h) leaves device memory as it was, so a unit reading an
// element no op wrote would read stale numbers. With
// PIPETRAIN_POISON_EMPTY=1 in the environment when the backend is made,
// Empty fills NaN (one memset more): the GPU parity tests set it, so that
// an op leaving part of its output unwritten fails them.
#ifndef PIPETRAIN_WORKER_MODEL_CUDA_BACKEND_H_
#define PIPETRAIN_WORKER_MODEL_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cuda/linear.h"
#include "worker/model/backend.h"

namespace pipetrain {

// How the backend computes attention: kReference, the row kernels of
// kernels/cuda/attention.h (checked against the CPU), or kGemm, cuBLAS
// batched GEMMs around softmax row kernels (kernels/cuda/attention_gemm.h;
// in the GEMM mode, so on tensor cores for tf32 and bf16), or kFlash, the
// fused kernels of kernels/cuda/flash_attention.h (bf16 tensor cores in
// every GEMM mode; no seq_len x seq_len matrices kept; kGemm's kernels
// where the caller reads the probabilities or a head is wider than 128).
// All three passed their parity tests on an H200 (2026-11-29,
// docs/gpu-results/). kGemm is what --attention auto (the flags' default,
// backend_select.h) picks: a GPT-2 124M step there took 65 ms with it, 575
// ms with kReference and 75 ms with kFlash (bf16 GEMMs, batch 8). kFlash
// runs the kernels PIPETRAIN_FLASH_KERNEL names ("wmma", the default, or
// "mma", not yet run on a GPU; flash_attention.h).
enum class AttentionImpl { kReference, kGemm, kFlash };

// A backend on CUDA device `device` with `mode` GEMMs. INVALID_ARGUMENT if
// device < 0, or PIPETRAIN_FLASH_KERNEL, PIPETRAIN_BF16_OPERANDS or
// PIPETRAIN_BIAS_EPILOGUE holds a value it does not know; NOT_FOUND if
// there is no such device (e.g. none at all; the message names the index
// and the device count); FAILED_PRECONDITION if the device's compute
// capability is below the kernels' (CheckKernelsRunOn); INTERNAL if CUDA
// or cuBLAS setup fails.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(
    int device, GemmMode mode, AttentionImpl attention = AttentionImpl::kReference);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_CUDA_BACKEND_H_
