/* Compiled passes for the CPU backend, where numpy would need several strided passes or
 * copies: 2-D MAX and AVE pooling, forward and backward, over planes of (height, width).
 *
 * Built at install as the extension module poseidon_caffe.backend._kernels (optional:
 * without a compiler the numpy paths run). The module itself is empty; native.py calls the
 * functions below through ctypes, which releases the GIL, so the batch parts of split.py run
 * side by side. The functions only read and write the C-contiguous float32 arrays they are
 * handed.
 *
 * The window rules are Caffe's (pooling_layer.cpp): MAX ignores padding and an empty window
 * gives -FLT_MAX and no winner; AVE sums the window clipped to the input and divides by its
 * size clipped to input + padding, in Caffe's order of summation.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_loop.h"

/* pool_same.c: stride-1 MAX pooling whose output is the input's size, where the CPU has
 * AVX-512 (-2 where it does not serve) */
int pool_same_max_forward(const float *x, float *y, void *arg, int arg_bytes, int64_t planes,
                          int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                          int ph, int pw);
int pool_tiles_max_forward(const float *x, float *y, void *arg, int arg_bytes, int64_t planes,
                           int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                           int ph, int pw);
int pool_tiles_max_backward(const float *dy, const void *arg, int arg_bytes, float *dx,
                            int64_t planes, int h, int w, int oh, int ow, int kh, int kw,
                            int sh, int sw, int ph, int pw);
int pool_same_max_backward(const float *dy, const void *arg, int arg_bytes, float *dx,
                           int64_t planes, int h, int w, int oh, int ow, int kh, int kw,
                           int sh, int sw, int ph, int pw);
/* pool_gather.c: MAX's and AVE's backward for 3x3 windows of stride 2, where the CPU has AVX2
 * (-2 where it does not serve) */
int pool_gather_max_backward(const float *dy, const void *arg, int arg_bytes, float *dx,
                             int64_t planes, int h, int w, int oh, int ow, int kh, int kw,
                             int sh, int sw, int ph, int pw);
int pool_gather_ave_backward(const float *dy, float *dx, const float *size, int64_t planes,
                             int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                             int ph, int pw);
/* pool_stride2.c: MAX pooling whose columns step by 2, where the CPU has AVX-512 (-2 where
 * it does not serve) */
int pool_stride2_max_forward(const float *x, float *y, void *arg, int arg_bytes,
                             int64_t planes, int h, int w, int oh, int ow, int kh, int kw,
                             int sh, int sw, int ph, int pw);
/* pool_packed.c: MAX pooling of rows of 5 to 8 outputs, two planes a vector, where the CPU
 * has AVX-512 (-2 where it does not serve) */
int pool_packed_max_forward(const float *x, float *y, void *arg, int arg_bytes,
                            int64_t planes, int h, int w, int oh, int ow, int kh, int kw,
                            int sh, int sw, int ph, int pw);
/* pool_lanes.c: 16 planes a vector, where the CPU has AVX-512 (-2 where it does not serve) */
int pool_lanes_max_forward(const float *x, float *y, void *arg, int arg_bytes, int64_t planes,
                           int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                           int ph, int pw);
int pool_lanes_ave_forward(const float *x, float *y, const float *size, int64_t planes, int h,
                           int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                           int pw);
int pool_lanes_ave_backward(const float *dy, float *dx, const float *size, int64_t planes,
                            int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                            int ph, int pw);
/* pool_lanes8.c: 8 planes a vector, where the CPU has AVX2 (-2 where it does not serve);
 * pool_lanes8_first(): whether it comes before the AVX-512 passes (only without AVX-512, by
 * default) */
int pool_lanes8_max_forward(const float *x, float *y, void *arg, int arg_bytes, int64_t planes,
                            int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                            int ph, int pw);
int pool_lanes8_ave_forward(const float *x, float *y, const float *size, int64_t planes, int h,
                            int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                            int pw);
int pool_lanes8_first(void);
/* pool_rows.c: a window's rows, then its columns, where the CPU has AVX2 (-2 where it does not
 * serve); called with pool_lanes8.c, before it */
int pool_rows_max_forward(const float *x, float *y, void *arg, int arg_bytes, int64_t planes,
                          int h, int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                          int pw);
int pool_vectors_ave_backward(const float *dy, float *dx, const float *size, int64_t planes,
                              int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                              int ph, int pw, int add);

/* The version of the functions' signatures below and in lrn.c, direct.c, winograd.c,
 * columns.c and dropout.c (raise it with any change to one); native.py refuses a library built
 * from another version (an in-place build older than this source). */
int kernels_version(void)
{
    return 18;
}

/* One axis of a pooling: where output o's window starts and ends, clipped to the input. */
static void window(int o, int stride, int pad, int kernel, int size, int *start, int *end)
{
    int s = o * stride - pad;
    int e = s + kernel;
    *start = s < 0 ? 0 : s;
    *end = e > size ? size : e;
}

