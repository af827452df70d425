"""cuda_library: compiles .cu files with the CUDA toolkit's nvcc (DESIGN.md §9).

Bazel 4.2.3 has no CUDA rules that work offline, so each .cu file goes
through a genrule that runs /usr/local/cuda/bin/nvcc and produces an object
file; a cc_library wraps the objects with their headers and deps, so C++
code depends on CUDA code like on any cc_library.

    load("//tools/cuda:cuda.bzl", "cuda_library", "CUDA_COMPATIBLE")

    cuda_library(
        name = "gelu",
        srcs = ["gelu.cu"],
        hdrs = ["gelu.h"],
        nvcc_hdrs = [":cuda_status.h"],  # other headers the .cu includes
        deps = [":cuda_status"],
    )

Code generation: sm_90 SASS (H100/H200) plus compute_90 PTX, which the
driver JIT-compiles for newer GPUs. No relocatable device code (-rdc): a
kernel and everything it calls live in one .cu file.

Limitation: the genrule cannot see the headers of `deps` (a cc_library's
headers are not a genrule input). nvcc finds headers through -I<workspace
root>, -I<genfiles root> and /usr/local/cuda/include; system headers
(/usr/include, e.g. Abseil) are found as usual. Every workspace header a .cu
file includes, directly or indirectly, must be listed in `hdrs` or
`nvcc_hdrs`, or nvcc fails with "No such file or directory" in the sandbox.
Changes to system or toolkit headers do not trigger a rebuild.

Every target is CUDA_COMPATIBLE: it only exists under --config=cuda, so
builds without the toolkit never run nvcc.
"""

load("@rules_cc//cc:defs.bzl", "cc_library")

NVCC = "/usr/local/cuda/bin/nvcc"

NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-Xcompiler",
    "-fPIC",
    # kernels/cuda/device.h's kKernelsComputeMajor/Minor name this target:
    # CheckKernelsRunOn refuses GPUs below it. Change both together.
    "-gencode",
    "arch=compute_90,code=sm_90",
    "-gencode",
    "arch=compute_90,code=compute_90",
    "-isystem",
    "/usr/local/cuda/include",
]

# For target_compatible_with: the target builds only under --config=cuda.
CUDA_COMPATIBLE = select({
    "//tools/cuda:enabled": [],
    "//conditions:default": ["//tools/cuda:cuda_backend_disabled"],
})

# For target_compatible_with: the target builds only without --config=cuda.
# For CPU-only tests under kernels/cuda (kernels/cuda/emulation): the plain
# pass runs them, and the CUDA pass's //kernels/cuda/... would run them a
# second time and count them among the GPU tests.
CPU_ONLY = select({
    "//tools/cuda:enabled": ["//tools/cuda:cuda_backend_disabled"],
    "//conditions:default": [],
})

def cuda_library(
        name,
        srcs,
        hdrs = [],
        deps = [],
        copts = [],
        nvcc_hdrs = [],
        tags = [],
        testonly = False,
        visibility = None):
    """One nvcc genrule per .cu file in srcs, wrapped in a cc_library.

    Args:
      name: the cc_library's name.
      srcs: .cu files.
      hdrs: public headers (also inputs of every nvcc action).
      deps: cc_library deps (linked; their headers are NOT seen by nvcc).
      copts: extra nvcc flags, e.g. ["-lineinfo"].
      nvcc_hdrs: further headers the .cu files include (labels or files).
      tags, testonly, visibility: as for cc_library.
    """
    objs = []
    for src in srcs:
        if not src.endswith(".cu"):
            fail("cuda_library %s: %s is not a .cu file" % (name, src))
        stem = src[:-len(".cu")]

        # A plain .o: Bazel 4.2.3 links it in PIC and non-PIC builds alike
        # (given both a .o and a .pic.o it links both, duplicating every
        # symbol). It is compiled with -fPIC, so it suits shared libraries.
        obj = "_objs_cuda/%s/%s.o" % (name, stem)
        native.genrule(
            name = "%s_%s_nvcc" % (name, stem.replace("/", "_")),
            srcs = [src] + hdrs + nvcc_hdrs,
            outs = [obj],
            cmd = " ".join(
                [NVCC] + NVCC_FLAGS + copts +
                ["-I.", "-I$(GENDIR)", "-c", "$(location %s)" % src, "-o", "$@"],
            ),
            message = "nvcc %s" % src,
            tags = tags,
            testonly = testonly,
            target_compatible_with = CUDA_COMPATIBLE,
            visibility = ["//visibility:private"],
        )
        objs.append(obj)
    cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["//third_party/cuda:cudart"],
        tags = tags,
        testonly = testonly,
        target_compatible_with = CUDA_COMPATIBLE,
        visibility = visibility,
    )
