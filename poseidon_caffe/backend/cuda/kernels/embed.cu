// Embed: each index of the bottom selects a row of W (input_dim, num_output). An index that
// is not an integer in [0, input_dim) gives a NaN row (the layer reports it).
#include "common.cuh"

// n = count(indices) * num_output; bias may be null
KERNEL embed_forward(const int n, const float* indices, const float* weight,
                     const int input_dim, const int num_output, const float* bias,
                     float* top) {
  CUDA_KERNEL_LOOP(index, n) {
    const int m = index / num_output;
    const int d = index % num_output;
    const float value = indices[m];
    const int row = as_index(value);
    if ((float)row != value || row < 0 || row >= input_dim) {
      top[index] = quiet_nan();
    } else {
      top[index] = bias ? weight[row * num_output + d] + bias[d] : weight[row * num_output + d];
    }
  }
}

// n = input_dim * num_output: each weight gathers the top gradients of the positions that
// chose its row, in position order, into its diff (race free, no atomics)
KERNEL embed_backward(const int n, const float* indices, const float* top_diff,
                      const int count, const int num_output, float* weight_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    const int row = index / num_output;
    const int d = index % num_output;
    float sum = weight_diff[index];
    for (int m = 0; m < count; ++m) {
      if (indices[m] == (float)row) sum += top_diff[m * num_output + d];
    }
    weight_diff[index] = sum;
  }
}
