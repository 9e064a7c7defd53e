// The 16-bit float formats checkpoints and caches hold: bfloat16 (the upper half of an
// IEEE binary32) and IEEE binary16. Widening is exact; narrowing rounds to nearest, ties
// to even, as torch's .to(torch.bfloat16) / .to(torch.float16) do.
#pragma once

#include <cstdint>

namespace linnet {

/// IEEE binary16 bits -> f32, exact (signed zeros, subnormals, infinities, NaN payloads kept).
float half_to_float(uint16_t h);
/// bfloat16 bits -> f32, exact.
float bf16_to_float(uint16_t b);
/// f32 -> bfloat16 bits, round to nearest even (torch's .to(torch.bfloat16)); NaN stays NaN.
uint16_t float_to_bf16(float f);
/// f32 -> IEEE binary16 bits, round to nearest even; overflow to inf, subnormals kept.
uint16_t float_to_half(float f);

}  // namespace linnet