/* For n cells: where g[q] is greater than best[q], it becomes best[q] and at[q] becomes t;
 * a NaN becomes best[q] (and stays: no value is greater than NaN) but does not move at[q].
 * Masks, not branches, so the loop runs on vectors (kept a call of its own: inlined into
 * the pass, the compiler loses the restrict promises and runs the loop a cell at a time). */
VECTOR_LOOP
static void take_greater_tap(const float *restrict g, int32_t t, int n,
                                    float *restrict best, int32_t *restrict at)
{
    for (int q = 0; q < n; ++q) {
        float value = g[q];
        int32_t greater = -(int32_t)(value > best[q]);
        best[q] = (value > best[q]) | (value != value) ? value : best[q];
        at[q] = (at[q] & ~greater) | (t & greater);
    }
}

/* Winners are kept as their place inside the window, (row tap) * kw + column tap, counted
 * from the window's corner in the padded input: one byte each where the window has at most
 * 255 cells (255: no winner), else int32 (-1: no winner). A flat index would need int32
 * whatever the window, four times the memory of the outputs' byte each. */
#define NO_WINNER_BYTE 255

/* to = the low byte of each from: a place, or -1 -> NO_WINNER_BYTE */
VECTOR_LOOP
static void narrow(const int32_t *restrict from, size_t n, uint8_t *restrict to)
{
    for (size_t q = 0; q < n; ++q)
        to[q] = (uint8_t)from[q];
}

/* The layout every pooling pass below works in: planes, padded, split by phase, a group of
 * them side by side. Padded row u + ph = kk * sh + rr and padded column v + pw = k * sw + r of
 * plane p go to block (rr, r), plane p, row kk, column k; a plane of a block has `rows` =
 * oh + (kh - 1) / sh rows of `cols` = ow + (kw - 1) / sw columns. Then window tap (a, t) of
 * output (p, i, j) lies at plane p, row i + a / sh, column j + t / sw of block
 * (a % sh, t % sw): for one tap the cells of all outputs of the group are one block read
 * with the outputs' plane pitch `plane` and row pitch `cols`, so a tap is a single contiguous
 * loop over the whole group (the rows i >= oh and columns j >= ow it also computes are
 * dropped). A group, not a plane: small planes (LeNet's, CIFAR-10's 8x8) would otherwise spend
 * their time starting loops. Cells outside the input keep the fill value they were given once
 * per call (0 for AVE, -inf for MAX), which cannot change a sum or a strict maximum; input
 * cells no window reads are not stored. */
typedef struct {
    int rows, cols, sh, sw, ph, pw, h, w;
    int group;                  /* planes side by side */
    size_t plane;               /* rows * cols */
    size_t block;               /* group * plane */
    size_t size;                /* all blocks, plus a plane of slack the last taps read past */
    int *lo, *hi;               /* per column phase r: the block columns that hold input */
} phased;

/* The floats of a group's blocks: a group's passes stay in the core's L1 and L2 caches. */
#define GROUP_FLOATS 8192
/* Outputs taken through all taps at a time (MAX: 8 KB of maxima and winners). */
#define STRETCH 1024

static int phased_init(phased *q, int64_t planes, int h, int w, int oh, int ow, int kh,
                       int kw, int sh, int sw, int ph, int pw)
{
    q->rows = oh + (kh - 1) / sh;
    q->cols = ow + (kw - 1) / sw;
    q->sh = sh;
    q->sw = sw;
    q->ph = ph;
    q->pw = pw;
    q->h = h;
    q->w = w;
    q->plane = (size_t)q->rows * q->cols;
    size_t per_plane = (size_t)sh * sw * q->plane;
    int64_t group = per_plane >= GROUP_FLOATS ? 1 : (int64_t)(GROUP_FLOATS / per_plane);
    q->group = (int)(group < planes ? group : (planes > 0 ? planes : 1));
    q->block = (size_t)q->group * q->plane;
    q->size = (size_t)sh * sw * q->block + q->plane;
    q->lo = malloc(sizeof(int) * (size_t)sw);
    q->hi = malloc(sizeof(int) * (size_t)sw);
    if (q->lo == NULL || q->hi == NULL) {
        free(q->lo);
        free(q->hi);
        return -1;
    }
    for (int r = 0; r < sw; ++r) {
        /* 0 <= k * sw + r - pw <= w - 1, and k < cols */
        int first = pw - r;
        int lo = first <= 0 ? 0 : (first + sw - 1) / sw;
        int last = w - 1 + pw - r;
        int hi = last < 0 ? 0 : last / sw + 1;
        q->lo[r] = lo;
        q->hi[r] = hi < q->cols ? hi : q->cols;
        if (q->hi[r] < lo)
            q->hi[r] = lo;
    }
    return 0;
}

static void phased_free(phased *q)
{
    free(q->lo);
    free(q->hi);
}

/* The first cell of block (rr, r), plane p of the group, row kk. */
static inline float *phased_row(const phased *q, float *base, int p, int rr, int r, int kk)
{
    return base + ((size_t)rr * q->sw + r) * q->block + (size_t)p * q->plane +
        (size_t)kk * q->cols;
}

/* Where tap (a, t) of output (0, 0, 0) lies: output (p, i, j)'s cell is p * plane +
 * i * cols + j past it. */
