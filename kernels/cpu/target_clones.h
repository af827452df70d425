// PT_TARGET_CLONES: compile a hot loop for AVX-512, AVX2 and baseline x86-64
// and pick one at load time (GCC target_clones + ifunc), so it vectorises on
// every CPU without -march flags.
//
// Under ThreadSanitizer the attribute is dropped: the ifunc resolvers run
// while the dynamic loader relocates the binary, before the TSan runtime is
// initialised, and their instrumented code crashes there. The baseline loop
// computes the same thing, only slower.
#ifndef PIPETRAIN_KERNELS_CPU_TARGET_CLONES_H_
#define PIPETRAIN_KERNELS_CPU_TARGET_CLONES_H_

#if defined(__SANITIZE_THREAD__)
#define PT_TARGET_CLONES
#else
#define PT_TARGET_CLONES \
  __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
#endif

#endif  // PIPETRAIN_KERNELS_CPU_TARGET_CLONES_H_
