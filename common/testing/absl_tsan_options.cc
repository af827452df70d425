// TSan settings for multi-threaded tests that do not run gRPC (those link
// grpc_tsan_options, which carries the same suppression; a test links at
// most one of the two).
//
// Debian's Abseil is not built with ThreadSanitizer. Its absl::Mutex keeps a
// process-wide graph of mutexes for its own deadlock detection
// (synchronization_internal::GraphCycles), guarded by a spin lock TSan cannot
// see; when two threads lock mutexes for the first time at once, the
// graph's memmove calls look like a race although both sit inside Abseil.
// Our code is never on those stacks (TSan keeps checking our accesses, and
// AnnotatedMutex makes our hand-offs visible), and TSan's own lock-order
// checking covers what Abseil's detector would find.
//
// Linked into the test executable (linkstatic, alwayslink): libtsan's weak
// default would win over a copy in a shared library loaded after it.
extern "C" const char* __tsan_default_suppressions() {
  return "race:synchronization_internal::GraphCycles\n";
}