static inline size_t phased_tap(const phased *q, int a, int t)
{
    return ((size_t)(a % q->sh) * q->sw + t % q->sw) * q->block +
        (size_t)(a / q->sh) * q->cols + t / q->sw;
}

/* The input cells of a group's planes, x, into the layout. Padded column c = k * sw + r of an
 * input row goes to column k of block phase r; with stride 2 (most nets' poolings) the pairs
 * (2k, 2k + 1) go together, so the loop runs on vectors. */
VECTOR_LOOP
static void phased_fill(const phased *q, const float *restrict x, float *restrict base,
                        int group)
{
    int sw = q->sw, c0 = q->pw, c1 = q->pw + q->w;   /* padded columns of the input */
    if (c1 > q->cols * sw)
        c1 = q->cols * sw;                          /* past the blocks' columns */
    for (int g = 0; g < group; ++g) {
        for (int u = 0; u < q->h; ++u) {
            int kk = (u + q->ph) / q->sh;
            if (kk >= q->rows)
                break;
            const float *restrict row = x + ((size_t)g * q->h + u) * q->w - q->pw;
            float *restrict to = phased_row(q, base, g, (u + q->ph) % q->sh, 0, kk);
            if (sw == 2) {
                float *restrict odd = to + q->block;
                if (c0 & 1)
                    odd[c0 / 2] = row[c0];
#pragma GCC ivdep
                for (int k = (c0 + 1) / 2; k < c1 / 2; ++k) {
                    to[k] = row[2 * k];
                    odd[k] = row[2 * k + 1];
                }
                if ((c1 & 1) && c1 - 1 >= c0)     /* an even last column, c0 itself too */
                    to[(c1 - 1) / 2] = row[c1 - 1];
            } else {
                for (int r = 0; r < sw; ++r)
#pragma GCC ivdep
                    for (int k = q->lo[r]; k < q->hi[r]; ++k)
                        to[r * q->block + k] = row[k * sw + r];
            }
        }
    }
}

/* The other way: each input cell of a group's planes, dx, from the layout; 0 for a cell no
 * window reads (a row past the blocks' rows, columns past their columns). */
VECTOR_LOOP
static void phased_take(const phased *q, const float *restrict base, float *restrict dx,
                        int group)
{
    int sw = q->sw, c0 = q->pw, c1 = q->pw + q->w;
    if (c1 > q->cols * sw)
        c1 = q->cols * sw;
    int covered = c1 > c0 ? c1 - c0 : 0;            /* input columns some window reads */
    for (int g = 0; g < group; ++g) {
        for (int u = 0; u < q->h; ++u) {
            int kk = (u + q->ph) / q->sh;
            float *restrict row = dx + ((size_t)g * q->h + u) * q->w;
            if (kk >= q->rows) {
                memset(row, 0, sizeof(float) * (size_t)q->w);
                continue;
            }
            const float *restrict from = phased_row(q, (float *)base, g, (u + q->ph) % q->sh,
                                                    0, kk);
            float *restrict at = row - q->pw;       /* at[c]: padded column c */
            if (sw == 2 && covered > 0) {
                const float *restrict odd = from + q->block;
                if (c0 & 1)
                    at[c0] = odd[c0 / 2];
#pragma GCC ivdep
                for (int k = (c0 + 1) / 2; k < c1 / 2; ++k) {
                    at[2 * k] = from[k];
                    at[2 * k + 1] = odd[k];
                }
                if ((c1 & 1) && c1 - 1 >= c0)     /* an even last column, c0 itself too */
                    at[c1 - 1] = from[(c1 - 1) / 2];
            } else if (covered > 0) {
                for (int r = 0; r < sw; ++r)
#pragma GCC ivdep
                    for (int k = q->lo[r]; k < q->hi[r]; ++k)
                        at[k * sw + r] = from[r * q->block + k];
            }
            memset(row + covered, 0, sizeof(float) * (size_t)(q->w - covered));
        }
    }
}

/* to += from over n cells (a call of its own, as take_greater_tap). */
VECTOR_LOOP
static void add_into(float *restrict to, const float *restrict from, size_t n)
{
    for (size_t q = 0; q < n; ++q)
        to[q] += from[q];
}

static inline void fill_floats(float *to, float value, size_t n)
{
    for (size_t q = 0; q < n; ++q)
        to[q] = value;
}

/* Below this many outputs a plane (a global pooling's one) the taps' loops are too short to
 * pay for the layout: each window is visited directly, in Caffe's loop order. */
#define FEW_OUTPUTS 16

