// Mean squared error of linear (acctfm eq. 4-5) vs piecewise (eq. 6-12)
// quantization on standard Gaussian data at equal bits per value: linear with
// b bits against piecewise with N = b - 1 clusters (N + 1 = b bits). The paper
// claims piecewise has the lower MSE; this program measures it.
//
//   bazel run //kernels/compress:quantization_mse [-- <count> <seed>]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/philox.h"
#include "common/tensor.h"
#include "kernels/compress/linear_codec.h"
#include "kernels/compress/piecewise_codec.h"

namespace pipetrain {
namespace {

struct Result {
  double mse = 0;
  double max_err = 0;
  int64_t bytes = 0;
  bool ok = false;
};

Result Measure(const Codec& codec, const Tensor& x) {
  Result r;
  auto payload = codec.Encode(x, nullptr);
  if (!payload.ok()) return r;
  auto y = codec.Decode(*payload);
  if (!y.ok()) return r;
  double sum = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double e = double{(*y)[i]} - double{x[i]};
    sum += e * e;
    r.max_err = std::fmax(r.max_err, std::fabs(e));
  }
  r.mse = sum / static_cast<double>(x.numel());
  r.bytes = static_cast<int64_t>(payload->size());
  r.ok = r.bytes == codec.EncodedBytes(x.shape());
  return r;
}

int Run(int64_t count, uint64_t seed) {
  Tensor x = Tensor::Zeros({count});
  FillNormal(seed, /*stream=*/0, 0.0f, 1.0f, x.data(), count);
  float max_abs = 0;
  for (int64_t i = 0; i < count; ++i) max_abs = std::fmax(max_abs, std::fabs(x[i]));
  std::printf("# Quantization MSE on N(0,1) data: %lld values, Philox seed %llu, max|R| = %.4f\n",
              static_cast<long long>(count), static_cast<unsigned long long>(seed), max_abs);
  std::printf("# ratio = fp32 bytes (4 * count) / encoded bytes (header included)\n");
  std::printf("# %4s  %-18s  %12s  %10s  %10s  %7s  %s\n", "bits", "codec", "mse", "max_err",
              "bytes", "ratio", "check");
  bool all_ok = true;
  for (int bits : {3, 4, 5}) {
    double mse[2] = {0, 0};
    for (int which = 0; which < 2; ++which) {
      auto codec = which == 0 ? MakeLinearCodec(bits) : MakePiecewiseCodec(bits - 1);
      if (!codec.ok()) return 1;
      const Result r = Measure(**codec, x);
      all_ok = all_ok && r.ok;
      mse[which] = r.mse;
      std::printf("  %4d  %-18s  %12.6e  %10.6f  %10lld  %7.3f  %s\n", bits,
                  (*codec)->name().c_str(), r.mse, r.max_err, static_cast<long long>(r.bytes),
                  4.0 * count / static_cast<double>(r.bytes), r.ok ? "OK" : "FAILED");
    }
    std::printf("  %4d  piecewise/linear MSE ratio = %.3f (%s)\n", bits, mse[1] / mse[0],
                mse[1] < mse[0] ? "piecewise lower" : "piecewise NOT lower");
  }
  std::printf("# %s (check: round trip succeeded and size == EncodedBytes)\n",
              all_ok ? "OK" : "FAILED");
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  const int64_t count = argc > 1 ? std::atoll(argv[1]) : 1000000;
  const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 20240601;
  if (count <= 0) {
    std::fprintf(stderr, "count must be positive, got %s\n", argv[1]);
    return 2;
  }
  return pipetrain::Run(count, seed);
}
