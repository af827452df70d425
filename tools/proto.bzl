"""cc_proto: compiles .proto files with the system protoc and grpc_cpp_plugin.

Bazel's own proto rules would download protobuf; this macro runs Debian's
protoc through a genrule instead (DESIGN.md §9). Imports are resolved from
the workspace root (-I.), so `import "proto/pipetrain/v1/x.proto";` works.

    cc_proto(name = "foo_cc_proto", srcs = ["foo.proto"], grpc = True,
             deps = [":bar_cc_proto"])
"""

load("@rules_cc//cc:defs.bzl", "cc_library")

def cc_proto(name, srcs, deps = [], grpc = False, visibility = None):
    stems = [s[:-len(".proto")] for s in srcs]
    outs = [s + ".pb.h" for s in stems] + [s + ".pb.cc" for s in stems]
    if grpc:
        outs += [s + ".grpc.pb.h" for s in stems] + [s + ".grpc.pb.cc" for s in stems]
    pkg = native.package_name()
    full_srcs = [pkg + "/" + s if pkg else s for s in srcs]
    cmd = "protoc -I. --cpp_out=$(GENDIR) "
    if grpc:
        cmd += "--grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) "
    cmd += " ".join(full_srcs)
    native.genrule(
        name = name + "_gen",
        srcs = srcs + [d + "_srcs" for d in deps],
        outs = outs,
        cmd = cmd,
    )

    # Exposes the .proto files to dependants' protoc invocations.
    native.filegroup(name = name + "_srcs", srcs = srcs + [d + "_srcs" for d in deps])
    cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["//third_party/system:protobuf"] +
               (["//third_party/system:grpc"] if grpc else []),
        visibility = visibility,
    )
