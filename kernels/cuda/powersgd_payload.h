// The PowerSGD codec on the GPU at the payload level: what a CUDA stage
// sends and receives, in the format of kernels/compress/powersgd_codec.h
// (read it for the algorithm), with P and Q computed on the device
// (powersgd.h) and only the factors, rank * (rows + cols) floats, crossing
// to or from the host. The CPU codec's own payload writer and reader
// (WritePowerSgdPayload, ReadPowerSgdPayload) frame them, so the two
// formats cannot drift apart.
//
// Not byte-identical to the CPU codec's payloads: cuBLAS sums in another
// order, so P and Q agree within rounding (powersgd_test.cc bounds it);
// either side decodes the other's payloads.
//
// Warm start (the CPU's CodecState::powersgd_q): the caller keeps Q
// [cols, rank] on the device from call to call on one link and passes it
// as q_warm; the encode writes the new Q into q_out, which may be q_warm
// (then a refused encode leaves q_warm overwritten: powersgd.h).
//
// Synchronisation: both wait for the handle's stream (a payload is a host
// string). Scratch comes from the device's stream-keyed cache
// (stream_scratch.h). Thread-safety: a CublasHandle is used from one
// thread at a time.
#ifndef PIPETRAIN_KERNELS_CUDA_POWERSGD_PAYLOAD_H_
#define PIPETRAIN_KERNELS_CUDA_POWERSGD_PAYLOAD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"
#include "kernels/cuda/linear.h"

namespace pipetrain {

// The payload MakePowerSgdCodec(rank)->Encode would make of x (device,
// `shape`) with a state whose Q is q_warm (device, [cols, rank] of x's
// PowerSgdMatrixOf; null: a cold start), up to rounding; the new Q goes to
// q_out (device, [cols, rank]). Errors as PowerSgdEncodeCuda
// (INVALID_ARGUMENT for a non-finite value, with the CPU's message), and
// INVALID_ARGUMENT for an empty tensor (encode it on the host: the CPU codec
// leaves its state alone then).
absl::StatusOr<std::string> PowerSgdEncodePayloadCuda(const CublasHandle& handle, const float* x,
                                                      const Shape& shape, int rank,
                                                      const float* q_warm, float* q_out);

// Decodes such a payload (or the CPU codec's) into out[0, numel) (device)
// and returns its shape: P Q^T. The CPU Decode's INVALID_ARGUMENT errors
// (ReadPowerSgdPayload), and one for a payload of more than `capacity`
// values or of an empty tensor; INTERNAL on CUDA or cuBLAS failures.
absl::StatusOr<Shape> PowerSgdDecodePayloadCuda(const CublasHandle& handle,
                                                absl::string_view payload, int rank, float* out,
                                                int64_t capacity);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_POWERSGD_PAYLOAD_H_
