/* Softmax over (outer, channels, inner), and SoftmaxWithLoss's loss and gradient, in Caffe's
 * arithmetic (softmax_layer.cpp, softmax_loss_layer.cpp):
 *
 *     y = exp(x - max over channels) / its sum over channels
 *     loss = -sum log(max(p[label], FLT_MIN)) over the labels not ignored, count of them
 *     dx = scale (p - onehot(label)), zero where the label is ignored
 *
 * numpy made these of a dozen passes and temporaries each (a 32 x 1000 loss took 0.4 ms, a
 * tenth of the memory's rate); here each is one or two passes. AVX-512, or AVX2 with FMA (an
 * AMD EPYC's: the same exp, 8 lanes a vector), only (the callers take numpy's path elsewhere):
 * exp is a vector of its own, within 2 ulp of the exact value (numpy's is within 1-2 ulp as
 * well, and Caffe's expf within 1). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "avx2.h"
#include "vector_loop.h"

#if HAVE_AVX2
#define AVX2_FMA __attribute__((target("avx2,fma")))
#endif

/* Whether the CPU has AVX2 and FMA, the 8-lane passes' (asked once). */
static int cpu_has_avx2_fma(void)
{
#if HAVE_AVX2
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = cpu_has_avx2() && __builtin_cpu_supports("fma") ? 1 : 0;
    }
    return known;
#else
    return 0;
#endif
}

int softmax_available(void)
{
    return cpu_has_avx512() || cpu_has_avx2_fma();
}

#if HAVE_AVX512
/* exp(t) for t <= 0 (and NaN, which passes): t = n ln2 + r with |r| <= ln2 / 2, e^r by its
 * series to r^7 (the rest below 1e-8 relative), times 2^n by scalef, which rounds the
 * results below FLT_MIN to their denormals and those below half the least to 0 as expf. */
AVX512 static inline __m512 exp16(__m512 t)
{
    /* below -104 e^t is 0 in float; max(lo, t) returns t where t is NaN */
    t = _mm512_max_ps(_mm512_set1_ps(-104.0f), t);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), t);     /* ln2's high part */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);          /* and its low */
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* One row of channels (inner 1). The max propagates a NaN as numpy's does: then every value
 * of the row is NaN. */
AVX512 static void softmax_row(const float *x, float *y, int64_t channels)
{
    const __m512 lowest = _mm512_set1_ps(-INFINITY);
    __m512 top = lowest;
    __mmask16 nan = 0;
    for (int64_t c = 0; c < channels; c += 16) {
        const __m512 v = _mm512_mask_loadu_ps(lowest, first_lanes(channels - c), x + c);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        top = _mm512_max_ps(top, v);
    }
    const float most = nan ? NAN : _mm512_reduce_max_ps(top);
    const __m512 shift = _mm512_set1_ps(most);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < channels; c += 16) {
        const __mmask16 m = first_lanes(channels - c);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + c), shift));
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
        _mm512_mask_storeu_ps(y + c, m, e);
    }
    const __m512 total = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
    for (int64_t c = 0; c < channels; c += 16) {
        const __mmask16 m = first_lanes(channels - c);
        _mm512_mask_storeu_ps(y + c, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, y + c), total));
    }
}

/* One outer slice of channels x inner (inner > 1): each pass runs along inner, its vectors
 * 16 positions; most and sum hold a value per position. */
AVX512 static void softmax_plane(const float *x, float *y, int64_t channels, int64_t inner,
                                 float *most, float *sum)
{
    const __m512 lowest = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < inner; i += 16) {
        const __mmask16 m = first_lanes(inner - i);
        __m512 top = lowest;
        __mmask16 nan = 0;
        for (int64_t c = 0; c < channels; ++c) {
            const __m512 v = _mm512_maskz_loadu_ps(m, x + c * inner + i);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            top = _mm512_max_ps(top, v);
        }
        top = _mm512_mask_mov_ps(top, nan, _mm512_set1_ps(NAN));
        _mm512_mask_storeu_ps(most + i, m, top);
        _mm512_mask_storeu_ps(sum + i, m, _mm512_setzero_ps());
    }
    for (int64_t c = 0; c < channels; ++c)
        for (int64_t i = 0; i < inner; i += 16) {
            const __mmask16 m = first_lanes(inner - i);
            const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + c * inner + i),
                                                 _mm512_maskz_loadu_ps(m, most + i)));
            _mm512_mask_storeu_ps(y + c * inner + i, m, e);
            _mm512_mask_storeu_ps(sum + i, m,
                                  _mm512_add_ps(_mm512_maskz_loadu_ps(m, sum + i), e));
        }
    for (int64_t c = 0; c < channels; ++c)
        for (int64_t i = 0; i < inner; i += 16) {
            const __mmask16 m = first_lanes(inner - i);
            float *row = y + c * inner + i;
            _mm512_mask_storeu_ps(row, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, row),
                                                        _mm512_maskz_loadu_ps(m, sum + i)));
        }
}
#endif

