/* GEMMs whose columns run across a batch of images (pointwise.py), on AVX-512:
 *
 *     c[n][i, p] (+)= sum over k of a[i, k] * b[n][k, p]       (gemm_images)
 *
 * for each image n, with a read through strides (so a 1x1 convolution's weights serve as
 * they lie for the forward, and transposed for the backward-data), b and c image by image at
 * their own pitches. A 1x1 convolution of a small map is such a product with only 49 to 784
 * columns an image, where a GEMM library runs a GEMM per image slowly and one wide GEMM needs
 * the batch transposed through memory first. Here the columns of every image are one run:
 * 48 of them at a time are packed in cache (crossing images where a map ends), so the
 * transpose is the packing a GEMM makes anyway.
 *
 * Blocking: a is packed once a call, rows in panels of ROWS, zero past its last row. For each
 * block of STRIPS strips of 48 columns and each depth block of DEPTH, the block's b is packed
 * (strip, k, 48), row by row of b, and each panel of a, staying near the core, meets every
 * strip: 8 x 48 sums in 24 registers, each a broadcast of a times three vectors of b.
 * The filter gradient (gemm_images_filter) packs both sides of a depth block, transposed in
 * registers, its depth being the batch's positions.
 * Returns 0, -1 when out of memory, -2 where the CPU has no AVX-512.
 */
#define _POSIX_C_SOURCE 200112L       /* posix_memalign, pthread keys */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "avx512.h"
#if HAVE_AVX512
#include "transpose16.h"
#endif

#define ROWS 8            /* rows of a panel of a: broadcast one at a time */
#define VECS 3            /* vectors of a strip */
#define WIDTH 48          /* columns of a strip: VECS * 16 */
#define DEPTH 256         /* k of a block */
#define STRIPS 8          /* strips packed together (384 KB at most, in L2): b's rows read in
                           * runs of 384 floats */
#define DEPTH_T 128       /* depth of a block of the filter gradient (both sides packed) */

#if HAVE_AVX512
/* The calling thread's packing buffers (0: a's panels, 1: b's strips), kept from call to call
 * and grown as needed: aligned blocks of a few hundred KB made and freed at every call,
 * between numpy's own, fragmented the heap (AlexNet's peak 14 MiB higher). Freed when the
 * thread ends. */
struct packing {
    float *data[2];
    size_t size[2];
};

static pthread_key_t packing_key;
static pthread_once_t packing_once = PTHREAD_ONCE_INIT;

static void release_packing(void *p)
{
    struct packing *b = p;
    free(b->data[0]);
    free(b->data[1]);
    free(b);
}

static void make_packing_key(void)
{
    pthread_key_create(&packing_key, release_packing);
}

/* Buffer `slot` of at least `count` floats at a 64-byte boundary (the packed operands' vector
 * loads), or NULL when out of memory. */
static float *packing_buffer(int slot, size_t count)
{
    pthread_once(&packing_once, make_packing_key);
    struct packing *b = pthread_getspecific(packing_key);
    if (b == NULL) {
        b = calloc(1, sizeof(*b));
        if (b == NULL || pthread_setspecific(packing_key, b)) {
            free(b);
            return NULL;
        }
    }
    if (b->size[slot] < count) {
        void *p = NULL;
        free(b->data[slot]);
        b->data[slot] = posix_memalign(&p, 64, sizeof(float) * count) ? NULL : p;
        b->size[slot] = b->data[slot] ? count : 0;
    }
    return b->data[slot];
}

/* Where a run of columns (or depths) lies: pieces, each `len` of them from offset `at` of the
 * run, in image `image` from position `pos`; at most one more piece than the run is long. */
struct piece {
    int at, len;
    int64_t image, pos;
};

static int pieces_of(struct piece *pieces, int64_t first, int width, int64_t positions)
{
    int count = 0;
    for (int at = 0; at < width;) {
        int64_t col = first + at;
        struct piece *p = &pieces[count++];
        p->at = at;
        p->image = col / positions;
        p->pos = col % positions;
        int64_t left = positions - p->pos;
        p->len = left < width - at ? (int)left : width - at;
        at += p->len;
    }
    return count;
}

AVX512 static inline void copy_run(float *restrict dst, const float *restrict src, int len)
{
    int j = 0;
    for (; j + 16 <= len; j += 16)
        _mm512_storeu_ps(dst + j, _mm512_loadu_ps(src + j));
    if (j < len) {
        __mmask16 m = (__mmask16)((1u << (len - j)) - 1);
        _mm512_mask_storeu_ps(dst + j, m, _mm512_maskz_loadu_ps(m, src + j));
    }
}

