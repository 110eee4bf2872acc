/* A 2-D pooling's geometry and one output's window clipped to the input, for the passes that
 * lay planes side by side in vector lanes (pool_lanes.c, pool_lanes8.c). */
#ifndef POSEIDON_POOL_WINDOW_H
#define POSEIDON_POOL_WINDOW_H

typedef struct {
    int h, w, oh, ow, kh, kw, sh, sw, ph, pw;
} window2d;

/* Output (i, j)'s window clipped to the input: rows [*hs, *he), columns [*ws, *we). */
static inline void clip(const window2d *g, int i, int j, int *hs, int *he, int *ws, int *we)
{
    int r = i * g->sh - g->ph, c = j * g->sw - g->pw;
    *hs = r < 0 ? 0 : r;
    *he = r + g->kh > g->h ? g->h : r + g->kh;
    *ws = c < 0 ? 0 : c;
    *we = c + g->kw > g->w ? g->w : c + g->kw;
}

#endif
