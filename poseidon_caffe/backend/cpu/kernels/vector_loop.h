/* VECTOR_LOOP, shared by the kernels (pooling.c, winograd.c). */
#ifndef POSEIDON_VECTOR_LOOP_H
#define POSEIDON_VECTOR_LOOP_H

/* A loop over whole planes, kept a call of its own (inlined into its pass, the compiler loses
 * the restrict promises and runs it a cell at a time), and on x86-64 built also for AVX2 and
 * AVX-512, the widest the CPU has chosen at load: the install's flags target the oldest x86-64
 * so the library runs anywhere. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(POSEIDON_NO_CLONES)
#define VECTOR_LOOP __attribute__((noinline, target_clones("avx512f", "avx2", "default")))
#elif defined(__GNUC__)
#define VECTOR_LOOP __attribute__((noinline))
#else
#define VECTOR_LOOP
#endif

#endif
