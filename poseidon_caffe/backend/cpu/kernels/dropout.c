/* Inverted dropout's map, y = x scale where index i's draw keeps it, else x times 0: the
 * counter hash of (key, i) that every backend draws with (backend/dropout_bits.py; the CUDA
 * kernel dropout_apply in neuron.cu is the same function), so nothing is drawn into an
 * array and backward recomputes the mask from the key. */
#include <stdint.h>

#include "vector_loop.h"

static inline uint32_t mix(uint32_t v)
{
    v ^= v >> 16;
    v *= 0x85ebca6bu;
    v ^= v >> 13;
    v *= 0xc2b2ae35u;
    v ^= v >> 16;
    return v;
}

/* Indices [start, start + n) of x and y (int32, as the CUDA kernel's); y may be x (Caffe's
 * in-place Dropout), so no restrict. */
VECTOR_LOOP
static void apply(const float *x, float *y, int32_t start, int32_t n,
                  uint32_t key0, uint32_t key1, uint32_t threshold, float scale)
{
    for (int32_t i = 0; i < n; ++i) {
        uint32_t bits = mix(mix((uint32_t)(start + i) ^ key0) ^ key1);
        y[i] = x[i] * ((bits >> 8) >= threshold ? 1.0f : 0.0f) * scale;
    }
}

int dropout_apply(const float *x, float *y, int32_t start, int32_t n, uint32_t key0,
                  uint32_t key1, uint32_t threshold, float scale)
{
    apply(x + start, y + start, start, n, key0, key1, threshold, scale);
    return 0;
}
