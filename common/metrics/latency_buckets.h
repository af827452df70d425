// Histogram buckets of request latency shared by the RED metrics of the gRPC
// and HTTP servers, so that their quantiles compare: from 100 µs (a loopback
// round trip) to 10 s (a plan compiled in a handler).
#ifndef PIPETRAIN_COMMON_METRICS_LATENCY_BUCKETS_H_
#define PIPETRAIN_COMMON_METRICS_LATENCY_BUCKETS_H_

#include "prometheus/histogram.h"

namespace pipetrain {

inline const prometheus::Histogram::BucketBoundaries& RequestLatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
  return *buckets;
}

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_METRICS_LATENCY_BUCKETS_H_
