// RNN, LSTM and LSTMUnit (layers/recurrent.py): the per-step elementwise work between the
// cuBLAS GEMMs, in the CPU formulas' order of operations. Rows are the N streams of H units.
#include "common.cuh"

DEVICE float sigmoid_of(const float x) { return 0.5f * tanhf(0.5f * x) + 0.5f; }

// y (N, H) = x scaled per row by c (N): cont_t h_{t-1}, or a gradient through it
KERNEL rows_scale(const int n, const float* x, const float* c, const int hidden, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[i] * c[i / hidden]; }
}

// n = N * H. gates (N, 4H) pre-activations in (i, f, o, g) blocks; writes c, h, the
// activations (N, 4H: this index's four) and tanh(c) that backward reads
KERNEL lstm_unit_forward(const int n, const float* c_prev, const float* gates,
                         const float* cont, const int hidden, float* c, float* h, float* acts,
                         float* tanh_c) {
  CUDA_KERNEL_LOOP(i, n) {
    const int row = i / hidden, d = i % hidden;
    const float* g4 = gates + row * 4 * hidden;
    float* a4 = acts + row * 4 * hidden;
    const float ig = sigmoid_of(g4[d]);
    const float fg = sigmoid_of(g4[hidden + d]);
    const float og = sigmoid_of(g4[2 * hidden + d]);
    const float gg = tanhf(g4[3 * hidden + d]);
    a4[d] = ig;
    a4[hidden + d] = fg;
    a4[2 * hidden + d] = og;
    a4[3 * hidden + d] = gg;
    const float cv = (cont[row] * fg) * c_prev[i] + ig * gg;
    const float t = tanhf(cv);
    c[i] = cv;
    tanh_c[i] = t;
    h[i] = og * t;
  }
}

// n = N * H: d c_prev and this index's four gate gradients (the forget gate's scaled by cont)
KERNEL lstm_unit_backward(const int n, const float* c_prev, const float* cont,
                          const float* acts, const float* tanh_c, const float* dc,
                          const float* dh, const int hidden, float* dc_prev, float* dgates) {
  CUDA_KERNEL_LOOP(i, n) {
    const int row = i / hidden, d = i % hidden;
    const float* a4 = acts + row * 4 * hidden;
    float* d4 = dgates + row * 4 * hidden;
    const float ig = a4[d], fg = a4[hidden + d], og = a4[2 * hidden + d];
    const float gg = a4[3 * hidden + d];
    const float t = tanh_c[i], k = cont[row], dhv = dh[i];
    const float c_term = dc[i] + dhv * og * (1.0f - t * t);
    dc_prev[i] = c_term * (k * fg);
    d4[d] = c_term * gg * ig * (1.0f - ig);
    d4[hidden + d] = c_term * c_prev[i] * k * fg * (1.0f - fg);
    d4[2 * hidden + d] = dhv * t * og * (1.0f - og);
    d4[3 * hidden + d] = c_term * ig * (1.0f - gg * gg);
  }
}
