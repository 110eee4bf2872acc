// Top-k accuracy per position of (outer, channels, inner) scores: a hit when at most top_k
// scores are >= the label's (the label's own among them), as the CPU layer counts. counts:
// 1, or 0 where the label is ignored. A label outside [0, channels) that is not ignored
// gives NaN (see softmax.cu). With per-class arrays (channels x n, zeroed by the caller; both
// may be null) the position's hit and count also go to its label's row.
#include "common.cuh"

KERNEL accuracy_forward(const int n, const float* scores, const float* label,
                        const int channels, const int inner, const int top_k,
                        const int has_ignore_label, const int ignore_label, float* hits,
                        float* counts, float* class_hits, float* class_counts) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner;
    const int s = index % inner;
    const int value = as_index(label[index]);
    if (has_ignore_label && value == ignore_label) {
      hits[index] = 0;
      counts[index] = 0;
    } else if (value < 0 || value >= channels) {
      hits[index] = quiet_nan();
      counts[index] = 0;
    } else {
      const float* column = scores + o * channels * inner + s;
      const float truth = column[value * inner];
      int at_least = 0;
      for (int c = 0; c < channels; ++c) at_least += column[c * inner] >= truth;
      const float hit = at_least <= top_k ? 1.0f : 0.0f;
      hits[index] = hit;
      counts[index] = 1;
      if (class_hits) class_hits[value * n + index] = hit;
      if (class_counts) class_counts[value * n + index] = 1;
    }
  }
}
