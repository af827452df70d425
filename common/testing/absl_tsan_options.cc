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
// Debian's protobuf, likewise uninstrumented, makes its shared empty
// UnknownFieldSet on first use behind a once-guard TSan cannot see: two
// threads reading messages' unknown fields for the first time at once
// (two job runners resolving their specs) show that allocation racing the
// inlined read. Only stacks through UnknownFieldSet::default_instance are
// suppressed, not reads of our messages.
//
// Linked into the test executable (linkstatic, alwayslink): libtsan's weak
// default would win over a copy in a shared library loaded after it.
extern "C" const char* __tsan_default_suppressions() {
  return "race:synchronization_internal::GraphCycles\n"
         "race:google::protobuf::UnknownFieldSet::default_instance\n";
}
