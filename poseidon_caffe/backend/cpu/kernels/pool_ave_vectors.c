/* AVE pooling's backward, 16 consecutive cells of a plane a vector (AVX-512), or 8 (AVX2).
 *
 * pool_lanes.c lays 16 planes side by side and transposes them back on the way out: for a
 * backward, whose output dx is the large side, those transposes are most of its time
 * (GoogLeNet's auxiliary heads, 14x14 -> 4x4 over 512 channels: 4.8 GB/s). Here dx is made
 * in the order it is stored: for each vector of a plane's cells, a list made once a call says
 * which windows cover which of its lanes, and each window adds its share (dy / Caffe's
 * divisor) to those lanes, one masked add; the windows in Caffe's row-major order, so each
 * cell gets Caffe's float32 sum in Caffe's order. dx is then written once, whole vectors in
 * increasing order. Or added to: the sums then start from dx's values (a folded Split's
 * input, net/split_folding.py, whose gradient other consumers began). Where the CPU has AVX2
 * but not AVX-512, 8 cells a vector against pooling.c's phased layout: GoogLeNet's auxiliary
 * heads 5.0 -> 2.3 ms on an EPYC, CIFAR-10 quick's pool3 0.62 -> 0.31, its pool2 0.70 ->
 * 0.68; and four planes at once on one list (four chains of blends in flight, not one): in
 * cache 2.5x faster, the heads 2.3 -> 1.6 ms, pool3 0.58 -> 0.25, pool2 1.36 -> 0.94 (its
 * 6400 planes, a C harness); then eight, each share an and and an add where the sums start
 * from 0 (the heads 0.81-0.88 of the time, pool2 0.80-0.93). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx2.h"

/* planes of more cells take pool_lanes.c (whose planes are at most 16384 cells) */
#define MAX_CELLS 16384
/* and so do windows of more adds a vector than this, on average: pool_lanes.c's transposes
 * then cost less (CIFAR-10 quick's pool2, 11.5 windows a vector: 528 -> 664 us; its pool3, 7:
 * the same; GoogLeNet's auxiliary heads, 5.8: 1842 -> 1430) */
#define MAX_SHARES 8
/* With 8 lanes (AVX2, where the alternative is pooling.c's phased layout, or its window by
 * window loop under 16 outputs), planes of fewer outputs take that loop: a global pooling's
 * one share a vector costs more in its starts (GoogLeNet's 7x7 pool5: 1.8 ms against 1.2) */
#define FEW_OUTPUTS8 16

int pool_vectors_ave_backward(const float *dy, float *dx, const float *size, int64_t planes,
                              int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                              int ph, int pw, int add);
/* pool_lanes8.c: whether the AVX2 passes come first (no AVX-512, or the tests asked): then 8
 * lanes here too */
int pool_lanes8_first(void);

#if HAVE_AVX512
typedef struct {
    int32_t output;           /* the window, i * ow + j */
    uint16_t lanes;           /* the vector's cells it covers, a bit each */
} share_of;

typedef struct {
    int first, last;          /* the outputs on one axis whose windows cover a cell */
} covering;

/* For each input position on one axis, the outputs whose clipped windows hold it (Caffe's
 * start i * stride - pad, end clipped to extent + pad, then both to the input). */
static void cover_axis(covering *at, int extent, int outputs, int stride, int pad, int kernel)
{
    for (int x = 0; x < extent; ++x) {
        at[x].first = outputs;
        at[x].last = -1;
    }
    for (int i = 0; i < outputs; ++i) {
        int s = i * stride - pad, e = s + kernel;
        if (e > extent + pad)
            e = extent + pad;
        for (int x = s < 0 ? 0 : s; x < e && x < extent; ++x) {
            if (i < at[x].first)
                at[x].first = i;
            at[x].last = i;
        }
    }
}