static void max_direct(const float *restrict xp, float *restrict yp, int32_t *restrict at,
                       int h, int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                       int pw)
{
    for (int i = 0; i < oh; ++i) {
        int hs, he;
        window(i, sh, ph, kh, h, &hs, &he);
        for (int j = 0; j < ow; ++j) {
            int ws, we;
            window(j, sw, pw, kw, w, &ws, &we);
            float best = -INFINITY;
            int32_t place = hs < he && ws < we ?
                (hs - (i * sh - ph)) * kw + ws - (j * sw - pw) : -1;
            for (int u = hs; u < he; ++u) {
                for (int v = ws; v < we; ++v) {
                    float value = xp[u * w + v];
                    if (value > best)
                        place = (u - (i * sh - ph)) * kw + v - (j * sw - pw);
                    best = (value > best) | (value != value) ? value : best;
                }
            }
            yp[i * ow + j] = place < 0 ? -FLT_MAX : best;
            at[i * ow + j] = place;
        }
    }
}

static void ave_direct(const float *restrict xp, float *restrict yp, const float *size, int h,
                       int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph, int pw)
{
    for (int i = 0; i < oh; ++i) {
        int hs, he;
        window(i, sh, ph, kh, h, &hs, &he);
        for (int j = 0; j < ow; ++j) {
            int ws, we;
            window(j, sw, pw, kw, w, &ws, &we);
            float sum = 0.0f;
            for (int u = hs; u < he; ++u)
                for (int v = ws; v < we; ++v)
                    sum += xp[u * w + v];
            yp[i * ow + j] = sum / size[i * ow + j];
        }
    }
}

static void ave_direct_backward(const float *restrict dyp, float *restrict dxp,
                                const float *size, int h, int w, int oh, int ow, int kh,
                                int kw, int sh, int sw, int ph, int pw)
{
    memset(dxp, 0, sizeof(float) * (size_t)h * w);
    for (int i = 0; i < oh; ++i) {
        int hs, he;
        window(i, sh, ph, kh, h, &hs, &he);
        for (int j = 0; j < ow; ++j) {
            int ws, we;
            window(j, sw, pw, kw, w, &ws, &we);
            float share = dyp[i * ow + j] / size[i * ow + j];
            for (int u = hs; u < he; ++u)
                for (int v = ws; v < we; ++v)
                    dxp[u * w + v] += share;
        }
    }
}

/* y = the maximum of each window; arg = the place in its window (see above) of the first
 * maximum in row-major order (a later cell takes over only when strictly greater), no winner
 * for an empty window; arg_bytes: 1 or 4, arg's element size. A NaN in a window makes its
 * output NaN, as numpy's maximum does.
 *
 * With `lanes`, pool_same.c's shifted loads (stride 1, the output the input's size) or
 * pool_lanes.c's pass run where they serve (AVX-512), 16 cells or 16 planes a vector, and
 * where the CPU has AVX2 but not AVX-512, pool_tiles.c's pass over planes that 2x2 windows of
 * stride 2 tile, pool_rows.c's rows then columns (column strides 1 and 2) or pool_lanes8.c's 8
 * planes a vector.
 * Otherwise: which cell wins is data, which a branch predictor cannot learn, so the
 * comparisons are masks over whole planes: in the phased layout (above, padding -inf) the
 * taps are visited in the window's row-major order, each one contiguous loop over every output
 * of the group, a stretch of outputs through all taps at a time. Each output starts at -inf
 * with its window's first input cell as winner, so a window of -inf keeps that cell, as
 * Caffe's loop keeps its first. -1: out of memory. */
