// Transport: how a stage's program moves tensors to and from other stages.
//
// The runtime (worker/runtime) speaks only this interface; implementations
// are the in-process transport (tests, single-machine equivalence) and the
// gRPC data plane (grpc_transport.h). Receives are by address, not by
// arrival order, so send order between different tensors never matters.
//
// What travels is a WireTensor: a plain fp32 tensor, or the payload a
// compression codec made of one (kernels/compress, DESIGN.md §6). The
// transport moves payloads as opaque bytes; encoding and decoding are the
// runtime's (worker/runtime/link_compressor.h), which times them per link.
#ifndef PIPETRAIN_WORKER_TRANSPORT_TRANSPORT_H_
#define PIPETRAIN_WORKER_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "kernels/compress/codec.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

// Identifies one tensor of one job: (job, iteration, kind, micro-batch, unit).
struct TensorAddress {
  std::string job_id;
  int64_t iteration = 0;
  v1::TensorKind kind = v1::TENSOR_KIND_UNSPECIFIED;
  int32_t micro_batch = 0;
  int32_t unit = 0;

  // "ACTIVATION of unit 3, micro-batch 1, iteration 7 (job j-1)".
  std::string DebugString() const;
  bool operator<(const TensorAddress& o) const;
  bool operator==(const TensorAddress& o) const;
};

TensorAddress MakeAddress(const std::string& job_id, int64_t iteration,
                          const v1::TensorKey& key);

// A tensor as one Send carries it.
//   raw:     `tensor` (fp32, any shape); codec, payload and shape unused.
//   encoded: `codec` is the spec the payload was made with
//            (kernels/compress/codec_spec.h, e.g. "piecewise:bits=3"),
//            `payload` its self-describing bytes (kernels/compress/payload.h)
//            and `shape` the shape it decodes to; `tensor` is null.
struct WireTensor {
  Tensor tensor;
  std::string codec;
  std::string payload;
  Shape shape;

  static WireTensor Raw(Tensor t);
  static WireTensor Encoded(std::string codec, std::string payload, Shape shape);
  bool encoded() const { return !codec.empty(); }
  // The decoded shape: tensor.shape() when raw.
  const Shape& decoded_shape() const;
  // Bytes on the wire: payload.size() when encoded, numel * 4 when raw.
  int64_t wire_bytes() const;
  // Bytes of the decoded fp32 tensor: numel(decoded_shape()) * 4.
  int64_t raw_bytes() const;
};

// Decodes an encoded WireTensor with the codec its spec names (built anew on
// each call: callers that decode often cache codecs themselves); returns a
// raw one's tensor as is. INVALID_ARGUMENT naming `what` (e.g. the address)
// for an unknown codec spec, a payload the codec rejects, or a payload whose
// header announces a shape other than `shape` (checked before decoding, so
// a payload never makes the receiver allocate more than `shape`).
absl::StatusOr<Tensor> DecodeWireTensor(const WireTensor& wire, const std::string& what);

// DecodeWireTensor with a codec the caller built from wire.codec (requires
// an encoded `wire`); the same errors but for the unknown spec.
absl::StatusOr<Tensor> DecodeWireTensorWith(const Codec& codec, const WireTensor& wire,
                                            const std::string& what);

// A receive's DEADLINE_EXCEEDED from `peer_stage` (`timed_out`), told
// that this worker still holds `queued_bytes` of its own sends for that
// peer (0: returned as it is). A worker whose own link is the slow one
// waits for a peer that, in turn, waits for this worker's sends: without
// this the message blames the peer ("slow, stalled or gone") when the
// slow side may be this one.
absl::Status WithOwnQueuedSends(absl::Status timed_out, int peer_stage, int64_t queued_bytes,
                                absl::string_view where);

class Transport {
 public:
  virtual ~Transport() = default;

  // This transport's stage index.
  virtual int stage() const = 0;

  // Sends `wire` to `peer_stage`. Returns once it is handed to the
  // transport (buffered or on the wire); the caller may reuse `wire`
  // afterwards. UNAVAILABLE when the peer cannot be reached (names the
  // peer). Thread-safe.
  virtual absl::Status SendWire(int peer_stage, const TensorAddress& address,
                                const WireTensor& wire) = 0;

  // SendWire that takes `wire` over, so a transport may send straight from
  // its memory instead of copying it first: an encoded payload always, a raw
  // tensor when no other handle shares its storage (Tensor::sole_owner; a
  // shared one is copied as SendWire does). This default copies.
  virtual absl::Status SendWireOwned(int peer_stage, const TensorAddress& address,
                                     WireTensor wire) {
    return SendWire(peer_stage, address, wire);
  }

  // Waits up to `timeout` for the tensor `address` from `peer_stage` and
  // removes it from the mailbox, as it was sent (raw or encoded).
  // DEADLINE_EXCEEDED names the peer and the tensor; ABORTED if the
  // transport was shut down. Thread-safe.
  virtual absl::StatusOr<WireTensor> RecvWire(int peer_stage, const TensorAddress& address,
                                              absl::Duration timeout) = 0;

  // Gives up on everything being sent: ends every Send that waits (for a
  // connection, for room in a queue) with ABORTED, drops what is queued
  // undelivered, and makes later sends and receives ABORTED. For a job that
  // is stopped (JobRunner::Stop): its sends to a stalled or vanished peer
  // must not hold the worker for their timeouts. Does not wait for
  // anything; thread-safe. Default: nothing (a transport whose sends never
  // wait).
  virtual void Abort() {}

  // SendWire of a raw fp32 tensor (any shape).
  absl::Status Send(int peer_stage, const TensorAddress& address, const Tensor& tensor);
  // SendWireOwned of a raw fp32 tensor (any shape).
  absl::Status SendOwned(int peer_stage, const TensorAddress& address, Tensor tensor);

  // RecvWire, then DecodeWireTensor: the tensor whatever its encoding.
  absl::StatusOr<Tensor> Recv(int peer_stage, const TensorAddress& address,
                              absl::Duration timeout);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_TRANSPORT_H_