#if HAVE_AVX2
/* exp16 on AVX2 with FMA, 8 lanes: the same reduction and series; 2^n (n in [-150, 0]) as
 * two exact powers of two, 2^(n >> 1) then 2^(n - (n >> 1)), each at least 2^-75, so the
 * product rounds once, at the second, into the denormals as scalef's does. */
AVX2_FMA static inline __m256 exp8(__m256 t)
{
    t = _mm256_max_ps(_mm256_set1_ps(-104.0f), t);      /* returns t where t is NaN */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), t);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i whole = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(whole, 1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 first = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
    const __m256 second = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(whole, half), bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, first), second);
}

AVX2_FMA static inline float lanes_max8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

AVX2_FMA static inline float lanes_sum8(__m256 v)
{
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(m, _mm_shuffle_ps(m, m, 1)));
}

/* softmax_row on AVX2: whole vectors loaded plainly and a row's last, short one masked
 * (once a row: an AMD's masked load and blend, in every step of the first two passes, made
 * the row a quarter slower; its masked store takes tens of cycles); the maximum kept in two
 * vectors, 16 channels a step (one unordered compare finds a NaN in either). */
AVX2_FMA static void softmax_row8(const float *x, float *y, int64_t channels)
{
    const __m256 lowest = _mm256_set1_ps(-INFINITY);
    __m256 top = lowest, top2 = lowest, nan = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= channels; c += 16) {
        const __m256 v = _mm256_loadu_ps(x + c), u = _mm256_loadu_ps(x + c + 8);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, u, _CMP_UNORD_Q));
        top = _mm256_max_ps(top, v);
        top2 = _mm256_max_ps(top2, u);
    }
    for (; c < channels; c += 8) {
        const __m256i m = first_lanes8(channels - c);
        const __m256 v = _mm256_blendv_ps(lowest, _mm256_maskload_ps(x + c, m),
                                          _mm256_castsi256_ps(m));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        top = _mm256_max_ps(top, v);
    }
    const float most = _mm256_movemask_ps(nan) ? NAN : lanes_max8(_mm256_max_ps(top, top2));
    const __m256 shift = _mm256_set1_ps(most);
    __m256 sum = _mm256_setzero_ps();
    for (c = 0; c < channels; c += 8) {
        if (c + 8 <= channels) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c), shift));
            sum = _mm256_add_ps(sum, e);
            _mm256_storeu_ps(y + c, e);
        } else {
            const __m256i m = first_lanes8(channels - c);
            const __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(x + c, m), shift));
            sum = _mm256_add_ps(sum, _mm256_and_ps(_mm256_castsi256_ps(m), e));
            _mm256_maskstore_ps(y + c, m, e);
        }
    }
    const __m256 total = _mm256_set1_ps(lanes_sum8(sum));
    for (c = 0; c < channels; c += 8) {
        if (c + 8 <= channels) {
            _mm256_storeu_ps(y + c, _mm256_div_ps(_mm256_loadu_ps(y + c), total));
        } else {
            const __m256i m = first_lanes8(channels - c);
            _mm256_maskstore_ps(y + c, m, _mm256_div_ps(_mm256_maskload_ps(y + c, m), total));
        }
    }
}

/* softmax_plane on AVX2, 8 positions a vector (most and sum padded to whole vectors) */
AVX2_FMA static void softmax_plane8(const float *x, float *y, int64_t channels, int64_t inner,
                                    float *most, float *sum)
{
    const __m256 lowest = _mm256_set1_ps(-INFINITY);
    for (int64_t i = 0; i < inner; i += 8) {
        const __m256i m = first_lanes8(inner - i);
        __m256 top = lowest, nan = _mm256_setzero_ps();
        for (int64_t c = 0; c < channels; ++c) {
            const __m256 v = _mm256_maskload_ps(x + c * inner + i, m);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            top = _mm256_max_ps(top, v);
        }
        _mm256_storeu_ps(most + i, _mm256_blendv_ps(top, _mm256_set1_ps(NAN), nan));
        _mm256_storeu_ps(sum + i, _mm256_setzero_ps());
    }
    for (int64_t c = 0; c < channels; ++c)
        for (int64_t i = 0; i < inner; i += 8) {
            const __m256i m = first_lanes8(inner - i);
            const __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(x + c * inner + i, m),
                                                _mm256_loadu_ps(most + i)));
            _mm256_maskstore_ps(y + c * inner + i, m, e);
            _mm256_storeu_ps(sum + i, _mm256_add_ps(_mm256_loadu_ps(sum + i), e));
        }
    for (int64_t c = 0; c < channels; ++c)
        for (int64_t i = 0; i < inner; i += 8) {
            const __m256i m = first_lanes8(inner - i);
            float *row = y + c * inner + i;
            _mm256_maskstore_ps(row, m, _mm256_div_ps(_mm256_maskload_ps(row, m),
                                                      _mm256_loadu_ps(sum + i)));
        }
}
#endif