int pool_max_forward(const float *restrict x, float *restrict y, void *restrict arg,
                     int arg_bytes, int64_t planes, int h, int w, int oh, int ow, int kh,
                     int kw, int sh, int sw, int ph, int pw, int lanes)
{
    if (lanes) {
        int status = -2;
        if (pool_lanes8_first()) {
            status = pool_tiles_max_forward(x, y, arg, arg_bytes, planes, h, w, oh, ow, kh, kw,
                                            sh, sw, ph, pw);
            if (status == -2)
                status = pool_rows_max_forward(x, y, arg, arg_bytes, planes, h, w, oh, ow, kh,
                                               kw, sh, sw, ph, pw);
            if (status == -2)
                status = pool_lanes8_max_forward(x, y, arg, arg_bytes, planes, h, w, oh, ow, kh,
                                                 kw, sh, sw, ph, pw);
        }
        if (status == -2)
            status = pool_same_max_forward(x, y, arg, arg_bytes, planes, h, w, oh, ow, kh, kw,
                                           sh, sw, ph, pw);
        if (status == -2)
            status = pool_stride2_max_forward(x, y, arg, arg_bytes, planes, h, w, oh, ow, kh,
                                              kw, sh, sw, ph, pw);
        if (status == -2)
            status = pool_packed_max_forward(x, y, arg, arg_bytes, planes, h, w, oh, ow, kh,
                                             kw, sh, sw, ph, pw);
        if (status == -2)
            status = pool_lanes_max_forward(x, y, arg, arg_bytes, planes, h, w, oh, ow, kh,
                                            kw, sh, sw, ph, pw);
        if (status != -2)
            return status;
    }
    size_t outputs = (size_t)oh * ow;
    if (outputs < FEW_OUTPUTS) {
        int32_t *at = malloc(sizeof(int32_t) * outputs);
        if (at == NULL)
            return -1;
        for (int64_t p = 0; p < planes; ++p) {
            max_direct(x + p * (int64_t)h * w, y + p * (int64_t)outputs, at, h, w, oh, ow, kh,
                       kw, sh, sw, ph, pw);
            if (arg_bytes == 1)
                narrow(at, outputs, (uint8_t *)arg + (size_t)p * outputs);
            else
                memcpy((int32_t *)arg + (size_t)p * outputs, at, sizeof(int32_t) * outputs);
        }
        free(at);
        return 0;
    }
    phased q;
    if (phased_init(&q, planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw) < 0)
        return -1;
    float *base = malloc(sizeof(float) * q.size);
    float *best = malloc(sizeof(float) * q.block);
    int32_t *at = malloc(sizeof(int32_t) * q.block);
    int32_t *first = malloc(sizeof(int32_t) * q.block);   /* each window's first cell, -1 */
    if (base == NULL || best == NULL || at == NULL || first == NULL) {
        free(base);
        free(best);
        free(at);
        free(first);
        phased_free(&q);
        return -1;
    }
    fill_floats(base, -INFINITY, q.size);
    int empty = 0;                      /* a window holds no input cell */
    for (int i = 0; i < q.rows; ++i) {
        int hs = 0, he = 0;
        if (i < oh)
            window(i, sh, ph, kh, h, &hs, &he);
        for (int j = 0; j < q.cols; ++j) {
            int ws = 0, we = 0;
            if (j < ow)
                window(j, sw, pw, kw, w, &ws, &we);
            first[i * q.cols + j] = hs < he && ws < we ?
                (hs - (i * sh - ph)) * kw + ws - (j * sw - pw) : -1;
            empty |= i < oh && j < ow && first[i * q.cols + j] < 0;
        }
    }
    for (int g = 1; g < q.group; ++g)
        memcpy(first + g * q.plane, first, sizeof(int32_t) * q.plane);
    for (int64_t p0 = 0; p0 < planes; p0 += q.group) {
        int group = planes - p0 < q.group ? (int)(planes - p0) : q.group;
        size_t cells = (size_t)group * q.plane;
        phased_fill(&q, x + p0 * (int64_t)h * w, base, group);
        fill_floats(best, -INFINITY, cells);
        memcpy(at, first, sizeof(int32_t) * cells);
        /* a stretch of outputs through every tap at a time: its maxima and winners stay in
         * the L1 cache while the taps stream past */
        for (size_t lo = 0; lo < cells; lo += STRETCH) {
            int count = (int)(cells - lo < STRETCH ? cells - lo : STRETCH);
            for (int a = 0; a < kh; ++a)
                for (int t = 0; t < kw; ++t)
                    take_greater_tap(base + phased_tap(&q, a, t) + lo, a * kw + t, count,
                                     best + lo, at + lo);
        }
        for (int g = 0; g < group; ++g) {
            float *yp = y + (p0 + g) * (int64_t)outputs;
            for (int i = 0; i < oh; ++i) {
                size_t from = g * q.plane + (size_t)i * q.cols, to = (size_t)i * ow;
                const int32_t *fr = first + from;
                const float *br = best + from;
                int32_t *ar = at + from;
                if (empty) {
                    for (int j = 0; j < ow; ++j) {
                        ar[j] = fr[j] < 0 ? -1 : ar[j];
                        yp[to + j] = fr[j] < 0 ? -FLT_MAX : br[j];
                    }
                } else {
                    memcpy(yp + to, br, sizeof(float) * (size_t)ow);
                }
                /* places are 0..254 and -1 (no winner) keeps its low byte, 255 */
                size_t out = (size_t)(p0 + g) * outputs + to;
                if (arg_bytes == 1)
                    narrow(ar, (size_t)ow, (uint8_t *)arg + out);
                else
                    memcpy((int32_t *)arg + out, ar, sizeof(int32_t) * (size_t)ow);
            }
        }
    }
    free(base);
    free(best);
    free(at);
    free(first);
    phased_free(&q);
    return 0;
}

/* dx of one plane: each dy added at its window's winner, in the outputs' order. Inlined with
 * a constant arg_bytes, so each element size gets its own loop. */
static inline void route_plane(const float *restrict dy, const void *restrict arg,
                               int arg_bytes, float *restrict dx, const int32_t *restrict cell,
                               int w, int oh, int ow, int sh, int sw, int ph, int pw)
{
    const uint8_t *a1 = arg;
    const int32_t *a4 = arg;
    for (int i = 0; i < oh; ++i) {
        int64_t corner = (int64_t)(i * sh - ph) * w - pw;     /* of window (i, 0) */
        for (int j = 0; j < ow; ++j, corner += sw) {
            int32_t place = arg_bytes == 1 ? a1[j] : a4[j];
            if (arg_bytes == 1 ? place != NO_WINNER_BYTE : place >= 0)
                dx[corner + cell[place]] += dy[j];
        }
        a1 += ow;
        a4 += ow;
        dy += ow;
    }
}

#define AHEAD_CELLS 512      /* planes zeroed a plane ahead, in pieces, from this size */

