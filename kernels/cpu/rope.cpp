// Rotary position embedding, half-split layout as in transformers (rotate_half).
// Angles are formed in f32 (pos * inv_freq) as transformers does, so positions far
// into the context round the same way as the reference.
// Rows are split over the rank's threads (threads_for) when the work pays for it; each
// element is rotated by one thread, so results do not depend on the thread count.
#include <cmath>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/threads.h"

namespace linnet::cpu {

void rope_inv_freq(double theta, int64_t head_dim, float* out) {
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    out[i] = 1.0f / std::pow(base, e);
  }
}

void rope(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
          const int32_t* positions, const float* inv_freq) {
  const int64_t half = head_dim / 2;
#pragma omp parallel for num_threads(threads_for(rows * n_heads * head_dim)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float pos = static_cast<float>(positions[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float a = pos * inv_freq[i];
      const float c = static_cast<float>(std::cos(static_cast<double>(a)));
      const float s = static_cast<float>(std::sin(static_cast<double>(a)));
      for (int64_t h = 0; h < n_heads; ++h) {
        float* xh = x + r * row_stride + h * head_dim;
        const float x1 = xh[i];
        const float x2 = xh[i + half];
        xh[i] = x1 * c - x2 * s;
        xh[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

}  // namespace linnet::cpu

namespace linnet::cpu {

void rope_scale_llama3(float* inv_freq, int64_t n, double factor, double low_freq_factor,
                       double high_freq_factor, double original_max_position_embeddings) {
  const double kPi = 3.14159265358979323846;
  const double low_wavelen = original_max_position_embeddings / low_freq_factor;
  const double high_wavelen = original_max_position_embeddings / high_freq_factor;
  for (int64_t i = 0; i < n; ++i) {
    const double f = inv_freq[i];
    const double wavelen = 2.0 * kPi / f;
    double scaled = f;
    if (wavelen > low_wavelen) {
      scaled = f / factor;
    } else if (wavelen >= high_wavelen) {
      const double s = (original_max_position_embeddings / wavelen - low_freq_factor) /
                       (high_freq_factor - low_freq_factor);
      scaled = (1.0 - s) * f / factor + s * f;
    }
    inv_freq[i] = static_cast<float>(scaled);
  }
}

}  // namespace linnet::cpu
