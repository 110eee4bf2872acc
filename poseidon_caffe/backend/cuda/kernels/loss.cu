// The loss layers other than SoftmaxWithLoss (layers/loss.py): per-item losses the backend
// sums with BLAS, and per-element gradients the caller scales by loss_weight / normalizer.
// Sums the CPU layers take in double are taken in double here too. A label out of range (and
// not ignored) gives a NaN loss, so the layer finds and names it on the host; nothing is read
// back on a normal pass.
#include "common.cuh"

// HingeLoss, x as (num, dim): margin = max(0, 1 - s x), s = +1 at the item's label, else -1
KERNEL hinge_forward(const int n, const float* x, const float* labels, const int dim,
                     float* margin) {
  CUDA_KERNEL_LOOP(i, n) {
    const int label = as_index(labels[i / dim]);
    if (label < 0 || label >= dim) {
      margin[i] = quiet_nan();
    } else {
      const float s = (i % dim) == label ? 1.0f : -1.0f;
      const float v = 1.0f - s * x[i];
      margin[i] = v < 0.0f ? 0.0f : v;    // a NaN input stays NaN, as np.maximum keeps it
    }
  }
}

// L2: dx = -2 margin s scale; L1: dx = -sign(margin) s scale
KERNEL hinge_backward(const int n, const float* margin, const float* labels, const int dim,
                      const int l2, const float scale, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float s = (i % dim) == as_index(labels[i / dim]) ? 1.0f : -1.0f;
    const float m = margin[i];
    const float g = l2 ? -2.0f * m * s : -(float)((m > 0) - (m < 0)) * s;
    dx[i] = g * scale;
  }
}

// ContrastiveLoss, n = num pairs of dim features: the squared distance and the pair's loss
// (similar: d^2; else max(margin - d, 0)^2, or max(margin - d^2, 0) in the legacy version)
KERNEL contrastive_forward(const int n, const float* a, const float* b, const float* similar,
                           const int dim, const float margin, const int legacy,
                           float* dist_sq, float* loss) {
  CUDA_KERNEL_LOOP(i, n) {
    double d2 = 0.0;
    for (int k = 0; k < dim; ++k) {
      const double d = (double)(a[i * dim + k] - b[i * dim + k]);
      d2 += d * d;
    }
    dist_sq[i] = (float)d2;
    if (as_index(similar[i]) != 0) {
      loss[i] = (float)d2;
    } else if (legacy) {
      loss[i] = (float)fmax((double)margin - d2, 0.0);
    } else {
      const double m = fmax((double)margin - sqrt(d2), 0.0);
      loss[i] = (float)(m * m);
    }
  }
}

// n = num * dim; dx = alpha w (a - b), w = 1 for a similar pair, else the dissimilar term's
// derivative over (a - b) (Caffe's 1e-4 keeps it finite at d = 0)
KERNEL contrastive_backward(const int n, const float* a, const float* b, const float* similar,
                            const float* dist_sq, const int dim, const float margin,
                            const int legacy, const float alpha, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int pair = i / dim;
    double w = 1.0;
    if (as_index(similar[pair]) == 0) {
      if (legacy) {
        w = ((double)margin - (double)dist_sq[pair]) > 0 ? -1.0 : 0.0;
      } else {
        const double dist = sqrt((double)dist_sq[pair]);
        const double mdist = (double)margin - dist;
        w = mdist > 0 ? -mdist / (dist + 1e-4) : 0.0;
      }
    }
    dx[i] = (float)((double)alpha * w * (double)(a[i] - b[i]));
  }
}

// InfogainLoss, n = outer * inner: -sum_c H[label, c] log(max(prob_c, 1e-20)); counts 1 or 0
KERNEL infogain_forward(const int n, const float* prob, const float* labels, const float* h,
                        const int channels, const int inner, const int has_ignore_label,
                        const int ignore_label, float* loss, float* counts) {
  CUDA_KERNEL_LOOP(i, n) {
    const int o = i / inner, s = i % inner;
    const int label = as_index(labels[i]);
    if (has_ignore_label && label == ignore_label) {
      loss[i] = 0.0f;
      counts[i] = 0.0f;
    } else if (label < 0 || label >= channels) {
      loss[i] = quiet_nan();
      counts[i] = 1.0f;
    } else {
      double sum = 0.0;
      for (int c = 0; c < channels; ++c) {
        const float p = prob[(o * channels + c) * inner + s];
        sum += (double)h[label * channels + c] * (double)logf(fmaxf(p, 1e-20f));
      }
      loss[i] = (float)(-sum);
      counts[i] = 1.0f;
    }
  }
}

// n = outer * channels * inner: dx = (prob sum_k H[label, k] - H[label, c]) scale, 0 where
// the label is ignored
KERNEL infogain_backward(const int n, const float* prob, const float* labels, const float* h,
                         const int channels, const int inner, const int has_ignore_label,
                         const int ignore_label, const float scale, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int s = i % inner, c = (i / inner) % channels, o = i / (inner * channels);
    const int label = as_index(labels[o * inner + s]);
    if ((has_ignore_label && label == ignore_label) || label < 0 || label >= channels) {
      dx[i] = 0.0f;
    } else {
      float row = 0.0f;
      for (int k = 0; k < channels; ++k) row += h[label * channels + k];
      dx[i] = (prob[i] * row - h[label * channels + c]) * scale;
    }
  }
}

// MultinomialLogisticLoss, prob as (num, dim), n = num: -log(max(p[label], 1e-20))
KERNEL multinomial_logistic_forward(const int n, const float* prob, const float* labels,
                                    const int dim, float* loss) {
  CUDA_KERNEL_LOOP(i, n) {
    const int label = as_index(labels[i]);
    if (label < 0 || label >= dim) {
      loss[i] = quiet_nan();
    } else {
      loss[i] = (float)(-log((double)fmaxf(prob[i * dim + label], 1e-20f)));
    }
  }
}

// n = num * dim: dx = -scale / max(p, 1e-20) at the label, else 0
KERNEL multinomial_logistic_backward(const int n, const float* prob, const float* labels,
                                     const int dim, const float scale, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    dx[i] = (i % dim) == as_index(labels[i / dim]) ? -scale / fmaxf(prob[i], 1e-20f) : 0.0f;
  }
}

// SigmoidCrossEntropyLoss: -[t log s(x) + (1 - t) log(1 - s(x))] in the form where exp never
// overflows; 0 (and count 0) where the target equals the ignored label
KERNEL sigmoid_cross_entropy_forward(const int n, const float* x, const float* target,
                                     const int has_ignore_label, const int ignore_label,
                                     float* loss, float* counts) {
  CUDA_KERNEL_LOOP(i, n) {
    if (has_ignore_label && as_index(target[i]) == ignore_label) {
      loss[i] = 0.0f;
      counts[i] = 0.0f;
    } else {
      const double v = (double)x[i];
      const double positive = v >= 0 ? 1.0 : 0.0;
      loss[i] = (float)(-(v * ((double)target[i] - positive) -
                          log1p(exp(v - 2.0 * v * positive))));
      counts[i] = 1.0f;
    }
  }
}

KERNEL sigmoid_cross_entropy_backward(const int n, const float* x, const float* target,
                                      const int has_ignore_label, const int ignore_label,
                                      const float scale, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    if (has_ignore_label && as_index(target[i]) == ignore_label) {
      dx[i] = 0.0f;
    } else {
      const float s = 0.5f * (1.0f + tanhf(0.5f * x[i]));
      dx[i] = (s - target[i]) * scale;
    }
  }
}
