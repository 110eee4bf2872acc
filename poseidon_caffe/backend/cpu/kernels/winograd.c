/* Winograd's tile transforms (winograd.py), each with the copy between a feature map and its
 * tiles. numpy makes the copy as one strided copy whose innermost run is a row of tiles, and the
 * transform as a GEMM with the 36x36 (or 16x36) Kronecker product, 3x the multiply-adds of the
 * two 6x6 products it stands for and a pass over memory of its own. Here a channel's tiles are
 * gathered into a buffer that stays in cache and transformed from it, a block of tiles at a
 * time (the tiles are the vector lanes); on AVX-512, 16 tiles at a time are taken straight
 * into registers, transformed there and stored (or scattered into the map): by rows of tiles
 * (struct rows: a window row's cells loaded once, each column picked by permutes; outputs
 * interleaved by permutes and stored by rows), a channel's tiles passing through a buffer
 * the cache keeps, where a map's row holds 3 to 16 tiles; else gathered and scattered.
 *
 *   winograd_in    v[q][q'][c][t] = sum over r, s of mat[q][r] mat[q'][s] X[r][s], X[r][s] =
 *                  x[i][c][ty*m + r - ph][tx*m + s - pw] (0 outside x) for tile t = (i, ty, tx):
 *                  the a x a windows of an input (mat = B', p = a = 6) or the m x m tiles of an
 *                  output gradient (mat = A, 6 x 4, no pad), each transformed to p x p
 *   winograd_out   y[i][c][ty*m + r][tx*m + s] = sum over q, q' of mat[r][q] mat[s][q']
 *                  P[q][q'][c][t] (+ bias[c]): each p x p product transformed to the m x m
 *                  outputs (mat = A', 4 x 6), the parts past the map left out
 *
 * x and y are (k, c, h, w) and (k, c, oh, ow), v and P (p * p, c, k * th * tw), mat row-major,
 * all C-contiguous float32. `portable` takes the plain loops even where the CPU has AVX-512
 * (they are what other CPUs run). Each returns 0, or -1 when out of memory.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx512.h"
#include "vector_loop.h"

#if HAVE_AVX512
#define INLINE_AVX512 __attribute__((target("avx512f"), always_inline)) static inline
#endif

#define MAX_SIDE 8       /* the largest tile side (a, p) these loops take */
#define LANES 64         /* tiles transformed together: each row of the work below is a run */
/* rows of fewer tiles take the gathers: a vector of rows of 2 tiles needs 8 tile rows' loads */
#define ROWS_MIN_TILES 3

/* Loops that store zeros or copy kept as loops: GCC otherwise makes them memset and memcpy,
 * called for the few bytes of a window's edge columns (gather) or, where the size is known
 * and small, written as `rep stos`, which takes tens of cycles to start on an AMD Zen 3
 * (transform: 72 per LANES tiles). winograd_in of VGG's conv1_2 input 61-69 -> 43-47 ms,
 * of a 512 x 8 x 8 one 8.1-13 -> 5.9-6.8 ms at one thread. */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_MEMSET_LOOPS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define NO_MEMSET_LOOPS
#endif

/* The tiles tx in [*lo, *hi) whose column tx*m + s - pw lies in [0, w). */
static void inside(int s, int m, int pw, int w, int tw, int *lo, int *hi)
{
    int first = pw - s > 0 ? (pw - s + m - 1) / m : 0;
    int last = w - 1 + pw - s >= 0 ? (w - 1 + pw - s) / m + 1 : 0;
    *lo = first < tw ? first : tw;
    *hi = last < tw ? last : tw;
    if (*hi < *lo)
        *hi = *lo;
}