/* route_plane where dx is zeroed already, and after each row of outputs `share` more of the
 * next plane's `cells` floats zeroed (none where next is NULL): those stores' trips to
 * memory overlap these adds rather than follow them */
static inline void route_plane_ahead(const float *restrict dy, const void *restrict arg,
                                     int arg_bytes, float *restrict dx,
                                     const int32_t *restrict cell, int w, int oh, int ow,
                                     int sh, int sw, int ph, int pw, float *restrict next,
                                     size_t cells, size_t share)
{
    size_t zeroed = next == NULL ? cells : 0;
    for (int i = 0; i < oh; ++i) {
        /* output row i as a plane of one row, its windows ph - i sh rows lower */
        int64_t at = (int64_t)i * ow;
        if (arg_bytes == 1)
            route_plane(dy + at, (const uint8_t *)arg + at, 1, dx, cell, w, 1, ow, sh, sw,
                        ph - i * sh, pw);
        else
            route_plane(dy + at, (const int32_t *)arg + at, 4, dx, cell, w, 1, ow, sh, sw,
                        ph - i * sh, pw);
        if (zeroed < cells) {
            size_t count = cells - zeroed < share ? cells - zeroed : share;
            memset(next + zeroed, 0, sizeof(float) * count);
            zeroed += count;
        }
    }
}

/* MAX backward by planes of 2 KB or more, each zeroed while the one before it takes its
 * sums (GoogLeNet's pool1 backward 14 -> 11-12 ms at one thread; on smaller planes the
 * pieces cost more than they overlap: AlexNet's pool5 0.39 -> 0.46 ms). -2 for smaller
 * planes. Not inlined: where the compiler knows the caller's planes are small, it writes
 * their memset as a `rep stos`, tens of cycles slower to start than the library's on an AMD
 * Zen 3 (VGG's pool4 backward, planes of 8x8: 0.37 -> 0.62 ms). */
__attribute__((noinline)) static int route_planes_ahead(const float *dy, const void *arg,
                                                        int arg_bytes, float *dx,
                                                        const int32_t *cell, int64_t planes,
                                                        int h, int w, int oh, int ow, int sh,
                                                        int sw, int ph, int pw)
{
    const size_t cells = (size_t)h * w, out_count = (size_t)oh * ow;
    if (cells < AHEAD_CELLS)
        return -2;
    size_t share = (cells + oh - 1) / oh;        /* at least 1 KB a call */
    share = share < 256 ? 256 : share;
    memset(dx, 0, sizeof(float) * cells);
    for (int64_t p = 0; p < planes; ++p) {
        float *dxp = dx + p * (int64_t)cells;
        float *next = p + 1 < planes ? dxp + cells : NULL;
        if (arg_bytes == 1)
            route_plane_ahead(dy + p * out_count, (const uint8_t *)arg + p * out_count, 1,
                              dxp, cell, w, oh, ow, sh, sw, ph, pw, next, cells, share);
        else
            route_plane_ahead(dy + p * out_count, (const int32_t *)arg + p * out_count, 4,
                              dxp, cell, w, oh, ow, sh, sw, ph, pw, next, cells, share);
    }
    return 0;
}

/* dx = each dy added at its window's winner (arg from pool_max_forward, arg_bytes its element
 * size): the window's corner plus the offset of the winner's place in the input; planes of
 * 2 KB and more zeroed a plane ahead (route_planes_ahead). With `lanes`, pool_tiles.c's
 * dense pass where 2x2 windows tile the plane (AVX2), pool_same.c's gather where it serves
 * (AVX-512 or AVX2, stride 1, output the input's size), pool_gather.c's for 3x3 windows of
 * stride 2 (AVX2, rows of 16 cells or more). -1: out of memory. */
int pool_max_backward(const float *restrict dy, const void *restrict arg, int arg_bytes,
                      float *restrict dx, int64_t planes, int h, int w, int oh, int ow,
                      int kh, int kw, int sh, int sw, int ph, int pw, int lanes)
{
    if (lanes && pool_tiles_max_backward(dy, arg, arg_bytes, dx, planes, h, w, oh, ow, kh, kw,
                                         sh, sw, ph, pw) == 0)
        return 0;
    if (lanes && pool_same_max_backward(dy, arg, arg_bytes, dx, planes, h, w, oh, ow, kh, kw,
                                        sh, sw, ph, pw) == 0)
        return 0;
    if (lanes && pool_gather_max_backward(dy, arg, arg_bytes, dx, planes, h, w, oh, ow, kh, kw,
                                          sh, sw, ph, pw) == 0)
        return 0;
    int32_t *cell = malloc(sizeof(int32_t) * (size_t)kh * kw);   /* place -> offset */
    if (cell == NULL)
        return -1;
    for (int a = 0; a < kh; ++a)
        for (int b = 0; b < kw; ++b)
            cell[a * kw + b] = a * w + b;
    if (route_planes_ahead(dy, arg, arg_bytes, dx, cell, planes, h, w, oh, ow, sh, sw, ph,
                           pw) == 0) {
        free(cell);
        return 0;
    }
    int64_t out_count = (int64_t)oh * ow;
    for (int64_t p = 0; p < planes; ++p) {
        const float *dyp = dy + p * out_count;
        float *dxp = dx + p * (int64_t)h * w;
        /* a plane zeroed right before its sums: it is still in cache for them (zeroing the
         * whole dx first sent it through memory twice more) */
        memset(dxp, 0, sizeof(float) * (size_t)h * w);
        if (arg_bytes == 1)
            route_plane(dyp, (const uint8_t *)arg + p * out_count, 1, dxp, cell, w, oh, ow,
                        sh, sw, ph, pw);
        else
            route_plane(dyp, (const int32_t *)arg + p * out_count, 4, dxp, cell, w, oh, ow,
                        sh, sw, ph, pw);
    }
    free(cell);
    return 0;
}