/* The list of each vector of `width` cells: entries [start[t], start[t + 1]) for vector t,
 * in output order. NULL out of memory. */
static share_of *list_shares(int h, int w, int oh, int ow, const covering *rows,
                             const covering *cols, int64_t *start, int width)
{
    int cells = h * w, vectors = (cells + width - 1) / width;
    size_t room = 0;
    for (int q = 0; q < cells; ++q) {
        const covering *r = rows + q / w, *c = cols + q % w;
        if (r->last >= r->first && c->last >= c->first)
            room += (size_t)(r->last - r->first + 1) * (c->last - c->first + 1);
    }
    share_of *list = malloc(sizeof(share_of) * (room + 1));
    uint16_t *lanes = calloc((size_t)oh * ow, sizeof(uint16_t));
    if (list == NULL || lanes == NULL) {
        free(list);
        free(lanes);
        return NULL;
    }
    int64_t n = 0;
    for (int t = 0; t < vectors; ++t) {
        int low = oh * ow, high = -1;
        start[t] = n;
        for (int q = width * t; q < width * t + width && q < cells; ++q) {
            const covering *r = rows + q / w, *c = cols + q % w;
            for (int i = r->first; i <= r->last; ++i)
                for (int j = c->first; j <= c->last; ++j) {
                    int k = i * ow + j;
                    lanes[k] |= (uint16_t)(1u << (q - width * t));
                    low = k < low ? k : low;
                    high = k > high ? k : high;
                }
        }
        for (int k = low; k <= high; ++k)
            if (lanes[k]) {
                list[n].output = k;
                list[n].lanes = lanes[k];
                ++n;
                lanes[k] = 0;
            }
    }
    start[vectors] = n;
    free(lanes);
    return list;
}

/* One plane; `last`: the call's last plane, whose last vector must not pass dx's end. */
AVX512 static void plane16(const float *restrict dy, float *restrict dx, const float *size,
                         float *share, const share_of *list, const int64_t *start, int cells,
                         int outputs, int last, int add)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int q = 0; q < outputs; q += 16) {
        /* a whole-vector store: the scalar loads below are then forwarded from it (a masked
         * store's cannot be, and each would wait for the store to reach the cache) */
        __mmask16 m = first_lanes(outputs - q);
        _mm512_storeu_ps(share + q, _mm512_div_ps(_mm512_maskz_loadu_ps(m, dy + q),
                                                  _mm512_mask_loadu_ps(one, m, size + q)));
    }
    int vectors = (cells + 15) / 16;
    for (int t = 0; t < vectors; ++t) {
        int end = last && t == vectors - 1;      /* masked: dx ends inside this vector */
        __mmask16 ours = end ? first_lanes(cells - 16 * t) : (__mmask16)0xFFFF;
        /* with `add`, the lanes past the plane are the next one's cells, stored back as they
         * were */
        __m512 sum = !add ? _mm512_setzero_ps()
                          : end ? _mm512_maskz_loadu_ps(ours, dx + 16 * t)
                                : _mm512_loadu_ps(dx + 16 * t);
        for (int64_t e = start[t]; e < start[t + 1]; ++e)
            sum = _mm512_mask_add_ps(sum, list[e].lanes, sum,
                                     _mm512_set1_ps(share[list[e].output]));
        /* a plane's last vector spills into the next plane's first cells, which the next
         * stores then write: whole stores, in increasing order */
        if (end)
            _mm512_mask_storeu_ps(dx + 16 * t, ours, sum);
        else
            _mm512_storeu_ps(dx + 16 * t, sum);
    }
}

/* masks[b]: the lanes of bits b, a bit each, as a mask of blendv (all 256 of 8 bits) */
AVX2 static void lane_masks8(__m256 *masks)
{
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    for (int b = 0; b < 256; ++b)
        masks[b] = _mm256_castsi256_ps(_mm256_cmpeq_epi32(
            _mm256_and_si256(_mm256_set1_epi32(b), bit), bit));
}

