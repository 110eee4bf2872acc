/* Asking for memory a few lines at a time while other work runs: a region a later step reads
 * goes to the L2 cache spread over the calls of this step's loop, so that its misses overlap
 * the work rather than wait in a burst between steps (pool_lanes8.c's groups of planes). */
#ifndef POSEIDON_FETCH_AHEAD_H
#define POSEIDON_FETCH_AHEAD_H

#include <stdint.h>

typedef struct {
    const float *next, *end;      /* the next line to ask for, and the region's end */
    int64_t per;                  /* lines asked for at each fetch_some */
} fetch_ahead;

/* `floats` floats from `from` on, over `calls` calls of fetch_some */
static inline fetch_ahead fetch_region(const float *from, int64_t floats, int64_t calls)
{
    const int64_t lines = (floats + 15) / 16;
    fetch_ahead f = {from, from + floats, (lines + calls - 1) / (calls > 0 ? calls : 1)};
    return f;
}

static inline void fetch_some(fetch_ahead *f)
{
    for (int64_t l = 0; l < f->per && f->next < f->end; ++l, f->next += 16)
        __builtin_prefetch(f->next, 0, 2);
}

#endif