AVX512 static inline void add_run(float *restrict dst, const float *restrict src, int len,
                                  __m512 shift, int accumulate)
{
    int j = 0;
    for (; j + 16 <= len; j += 16) {
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(src + j), shift);
        if (accumulate)
            v = _mm512_add_ps(v, _mm512_loadu_ps(dst + j));
        _mm512_storeu_ps(dst + j, v);
    }
    if (j < len) {
        __mmask16 m = (__mmask16)((1u << (len - j)) - 1);
        __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, src + j), shift);
        if (accumulate)
            v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, dst + j));
        _mm512_mask_storeu_ps(dst + j, m, v);
    }
}

/* a's rows [0, m) by its depth [0, k) as panels of ROWS rows: panel r holds, for each k, the
 * panel's ROWS values (zero past row m). */
static void pack_a(float *restrict packed, const float *restrict a, int64_t row_step,
                   int64_t col_step, int m, int k)
{
    int panels = (m + ROWS - 1) / ROWS;
    for (int r = 0; r < panels; ++r)
        for (int kk = 0; kk < k; ++kk) {
            float *dst = packed + ((size_t)r * k + kk) * ROWS;
            for (int i = 0; i < ROWS; ++i) {
                int row = r * ROWS + i;
                dst[i] = row < m ? a[row * row_step + kk * col_step] : 0.0f;
            }
        }
}

/* A block's strips of b for depths [k0, k0 + kc): strip s at packed + s * DEPTH * WIDTH,
 * (kc, WIDTH), zero past the strip's width; row by row, so that b's rows are read in runs. */
AVX512 static void pack_b(float *restrict packed, const float *restrict b, int64_t image_pitch,
                          int64_t positions, struct piece pieces[][WIDTH + 1],
                          const int *counts, const int *widths, int strips, int k0, int kc)
{
    for (int kk = 0; kk < kc; ++kk)
        for (int s = 0; s < strips; ++s) {
            float *dst = packed + ((size_t)s * DEPTH + kk) * WIDTH;
            for (int q = 0; q < counts[s]; ++q) {
                const struct piece *p = &pieces[s][q];
                copy_run(dst + p->at,
                         b + p->image * image_pitch + (k0 + kk) * positions + p->pos, p->len);
            }
            for (int j = widths[s]; j < WIDTH; ++j)
                dst[j] = 0.0f;
        }
}

/* tile (ROWS, WIDTH) = a panel (kc, ROWS) times a strip (kc, WIDTH). */
AVX512 static void panel_times_strip(const float *restrict a, const float *restrict b, int kc,
                                     float *restrict tile)
{
    __m512 acc[ROWS][VECS];
    for (int i = 0; i < ROWS; ++i)
        for (int v = 0; v < VECS; ++v)
            acc[i][v] = _mm512_setzero_ps();
    for (int kk = 0; kk < kc; ++kk) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16), b2 = _mm512_load_ps(b + 32);
        for (int i = 0; i < ROWS; ++i) {
            __m512 s = _mm512_set1_ps(a[i]);
            acc[i][0] = _mm512_fmadd_ps(s, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(s, b1, acc[i][1]);
            acc[i][2] = _mm512_fmadd_ps(s, b2, acc[i][2]);
        }
        a += ROWS;
        b += WIDTH;
    }
    for (int i = 0; i < ROWS; ++i)
        for (int v = 0; v < VECS; ++v)
            _mm512_store_ps(tile + i * WIDTH + v * 16, acc[i][v]);
}

/* c's rows [row0, row0 + rows) of the strip's columns: the tile, plus the bias on the first
 * block, added to what c holds on later blocks (and on every block when accumulating). */
AVX512 static void put_tile(const float *restrict tile, float *restrict c, int64_t image_pitch,
                            int64_t positions, const struct piece *pieces, int count, int row0,
                            int rows, const float *restrict bias, int accumulate, int ahead)
{
    for (int i = 0; i < rows; ++i) {
        __m512 shift = _mm512_set1_ps(bias ? bias[row0 + i] : 0.0f);
        float *row = NULL;
        for (int q = 0; q < count; ++q) {
            const struct piece *p = &pieces[q];
            row = c + p->image * image_pitch + (int64_t)(row0 + i) * positions + p->pos;
            add_run(row, tile + i * WIDTH + p->at, p->len, shift, accumulate);
            row += p->len;
        }
        if (ahead)      /* the row's next strip, written next: its lines on the way meanwhile */
            for (int line = 0; line < 4; ++line)
                __builtin_prefetch((const char *)row + 64 * line, 1, 3);
    }
}

