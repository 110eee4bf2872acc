// PReLU: y = x where x > 0, else slope x, with one slope per channel of (N, C, inner) or one
// shared slope (channels = 1 and inner = C * rest then give every index slope 0). The slopes'
// gradient is reduced by BLAS from the per-element terms prelu_slope_terms writes.
#include "common.cuh"

KERNEL prelu_forward(const int n, const float* x, float* y, const float* slopes,
                     const int channels, const int inner) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    y[i] = v > 0 ? v : slopes[(i / inner) % channels] * v;
  }
}

KERNEL prelu_backward(const int n, const float* dy, const float* x, float* dx,
                      const float* slopes, const int channels, const int inner) {
  CUDA_KERNEL_LOOP(i, n) {
    dx[i] = dy[i] * (x[i] <= 0 ? slopes[(i / inner) % channels] : 1.0f);
  }
}

// terms = dy x where x <= 0, else 0: summed per channel they are the slopes' gradient
KERNEL prelu_slope_terms(const int n, const float* dy, const float* x, float* terms) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    terms[i] = v <= 0 ? dy[i] * v : 0.0f;
  }
}
