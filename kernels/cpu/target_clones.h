// PT_TARGET_CLONES: compile a hot loop for AVX-512, AVX2 and baseline x86-64
// and pick one at load time (GCC target_clones + ifunc), so it vectorises on
// every CPU without -march flags.
//
// The clones are the x86-64 ISA levels (v4: AVX-512 F/BW/CD/DQ/VL; v3: AVX2,
// FMA, BMI2), which the resolver picks by the CPU's features. Named CPUs
// ("arch=skylake-avx512", "arch=haswell", as before 2026-11-29) are picked
// by CPU model instead: an AMD EPYC, or an Intel CPU of any other model,
// matched neither and ran the baseline clone.
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
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

#endif  // PIPETRAIN_KERNELS_CPU_TARGET_CLONES_H_