/* buf[r][s][t] (tiles t = (i, ty, tx) of one channel) = the tiles' a x a windows. */
NO_MEMSET_LOOPS static void gather(const float *restrict x, float *restrict buf, int64_t k,
                                   int c, int cc, int h, int w, int a, int m, int ph, int pw,
                                   int th, int tw)
{
    size_t tiles = (size_t)k * th * tw;
    for (int r = 0; r < a; ++r) {
        for (int s = 0; s < a; ++s) {
            int lo, hi;
            inside(s, m, pw, w, tw, &lo, &hi);
            float *dst = buf + (size_t)(r * a + s) * tiles;
            for (int64_t i = 0; i < k; ++i) {
                const float *img = x + ((size_t)i * c + cc) * h * w;
                for (int ty = 0; ty < th; ++ty, dst += tw) {
                    int u = ty * m + r - ph;
                    if (u < 0 || u >= h) {
                        memset(dst, 0, sizeof(float) * (size_t)tw);
                        continue;
                    }
                    const float *row = img + (size_t)u * w;
                    for (int tx = 0; tx < lo; ++tx)
                        dst[tx] = 0.0f;
                    for (int tx = lo; tx < hi; ++tx)
                        dst[tx] = row[tx * m + s - pw];
                    for (int tx = hi; tx < tw; ++tx)
                        dst[tx] = 0.0f;
                }
            }
        }
    }
}

/* out[q][q'][t] = sum over r, s of mat[q][r] mat[q'][s] in[r][s][t] for n tiles t, `in` and
 * `out` rows `in_stride` and `out_stride` apart: the two small products, LANES tiles at a time. */
VECTOR_LOOP NO_MEMSET_LOOPS
static void transform(const float *restrict in, size_t in_stride, float *restrict out,
                      size_t out_stride, const float *restrict mat, int p, int a, size_t n)
{
    /* half[q][s] = sum over r of mat[q][r] in[r][s] */
    float half[MAX_SIDE * MAX_SIDE][LANES];
    float acc[LANES];
    for (size_t t0 = 0; t0 < n; t0 += LANES) {
        int lanes = n - t0 < LANES ? (int)(n - t0) : LANES;
        for (int q = 0; q < p; ++q) {
            for (int s = 0; s < a; ++s) {
                float *hq = half[q * a + s];
                for (int l = 0; l < LANES; ++l)
                    hq[l] = 0.0f;
                for (int r = 0; r < a; ++r) {
                    float coef = mat[q * a + r];
                    if (coef == 0.0f)
                        continue;
                    const float *row = in + (size_t)(r * a + s) * in_stride + t0;
                    for (int l = 0; l < lanes; ++l)
                        hq[l] += coef * row[l];
                }
            }
        }
        for (int q = 0; q < p; ++q) {
            for (int q2 = 0; q2 < p; ++q2) {
                for (int l = 0; l < LANES; ++l)
                    acc[l] = 0.0f;
                for (int s = 0; s < a; ++s) {
                    float coef = mat[q2 * a + s];
                    if (coef == 0.0f)
                        continue;
                    const float *hq = half[q * a + s];
                    for (int l = 0; l < LANES; ++l)
                        acc[l] += coef * hq[l];
                }
                float *dst = out + (size_t)(q * p + q2) * out_stride + t0;
                for (int l = 0; l < lanes; ++l)
                    dst[l] = acc[l];
            }
        }
    }
}


#if HAVE_AVX512
/* 16 consecutive tiles t = (i, ty, tx): where each window's corner lies relative to its
 * channel's plane in image 0 (i*c*h*w + (ty*m - ph)*w + tx*m - pw), and in which lanes each of
 * its rows and columns lies inside the map (no lane past the last tile). */
struct group {
    int32_t corner[16];
    uint16_t rows[MAX_SIDE];
    uint16_t cols[MAX_SIDE];
};

static struct group *describe(size_t tiles, int64_t c, int h, int w, int a, int m, int ph,
                              int pw, int th, int tw)
{
    size_t count = (tiles + 15) / 16;
    struct group *groups = calloc(count, sizeof(struct group));
    if (groups == NULL)
        return NULL;
    for (size_t t = 0; t < tiles; ++t) {
        struct group *gr = groups + t / 16;
        int lane = (int)(t % 16);
        int tx = (int)(t % tw), ty = (int)(t / tw % th);
        int64_t i = (int64_t)(t / ((size_t)tw * th));
        int u0 = ty * m - ph, v0 = tx * m - pw;
        gr->corner[lane] = (int32_t)(i * c * h * w + (int64_t)u0 * w + v0);
        for (int r = 0; r < a; ++r)
            if (u0 + r >= 0 && u0 + r < h)
                gr->rows[r] |= (uint16_t)(1u << lane);
        for (int s = 0; s < a; ++s)
            if (v0 + s >= 0 && v0 + s < w)
                gr->cols[s] |= (uint16_t)(1u << lane);
    }
    return groups;
}