AVX512 static int run(const float *a, int64_t a_row_step, int64_t a_col_step, int m, int k,
                      const float *b, int64_t b_image_pitch, float *c, int64_t c_image_pitch,
                      int64_t positions, int64_t first, int64_t last, const float *bias,
                      int accumulate)
{
    int panels = (m + ROWS - 1) / ROWS;
    float *pa = packing_buffer(0, (size_t)panels * ROWS * k);
    float *pb = packing_buffer(1, (size_t)STRIPS * DEPTH * WIDTH + ROWS * WIDTH);
    struct piece (*pieces)[WIDTH + 1] = malloc(sizeof(*pieces) * STRIPS);
    if (pa == NULL || pb == NULL || pieces == NULL) {
        free(pieces);
        return -1;
    }
    float *tile = pb + (size_t)STRIPS * DEPTH * WIDTH;
    pack_a(pa, a, a_row_step, a_col_step, m, k);
    int counts[STRIPS], widths[STRIPS];
    for (int64_t block = first; block < last; block += STRIPS * WIDTH) {
        int strips = 0;
        for (int64_t col = block; col < last && strips < STRIPS; col += WIDTH, ++strips) {
            widths[strips] = last - col < WIDTH ? (int)(last - col) : WIDTH;
            counts[strips] = pieces_of(pieces[strips], col, widths[strips], positions);
        }
        for (int k0 = 0; k0 < k; k0 += DEPTH) {
            int kc = k - k0 < DEPTH ? k - k0 : DEPTH;
            pack_b(pb, b, b_image_pitch, positions, pieces, counts, widths, strips, k0, kc);
            /* a panel of a stays near the core while the block's strips pass */
            for (int r = 0; r < panels; ++r) {
                int rows = m - r * ROWS < ROWS ? m - r * ROWS : ROWS;
                for (int s = 0; s < strips; ++s) {
                    panel_times_strip(pa + ((size_t)r * k + k0) * ROWS,
                                      pb + (size_t)s * DEPTH * WIDTH, kc, tile);
                    put_tile(tile, c, c_image_pitch, positions, pieces[s], counts[s],
                             r * ROWS, rows, k0 == 0 ? bias : NULL, accumulate || k0 > 0,
                             k0 == 0);
                }
            }
        }
    }
    free(pieces);
    return 0;
}

/* -- the filter gradient: depth runs over the batch's positions ----------------------------- */

/* rows [row0, row0 + 16) of an image's (rows, positions) array, positions [pos, pos + len)
 * (len <= 16): out[t] = the 16 rows' values at position pos + t (zero past `rows`). */
AVX512 static inline void sixteen_across(const float *restrict src, int64_t positions,
                                         int row0, int rows, int64_t pos, int len,
                                         __m512 out[16])
{
    __mmask16 m = (__mmask16)((1u << len) - 1);
    for (int i = 0; i < 16; ++i) {
        const float *at = src + (int64_t)(row0 + i) * positions + pos;
        _mm_prefetch((const char *)(at + DEPTH_T), _MM_HINT_T0);    /* the next block's */
        out[i] = row0 + i < rows ? _mm512_maskz_loadu_ps(m, at) : _mm512_setzero_ps();
    }
    transpose16(out);
}

/* The block's depths of src's rows [0, rows) in blocks of `width` rows (8: a's panels, 48: b's
 * strips), DEPTH_T * width floats apart: block r holds (kc, width), rows past `rows` zero. */
