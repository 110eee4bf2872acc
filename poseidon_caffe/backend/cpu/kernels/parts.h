/* run_in_parts (parts.c): one pass over range(n) cut into parts that run side by side. */
#ifndef POSEIDON_PARTS_H
#define POSEIDON_PARTS_H

#include <stdint.h>

/* Does [lo, hi) of the pass described by ctx. */
typedef void (*part_task)(void *ctx, int64_t lo, int64_t hi);

/* task over `parts` near-equal parts of range(n), their bounds multiples of `align`, part 0 in
 * the calling thread; returns when every part is done. */
void run_in_parts(part_task task, void *ctx, int64_t n, int parts, int64_t align);

#endif