/* X[r * a + s] = cell (r, s) of the a x a windows of the 16 tiles of `gr` in one channel
 * `plane`, gathered (0 outside the map). */
INLINE_AVX512 void gather_windows(const float *plane, const struct group *gr, int w, __m512 *X,
                                  const int a)
{
    __m512i corner = _mm512_loadu_si512(gr->corner);
    for (int r = 0; r < a; ++r)
        for (int s = 0; s < a; ++s) {
            __m512i at = _mm512_add_epi32(corner, _mm512_set1_epi32(r * w + s));
            X[r * a + s] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(),
                                                    (__mmask16)(gr->rows[r] & gr->cols[s]),
                                                    at, plane, 4);
        }
}

/* The windows X of 16 tiles: mat X mat' made in registers and stored at
 * out[(q * p + q') * stride] (the lanes in `keep`). */
INLINE_AVX512 void transform_windows(const __m512 *X, const float *mat, float *out,
                                     size_t stride, __mmask16 keep, const int a, const int p)
{
    /* half[q][s] = sum over r of mat[q][r] X[r][s] */
    __m512 half[MAX_SIDE][MAX_SIDE];
    for (int s = 0; s < a; ++s)
        for (int q = 0; q < p; ++q) {
            __m512 acc = _mm512_setzero_ps();
            for (int r = 0; r < a; ++r)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(mat[q * a + r]), X[r * a + s], acc);
            half[q][s] = acc;
        }
    for (int q = 0; q < p; ++q)
        for (int q2 = 0; q2 < p; ++q2) {
            __m512 acc = _mm512_setzero_ps();
            for (int s = 0; s < a; ++s)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(mat[q2 * a + s]), half[q][s], acc);
            _mm512_mask_storeu_ps(out + (size_t)(q * p + q2) * stride, keep, acc);
        }
}

/* Rows of tiles laid in vector lanes (the map's rows of tiles, tw of them, at most 16): lane
 * L holds tile L % tw of the group's tile row L / tw. A window row's cells, from column -pw,
 * are loaded once (5 vectors, 80 cells) for the whole tile row, and column s of every tile's
 * window (cells 4 tx + s: steps of 4) picked from them by permutes, 8 tiles a permute, from
 * the loads as they lie (s < 4) or shifted by 4 cells (s >= 4): gathers, on this CPU 30 cycles
 * each where a permute takes one, made the transform several times slower than its memory. */
struct rows {
    int tw, per;                /* tiles a row; tile rows a group */
    int loads;                  /* vectors a window row: 16 cells each, from column -pw */
    __mmask16 inside[5];        /* their cells within [0, w) */
    __m512i pick[4];            /* lane L: cell (s mod 4) + 4 ((L mod tw) mod 8) of a pair */
    __mmask16 lanes[16][2];     /* tile row k's lanes of tiles 0-7 and 8-15 */
};

static void describe_rows(struct rows *d, int tw, int w, int pw)
{
    d->tw = tw;
    d->per = 16 / tw;
    d->loads = tw > 8 ? 5 : 3;
    for (int j = 0; j < d->loads; ++j) {
        uint32_t bits = 0;
        for (int l = 0; l < 16; ++l)
            bits |= (uint32_t)(16 * j + l - pw >= 0 && 16 * j + l - pw < w) << l;
        d->inside[j] = (__mmask16)bits;
    }
    for (int sm = 0; sm < 4; ++sm) {
        int32_t index[16];
        for (int l = 0; l < 16; ++l)
            index[l] = sm + 4 * ((l % tw) % 8);
        memcpy(&d->pick[sm], index, sizeof(index));
    }
    memset(d->lanes, 0, sizeof(d->lanes));
    for (int l = 0; l < d->per * tw; ++l)
        d->lanes[l / tw][(l % tw) / 8] |= (__mmask16)(1u << l);
}

