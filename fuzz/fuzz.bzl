"""pipetrain_fuzzer: a libFuzzer target, built only under --config=fuzz.

    pipetrain_fuzzer(name = "foo_fuzzer", srcs = ["foo_fuzzer.cc"], deps = [...])

The source defines LLVMFuzzerTestOneInput; libFuzzer supplies main. Seeds
live in fuzz/corpus/<name>/. Outside --config=fuzz (clang, sanitizers) the
target is incompatible, so `bazel build //...` with GCC skips it.
"""

load("@rules_cc//cc:defs.bzl", "cc_binary")

# For target_compatible_with: the target builds only under --config=fuzz.
FUZZ_COMPATIBLE = select({
    "//fuzz:enabled": [],
    "//conditions:default": ["//fuzz:fuzz_build_disabled"],
})

def pipetrain_fuzzer(name, srcs, deps = [], testonly = False):
    cc_binary(
        name = name,
        srcs = srcs,
        deps = deps,
        testonly = testonly,
        linkopts = ["-fsanitize=fuzzer"],
        target_compatible_with = FUZZ_COMPATIBLE,
        visibility = ["//visibility:private"],
    )