/* Caffe's AVE divisor on one axis: the window clipped to input + padding, before clipping to
 * the input. */
static int padded_extent(int o, int stride, int pad, int kernel, int size)
{
    int s = o * stride - pad;
    int e = s + kernel;
    if (e > size + pad)
        e = size + pad;
    return e - s;
}

/* Caffe's divisor of every output, as float (int products, converted as Caffe's /= does). */
static float *ave_divisors(int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                           int ph, int pw)
{
    float *size = malloc(sizeof(float) * (size_t)oh * ow);
    if (size == NULL)
        return NULL;
    for (int i = 0; i < oh; ++i)
        for (int j = 0; j < ow; ++j)
            size[i * ow + j] = (float)(padded_extent(i, sh, ph, kh, h) *
                                       padded_extent(j, sw, pw, kw, w));
    return size;
}

/* to = num / den over n cells (a call of its own, as take_greater_tap). */
VECTOR_LOOP
static void divide(const float *restrict num, const float *restrict den, float *restrict to,
                   int n)
{
    for (int q = 0; q < n; ++q)
        to[q] = num[q] / den[q];
}

/* y = the window sum divided by Caffe's window size (with `lanes`, by pool_lanes.c where it
 * serves). In the phased layout (padding 0) the taps are added in the window's row-major
 * order, each one contiguous loop over every output of the group: each output gets Caffe's
 * float32 sum in Caffe's order (adding 0 changes no sum). -1: out of memory. */
int pool_ave_forward(const float *restrict x, float *restrict y, int64_t planes, int h,
                     int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph, int pw,
                     int lanes)
{
    size_t outputs = (size_t)oh * ow;
    float *size = ave_divisors(h, w, oh, ow, kh, kw, sh, sw, ph, pw);
    if (size == NULL)
        return -1;
    if (lanes) {
        int status = pool_lanes8_first() ?
            pool_lanes8_ave_forward(x, y, size, planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw) :
            -2;
        if (status == -2)
            status = pool_lanes_ave_forward(x, y, size, planes, h, w, oh, ow, kh, kw, sh, sw,
                                            ph, pw);
        if (status != -2) {
            free(size);
            return status;
        }
    }
    if (outputs < FEW_OUTPUTS) {
        for (int64_t p = 0; p < planes; ++p)
            ave_direct(x + p * (int64_t)h * w, y + p * (int64_t)outputs, size, h, w, oh, ow,
                       kh, kw, sh, sw, ph, pw);
        free(size);
        return 0;
    }
    phased q;
    if (phased_init(&q, planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw) < 0) {
        free(size);
        return -1;
    }
    float *base = calloc(q.size, sizeof(float));
    float *sum = malloc(sizeof(float) * q.block);
    if (base == NULL || sum == NULL) {
        free(base);
        free(sum);
        free(size);
        phased_free(&q);
        return -1;
    }
    for (int64_t p0 = 0; p0 < planes; p0 += q.group) {
        int group = planes - p0 < q.group ? (int)(planes - p0) : q.group;
        size_t cells = (size_t)group * q.plane;
        phased_fill(&q, x + p0 * (int64_t)h * w, base, group);
        memset(sum, 0, sizeof(float) * cells);
        for (int a = 0; a < kh; ++a)
            for (int t = 0; t < kw; ++t)
                add_into(sum, base + phased_tap(&q, a, t), cells);
        for (int g = 0; g < group; ++g)
            for (int i = 0; i < oh; ++i)
                divide(sum + g * q.plane + (size_t)i * q.cols, size + (size_t)i * ow,
                       y + (p0 + g) * (int64_t)outputs + (size_t)i * ow, ow);
    }
    free(base);
    free(sum);
    free(size);
    phased_free(&q);
    return 0;
}

/* to += share over n cells */
VECTOR_LOOP
static void add_share(float *restrict to, float share, size_t n)
{
    for (size_t q = 0; q < n; ++q)
        to[q] += share;
}

/* AVE's backward where the one output's window holds the whole plane (GoogLeNet's global
 * pool5): each cell gets the plane's dy / size, added to 0 (Caffe's zeroed diff: -0 becomes
 * +0) or, with `add`, to its value; one pass that writes dx (the windows' lists of
 * pool_ave_vectors.c took 1.2 ms for GoogLeNet's 7x7 pool5 at one thread). -2 where the
 * window does not hold the plane. */