/* X (as gather_windows) of the tile rows [q0, q0 + count) (row q: image q / th, tile row
 * q % th) of one channel, `plane` its cells in image 0 and `image` the floats between
 * images. */
INLINE_AVX512 void pick_windows(const float *plane, int64_t image, const struct rows *d, int h,
                                int w, int th, int ph, int pw, int64_t q0, int count,
                                __m512 *X, const int a)
{
    const int halves = d->tw > 8 ? 2 : 1, loads = d->loads;
    /* the first tile row's picks fill whole vectors (the lanes past the group's tiles are
     * never stored), the others' are merged into their lanes: nothing is zeroed first (a
     * `rep stos` of X took 40% of the pass) */
    for (int k = 0; k < count; ++k) {
        const int64_t q = q0 + k;
        const int ty = (int)(q % th);
        const float *base = plane + q / th * image;
        for (int r = 0; r < a; ++r) {
            const int u = ty * 4 - ph + r;
            if (u < 0 || u >= h) {
                /* a row of padding: zeros */
                for (int s = 0; s < a; ++s)
                    X[r * a + s] = k == 0 ? _mm512_setzero_ps() : _mm512_mask_mov_ps(
                        X[r * a + s], d->lanes[k][0] | d->lanes[k][1], _mm512_setzero_ps());
                continue;
            }
            const float *row = base + (int64_t)u * w - pw;
            __m512 v[5], shifted[4];
            for (int j = 0; j < loads; ++j)
                v[j] = _mm512_maskz_loadu_ps(d->inside[j], row + 16 * j);
            if (a > 4)
                for (int j = 0; j + 1 < loads; ++j)
                    shifted[j] = _mm512_castsi512_ps(_mm512_alignr_epi32(
                        _mm512_castps_si512(v[j + 1]), _mm512_castps_si512(v[j]), 4));
            for (int s = 0; s < a; ++s) {
                const __m512 *src = s < 4 ? v : shifted;
                for (int half = 0; half < halves; ++half) {
                    __m512 picked = _mm512_permutex2var_ps(src[2 * half], d->pick[s & 3],
                                                           src[2 * half + 1]);
                    X[r * a + s] = k == 0 && half == 0 ? picked :
                        _mm512_mask_mov_ps(X[r * a + s], d->lanes[k][half], picked);
                }
            }
        }
    }
}

/* Y[r * m + s] = output (r, s) of 16 tiles: mat P mat' of their p x p products
 * in[(q * p + q') * stride], made in registers, plus b. */
INLINE_AVX512 void untransform(const float *in, size_t stride, const float *mat, float b,
                               __mmask16 keep, __m512 *Y, const int p, const int m)
{
    /* half[q][s] = sum over q' of mat[s][q'] P[q][q'] */
    __m512 half[MAX_SIDE][MAX_SIDE];
    for (int q = 0; q < p; ++q) {
        __m512 row[MAX_SIDE];
        for (int q2 = 0; q2 < p; ++q2)
            row[q2] = _mm512_maskz_loadu_ps(keep, in + (size_t)(q * p + q2) * stride);
        for (int s = 0; s < m; ++s) {
            __m512 acc = _mm512_setzero_ps();
            for (int q2 = 0; q2 < p; ++q2)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(mat[s * p + q2]), row[q2], acc);
            half[q][s] = acc;
        }
    }
    for (int r = 0; r < m; ++r)
        for (int s = 0; s < m; ++s) {
            __m512 acc = _mm512_set1_ps(b);
            for (int q = 0; q < p; ++q)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(mat[r * p + q]), half[q][s], acc);
            Y[r * m + s] = acc;
        }
}

/* The outputs Y of the 16 tiles of `gr` (described on the output map), scattered into the
 * output `plane`. */