/* Planes taken at once on AVX2: a vector's shares are added one after another (each sum
 * waits for the one before), so the same list runs over eight planes side by side, eight
 * chains in flight (four: 2-10% slower) */
#define GROUP8 8

/* plane16's on AVX2, 8 cells a vector, for `count` (<= GROUP8) consecutive planes: each share
 * added where its window covers. Adding into dx, the other lanes are kept as they are (a
 * blend: an add of 0 would make +0 of dx's -0); from 0 they take +0 (an and), which changes
 * no sum. `share` has room for GROUP8 planes' shares. `ahead` (or NULL): the next GROUP8
 * planes' dx, asked for a few lines at each vector to be written (in the net's flow dx comes
 * from memory, and GROUP8 planes written side by side are more streams than the hardware's
 * prefetcher follows: 0.79-0.86 of the time there). Inlined with a constant count (and for
 * GROUP8 planes a constant `add`). */
AVX2 static inline __attribute__((always_inline)) void
planes8(const float *restrict dy, float *restrict dx, const float *size, float *share,
        const share_of *list, const int64_t *start, const __m256 *masks, int cells,
        int outputs, int count, int last, int add, float *ahead)
{
    for (int g = 0; g < count; ++g) {
        const float *dyg = dy + (int64_t)g * outputs;
        float *shareg = share + (int64_t)g * outputs;
        int q = 0;
        for (; q + 8 <= outputs; q += 8)
            _mm256_storeu_ps(shareg + q, _mm256_div_ps(_mm256_loadu_ps(dyg + q),
                                                       _mm256_loadu_ps(size + q)));
        for (; q < outputs; ++q)
            shareg[q] = dyg[q] / size[q];
    }
    const int vectors = (cells + 7) / 8;
    for (int t = 0; t < vectors; ++t) {
        if (ahead != NULL)
            for (int l = 0; l < 4; ++l)
                __builtin_prefetch(ahead + (int64_t)t * 64 + l * 16, 1, 3);
        /* a plane's last vector past its end: the next plane's first cells, already made
         * (or made later), kept as they are; dx's very end masked */
        const int past = 8 * t + 8 > cells;
        const __m256i ours = first_lanes8(cells - 8 * t);
        __m256 sum[GROUP8];
        for (int g = 0; g < count; ++g) {
            float *at = dx + (int64_t)g * cells + 8 * t;
            const int end = last && g == count - 1 && past;
            sum[g] = end ? (add ? _mm256_maskload_ps(at, ours) : _mm256_setzero_ps())
                   : add ? _mm256_loadu_ps(at)
                   : past ? _mm256_blendv_ps(_mm256_loadu_ps(at), _mm256_setzero_ps(),
                                             _mm256_castsi256_ps(ours))
                   : _mm256_setzero_ps();
        }
        for (const share_of *e = list + start[t]; e < list + start[t + 1]; ++e) {
            const __m256 mask = masks[e->lanes];
            for (int g = 0; g < count; ++g) {
                const __m256 one = _mm256_set1_ps(share[(int64_t)g * outputs + e->output]);
                /* a sum from +0 is never -0, so there adding +0 to the other lanes changes
                 * none: an and and an add (a blend of each plane was the loop's bound) */
                sum[g] = add ? _mm256_blendv_ps(sum[g], _mm256_add_ps(sum[g], one), mask)
                             : _mm256_add_ps(sum[g], _mm256_and_ps(one, mask));
            }
        }
        /* as plane16's: whole stores, a masked one at dx's end only (an AMD's take tens of
         * cycles) */
        for (int g = 0; g < count; ++g) {
            float *at = dx + (int64_t)g * cells + 8 * t;
            if (last && g == count - 1 && past)
                _mm256_maskstore_ps(at, ours, sum[g]);
            else
                _mm256_storeu_ps(at, sum[g]);
        }
    }
}