static int global_ave_backward(const float *restrict dy, float *restrict dx, int64_t planes,
                               int h, int w, int oh, int ow, int kh, int kw, int ph, int pw,
                               float size, int add)
{
    if (oh != 1 || ow != 1 || kh - ph < h || kw - pw < w)
        return -2;
    const size_t cells = (size_t)h * w;
    for (int64_t p = 0; p < planes; ++p) {
        float *to = dx + (size_t)p * cells;
        const float share = dy[p] / size;
        if (add)
            add_share(to, share, cells);
        else
            fill_floats(to, 0.0f + share, cells);     /* every cell's 0 + share */
    }
    return 0;
}

/* dx = each dy divided by its window's size, added over the window's cells (with `lanes`, by
 * pool_gather.c for 3x3 windows of stride 2 where the AVX2 passes come first, rows of 16
 * cells or more, or pool_ave_vectors.c or pool_lanes.c where they serve). The shares go into
 * the phased layout a tap at a time, taps last to first: a cell then gets its windows' shares
 * in the windows' row-major order, the order of Caffe's loop over the outputs. -1: out of
 * memory. */
int pool_ave_backward(const float *restrict dy, float *restrict dx, int64_t planes, int h,
                      int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph, int pw,
                      int lanes)
{
    size_t outputs = (size_t)oh * ow;
    float *size = ave_divisors(h, w, oh, ow, kh, kw, sh, sw, ph, pw);
    if (size == NULL)
        return -1;
    if (global_ave_backward(dy, dx, planes, h, w, oh, ow, kh, kw, ph, pw, size[0], 0) == 0) {
        free(size);
        return 0;
    }
    if (lanes) {
        int status = pool_lanes8_first() ?
            pool_gather_ave_backward(dy, dx, size, planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw) :
            -2;
        if (status == -2)
            status = pool_vectors_ave_backward(dy, dx, size, planes, h, w, oh, ow, kh, kw, sh,
                                               sw, ph, pw, 0);
        if (status == -2)
            status = pool_lanes_ave_backward(dy, dx, size, planes, h, w, oh, ow, kh, kw, sh,
                                             sw, ph, pw);
        if (status != -2) {
            free(size);
            return status;
        }
    }
    if (outputs < FEW_OUTPUTS) {
        for (int64_t p = 0; p < planes; ++p)
            ave_direct_backward(dy + p * (int64_t)outputs, dx + p * (int64_t)h * w, size, h,
                                w, oh, ow, kh, kw, sh, sw, ph, pw);
        free(size);
        return 0;
    }
    phased q;
    if (phased_init(&q, planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw) < 0) {
        free(size);
        return -1;
    }
    float *base = malloc(sizeof(float) * q.size);
    /* rows i >= oh and columns j >= ow stay 0: their taps reach cells of real windows */
    float *share = calloc(q.block, sizeof(float));
    if (base == NULL || share == NULL) {
        free(base);
        free(share);
        free(size);
        phased_free(&q);
        return -1;
    }
    for (int64_t p0 = 0; p0 < planes; p0 += q.group) {
        int group = planes - p0 < q.group ? (int)(planes - p0) : q.group;
        size_t cells = (size_t)group * q.plane;
        for (int g = 0; g < group; ++g)
            for (int i = 0; i < oh; ++i)
                divide(dy + (p0 + g) * (int64_t)outputs + (size_t)i * ow,
                       size + (size_t)i * ow, share + g * q.plane + (size_t)i * q.cols, ow);
        memset(base, 0, sizeof(float) * q.size);
        for (int a = kh - 1; a >= 0; --a)
            for (int t = kw - 1; t >= 0; --t)
                add_into(base + phased_tap(&q, a, t), share, cells);
        phased_take(&q, base, dx + p0 * (int64_t)h * w, group);
    }
    free(base);
    free(share);
    free(size);
    phased_free(&q);
    return 0;
}

/* dx += AVE's gradient of dy: each cell's shares added to its value in Caffe's order
 * (pool_ave_vectors.c); -2 where that does not serve (the caller adds a gradient made apart),
 * -1 out of memory. */
int pool_ave_backward_add(const float *restrict dy, float *restrict dx, int64_t planes, int h,
                          int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph, int pw)
{
    float *size = ave_divisors(h, w, oh, ow, kh, kw, sh, sw, ph, pw);
    if (size == NULL)
        return -1;
    int status = global_ave_backward(dy, dx, planes, h, w, oh, ow, kh, kw, ph, pw, size[0], 1);
    if (status == -2)
        status = pool_vectors_ave_backward(dy, dx, size, planes, h, w, oh, ow, kh, kw, sh,
                                           sw, ph, pw, 1);
    free(size);
    return status;
}

/* An importable module, so that the import system finds the library (editable installs
 * included); it has no Python functions of its own. */
static struct PyModuleDef kernels_module = {
    PyModuleDef_HEAD_INIT, "_kernels", "Pooling passes called through ctypes (native.py).",
    -1, NULL, NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__kernels(void)
{
    return PyModule_Create(&kernels_module);
}
