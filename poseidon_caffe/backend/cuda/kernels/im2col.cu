// im2col and its adjoint col2im, over a whole batch: images (num, C, *in) <-> columns, rows
// ordered (channel, kernel taps) as Caffe's. Where a column lies is given by two pitches:
// row_pitch between rows, image_pitch between images. Caffe's per-image layout (num, C * taps,
// *out) has row_pitch = out and image_pitch = C * taps * out; the batch layout (C * taps,
// num, *out), one matrix whose columns are every image's outputs, has row_pitch = num * out and
// image_pitch = out (conv.py: one GEMM over the batch). 2-d kernels with the geometry as
// arguments, and N-d kernels (any number of spatial axes up to MAX_SPATIAL_AXES) that read it
// from one device array: [in shape, out shape, kernel, pad, stride, dilation], num_axes ints
// each. col2im gathers: each image element sums the column entries that read it.
#include "common.cuh"

// n = num * channels * height_col * width_col
KERNEL im2col_2d(const int n, const float* data_im, const int channels, const int height,
                 const int width, const int kernel_h, const int kernel_w, const int pad_h,
                 const int pad_w, const int stride_h, const int stride_w, const int dilation_h,
                 const int dilation_w, const int height_col, const int width_col,
                 const int row_pitch, const int image_pitch, float* data_col) {
  CUDA_KERNEL_LOOP(index, n) {
    const int w_out = index % width_col;
    const int h_index = index / width_col;
    const int h_out = h_index % height_col;
    const int channel_in = h_index / height_col;        // image * channels + channel
    const int image = channel_in / channels;
    const int row = (channel_in % channels) * kernel_h * kernel_w;
    const int h_in = h_out * stride_h - pad_h;
    const int w_in = w_out * stride_w - pad_w;
    float* col = data_col + (long long)image * image_pitch + (long long)row * row_pitch +
                 h_out * width_col + w_out;
    const float* im = data_im + ((long long)channel_in * height + h_in) * width + w_in;
    for (int i = 0; i < kernel_h; ++i) {
      for (int j = 0; j < kernel_w; ++j) {
        const int h_im = h_in + i * dilation_h;
        const int w_im = w_in + j * dilation_w;
        *col = (h_im >= 0 && w_im >= 0 && h_im < height && w_im < width)
                   ? im[i * dilation_h * width + j * dilation_w] : 0.0f;
        col += row_pitch;
      }
    }
  }
}

// n = num * channels * height * width
KERNEL col2im_2d(const int n, const float* data_col, const int channels, const int height,
                 const int width, const int kernel_h, const int kernel_w, const int pad_h,
                 const int pad_w, const int stride_h, const int stride_w, const int dilation_h,
                 const int dilation_w, const int height_col, const int width_col,
                 const int row_pitch, const int image_pitch, float* data_im) {
  CUDA_KERNEL_LOOP(index, n) {
    float val = 0;
    const int w_im = index % width + pad_w;
    const int h_im = (index / width) % height + pad_h;
    const int c_im = index / (width * height);          // image * channels + channel
    const float* col = data_col + (long long)(c_im / channels) * image_pitch;
    const int channel = c_im % channels;
    const int extent_w = (kernel_w - 1) * dilation_w + 1;
    const int extent_h = (kernel_h - 1) * dilation_h + 1;
    // the output positions whose window covers this element
    const int w_col_start = (w_im < extent_w) ? 0 : (w_im - extent_w) / stride_w + 1;
    const int w_col_end = imin(w_im / stride_w + 1, width_col);
    const int h_col_start = (h_im < extent_h) ? 0 : (h_im - extent_h) / stride_h + 1;
    const int h_col_end = imin(h_im / stride_h + 1, height_col);
    for (int h_col = h_col_start; h_col < h_col_end; ++h_col) {
      for (int w_col = w_col_start; w_col < w_col_end; ++w_col) {
        int h_k = h_im - h_col * stride_h;
        int w_k = w_im - w_col * stride_w;
        if (h_k % dilation_h == 0 && w_k % dilation_w == 0) {
          h_k /= dilation_h;
          w_k /= dilation_w;
          const long long row = (channel * kernel_h + h_k) * kernel_w + w_k;
          val += col[row * row_pitch + h_col * width_col + w_col];
        }
      }
    }
    data_im[index] = val;
  }
}