/* planes8 over every plane, GROUP8 at a time, the last few one at a time */
AVX2 static void every_plane8(const float *dy, float *dx, const float *size, float *share,
                              const share_of *list, const int64_t *start, const __m256 *masks,
                              int64_t planes, int cells, int outputs, int add)
{
    int64_t p = 0;
    /* `add` a constant in each call, which planes8 takes in its loop */
    for (; p + GROUP8 <= planes; p += GROUP8) {
        float *ahead = p + 2 * GROUP8 <= planes ? dx + (p + GROUP8) * cells : NULL;
        if (add)
            planes8(dy + p * outputs, dx + p * cells, size, share, list, start, masks, cells,
                    outputs, GROUP8, p + GROUP8 == planes, 1, ahead);
        else
            planes8(dy + p * outputs, dx + p * cells, size, share, list, start, masks, cells,
                    outputs, GROUP8, p + GROUP8 == planes, 0, ahead);
    }
    for (; p < planes; ++p)
        planes8(dy + p * outputs, dx + p * cells, size, share, list, start, masks, cells,
                outputs, 1, p == planes - 1, add, NULL);
}
#endif

/* dx (planes, h, w) = AVE's gradient of dy (planes, oh, ow), or with `add` dx plus it, `size`
 * Caffe's divisor of each output; -2 where this does not serve (neither AVX-512 nor AVX2,
 * planes over MAX_CELLS; with 16 lanes, windows overlapping more than MAX_SHARES allows; with
 * 8, planes of fewer than FEW_OUTPUTS8 outputs), -1 out of memory. */
int pool_vectors_ave_backward(const float *dy, float *dx, const float *size, int64_t planes,
                              int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                              int ph, int pw, int add)
{
#if HAVE_AVX512
    const int width = pool_lanes8_first() ? 8 : cpu_has_avx512() ? 16 : 0;
    if (width == 0 || (int64_t)h * w > MAX_CELLS || (width == 8 && oh * ow < FEW_OUTPUTS8))
        return -2;
    int cells = h * w, outputs = oh * ow, vectors = (cells + width - 1) / width;
    covering *rows = malloc(sizeof(covering) * (size_t)h);
    covering *cols = malloc(sizeof(covering) * (size_t)w);
    int64_t *start = malloc(sizeof(int64_t) * ((size_t)vectors + 1));
    float *share = malloc(sizeof(float) * GROUP8 * ((size_t)outputs + 16));
    __m256 *masks = width == 8 ? _mm_malloc(sizeof(__m256) * 256, 32) : NULL;
    share_of *list = NULL;
    if (rows != NULL && cols != NULL && start != NULL && share != NULL &&
        (width == 16 || masks != NULL)) {
        cover_axis(rows, h, oh, sh, ph, kh);
        cover_axis(cols, w, ow, sw, pw, kw);
        list = list_shares(h, w, oh, ow, rows, cols, start, width);
        if (width == 8)
            lane_masks8(masks);
    }
    int status = list != NULL ? 0 : -1;
    if (list != NULL && width == 16 && start[vectors] > (int64_t)MAX_SHARES * vectors)
        status = -2;
    for (int64_t p = 0; status == 0 && width == 16 && p < planes; ++p)
        plane16(dy + p * outputs, dx + p * cells, size, share, list, start, cells, outputs,
                p == planes - 1, add);
    if (status == 0 && width == 8)
        every_plane8(dy, dx, size, share, list, start, masks, planes, cells, outputs, add);
    free(rows);
    free(cols);
    free(start);
    free(share);
    free(list);
    _mm_free(masks);
    return status;
#else
    (void)dy, (void)dx, (void)size, (void)planes, (void)h, (void)w, (void)oh, (void)ow;
    (void)kh, (void)kw, (void)sh, (void)sw, (void)ph, (void)pw, (void)add;
    return -2;
#endif
}
