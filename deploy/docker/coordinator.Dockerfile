# pipetrain-coordinator image. UNBUILT HERE: the development machines have
# no Docker and no registry access, so this file has not been built or run;
# treat it as a starting point and check it on your build host.
#
#   docker build -f deploy/docker/coordinator.Dockerfile -t localhost/pipetrain/coordinator:0.1.0 .
#
# (from the repository root; coordinator.Dockerfile.dockerignore keeps
# bazel-* and node_modules out of the context, with BuildKit).

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
 && bazel build --jobs=auto //coordinator:pipetrain-coordinator \
 && mkdir -p /out \
 && cp -L bazel-bin/coordinator/pipetrain-coordinator /out/

# --- runtime: the shared libraries the binary links (Debian 12 names of
# libabsl-dev, libgrpc++-dev, libprotobuf-dev, libopenblas-dev,
# prometheus-cpp-dev, libcpp-httplib-dev and libsqlite3-dev from
# scripts/setup.sh). scripts/check_image_libraries.sh (CI) checks this list
# against what the binary links, and the --help below fails the build if a
# library is missing.
FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libabsl20220623 libgrpc++1.51 libgrpc29 libprotobuf32 \
      libopenblas0-pthread libprometheus-cpp-core1.0 libcpp-httplib0.11 \
      libsqlite3-0 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 pipetrain \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin pipetrain \
 && mkdir -p /var/lib/pipetrain && chown pipetrain:pipetrain /var/lib/pipetrain
COPY --from=build /out/pipetrain-coordinator /usr/local/bin/pipetrain-coordinator
RUN /usr/local/bin/pipetrain-coordinator --help > /dev/null
USER 10001:10001
# gRPC (workers, CLI) and HTTP (REST, /healthz, /metrics). The defaults of
# the binary listen on 127.0.0.1; in a container pass 0.0.0.0 addresses.
EXPOSE 7070 8080
# Final weights of jobs with output.weightsPath under this directory.
VOLUME /var/lib/pipetrain
ENTRYPOINT ["/usr/local/bin/pipetrain-coordinator"]
# Not enough on its own: the coordinator also needs its tokens
# (--join-token-file and --user-token-file, or --insecure for a trial), as
# deploy/k8s/base/coordinator.yaml passes them.
CMD ["--grpc-address=0.0.0.0:7070", "--http-address=0.0.0.0:8080"]