INLINE_AVX512 void scatter_outputs(const __m512 *Y, const struct group *gr, int ow, float *plane,
                                   const int m)
{
    __m512i corner = _mm512_loadu_si512(gr->corner);
    for (int r = 0; r < m; ++r)
        for (int s = 0; s < m; ++s) {
            __m512i at = _mm512_add_epi32(corner, _mm512_set1_epi32(r * ow + s));
            _mm512_mask_i32scatter_ps(plane, (__mmask16)(gr->rows[r] & gr->cols[s]), at,
                                      Y[r * m + s], 4);
        }
}

/* The outputs Y (4 x 4 a tile) of rows of tiles (struct rows) into the output `plane` of
 * image 0 (`image` floats between images): each output row of a tile row is its 4 tiles a
 * vector interleaved by two permutes and a blend, stored within the map (scatters, as
 * gathers, take 30 cycles each here). */
INLINE_AVX512 void place_outputs(const __m512 *Y, const struct rows *d, float *plane,
                                 int64_t image, int oh, int ow, int th, int64_t q0, int count)
{
    /* output cell e = 4 t + s of a vector: tile t's column s, from Y[s] (s < 2: the pair
     * Y[0], Y[1]; else Y[2], Y[3]) lane t + 16 (s mod 2), before the tiles' first lane */
    const __m512i pair = _mm512_setr_epi32(0, 16, 0, 16, 1, 17, 1, 17, 2, 18, 2, 18, 3, 19, 3,
                                           19);
    for (int k = 0; k < count; ++k) {
        const int64_t q = q0 + k;
        const int ty = (int)(q % th);
        float *base = plane + q / th * image;
        for (int j = 0; j * 4 < d->tw; ++j) {
            const int first = k * d->tw + 4 * j;            /* the vector's first tile's lane */
            const __m512i at = _mm512_add_epi32(pair, _mm512_set1_epi32(first));
            const int cell = 16 * j;
            int n = ow - cell < 16 ? ow - cell : 16;
            if (4 * (d->tw - 4 * j) < n)
                n = 4 * (d->tw - 4 * j);
            const __mmask16 inside = first_lanes(n);
            for (int r = 0; r < 4 && ty * 4 + r < oh; ++r) {
                const __m512 low = _mm512_permutex2var_ps(Y[r * 4], at, Y[r * 4 + 1]);
                const __m512 high = _mm512_permutex2var_ps(Y[r * 4 + 2], at, Y[r * 4 + 3]);
                _mm512_mask_storeu_ps(base + (int64_t)(ty * 4 + r) * ow + cell, inside,
                                      _mm512_mask_blend_ps((__mmask16)0xCCCC, low, high));
            }
        }
    }
}

AVX512 static void in_avx512(const float *x, float *v, const float *mat, const struct group *groups,
                             size_t tiles, int c, int h, int w, int a, int p)
{
    for (int cc = 0; cc < c; ++cc) {
        const float *plane = x + (size_t)cc * h * w;
        for (size_t g = 0; g * 16 < tiles; ++g) {
            size_t left = tiles - g * 16;
            __mmask16 keep = first_lanes((int64_t)left);
            float *out = v + (size_t)cc * tiles + g * 16;
            size_t stride = (size_t)c * tiles;
            __m512 X[MAX_SIDE * MAX_SIDE];
            if (a == 6 && p == 6) {
                gather_windows(plane, groups + g, w, X, 6);
                transform_windows(X, mat, out, stride, keep, 6, 6);
            } else if (a == 4 && p == 6) {
                gather_windows(plane, groups + g, w, X, 4);
                transform_windows(X, mat, out, stride, keep, 4, 6);
            } else {
                gather_windows(plane, groups + g, w, X, a);
                transform_windows(X, mat, out, stride, keep, a, p);
            }
        }
    }
}

