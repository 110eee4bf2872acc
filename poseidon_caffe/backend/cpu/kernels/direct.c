/* Direct 2-D convolution, stride 1, one group, on AVX-512 (direct.py):
 *
 *     y[m, i, j]  = sum over c, a, t of w[m, c, a, t] * x[c, i + a - ph, j + t - pw]
 *     dw[m, c, a, t] += sum over i, j of dy[m, i, j] * x[c, i + a - ph, j + t - pw]
 *
 * (the backward-data is the forward of dy with the flipped, swapped weights). GEMM libraries
 * run these layers' products, whose one side is only the tens of output channels, at a third of
 * their rate; here the output channels are the vector lanes: 32 of them for a block of 8
 * neighbouring outputs sit in 16 registers, and each input value is broadcast once per tap.
 * Arrays are C-contiguous float32; each call does images [0, n). Returns 0, -1 when out of
 * memory, -2 where the CPU has no AVX-512 (the caller keeps its other plans).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx512.h"
#if HAVE_AVX512
#include "transpose16.h"
#endif
#define HAVE_DIRECT HAVE_AVX512

#define LANES 16          /* floats in a vector */
#define BLOCK 8           /* neighbouring outputs of a row computed together */
#define MAX_TAPS 7        /* taps of a row whose weight gradients are summed together */

int conv_direct_available(void)
{
    return cpu_has_avx512();
}

#if HAVE_DIRECT
/* One image into `pad`: channels of (h + 2 ph) rows of (w + 2 pw), zeros around. */
static void pad_image(const float *restrict x, float *restrict pad, int c, int h, int w,
                      int ph, int pw)
{
    int hp = h + 2 * ph, wp = w + 2 * pw;
    for (int cc = 0; cc < c; ++cc)
        for (int u = 0; u < h; ++u)
            memcpy(pad + ((size_t)cc * hp + u + ph) * wp + pw,
                   x + ((size_t)cc * h + u) * w, sizeof(float) * (size_t)w);
}

/* The weights as (c, kh, kw, m rounded up to 32 lanes): each tap's output channels are one
 * contiguous run of vectors; the lanes past m are 0. With `flip`, w is read as the weights of
 * the backward-data: (c_out = w's channels, m_in = w's outputs, kh, kw) flipped in space. */
static float *lane_weights(const float *restrict w, int m, int c, int kh, int kw, int mpad,
                           int flip)
{
    float *wt = calloc((size_t)c * kh * kw * mpad, sizeof(float));
    if (wt == NULL)
        return NULL;
    for (int mm = 0; mm < m; ++mm)
        for (int cc = 0; cc < c; ++cc)
            for (int a = 0; a < kh; ++a)
                for (int t = 0; t < kw; ++t) {
                    float v = flip ? w[(((size_t)cc * m + mm) * kh + kh - 1 - a) * kw + kw - 1 - t]
                                   : w[(((size_t)mm * c + cc) * kh + a) * kw + t];
                    wt[(((size_t)cc * kh + a) * kw + t) * mpad + mm] = v;
                }
    return wt;
}

/* A block's sums (BLOCK outputs of a row by 32 output channels in lanes) plus the bias, into
 * y's rows: each 16 channels' BLOCK x 16 turned to 16 x BLOCK in registers, a row segment of
 * `count` outputs stored per channel (`at`: output channel m0's segment; `plane`: y's channel
 * pitch). */
AVX512 static inline void store_block(__m512 acc[BLOCK][2], const float *restrict bias, int m0,
                                      int lanes, int count, float *restrict at, size_t plane)
{
    __mmask16 keep = (__mmask16)((1u << count) - 1);
    for (int h = 0; h < 2 && h * LANES < lanes; ++h) {
        __m512 r[LANES];
        __m512 b = _mm512_setzero_ps();
        if (bias) {
            int have = lanes - h * LANES < LANES ? lanes - h * LANES : LANES;
            b = _mm512_maskz_loadu_ps((__mmask16)((1u << have) - 1), bias + m0 + h * LANES);
        }
        for (int p = 0; p < LANES; ++p)
            r[p] = p >= BLOCK ? _mm512_setzero_ps() :
                bias ? _mm512_add_ps(acc[p][h], b) : acc[p][h];
        transpose16(r);
        for (int q = 0; q < LANES && h * LANES + q < lanes; ++q)
            _mm512_mask_storeu_ps(at + (size_t)(m0 + h * LANES + q) * plane, keep, r[q]);
    }
}

/* y (m, oh, ow) of one padded image (c, hp, wp): 32 output channels by 8 outputs at a time,
 * the sum over (c, a, t) in that order, then the bias added, as a GEMM's product is. */
