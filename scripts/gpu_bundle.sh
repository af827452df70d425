#!/usr/bin/env bash
# Builds, here (no GPU needed), everything the GPU checks of the CUDA issue
# run, and packs it for a GPU machine that has the NVIDIA driver and the
# CUDA 13 runtime libraries but neither Bazel nor this project's Debian
# packages:
#   gpu-bundle/bin/   every CUDA test binary (scripts/cuda_targets.sh), the
#                     pipetrain CLI, coordinator and worker, the training-
#                     step, collective and NCCL all-reduce benchmarks; built -c opt
#                     --config=cuda with our own
#                     code linked in statically
#   gpu-bundle/lib/   the Debian shared libraries they need (Abseil, gRPC,
#                     protobuf, OpenBLAS, GoogleTest, ...), not glibc,
#                     libstdc++ or the CUDA libraries (the machine's own)
#   gpu-bundle/run.sh scripts/gpu_run.sh
# and gpu-bundle.tar.gz of it all (what travels; gzip, which every machine
# unpacks). On the GPU machine (run.sh's header says more):
#   tar xzf gpu-bundle.tar.gz && bash gpu-bundle/run.sh OUTDIR [quick|bench|sanitize|collectives]
# gpu-bundle/BUILD_INFO says which commit it was built from (run.sh puts it
# at the top of its summary): rebuild after every change you want measured.
#
#   bash scripts/gpu_bundle.sh           # writes gpu-bundle/ and gpu-bundle.tar.gz
#   bash scripts/gpu_bundle.sh --check   # only analyses what it would build
#                                        # (scripts/test.sh runs this, so a
#                                        # bundle that cannot build fails CI)
set -euo pipefail
usage="usage: scripts/gpu_bundle.sh [--check]"
# Anything else would be taken for a full build, which first deletes the
# bundle there is.
case "$#:${1:-}" in
  0: | 1:--check) ;;
  1:-h | 1:--help)
    echo "$usage"
    echo "  builds gpu-bundle/ and gpu-bundle.tar.gz; --check only analyses what it would build"
    exit 0
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
cd "$(dirname "$0")/.."
source scripts/cuda_targets.sh
flags=(--config=cuda -c opt --dynamic_mode=off)
# Bazel's stderr of the queries below: noise, unless one fails.
bazel_err=$(mktemp) || { echo "gpu-bundle: cannot create a temporary file" >&2; exit 1; }
trap 'rm -f "$bazel_err"' EXIT
# The tests in that set that build under these flags: a query lists the CPU-only
# ones too (kernels/cuda/emulation, CPU_ONLY), and naming them to
# `bazel build --config=cuda` would stop it ("incompatible ... explicitly
# requested"), so the configured query drops those.
if ! tests=$(bazel cquery "${flags[@]}" "tests(set(${CUDA_TARGETS[*]}))" --output=starlark \
  --starlark:expr='"" if "IncompatiblePlatformProvider" in providers(target) else str(target.label)' \
  2>"$bazel_err"); then
  cat "$bazel_err" >&2
  echo "gpu-bundle: bazel cquery of the CUDA test targets (scripts/cuda_targets.sh) failed" >&2
  exit 1
fi
tests=$(grep . <<<"$tests" || true)
if [[ -z "$tests" ]]; then
  echo "gpu-bundle: no CUDA test target builds under ${flags[*]} (scripts/cuda_targets.sh)" >&2
  exit 1
fi
binaries=(//cli:pipetrain //coordinator:pipetrain-coordinator //worker:pipetrain-worker
  //worker/train:train_step_benchmark //worker/collectives:collective_benchmark
  //kernels/cuda:nccl_all_reduce_benchmark)
if [[ $# -eq 1 ]]; then  # --check
  # shellcheck disable=SC2086
  bazel build --nobuild "${flags[@]}" $tests "${binaries[@]}"
  echo "gpu-bundle check: $(echo "$tests" | wc -l) test binaries and ${#binaries[@]} programs analyse" >&2
  exit 0
fi
echo "building $(echo "$tests" | wc -l) test binaries and ${#binaries[@]} programs (--config=cuda -c opt)" >&2
# shellcheck disable=SC2086
bazel build "${flags[@]}" $tests "${binaries[@]}"
if ! bin_dir=$(bazel info "${flags[@]}" bazel-bin 2>"$bazel_err"); then
  cat "$bazel_err" >&2
  echo "gpu-bundle: bazel info ${flags[*]} bazel-bin failed" >&2
  exit 1
fi
rm -rf gpu-bundle gpu-bundle.tar.gz gpu-bundle.tar.xz
mkdir -p gpu-bundle/bin gpu-bundle/lib
for target in $tests "${binaries[@]}"; do
  path="${target#//}"; path="${path/://}"
  install -m 755 "$bin_dir/$path" gpu-bundle/bin/
done
# Shared libraries from the Debian system, except those every Linux (glibc,
# the C++ runtime) or the GPU machine (CUDA, the driver) provides.
for f in gpu-bundle/bin/*; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
    libcuda.so*|libcudart.so*|libcublas*.so*|libnccl.so*|libnvidia*) ;;
    *) cp -L "$lib" gpu-bundle/lib/ ;;
  esac
done
strip --strip-unneeded gpu-bundle/bin/* gpu-bundle/lib/* 2>/dev/null || true
install -m 755 scripts/gpu_run.sh gpu-bundle/run.sh
{
  echo "commit $(git rev-parse --short=12 HEAD) ($(git status --porcelain --untracked-files=no | wc -l) files changed since)"
  echo "built $(date -u +%Y-%m-%dT%H:%MZ) with ${flags[*]}; $(/usr/local/cuda/bin/nvcc --version | tail -1)"
} >gpu-bundle/BUILD_INFO
tar czf gpu-bundle.tar.gz gpu-bundle
echo "gpu-bundle: $(ls gpu-bundle/bin | wc -l) binaries, $(ls gpu-bundle/lib | wc -l) libraries;" \
  "gpu-bundle.tar.gz $(du -h gpu-bundle.tar.gz | cut -f1)" >&2
