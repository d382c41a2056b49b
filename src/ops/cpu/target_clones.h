// DI_TARGET_CLONES: compile a kernel for AVX-512, AVX2+FMA and baseline x86-64 and pick one when
// the program is loaded (GCC/Clang target_clones, an ifunc), or nothing where that cannot work.
#pragma once

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DI_TSAN_BUILD 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define DI_TSAN_BUILD 1
#endif

// Not under ThreadSanitizer: the compiler instruments the ifunc resolver as well (it calls
// __tsan_func_entry), and the dynamic loader runs that resolver while it relocates the
// executable, before the TSan runtime exists, so every TSan binary linking these kernels died
// with SIGSEGV before main. TSan builds get the baseline variant only.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && !defined(DI_TSAN_BUILD)
#define DI_TARGET_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DI_TARGET_CLONES
#endif