AVX512 static void forward_image(const float *restrict pad, const float *restrict wt,
                                 const float *restrict bias, float *restrict y, int c, int hp,
                                 int wp, int m, int mpad, int kh, int kw, int oh, int ow)
{
    for (int m0 = 0; m0 < mpad; m0 += 2 * LANES) {
        for (int i = 0; i < oh; ++i) {
            for (int j0 = 0; j0 < ow; j0 += BLOCK) {
                __m512 acc[BLOCK][2];
                for (int p = 0; p < BLOCK; ++p)
                    acc[p][0] = acc[p][1] = _mm512_setzero_ps();
                for (int cc = 0; cc < c; ++cc) {
                    for (int a = 0; a < kh; ++a) {
                        const float *row = pad + ((size_t)cc * hp + i + a) * wp + j0;
                        const float *wrow = wt + (((size_t)cc * kh + a) * kw) * mpad + m0;
                        for (int t = 0; t < kw; ++t) {
                            __m512 w0 = _mm512_loadu_ps(wrow + (size_t)t * mpad);
                            __m512 w1 = _mm512_loadu_ps(wrow + (size_t)t * mpad + LANES);
                            for (int p = 0; p < BLOCK; ++p) {
                                __m512 xv = _mm512_set1_ps(row[t + p]);
                                acc[p][0] = _mm512_fmadd_ps(xv, w0, acc[p][0]);
                                acc[p][1] = _mm512_fmadd_ps(xv, w1, acc[p][1]);
                            }
                        }
                    }
                }
                int count = ow - j0 < BLOCK ? ow - j0 : BLOCK;
                int lanes = m - m0 < 2 * LANES ? m - m0 : 2 * LANES;
                store_block(acc, bias, m0, lanes, count, y + (size_t)i * ow + j0,
                            (size_t)oh * ow);
            }
        }
    }
}

/* to (positions, mpad) = from (m, positions): one image's output gradient with its channels
 * as lanes, 16 channels by 16 positions at a time transposed in registers (lanes past m
 * are 0). */
AVX512 static void lanes_of(const float *restrict from, int m, int64_t positions, int mpad,
                            float *restrict to)
{
    for (int m0 = 0; m0 < mpad; m0 += LANES)
        for (int64_t q0 = 0; q0 < positions; q0 += LANES) {
            int64_t count = positions - q0 < LANES ? positions - q0 : LANES;
            __mmask16 keep = (__mmask16)((1u << count) - 1);
            __m512 r[LANES];
            for (int k = 0; k < LANES; ++k)
                r[k] = m0 + k < m ? _mm512_maskz_loadu_ps(keep, from + (m0 + k) * positions +
                                                          q0)
                                  : _mm512_setzero_ps();
            transpose16(r);
            for (int64_t k = 0; k < count; ++k)
                _mm512_storeu_ps(to + (q0 + k) * mpad + m0, r[k]);
        }
}

/* dw (as (c, kh, kw, mpad) lanes) += the products of `taps` neighbouring taps of one tap
 * row over every output position, 32 output channels in 2 * taps registers. `taps` is a
 * constant where this is inlined, so the registers are named at compile time. */
AVX512 static inline __attribute__((always_inline)) void
filter_taps(const float *restrict row0, const float *restrict dr0, float *restrict to,
            int oh, int ow, int wp, int mpad, const int taps)
{
    __m512 acc[MAX_TAPS][2];
    for (int t = 0; t < taps; ++t)
        acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (int i = 0; i < oh; ++i) {
        const float *row = row0 + (size_t)i * wp;
        const float *dr = dr0 + (size_t)i * ow * mpad;
        for (int j = 0; j < ow; ++j) {
            __m512 d0 = _mm512_loadu_ps(dr + (size_t)j * mpad);
            __m512 d1 = _mm512_loadu_ps(dr + (size_t)j * mpad + LANES);
            for (int t = 0; t < taps; ++t) {
                __m512 xv = _mm512_set1_ps(row[j + t]);
                acc[t][0] = _mm512_fmadd_ps(xv, d0, acc[t][0]);
                acc[t][1] = _mm512_fmadd_ps(xv, d1, acc[t][1]);
            }
        }
    }
    for (int t = 0; t < taps; ++t) {
        float *at = to + (size_t)t * mpad;
        _mm512_storeu_ps(at, _mm512_add_ps(_mm512_loadu_ps(at), acc[t][0]));
        _mm512_storeu_ps(at + LANES, _mm512_add_ps(_mm512_loadu_ps(at + LANES), acc[t][1]));
    }
}

/* dw (as (c, kh, kw, mpad) lanes) += one image's products: for each tap row (c, a), its taps
 * in groups of at most MAX_TAPS, over every output position. */
