// Eltwise MAX with its argmax (SUM and PROD are vec_axpby, vec_mul and vec_div of
// math.cu). Bottoms 0 and 1 first (a tie goes to bottom 1), then each later bottom
// b = index blob takes over only where strictly greater, as the CPU layer.
#include "common.cuh"

// blob == 1: a, b are bottoms 0 and 1; blob >= 2: a is the top so far, b is bottom blob
KERNEL eltwise_max_forward(const int n, const float* a, const float* b, const int blob,
                           float* top, int* mask) {
  CUDA_KERNEL_LOOP(index, n) {
    if (blob == 1) {
      const bool first = a[index] > b[index];
      top[index] = first ? a[index] : b[index];
      mask[index] = first ? 0 : 1;
    } else if (b[index] > a[index]) {
      top[index] = b[index];
      mask[index] = blob;
    } else {
      top[index] = a[index];
    }
  }
}

KERNEL eltwise_max_backward(const int n, const float* top_diff, const int* mask,
                            const int blob, float* bottom_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    bottom_diff[index] = mask[index] == blob ? top_diff[index] : 0.0f;
  }
}
