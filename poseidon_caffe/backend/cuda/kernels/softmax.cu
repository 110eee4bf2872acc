// Softmax over the channel axis of an (outer, channels, inner) array in Caffe's steps:
// channel max, subtract, exp (vec_exp in math.cu), channel sum, divide; its backward uses
// channel_dot. SoftmaxWithLoss's per-position loss and gradient, with ignore_label: the
// caller sums loss and counts (cuBLAS sasum) and applies the normalisation. A label outside
// [0, channels) that is not ignored gives a NaN loss (and NaN gradient), so the layer can
// find it and report it without reading the labels back on every pass.
#include "common.cuh"

// n = outer * inner
KERNEL channel_max(const int n, const float* data, const int channels, const int inner,
                   float* out) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner;
    const int s = index % inner;
    const float* column = data + o * channels * inner + s;
    float best = -FLT_MAX;
    for (int c = 0; c < channels; ++c) best = fmaxf(column[c * inner], best);
    out[index] = best;
  }
}

// n = outer * channels * inner; data -= per-position value
KERNEL channel_subtract(const int n, const int channels, const int inner,
                        const float* per_position, float* data) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / channels / inner;
    const int s = index % inner;
    data[index] -= per_position[o * inner + s];
  }
}

KERNEL channel_sum(const int n, const float* data, const int channels, const int inner,
                   float* out) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner;
    const int s = index % inner;
    const float* column = data + o * channels * inner + s;
    float sum = 0;
    for (int c = 0; c < channels; ++c) sum += column[c * inner];
    out[index] = sum;
  }
}

KERNEL channel_div(const int n, const int channels, const int inner,
                   const float* per_position, float* data) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / channels / inner;
    const int s = index % inner;
    data[index] /= per_position[o * inner + s];
  }
}

KERNEL channel_dot(const int n, const float* a, const float* b, const int channels,
                   const int inner, float* out) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner;
    const int s = index % inner;
    const int start = o * channels * inner + s;
    float dot = 0;
    for (int c = 0; c < channels; ++c) dot += a[start + c * inner] * b[start + c * inner];
    out[index] = dot;
  }
}

// n = outer * inner; loss = -log(max(prob of the label, FLT_MIN)); counts: 1 or 0 (ignored)
KERNEL softmax_loss_forward(const int n, const float* prob, const float* label,
                            const int channels, const int inner, const int has_ignore_label,
                            const int ignore_label, float* loss, float* counts) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner;
    const int s = index % inner;
    const int value = as_index(label[index]);
    if (has_ignore_label && value == ignore_label) {
      loss[index] = 0;
      counts[index] = 0;
    } else if (value < 0 || value >= channels) {
      loss[index] = quiet_nan();
      counts[index] = 0;
    } else {
      loss[index] = -logf(fmaxf(prob[(o * channels + value) * inner + s], FLT_MIN));
      counts[index] = 1;
    }
  }
}

// n = outer * inner; diff holds prob on entry and prob - onehot(label) on exit, zero where
// ignored; the caller scales it by loss_weight / normalizer
KERNEL softmax_loss_backward(const int n, const float* label, const int channels,
                             const int inner, const int has_ignore_label,
                             const int ignore_label, float* diff, float* counts) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner;
    const int s = index % inner;
    const int value = as_index(label[index]);
    float* column = diff + o * channels * inner + s;
    if (has_ignore_label && value == ignore_label) {
      for (int c = 0; c < channels; ++c) column[c * inner] = 0;
      counts[index] = 0;
    } else if (value < 0 || value >= channels) {
      for (int c = 0; c < channels; ++c) column[c * inner] = quiet_nan();
      counts[index] = 0;
    } else {
      column[value * inner] -= 1.0f;
      counts[index] = 1;
    }
  }
}