AVX512 static void filter_image(const float *restrict pad, const float *restrict dyt,
                                float *restrict dwt, int c, int hp, int wp, int mpad, int kh,
                                int kw, int oh, int ow)
{
    for (int m0 = 0; m0 < mpad; m0 += 2 * LANES) {
        for (int cc = 0; cc < c; ++cc) {
            for (int a = 0; a < kh; ++a) {
                for (int t0 = 0; t0 < kw; t0 += MAX_TAPS) {
                    const float *row0 = pad + ((size_t)cc * hp + a) * wp + t0;
                    float *to = dwt + (((size_t)cc * kh + a) * kw + t0) * mpad + m0;
                    const float *dr0 = dyt + m0;
                    switch (kw - t0 < MAX_TAPS ? kw - t0 : MAX_TAPS) {
                    case 1: filter_taps(row0, dr0, to, oh, ow, wp, mpad, 1); break;
                    case 2: filter_taps(row0, dr0, to, oh, ow, wp, mpad, 2); break;
                    case 3: filter_taps(row0, dr0, to, oh, ow, wp, mpad, 3); break;
                    case 4: filter_taps(row0, dr0, to, oh, ow, wp, mpad, 4); break;
                    case 5: filter_taps(row0, dr0, to, oh, ow, wp, mpad, 5); break;
                    case 6: filter_taps(row0, dr0, to, oh, ow, wp, mpad, 6); break;
                    default: filter_taps(row0, dr0, to, oh, ow, wp, mpad, 7); break;
                    }
                }
            }
        }
    }
}
#endif

static int round_lanes(int m)
{
    return (m + 2 * LANES - 1) / (2 * LANES) * (2 * LANES);
}

/* y (n, m, oh, ow) = the convolution of x (n, c, h, w) with w (m, c, kh, kw) (+ bias, may be
 * NULL), oh = h + 2 ph - kh + 1, ow likewise. With `flip`, w is (c, m, kh, kw) and used
 * flipped in space with its first two axes swapped: the backward-data of that convolution. */
int conv_direct_forward(const float *restrict x, const float *restrict w,
                        const float *restrict bias, float *restrict y, int64_t n, int c, int h,
                        int wd, int m, int kh, int kw, int ph, int pw, int flip)
{
#if HAVE_DIRECT
    if (!conv_direct_available())
        return -2;
    int hp = h + 2 * ph, wp = wd + 2 * pw, oh = hp - kh + 1, ow = wp - kw + 1;
    int mpad = round_lanes(m);
    /* a block's last outputs may read up to BLOCK cells past a row's end: slack at the end */
    float *pad = calloc((size_t)c * hp * wp + BLOCK + kw, sizeof(float));
    float *wt = lane_weights(w, m, c, kh, kw, mpad, flip);
    if (pad == NULL || wt == NULL) {
        free(pad);
        free(wt);
        return -1;
    }
    for (int64_t im = 0; im < n; ++im) {
        pad_image(x + im * (int64_t)c * h * wd, pad, c, h, wd, ph, pw);
        forward_image(pad, wt, bias, y + im * (int64_t)m * oh * ow, c, hp, wp, m, mpad, kh, kw,
                      oh, ow);
    }
    free(pad);
    free(wt);
    return 0;
#else
    (void)x; (void)w; (void)bias; (void)y; (void)n; (void)c; (void)h; (void)wd; (void)m;
    (void)kh; (void)kw; (void)ph; (void)pw; (void)flip;
    return -2;
#endif
}

/* dw (m, c, kh, kw) += the weight gradient of conv_direct_forward from x and dy (n, m, oh,
 * ow); the images' products are summed in image order. */
int conv_direct_filter(const float *restrict x, const float *restrict dy, float *restrict dw,
                       int64_t n, int c, int h, int wd, int m, int kh, int kw, int ph, int pw)
{
#if HAVE_DIRECT
    if (!conv_direct_available())
        return -2;
    int hp = h + 2 * ph, wp = wd + 2 * pw, oh = hp - kh + 1, ow = wp - kw + 1;
    int mpad = round_lanes(m);
    float *pad = calloc((size_t)c * hp * wp + kw, sizeof(float));
    float *dyt = calloc((size_t)oh * ow * mpad, sizeof(float));
    float *dwt = calloc((size_t)c * kh * kw * mpad, sizeof(float));
    if (pad == NULL || dyt == NULL || dwt == NULL) {
        free(pad);
        free(dyt);
        free(dwt);
        return -1;
    }
    for (int64_t im = 0; im < n; ++im) {
        pad_image(x + im * (int64_t)c * h * wd, pad, c, h, wd, ph, pw);
        lanes_of(dy + im * (int64_t)m * oh * ow, m, (int64_t)oh * ow, mpad, dyt);
        filter_image(pad, dyt, dwt, c, hp, wp, mpad, kh, kw, oh, ow);
    }
    for (int mm = 0; mm < m; ++mm)
        for (int cc = 0; cc < c; ++cc)
            for (int a = 0; a < kh; ++a)
                for (int t = 0; t < kw; ++t)
                    dw[(((size_t)mm * c + cc) * kh + a) * kw + t] +=
                        dwt[(((size_t)cc * kh + a) * kw + t) * mpad + mm];
    free(pad);
    free(dyt);
    free(dwt);
    return 0;
#else
    (void)x; (void)dy; (void)dw; (void)n; (void)c; (void)h; (void)wd; (void)m; (void)kh;
    (void)kw; (void)ph; (void)pw;
    return -2;
#endif
}
