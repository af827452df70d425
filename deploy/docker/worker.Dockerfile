# pipetrain-worker image on an NVIDIA CUDA runtime base. UNBUILT HERE: the
# development machines have no Docker, no registry access and no GPU, so
# this file has not been built or run; check it on your build host.
#
#   docker build -f deploy/docker/worker.Dockerfile -t localhost/pipetrain/worker:0.1.0 .
#   docker build -f deploy/docker/worker.Dockerfile \
#     --build-arg CUDA_BASE=nvidia/cuda:<tag>-runtime-ubuntu24.04 ...   # another CUDA
#
# This is the plain build: its --device auto computes on the CPU (OpenBLAS),
# so it also runs without a GPU (overlay cpu-demo). A GPU worker needs
# `bazel build --config=cuda` on a build stage with the CUDA 13 toolkit and a
# CUDA 13 runtime base; not done here. The CUDA backend's parity checks
# passed on an NVIDIA H200 (docs/gpu-results/), outside any image.
ARG CUDA_BASE=nvidia/cuda:12.6.3-runtime-ubuntu24.04

# --- build: Debian 12 with the project's packages, Bazel builds the binary.
FROM debian:12 AS build
WORKDIR /src
COPY . .
# The commit the binaries report (--version, pipetrain_build_info): the
# context has no .git, so it comes as a build argument (docs/operations.md
# "Building the images"); "unknown" without one.
ARG PIPETRAIN_COMMIT=
RUN printf '%s\n' "$PIPETRAIN_COMMIT" > .build-commit \
 && PIPETRAIN_SETUP_BUILD_ONLY=1 scripts/setup.sh \
 && bazel build --jobs=auto //worker:pipetrain-worker \
 && mkdir -p /out/lib \
 && cp -L bazel-bin/worker/pipetrain-worker /out/
# The CUDA images are Ubuntu, whose package names and versions differ from
# Debian 12's: bundle the Debian libraries the binary links, except glibc
# and the C++ runtime, which the newer Ubuntu base provides (the binary
# needs glibc >= 2.36, Debian 12's; Ubuntu 24.04 has 2.39).
RUN ldd /out/pipetrain-worker \
      | awk '$2 == "=>" && $3 ~ /^\// {print $3}' \
      | grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s)\.so' \
      | xargs -r cp -L -t /out/lib/

# --- runtime
FROM ${CUDA_BASE}
COPY --from=build /out/lib/ /opt/pipetrain/lib/
COPY --from=build /out/pipetrain-worker /usr/local/bin/pipetrain-worker
ENV LD_LIBRARY_PATH=/opt/pipetrain/lib
RUN groupadd --gid 10001 pipetrain \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin pipetrain \
 && /usr/local/bin/pipetrain-worker --help > /dev/null
USER 10001:10001
# Data plane (--listen) and HTTP /metrics, /healthz (--metrics-address).
# Pass addresses peers can reach (the pod IP), not 0.0.0.0: the worker
# advertises them as given (docs/operations.md).
EXPOSE 7100 9100
ENTRYPOINT ["/usr/local/bin/pipetrain-worker"]
