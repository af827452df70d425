// The GEMM rate a worker's cores reach, for the planner's speeds.
//
// Each worker measures its GEMM rate once at start-up (DeviceInfo
// .measured_gflops, with its own BLAS threads). CPU workers started
// together on one host probe at once and slow each other, so one probe
// can read low; the planner models the sharing of cores itself
// (coordinator/planner/host_sharing.h), so a worker is taken at the best
// probe of its host-mates that compute as it does: the same thread count.
// Workers with other thread counts reach other rates by design (8 threads
// against 1), and took the best of them: a 1-thread worker beside an
// 8-thread one was planned as fast as it, and given 8 times its share.
//
// Pure and thread-safe.
#ifndef PIPETRAIN_COORDINATOR_JOBS_HOST_GFLOPS_H_
#define PIPETRAIN_COORDINATOR_JOBS_HOST_GFLOPS_H_

#include <vector>

#include "proto/pipetrain/v1/coordinator.pb.h"

namespace pipetrain {

// On the CPU, the best measured_gflops among `w` and the CPU workers of
// `workers` on w's host (same hostname) with w's compute_threads; on a GPU,
// or without a hostname, w's own.
double HostGflops(const std::vector<v1::Worker>& workers, const v1::Worker& w);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_HOST_GFLOPS_H_
