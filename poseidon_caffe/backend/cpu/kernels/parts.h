/* run_in_parts (parts.c): one pass over range(n) cut into parts that run side by side. */
#ifndef POSEIDON_PARTS_H
#define POSEIDON_PARTS_H

#include <stdint.h>

/* Does [lo, hi) of the pass described by ctx. */
typedef void (*part_task)(void *ctx, int64_t lo, int64_t hi);

/* task over range(n) on up to `parts` threads, the calling thread one of them, in pieces
 * whose bounds are multiples of `align`; returns when every piece is done. */
void run_in_parts(part_task task, void *ctx, int64_t n, int parts, int64_t align);

#endif