/* The same by rows of tiles (struct rows): steps of 4, windows of at most 8 cells. */
AVX512 static void in_rows_avx512(const float *x, float *v, const float *mat, int64_t k, int c,
                                  int h, int w, int a, int p, int ph, int pw, int th, int tw,
                                  float *stage)
{
    struct rows d;
    describe_rows(&d, tw, w, pw);
    const int64_t tile_rows = k * th, image = (int64_t)c * h * w;
    const size_t tiles = (size_t)(tile_rows * tw);
    /* a channel's p * p rows of tiles are made in `stage`, which the cache keeps, then copied
     * out a row at a time: p * p rows written side by side, far apart in v, ran at a quarter
     * of the memory's rate (GoogLeNet's inception_3b/3x3, forward + backward, 367 -> 246 ms) */
    const size_t stride = tiles;
    for (int cc = 0; cc < c; ++cc) {
        const float *plane = x + (size_t)cc * h * w;
        for (int64_t q0 = 0; q0 < tile_rows; q0 += d.per) {
            const int count = tile_rows - q0 < d.per ? (int)(tile_rows - q0) : d.per;
            const int n = count * tw;
            const __mmask16 keep = first_lanes(n);
            float *out = stage + (size_t)q0 * tw;
            __m512 X[MAX_SIDE * MAX_SIDE];
            if (a == 6 && p == 6) {
                pick_windows(plane, image, &d, h, w, th, ph, pw, q0, count, X, 6);
                transform_windows(X, mat, out, stride, keep, 6, 6);
            } else if (a == 4 && p == 6) {
                pick_windows(plane, image, &d, h, w, th, ph, pw, q0, count, X, 4);
                transform_windows(X, mat, out, stride, keep, 4, 6);
            } else {
                pick_windows(plane, image, &d, h, w, th, ph, pw, q0, count, X, a);
                transform_windows(X, mat, out, stride, keep, a, p);
            }
        }
        for (int j = 0; j < p * p; ++j)
            memcpy(v + ((size_t)j * c + cc) * tiles, stage + j * stride, sizeof(float) * tiles);
    }
}

AVX512 static void out_avx512(const float *prod, const float *mat, const float *bias, float *y,
                              const struct group *groups, size_t tiles, int c, int oh, int ow,
                              int p, int m)
{
    for (int cc = 0; cc < c; ++cc) {
        float *plane = y + (size_t)cc * oh * ow;
        float b = bias ? bias[cc] : 0.0f;
        for (size_t g = 0; g * 16 < tiles; ++g) {
            size_t left = tiles - g * 16;
            __mmask16 keep = first_lanes((int64_t)left);
            const float *in = prod + (size_t)cc * tiles + g * 16;
            size_t stride = (size_t)c * tiles;
            __m512 Y[MAX_SIDE * MAX_SIDE];
            if (p == 6 && m == 4) {
                untransform(in, stride, mat, b, keep, Y, 6, 4);
                scatter_outputs(Y, groups + g, ow, plane, 4);
            } else {
                untransform(in, stride, mat, b, keep, Y, p, m);
                scatter_outputs(Y, groups + g, ow, plane, m);
            }
        }
    }
}

/* The same by rows of tiles (struct rows): 4 x 4 outputs from 6 x 6 products. */
AVX512 static void out_rows_avx512(const float *prod, const float *mat, const float *bias,
                                   float *y, int64_t k, int c, int oh, int ow, int th, int tw,
                                   float *stage)
{
    struct rows d;
    describe_rows(&d, tw, ow, 0);
    const int64_t tile_rows = k * th, image = (int64_t)c * oh * ow;
    const size_t tiles = (size_t)(tile_rows * tw);
    for (int cc = 0; cc < c; ++cc) {
        float *plane = y + (size_t)cc * oh * ow;
        const float b = bias ? bias[cc] : 0.0f;
        /* the channel's 36 rows of products copied together into `stage` first (as in) */
        for (int j = 0; j < 36; ++j)
            memcpy(stage + j * tiles, prod + ((size_t)j * c + cc) * tiles,
                   sizeof(float) * tiles);
        for (int64_t q0 = 0; q0 < tile_rows; q0 += d.per) {
            const int count = tile_rows - q0 < d.per ? (int)(tile_rows - q0) : d.per;
            const int n = count * tw;
            const __mmask16 keep = first_lanes(n);
            __m512 Y[16];
            untransform(stage + (size_t)q0 * tw, tiles, mat, b, keep, Y, 6, 4);
            place_outputs(Y, &d, plane, image, oh, ow, th, q0, count);
        }
    }
}
#endif

