/* Winograd's tile transforms (winograd.py), each with the copy between a feature map and its
 * tiles. numpy makes the copy as one strided copy whose innermost run is a row of tiles, and the
 * transform as a GEMM with the 36x36 (or 16x36) Kronecker product, 3x the multiply-adds of the
 * two 6x6 products it stands for and a pass over memory of its own. Here a channel's tiles are
 * gathered into a buffer that stays in cache and transformed from it, a block of tiles at a
 * time (the tiles are the vector lanes); on AVX-512, 16 tiles at a time are gathered straight
 * into registers, transformed there and stored (or scattered into the map).
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
static void gather(const float *restrict x, float *restrict buf, int64_t k, int c, int cc,
                   int h, int w, int a, int m, int ph, int pw, int th, int tw)
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
VECTOR_LOOP static void transform(const float *restrict in, size_t in_stride,
                                  float *restrict out, size_t out_stride,
                                  const float *restrict mat, int p, int a, size_t n)
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

/* The 16 tiles of `gr` in one channel `plane`: gathered, mat X mat' made in registers, and
 * stored at out[(q * p + q') * stride] (the lanes in `keep`). */
INLINE_AVX512 void in_group(const float *plane, const struct group *gr, int w,
                            const float *mat, float *out, size_t stride, __mmask16 keep,
                            const int a, const int p)
{
    /* half[q][s] = sum over r of mat[q][r] X[r][s] */
    __m512 half[MAX_SIDE][MAX_SIDE];
    __m512i corner = _mm512_loadu_si512(gr->corner);
    for (int s = 0; s < a; ++s) {
        __m512 col[MAX_SIDE];
        for (int r = 0; r < a; ++r) {
            __m512i at = _mm512_add_epi32(corner, _mm512_set1_epi32(r * w + s));
            col[r] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(),
                                              (__mmask16)(gr->rows[r] & gr->cols[s]), at,
                                              plane, 4);
        }
        for (int q = 0; q < p; ++q) {
            __m512 acc = _mm512_setzero_ps();
            for (int r = 0; r < a; ++r)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(mat[q * a + r]), col[r], acc);
            half[q][s] = acc;
        }
    }
    for (int q = 0; q < p; ++q)
        for (int q2 = 0; q2 < p; ++q2) {
            __m512 acc = _mm512_setzero_ps();
            for (int s = 0; s < a; ++s)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(mat[q2 * a + s]), half[q][s], acc);
            _mm512_mask_storeu_ps(out + (size_t)(q * p + q2) * stride, keep, acc);
        }
}

/* The 16 tiles of `gr` (described on the output map) in one channel: their p x p products
 * from in[(q * p + q') * stride], mat P mat' made in registers, plus b, and scattered into
 * the output `plane`. */
INLINE_AVX512 void out_group(const float *in, size_t stride, const struct group *gr, int ow,
                             const float *mat, float b, float *plane, __mmask16 keep,
                             const int p, const int m)
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
    __m512i corner = _mm512_loadu_si512(gr->corner);
    __m512 bias = _mm512_set1_ps(b);
    for (int r = 0; r < m; ++r)
        for (int s = 0; s < m; ++s) {
            __m512 acc = bias;
            for (int q = 0; q < p; ++q)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(mat[r * p + q]), half[q][s], acc);
            __m512i at = _mm512_add_epi32(corner, _mm512_set1_epi32(r * ow + s));
            _mm512_mask_i32scatter_ps(plane, (__mmask16)(gr->rows[r] & gr->cols[s]), at, acc,
                                      4);
        }
}

AVX512 static void in_avx512(const float *x, float *v, const float *mat, const struct group *groups,
                             size_t tiles, int c, int h, int w, int a, int p)
{
    for (int cc = 0; cc < c; ++cc) {
        const float *plane = x + (size_t)cc * h * w;
        for (size_t g = 0; g * 16 < tiles; ++g) {
            size_t left = tiles - g * 16;
            __mmask16 keep = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            float *out = v + (size_t)cc * tiles + g * 16;
            size_t stride = (size_t)c * tiles;
            if (a == 6 && p == 6)
                in_group(plane, groups + g, w, mat, out, stride, keep, 6, 6);
            else if (a == 4 && p == 6)
                in_group(plane, groups + g, w, mat, out, stride, keep, 4, 6);
            else
                in_group(plane, groups + g, w, mat, out, stride, keep, a, p);
        }
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
            __mmask16 keep = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            const float *in = prod + (size_t)cc * tiles + g * 16;
            size_t stride = (size_t)c * tiles;
            if (p == 6 && m == 4)
                out_group(in, stride, groups + g, ow, mat, b, plane, keep, 6, 4);
            else
                out_group(in, stride, groups + g, ow, mat, b, plane, keep, p, m);
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
    /* offsets within the chunk's images are int32 */
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
