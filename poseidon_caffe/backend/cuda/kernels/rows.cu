// Items picked along axis 0 (Filter, BatchReindex): each row of inner values, rows named by
// a float index array (as the layers' index bottoms hold them).
#include "common.cuh"

// n = count * inner: y row t = x row rows[t]
KERNEL rows_gather(const int n, const float* x, const float* rows, const int inner, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[as_index(rows[i / inner]) * inner + i % inner]; }
}

// n = (bottom rows) * inner: dx row r = the sum, in order, of the dy rows t with rows[t] = r
// (0 for a row nobody picked); gathered per element, so no atomics
KERNEL rows_scatter_add(const int n, const float* dy, const float* rows, const int count,
                        const int inner, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int r = i / inner, d = i % inner;
    float sum = 0.0f;
    for (int t = 0; t < count; ++t) {
      if (as_index(rows[t]) == r) sum += dy[t * inner + d];
    }
    dx[i] = sum;
  }
}
