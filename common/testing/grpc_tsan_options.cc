// TSan settings for the tests that run Debian's gRPC end to end. gRPC (like
// Debian's Abseil and protobuf) is not built with ThreadSanitizer, so TSan
// cannot see how gRPC hands a call's state between its threads, and reports
// hundreds of races inside gRPC that are none.
//
// The price: a race whose stack passes through gRPC's C++ headers (every
// reaction and unary handler is called from them) is not reported here. The
// reactors' own concurrency is therefore checked by tests that drive them
// through fake gRPC writers and readers, without gRPC threads
// (assignment_streams_test, weights_upload_test); these settings do not
// apply there.
//
// Used by grpc_service_test and grpc_transport_test.
//
// Linked into the test executable (linkstatic): libtsan's weak defaults would
// win over copies in a shared library loaded after it. Harmless in builds
// without TSan, where nothing calls these hooks.

// Check intercepted calls (memmove, epoll_wait, ...) only when instrumented
// code makes them; uninstrumented gRPC and Abseil make them under
// synchronisation TSan cannot see.
extern "C" const char* __tsan_default_options() { return "ignore_noninstrumented_modules=1"; }

// gRPC's header-only code (call ops, handlers, interceptors, callback tags)
// is compiled into our objects with instrumentation, but synchronised by
// gRPC core without it.
extern "C" const char* __tsan_default_suppressions() {
  return "race:/usr/include/grpcpp/\n"
         "race:/usr/include/grpc/\n"
         // Abseil's deadlock-detection graph and protobuf's shared empty
         // unknown-field set (absl_tsan_options.cc says why).
         "race:synchronization_internal::GraphCycles\n"
         "race:google::protobuf::UnknownFieldSet::default_instance\n";
}