int winograd_in(const float *restrict x, float *restrict v, const float *restrict mat,
                int64_t k, int c, int h, int w, int a, int p, int m, int ph, int pw, int th,
                int tw, int portable)
{
    if (a > MAX_SIDE || p > MAX_SIDE)
        return -2;
    size_t tiles = (size_t)k * th * tw;
#if HAVE_AVX512
    if (!portable && cpu_has_avx512() && m == 4 && a <= 8 && tw >= ROWS_MIN_TILES &&
        tw <= 16) {
        float *stage = malloc(sizeof(float) * (size_t)p * p * tiles);
        if (stage == NULL)
            return -1;
        in_rows_avx512(x, v, mat, k, c, h, w, a, p, ph, pw, th, tw, stage);
        free(stage);
        return 0;
    }
    /* the gathers' offsets within the chunk's images are int32 */
    if (!portable && cpu_has_avx512() && (double)k * c * h * w < 2147483647.0) {
        struct group *groups = describe(tiles, c, h, w, a, m, ph, pw, th, tw);
        if (groups == NULL)
            return -1;
        in_avx512(x, v, mat, groups, tiles, c, h, w, a, p);
        free(groups);
        return 0;
    }
#endif
    float *buf = malloc(sizeof(float) * (size_t)a * a * tiles);
    if (buf == NULL)
        return -1;
    for (int cc = 0; cc < c; ++cc) {
        gather(x, buf, k, c, cc, h, w, a, m, ph, pw, th, tw);
        transform(buf, tiles, v + (size_t)cc * tiles, (size_t)c * tiles, mat, p, a, tiles);
    }
    free(buf);
    return 0;
}

int winograd_out(const float *restrict prod, const float *restrict mat,
                 const float *restrict bias, float *restrict y, int64_t k, int c, int oh,
                 int ow, int p, int m, int th, int tw, int portable)
{
    if (p > MAX_SIDE || m > MAX_SIDE)
        return -2;
    size_t tiles = (size_t)k * th * tw;
#if HAVE_AVX512
    if (!portable && cpu_has_avx512() && p == 6 && m == 4 && tw >= ROWS_MIN_TILES &&
        tw <= 16) {
        float *stage = malloc(sizeof(float) * (size_t)p * p * tiles);
        if (stage == NULL)
            return -1;
        out_rows_avx512(prod, mat, bias, y, k, c, oh, ow, th, tw, stage);
        free(stage);
        return 0;
    }
    if (!portable && cpu_has_avx512() && (double)k * c * oh * ow < 2147483647.0) {
        struct group *groups = describe(tiles, c, oh, ow, m, m, 0, 0, th, tw);
        if (groups == NULL)
            return -1;
        out_avx512(prod, mat, bias, y, groups, tiles, c, oh, ow, p, m);
        free(groups);
        return 0;
    }
#endif
    float *buf = malloc(sizeof(float) * (size_t)m * m * tiles);
    if (buf == NULL)
        return -1;
    for (int cc = 0; cc < c; ++cc) {
        /* buf[r][s][t]: the m x m outputs of each tile */
        transform(prod + (size_t)cc * tiles, (size_t)c * tiles, buf, tiles, mat, m, p, tiles);
        float b = bias ? bias[cc] : 0.0f;
        for (int64_t i = 0; i < k; ++i) {
            float *out = y + ((size_t)i * c + cc) * oh * ow;
            for (int u = 0; u < oh; ++u) {
                int ty = u / m, r = u % m;
                for (int s = 0; s < m; ++s) {
                    const float *src = buf + (size_t)(r * m + s) * tiles +
                                       ((size_t)i * th + ty) * tw;
                    int count = (ow - s + m - 1) / m;      /* the tiles whose column s < ow */
                    float *dst = out + (size_t)u * ow + s;
                    if (count > tw)
                        count = tw;
                    if (bias == NULL)
                        for (int tx = 0; tx < count; ++tx)
                            dst[tx * m] = src[tx];
                    else
                        for (int tx = 0; tx < count; ++tx)
                            dst[tx * m] = src[tx] + b;
                }
            }
        }
    }
    free(buf);
    return 0;
}