AVX512 static void pack_across(float *restrict packed, const float *restrict src,
                               int64_t image_pitch, int64_t positions, int rows, int width,
                               const struct piece *pieces, int count)
{
    const int padded = (rows + width - 1) / width * width;
    const int part = width < 16 ? width : 16;       /* lanes of a vector in one block */
    for (int row0 = 0; row0 < padded; row0 += 16)
        for (int q = 0; q < count; ++q) {
            const struct piece *p = &pieces[q];
            const float *image = src + p->image * image_pitch;
            for (int t0 = 0; t0 < p->len; t0 += 16) {
                int len = p->len - t0 < 16 ? p->len - t0 : 16;
                __m512 v[16];
                sixteen_across(image, positions, row0, rows, p->pos + t0, len, v);
                for (int h = 0; h < 16 && row0 + h < padded; h += part) {
                    /* lanes [h, h + part) land at the block's row (row0 + h) % width */
                    float *at = packed + (size_t)((row0 + h) / width) * DEPTH_T * width +
                                (row0 + h) % width - h;
                    __mmask16 lanes = (__mmask16)(((1u << part) - 1) << h);
                    for (int t = 0; t < len; ++t)
                        _mm512_mask_storeu_ps(at + (size_t)(p->at + t0 + t) * width, lanes,
                                              v[t]);
                }
            }
        }
}

AVX512 static int run_filter(const float *dy, int64_t dy_image_pitch, int m, const float *x,
                             int64_t x_image_pitch, int c, int64_t positions, int64_t first,
                             int64_t last, float *dw, int64_t dw_row_pitch)
{
    int panels = (m + ROWS - 1) / ROWS, strips = (c + WIDTH - 1) / WIDTH;
    float *pa = packing_buffer(0, (size_t)panels * ROWS * DEPTH_T);
    float *pb = packing_buffer(1, (size_t)strips * WIDTH * DEPTH_T + ROWS * WIDTH);
    if (pa == NULL || pb == NULL)
        return -1;
    float *tile = pb + (size_t)strips * WIDTH * DEPTH_T;
    struct piece pieces[DEPTH_T + 1];
    for (int64_t d0 = first; d0 < last; d0 += DEPTH_T) {
        int kc = last - d0 < DEPTH_T ? (int)(last - d0) : DEPTH_T;
        int count = pieces_of(pieces, d0, kc, positions);
        pack_across(pa, dy, dy_image_pitch, positions, m, ROWS, pieces, count);
        pack_across(pb, x, x_image_pitch, positions, c, WIDTH, pieces, count);
        for (int s = 0; s < strips; ++s) {
            int width = c - s * WIDTH < WIDTH ? c - s * WIDTH : WIDTH;
            for (int r = 0; r * ROWS < m; ++r) {
                int rows = m - r * ROWS < ROWS ? m - r * ROWS : ROWS;
                panel_times_strip(pa + (size_t)r * DEPTH_T * ROWS,
                                  pb + (size_t)s * DEPTH_T * WIDTH, kc, tile);
                for (int i = 0; i < rows; ++i)
                    add_run(dw + (int64_t)(r * ROWS + i) * dw_row_pitch + s * WIDTH,
                            tile + i * WIDTH, width, _mm512_setzero_ps(), 1);
            }
        }
    }
    return 0;
}
#endif

/* Columns [first, last) of the batch (column n * positions + p is image n's position p).
 * a[i, k] is a[i * a_row_step + k * a_col_step]; b[n][k, p] is b[n * b_image_pitch + k *
 * positions + p], c[n][i, p] likewise with c_image_pitch. bias (m values) may be NULL. */
int gemm_images(const float *a, int64_t a_row_step, int64_t a_col_step, int m, int k,
                const float *b, int64_t b_image_pitch, float *c, int64_t c_image_pitch,
                int64_t positions, int64_t first, int64_t last, const float *bias,
                int accumulate)
{
#if HAVE_AVX512
    if (cpu_has_avx512()) {
        return run(a, a_row_step, a_col_step, m, k, b, b_image_pitch, c, c_image_pitch,
                   positions, first, last, bias, accumulate);
    }
#endif
    return -2;
}

/* dw[i, j] += sum over images n in [first / positions, ...) and positions p of the columns
 * [first, last) of dy[n][i, p] * x[n][j, p]: the filter gradient of a 1x1 convolution (dw
 * rows at dw_row_pitch; dy (m rows) and x (c rows) image by image at their pitches). */
int gemm_images_filter(const float *dy, int64_t dy_image_pitch, int m, const float *x,
                       int64_t x_image_pitch, int c, int64_t positions, int64_t first,
                       int64_t last, float *dw, int64_t dw_row_pitch)
{
#if HAVE_AVX512
    if (cpu_has_avx512())
        return run_filter(dy, dy_image_pitch, m, x, x_image_pitch, c, positions, first, last,
                          dw, dw_row_pitch);
#endif
    return -2;
}
