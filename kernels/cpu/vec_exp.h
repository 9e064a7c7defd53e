// The f32 exp the CPU kernels vectorize (attention's softmax weights and the
// cross-entropy's sums in attention_impl.h, SwiGLU in elementwise.cpp), over GCC vector
// types of any width. Element-wise operations only, multiply and add kept apart (the
// files that include it are built with -ffp-contract=off or without FMA), so every
// width and ISA path gives the same bits.
// Not a public header. `static`: each file (each ISA's flags) gets its own copy; an
// inline one would be emitted once per file and the linker would keep one for all.
#pragma once

namespace linnet::cpu {

/// exp(x) element-wise for x in [-87, 88] (callers clamp or mask outside): x = 2^k e^r
/// with k = round(x / ln 2) (the 1.5 2^23 rounding trick), r = x - k ln 2 in two parts
/// (Cody and Waite), |r| <= ln 2 / 2, e^r by its Taylor polynomial of degree 7
/// (truncation below 6e-9 relative), 2^k put in the exponent bits: at most 1.17 ulp
/// from exp in double, measured on every 98th float of [-87, 0]. VF: a GCC vector of
/// floats, VI: the int vector of the same size. Through pointers: no wide vector crosses
/// a call on the narrower ISA paths.
template <class VF, class VI>
static inline void exp_in_range(const VF* xp, VF* out) {
  const float log2e = 1.44269504088896341f, magic = 12582912.0f;  // 1.5 2^23
  const float ln2_hi = 0.693145751953125f, ln2_lo = 1.42860682030941723e-6f;
  const VF x = *xp;
  const VF t = x * log2e + magic;
  const VF k = t - magic;
  VF r = x - k * ln2_hi;
  r = r - k * ln2_lo;
  VF p = r * (1.0f / 5040) + (1.0f / 720);
  p = p * r + (1.0f / 120);
  p = p * r + (1.0f / 24);
  p = p * r + (1.0f / 6);
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  VI bits;
  __builtin_memcpy(&bits, &t, sizeof(VF));
  const VI e2 = (bits - 0x4b400000 + 127) << 23;  // t's low bits hold k: 2^k
  VF two_k;
  __builtin_memcpy(&two_k, &e2, sizeof(VF));
  *out = p * two_k;
}

}  // namespace linnet::cpu