// n = num * channels * prod(out shape)
KERNEL im2col_nd(const int n, const float* data_im, const int channels, const int num_axes,
                 const int* geometry, const int row_pitch, const int image_pitch,
                 float* data_col) {
  const int* in_shape = geometry;
  const int* out_shape = geometry + num_axes;
  const int* kernel = geometry + 2 * num_axes;
  const int* pad = geometry + 3 * num_axes;
  const int* stride = geometry + 4 * num_axes;
  const int* dilation = geometry + 5 * num_axes;
  CUDA_KERNEL_LOOP(index, n) {
    int out_pos[MAX_SPATIAL_AXES];
    int rest = index;
    int in_count = 1, out_count = 1, taps = 1;
    for (int a = num_axes - 1; a >= 0; --a) {
      out_pos[a] = rest % out_shape[a];
      rest /= out_shape[a];
      in_count *= in_shape[a];
      out_count *= out_shape[a];
      taps *= kernel[a];
    }
    const int channel = rest;                            // image * channels + channel
    const int out_index = index % out_count;
    const float* im = data_im + (long long)channel * in_count;
    float* col = data_col + (long long)(channel / channels) * image_pitch +
                 (long long)(channel % channels) * taps * row_pitch + out_index;
    for (int tap = 0; tap < taps; ++tap) {
      int t = tap, offset = 0, stride_in = 1;
      bool inside = true;
      for (int a = num_axes - 1; a >= 0; --a) {
        const int k = t % kernel[a];
        t /= kernel[a];
        const int pos = out_pos[a] * stride[a] - pad[a] + k * dilation[a];
        inside = inside && pos >= 0 && pos < in_shape[a];
        offset += pos * stride_in;
        stride_in *= in_shape[a];
      }
      col[(long long)tap * row_pitch] = inside ? im[offset] : 0.0f;
    }
  }
}

// n = num * channels * prod(in shape)
KERNEL col2im_nd(const int n, const float* data_col, const int channels, const int num_axes,
                 const int* geometry, const int row_pitch, const int image_pitch,
                 float* data_im) {
  const int* in_shape = geometry;
  const int* out_shape = geometry + num_axes;
  const int* kernel = geometry + 2 * num_axes;
  const int* pad = geometry + 3 * num_axes;
  const int* stride = geometry + 4 * num_axes;
  const int* dilation = geometry + 5 * num_axes;
  CUDA_KERNEL_LOOP(index, n) {
    int im_pos[MAX_SPATIAL_AXES], start[MAX_SPATIAL_AXES], end[MAX_SPATIAL_AXES];
    int pos[MAX_SPATIAL_AXES];
    int rest = index;
    int taps = 1;
    bool empty = false;
    for (int a = num_axes - 1; a >= 0; --a) {
      im_pos[a] = rest % in_shape[a] + pad[a];
      rest /= in_shape[a];
      const int extent = (kernel[a] - 1) * dilation[a] + 1;
      start[a] = im_pos[a] < extent ? 0 : (im_pos[a] - extent) / stride[a] + 1;
      end[a] = imin(im_pos[a] / stride[a] + 1, out_shape[a]);
      empty = empty || start[a] >= end[a];
      pos[a] = start[a];
      taps *= kernel[a];
    }
    const float* col = data_col + (long long)(rest / channels) * image_pitch;
    const int channel = rest % channels;
    float val = 0;
    // walk every output position in [start, end) on each axis, last axis fastest
    while (!empty) {
      bool on_tap = true;
      int tap = 0, out_index = 0;
      for (int a = 0; a < num_axes; ++a) {
        const int k = im_pos[a] - pos[a] * stride[a];
        on_tap = on_tap && k % dilation[a] == 0;
        tap = tap * kernel[a] + k / dilation[a];
        out_index = out_index * out_shape[a] + pos[a];
      }
      if (on_tap) val += col[(long long)(channel * taps + tap) * row_pitch + out_index];
      int a = num_axes - 1;
      while (a >= 0 && ++pos[a] == end[a]) {
        pos[a] = start[a];
        --a;
      }
      empty = a < 0;
    }
    data_im[index] = val;
  }
}