/* y (may be x) = softmax of x along channels. Returns 0, or -1 without AVX-512 or AVX2 with
 * FMA, or memory. */
int softmax_forward(const float *x, float *y, int64_t outer, int64_t channels, int64_t inner)
{
#if HAVE_AVX512
    const int wide = cpu_has_avx512();
    if (!wide && !cpu_has_avx2_fma())
        return -1;
    if (inner == 1) {
        for (int64_t o = 0; o < outer; ++o)
            if (wide)
                softmax_row(x + o * channels, y + o * channels, channels);
            else
                softmax_row8(x + o * channels, y + o * channels, channels);
        return 0;
    }
    float *scratch = malloc(2 * ((size_t)inner + 8) * sizeof(float));
    if (scratch == NULL)
        return -1;
    for (int64_t o = 0; o < outer; ++o)
        if (wide)
            softmax_plane(x + o * channels * inner, y + o * channels * inner, channels, inner,
                          scratch, scratch + inner + 8);
        else
            softmax_plane8(x + o * channels * inner, y + o * channels * inner, channels, inner,
                           scratch, scratch + inner + 8);
    free(scratch);
    return 0;
#else
    (void)x, (void)y, (void)outer, (void)channels, (void)inner;
    return -1;
#endif
}

/* A label as numpy's astype(int64) makes it (toward zero; NaN and beyond int64: its least
 * value, a class of no layer). */
static int64_t label_int(float label)
{
    return fabsf(label) < 9.2e18f ? (int64_t)label : INT64_MIN;
}

/* out[0] = sum of -log(max(p[label], FLT_MIN)) over the labels not ignored (in double, each
 * log in float as numpy's), out[1] = their count. Returns 1 where one of them is out of
 * [0, channels) (out[0] is then not summed), else 0. */
int softmax_loss_forward(const float *prob, const float *labels, int64_t outer,
                         int64_t channels, int64_t inner, int has_ignore, int64_t ignore,
                         double *out)
{
    double loss = 0.0, count = 0.0;
    int bad = 0;
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
            const int64_t k = label_int(labels[o * inner + i]);
            if (has_ignore && k == ignore)
                continue;
            count += 1.0;
            if (k < 0 || k >= channels) {
                bad = 1;
                continue;
            }
            const float p = prob[(o * channels + k) * inner + i];
            loss -= (double)logf(p < FLT_MIN ? FLT_MIN : p);     /* std::max: NaN passes */
        }
    out[0] = loss;
    out[1] = count;
    return bad;
}

/* One row of channels' gradient (inner 1); d may be p. */
VECTOR_LOOP
static void gradient_row(const float *p, float *d, int64_t channels, int64_t hot, float keep,
                         float scale)
{
    for (int64_t c = 0; c < channels; ++c)
        d[c] = (p[c] - (c == hot ? 1.0f : 0.0f)) * keep * scale;
}

/* dx = scale ((prob - onehot(label)) times 0 where the label is ignored, 1 elsewhere), in
 * numpy's order of products (a NaN stays NaN); dx may be prob. An ignored label's one-hot is
 * class 0's, one out of range has none, as numpy's. */
int softmax_loss_backward(const float *prob, const float *labels, int64_t outer,
                          int64_t channels, int64_t inner, int has_ignore, int64_t ignore,
                          float scale, float *dx)
{
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
            const int64_t k = label_int(labels[o * inner + i]);
            const int ignored = has_ignore && k == ignore;
            const int64_t hot = ignored ? 0 : k;
            const float keep = ignored ? 0.0f : 1.0f;
            const float *p = prob + o * channels * inner + i;
            float *d = dx + o * channels * inner + i;
            if (inner == 1) {
                gradient_row(p, d, channels, hot, keep, scale);
                continue;
            }
            for (int64_t c = 0; c < channels; ++c)
                d[c * inner] = (p[c * inner] - (c == hot ? 1.0f : 0.0f)) * keep * scale;
        }
    return 0;
}
